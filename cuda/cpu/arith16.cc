// The loops of arith16.h for each instruction set. A set's functions live in a namespace
// compiled for it (#pragma GCC target) and are called only where the CPU has it; its loops
// (arith16_loops.inc) are the same text for every set, over the set's vector type, width,
// load() and store().
#include "arith16.h"

#include <atomic>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mncl::dev {
namespace {

template <typename H>
H round16(float x) {
  if constexpr (std::is_same_v<H, half_t>) return toHalf(x);
  else return toBfloat16(x);
}

// Portable: the scalar conversions have no branches, so the compiler vectorises these for
// the baseline set. (Also the tails of the vector loops.)
template <typename H>
void combinePortable(Arith16Op op, const H* a, const H* b, H* d, size_t n) {
  if (op == Arith16Op::add) {
    for (size_t i = 0; i < n; ++i) d[i] = round16<H>(toFloat(a[i]) + toFloat(b[i]));
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = round16<H>(toFloat(a[i]) * toFloat(b[i]));
  }
}
template <typename H>
void scalePortable(const H* a, float s, H* d, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = round16<H>(toFloat(a[i]) * s);
}
template <typename H>
void dividePortable(const H* a, H* d, size_t n, uint32_t divisor) {
  for (size_t i = 0; i < n; ++i) d[i] = round16<H>(toFloat(a[i]) / (float)divisor);
}

#if defined(__x86_64__)
constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;  // whatever MXCSR says
constexpr int kQuietNan = 0x7fc00000;

#pragma GCC push_options
#pragma GCC target("avx2,f16c")
namespace avx2 {
using V = __m256;
constexpr size_t kLanes = 8;
inline V load(const half_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
inline V load(const bfloat16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
// F16C keeps a NaN's payload, toHalf does not: a NaN becomes the quiet NaN (with its sign) first.
inline void store(V x, half_t* p) {
  V nan = _mm256_or_ps(_mm256_and_ps(x, _mm256_set1_ps(-0.0f)), _mm256_castsi256_ps(_mm256_set1_epi32(kQuietNan)));
  x = _mm256_blendv_ps(x, nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  _mm_storeu_si128((__m128i*)p, _mm256_cvtps_ph(x, kNearest));
}
// toBfloat16's arithmetic, 8 lanes at a time; then the low halves of the lanes, packed.
inline void store(V x, bfloat16_t* p) {
  __m256i u = _mm256_castps_si256(x), one = _mm256_set1_epi32(1);
  __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(_mm256_srli_epi32(u, 16), one));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  __m256i isNan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  __m256i r = _mm256_blendv_epi8(rounded, nan, isNan);
  __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);  // quads 0 and 2
  _mm_storeu_si128((__m128i*)p, _mm256_castsi256_si128(packed));
}
#include "arith16_loops.inc"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f")
namespace avx512 {
using V = __m512;
constexpr size_t kLanes = 16;
inline V load(const half_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
inline V load(const bfloat16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
inline void store(V x, half_t* p) {
  __m512i nan = _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)), _mm512_set1_epi32(kQuietNan));
  x = _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_castsi512_ps(nan));
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtps_ph(x, kNearest));
}
inline void store(V x, bfloat16_t* p) {
  __m512i u = _mm512_castps_si512(x), one = _mm512_set1_epi32(1);
  __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(u, 16), one));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  __mmask16 isNan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, isNan, nan)));
}
#include "arith16_loops.inc"
}  // namespace avx512
#pragma GCC pop_options
#endif

VectorIsa detect() {
#if defined(__x86_64__)
  __builtin_cpu_init();  // (libgcc also checks that the OS saves the wide registers)
  if (__builtin_cpu_supports("avx512f")) return VectorIsa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) return VectorIsa::avx2;
#endif
  return VectorIsa::portable;
}

std::atomic<VectorIsa> chosen{bestVectorIsa()};

template <typename H>
void combineFor(Arith16Op op, const H* a, const H* b, H* d, size_t n) {
  switch (vectorIsa()) {
#if defined(__x86_64__)
    case VectorIsa::avx512: return avx512::combine(op, a, b, d, n);
    case VectorIsa::avx2: return avx2::combine(op, a, b, d, n);
#endif
    default: return combinePortable(op, a, b, d, n);
  }
}

template <typename H>
void divideFor(const H* a, H* d, size_t n, uint32_t divisor) {
  switch (vectorIsa()) {
#if defined(__x86_64__)
    case VectorIsa::avx512: return avx512::divide(a, d, n, divisor);
    case VectorIsa::avx2: return avx2::divide(a, d, n, divisor);
#endif
    default: return dividePortable(a, d, n, divisor);
  }
}

template <typename H>
void scaleFor(const H* a, H scalar, H* d, size_t n) {
  float s = toFloat(scalar);
  switch (vectorIsa()) {
#if defined(__x86_64__)
    case VectorIsa::avx512: return avx512::scale(a, s, d, n);
    case VectorIsa::avx2: return avx2::scale(a, s, d, n);
#endif
    default: return scalePortable(a, s, d, n);
  }
}

}  // namespace

const char* vectorIsaName(VectorIsa isa) {
  switch (isa) {
    case VectorIsa::avx2: return "avx2";
    case VectorIsa::avx512: return "avx512";
    default: return "portable";
  }
}

VectorIsa bestVectorIsa() {
  static const VectorIsa best = detect();
  return best;
}

VectorIsa vectorIsa() { return chosen.load(std::memory_order_relaxed); }

void useVectorIsa(VectorIsa isa) { chosen.store(isa <= bestVectorIsa() ? isa : bestVectorIsa(), std::memory_order_relaxed); }

void combine16(Arith16Op op, const half_t* a, const half_t* b, half_t* d, size_t n) { combineFor(op, a, b, d, n); }
void combine16(Arith16Op op, const bfloat16_t* a, const bfloat16_t* b, bfloat16_t* d, size_t n) { combineFor(op, a, b, d, n); }
void scale16(const half_t* a, half_t scalar, half_t* d, size_t n) { scaleFor(a, scalar, d, n); }
void scale16(const bfloat16_t* a, bfloat16_t scalar, bfloat16_t* d, size_t n) { scaleFor(a, scalar, d, n); }
void divide16(const half_t* a, half_t* d, size_t n, uint32_t divisor) { divideFor(a, d, n, divisor); }
void divide16(const bfloat16_t* a, bfloat16_t* d, size_t n, uint32_t divisor) { divideFor(a, d, n, divisor); }

}  // namespace mncl::dev
