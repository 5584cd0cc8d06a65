// The CPU device code's 8-bit float conversions (cuda/dtypes.h) against CUDA's own
// (cuda_fp8.h's host functions, which its GPU instructions match): every code decoded, and
// floats encoded with round to nearest even and saturation (__NV_SATFINITE): every float of a
// stride through all 2^32 bit patterns, and every float whose low 12 bits are zero (every
// tie and every value an 8-bit float holds, at every scale). Prints "<n> checks, <m> failed".
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cuda_fp8.h>

#include "dtypes.h"

namespace {

long checks = 0, failed = 0;

void report(const char* what, uint32_t in, unsigned want, unsigned got) {
  if (++failed <= 10) std::printf("%s %08x: want %02x, got %02x\n", what, in, want, got);
}

void decodeAll() {
  for (unsigned b = 0; b < 256; ++b) {
    for (int e5 = 0; e5 < 2; ++e5) {
      __half_raw raw = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, e5 ? __NV_E5M2 : __NV_E4M3);
      float want = __half2float(__half(raw));
      float got = e5 ? mncl::toFloat(mncl::fp8e5m2_t{(uint8_t)b}) : mncl::toFloat(mncl::fp8e4m3_t{(uint8_t)b});
      bool same = std::isnan(want) ? std::isnan(got) : (want == got && std::signbit(want) == std::signbit(got));
      ++checks;
      if (!same) report(e5 ? "decode e5m2" : "decode e4m3", b, 0, 0);
    }
  }
}

void encode(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, 4);
  unsigned want4 = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
  unsigned want5 = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
  unsigned got4 = mncl::toFp8e4m3(x).bits, got5 = mncl::toFp8e5m2(x).bits;
  checks += 2;
  if (got4 != want4) report("encode e4m3", bits, want4, got4);
  if (got5 != want5) report("encode e5m2", bits, want5, got5);
}

}  // namespace

int main() {
  decodeAll();
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) encode((uint32_t)u);
  for (uint64_t hi = 0; hi < (uint64_t{1} << 20); ++hi) encode((uint32_t)(hi << 12));
  std::printf("%ld checks, %ld failed\n", checks, failed);
  return failed != 0;
}
