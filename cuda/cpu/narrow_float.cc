// The loops of narrow_float.h for each instruction set. A set's functions live in a namespace
// compiled for it (#pragma GCC target) and are called only where the CPU has it; its loops
// (narrow_float_loops.inc) are the same text for every set, over the set's vector type, width,
// load() and store().
#include "narrow_float.h"

#include "../reduce_ops.h"

#include <atomic>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mncl::dev {
namespace {

// A float rounded to H, as the element-at-a-time arithmetic rounds it.
template <typename H>
H roundNarrow(float x) {
  return ArithNarrow<H>::h(x);
}

// The two 8-bit formats' constants for the vector conversions (see toFp8e4m3, toFp8e5m2).
template <typename H>
struct Fp8Format;
template <>
struct Fp8Format<fp8e4m3_t> {
  static constexpr int kMantissaBits = 3, kRebias = 120;  // float's exponent bias 127 - 7
  static constexpr int kLargest = 0x7e, kSmallestNormal = 0x3c800000;  // 448; 2^-6 as float bits
  static constexpr int kLargestBits = 0x43e00000;
  static constexpr float kSubnormalUnit = 0x1p14f;  // (float's ulp at 2^14 is the format's 2^-9)
};
template <>
struct Fp8Format<fp8e5m2_t> {
  static constexpr int kMantissaBits = 2, kRebias = 112;
  static constexpr int kLargest = 0x7b, kSmallestNormal = 0x38800000;  // 57344; 2^-14
  static constexpr int kLargestBits = 0x47600000;
  static constexpr float kSubnormalUnit = 0x1p7f;  // (2^-16)
};

// Portable: the scalar conversions have no branches, so the compiler vectorises these for
// the baseline set. (Also the tails of the vector loops.)
template <typename H>
void combinePortable(NarrowOp op, const H* a, const H* b, H* d, size_t n) {
  if (op == NarrowOp::add) {
    for (size_t i = 0; i < n; ++i) d[i] = roundNarrow<H>(toFloat(a[i]) + toFloat(b[i]));
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = roundNarrow<H>(toFloat(a[i]) * toFloat(b[i]));
  }
}
template <typename H>
void scalePortable(const H* a, float s, H* d, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = roundNarrow<H>(toFloat(a[i]) * s);
}
// A term of a premulsum: x, or x * s rounded to H.
template <bool kScale, typename H>
float termPortable(H x, float s) {
  if constexpr (kScale) return toFloat(roundNarrow<H>(toFloat(x) * s));
  else return toFloat(x);
}
template <bool kScaleA, bool kScaleB, typename H>
void addScaledPortable(const H* a, float sa, const H* b, float sb, H* d, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = roundNarrow<H>(termPortable<kScaleA>(a[i], sa) + termPortable<kScaleB>(b[i], sb));
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
// x rounded to H, as floats: what store then load give, in registers (a premulsum's terms).
// A NaN keeps its payload here: the sum's store makes it the quiet NaN.
inline V rounded(V x, const half_t*) { return _mm256_cvtph_ps(_mm256_cvtps_ph(x, kNearest)); }
inline V rounded(V x, const bfloat16_t*) {
  __m256i u = _mm256_castps_si256(x), one = _mm256_set1_epi32(1);
  __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(_mm256_srli_epi32(u, 16), one));
  __m256i high = _mm256_set1_epi32((int)0xffff0000u);
  __m256i r = _mm256_and_si256(_mm256_add_epi32(u, bias), high);
  __m256i nan = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), high);
  __m256i isNan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  return _mm256_castsi256_ps(_mm256_blendv_epi8(r, nan, isNan));
}
// An E4M3 value as a half with the same bits shifted into place (E4M3's exponent field in the
// half's low exponent bits, subnormals included) is the value times 2^-8; F16C widens it
// exactly. The NaN code becomes a half NaN first.
inline __m128i fp8e4m3AsHalves(__m128i bytes) {
  __m128i u = _mm_cvtepu8_epi16(bytes);
  __m128i em = _mm_and_si128(u, _mm_set1_epi16(0x7f));
  __m128i h = _mm_or_si128(_mm_slli_epi16(em, 7), _mm_slli_epi16(_mm_and_si128(u, _mm_set1_epi16(0x80)), 8));
  return _mm_blendv_epi8(h, _mm_set1_epi16(0x7e00), _mm_cmpeq_epi16(em, _mm_set1_epi16(0x7f)));
}
inline V load(const fp8e4m3_t* p) {
  return _mm256_mul_ps(_mm256_cvtph_ps(fp8e4m3AsHalves(_mm_loadl_epi64((const __m128i*)p))), _mm256_set1_ps(256.0f));
}
// An E5M2 value is a half's upper byte.
inline V load(const fp8e5m2_t* p) {
  __m128i bytes = _mm_loadl_epi64((const __m128i*)p);
  return _mm256_cvtph_ps(_mm_unpacklo_epi8(_mm_setzero_si128(), bytes));
}
// toFp8e4m3 / toFp8e5m2's arithmetic, 8 lanes at a time; then each lane's low byte.
template <typename H>
inline void storeFp8(V x, H* p) {
  using F = Fp8Format<H>;
  const int drop = 23 - F::kMantissaBits;
  __m256i f = _mm256_castps_si256(x), a = _mm256_and_si256(f, _mm256_set1_epi32(0x7fffffff));
  __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, drop), _mm256_set1_epi32(1));
  __m256i bias = _mm256_add_epi32(_mm256_set1_epi32((1 << (drop - 1)) - 1 - (F::kRebias << 23)), odd);
  __m256i normal = _mm256_srli_epi32(_mm256_add_epi32(a, bias), drop);
  V unit = _mm256_set1_ps(F::kSubnormalUnit);
  __m256i small = _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), unit)), _mm256_castps_si256(unit));
  __m256i e = _mm256_blendv_epi8(normal, small, _mm256_cmpgt_epi32(_mm256_set1_epi32(F::kSmallestNormal), a));
  e = _mm256_blendv_epi8(e, _mm256_set1_epi32(F::kLargest), _mm256_cmpgt_epi32(a, _mm256_set1_epi32(F::kLargestBits - 1)));
  e = _mm256_or_si256(e, _mm256_and_si256(_mm256_srli_epi32(f, 24), _mm256_set1_epi32(0x80)));
  e = _mm256_blendv_epi8(e, _mm256_set1_epi32(0x7f), _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000)));
  __m256i bytes = _mm256_shuffle_epi8(e, _mm256_set1_epi32(0x0c080400));  // each half's four low bytes, first
  __m128i both = _mm_unpacklo_epi32(_mm256_castsi256_si128(bytes), _mm256_extracti128_si256(bytes, 1));
  _mm_storel_epi64((__m128i*)p, both);
}
inline void store(V x, fp8e4m3_t* p) { storeFp8(x, p); }
inline void store(V x, fp8e5m2_t* p) { storeFp8(x, p); }
#include "narrow_float_loops.inc"
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
inline V rounded(V x, const half_t*) { return _mm512_cvtph_ps(_mm512_cvtps_ph(x, kNearest)); }  // (as avx2's)
inline V rounded(V x, const bfloat16_t*) {
  __m512i u = _mm512_castps_si512(x), one = _mm512_set1_epi32(1);
  __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(u, 16), one));
  __m512i high = _mm512_set1_epi32((int)0xffff0000u);
  __m512i r = _mm512_and_si512(_mm512_add_epi32(u, bias), high);
  __m512i nan = _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x00400000)), high);
  __mmask16 isNan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_castsi512_ps(_mm512_mask_mov_epi32(r, isNan, nan));
}
inline V load(const fp8e4m3_t* p) {  // (as avx2's)
  __m256i u = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)p));
  __m256i em = _mm256_and_si256(u, _mm256_set1_epi16(0x7f));
  __m256i h = _mm256_or_si256(_mm256_slli_epi16(em, 7), _mm256_slli_epi16(_mm256_and_si256(u, _mm256_set1_epi16(0x80)), 8));
  h = _mm256_blendv_epi8(h, _mm256_set1_epi16(0x7e00), _mm256_cmpeq_epi16(em, _mm256_set1_epi16(0x7f)));
  return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
}
inline V load(const fp8e5m2_t* p) {
  __m256i halves = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)p)), 8);
  return _mm512_cvtph_ps(halves);
}
template <typename H>
inline void storeFp8(V x, H* p) {
  using F = Fp8Format<H>;
  const int drop = 23 - F::kMantissaBits;
  __m512i f = _mm512_castps_si512(x), a = _mm512_and_si512(f, _mm512_set1_epi32(0x7fffffff));
  __m512i odd = _mm512_and_si512(_mm512_srli_epi32(a, drop), _mm512_set1_epi32(1));
  __m512i bias = _mm512_add_epi32(_mm512_set1_epi32((1 << (drop - 1)) - 1 - (F::kRebias << 23)), odd);
  __m512i normal = _mm512_srli_epi32(_mm512_add_epi32(a, bias), drop);
  V unit = _mm512_set1_ps(F::kSubnormalUnit);
  __m512i small = _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), unit)), _mm512_castps_si512(unit));
  __m512i e = _mm512_mask_mov_epi32(normal, _mm512_cmplt_epi32_mask(a, _mm512_set1_epi32(F::kSmallestNormal)), small);
  e = _mm512_mask_mov_epi32(e, _mm512_cmpge_epi32_mask(a, _mm512_set1_epi32(F::kLargestBits)), _mm512_set1_epi32(F::kLargest));
  e = _mm512_or_si512(e, _mm512_and_si512(_mm512_srli_epi32(f, 24), _mm512_set1_epi32(0x80)));
  e = _mm512_mask_mov_epi32(e, _mm512_cmpgt_epi32_mask(a, _mm512_set1_epi32(0x7f800000)), _mm512_set1_epi32(0x7f));
  _mm_storeu_si128((__m128i*)p, _mm512_cvtepi32_epi8(e));
}
inline void store(V x, fp8e4m3_t* p) { storeFp8(x, p); }
inline void store(V x, fp8e5m2_t* p) { storeFp8(x, p); }
#include "narrow_float_loops.inc"
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
void combineFor(NarrowOp op, const H* a, const H* b, H* d, size_t n) {
  switch (vectorIsa()) {
#if defined(__x86_64__)
    case VectorIsa::avx512: return avx512::combine(op, a, b, d, n);
    case VectorIsa::avx2: return avx2::combine(op, a, b, d, n);
#endif
    default: return combinePortable(op, a, b, d, n);
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

template <bool kScaleA, bool kScaleB, typename H>
void addScaledFor(const H* a, float sa, const H* b, float sb, H* d, size_t n) {
  switch (vectorIsa()) {
#if defined(__x86_64__)
    case VectorIsa::avx512: return avx512::addScaled<kScaleA, kScaleB>(a, sa, b, sb, d, n);
    case VectorIsa::avx2: return avx2::addScaled<kScaleA, kScaleB>(a, sa, b, sb, d, n);
#endif
    default: return addScaledPortable<kScaleA, kScaleB>(a, sa, b, sb, d, n);
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

template <typename H>
void combineNarrow(NarrowOp op, const H* a, const H* b, H* d, size_t n) {
  combineFor(op, a, b, d, n);
}
template <typename H>
void scaleNarrow(const H* a, H scalar, H* d, size_t n) {
  scaleFor(a, scalar, d, n);
}
template <typename H>
void addScaledNarrow(const H* a, bool scaleA, H sa, const H* b, bool scaleB, H sb, H* d, size_t n) {
  float fa = toFloat(sa), fb = toFloat(sb);
  if (scaleA && scaleB) addScaledFor<true, true>(a, fa, b, fb, d, n);
  else if (scaleA) addScaledFor<true, false>(a, fa, b, fb, d, n);
  else if (scaleB) addScaledFor<false, true>(a, fa, b, fb, d, n);
  else combineFor(NarrowOp::add, a, b, d, n);
}
#define MNCL_NARROW(H)                                                               \
  template void combineNarrow<H>(NarrowOp, const H*, const H*, H*, size_t);         \
  template void scaleNarrow<H>(const H*, H, H*, size_t);                             \
  template void addScaledNarrow<H>(const H*, bool, H, const H*, bool, H, H*, size_t);
MNCL_NARROW(half_t)
MNCL_NARROW(bfloat16_t)
MNCL_NARROW(fp8e4m3_t)
MNCL_NARROW(fp8e5m2_t)
#undef MNCL_NARROW

}  // namespace mncl::dev
