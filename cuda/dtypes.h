// Element types the device code reduces, and the enums shared by host and device.
#pragma once

#include <cstring>

#include "arch.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace mncl {

// Numbering matches mnclDataType_t / mnclRedOp_t in minincl.h.
enum class DataType : uint8_t { i8, u8, i32, u32, i64, u64, f16, f32, f64, bf16, count };
enum class RedOp : uint8_t { sum, prod, max, min, avg, premulsum, count };
enum class Coll : uint8_t { allreduce, broadcast, reduce, allgather, reducescatter, sendrecv, count };
enum class Algo : uint8_t { ring, tree, direct, count };
enum class Proto : uint8_t { simple, ll, ll128, count };

MNCL_HOSTDEV size_t dataTypeSize(DataType t) {
  switch (t) {
    case DataType::i8: case DataType::u8: return 1;
    case DataType::f16: case DataType::bf16: return 2;
    case DataType::i32: case DataType::u32: case DataType::f32: return 4;
    default: return 8;
  }
}

#if defined(__CUDACC__)
using half_t = __half;
using bfloat16_t = __nv_bfloat16;
#else
// 16-bit floats on the CPU: storage plus exact conversions; arithmetic happens in float and
// rounds back to nearest-even, as the GPU's native half/bfloat16 instructions do.
struct half_t {
  uint16_t bits;
};
struct bfloat16_t {
  uint16_t bits;
};

inline float bitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t floatToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
// c ? x : y without a branch, so that loops over these conversions vectorise.
inline uint32_t pick(bool c, uint32_t x, uint32_t y) {
  uint32_t m = 0u - (uint32_t)c;
  return (x & m) | (y & ~m);
}

// Exact; a NaN comes out quiet, as the CPU's conversion instructions make it.
inline float toFloat(half_t h) {
  uint32_t em = h.bits & 0x7fffu, exp = em & 0x7c00u;
  uint32_t normal = (em << 13) + (112u << 23);       // rebias the exponent: 15 -> 127
  uint32_t infOrNan = (normal + (112u << 23)) | (uint32_t)(em > 0x7c00u) << 22;  // 31 -> 255; NaN quiet
  uint32_t small = floatToBits((float)(int32_t)em * 0x1p-24f);  // zero or subnormal, exact
  uint32_t mag = pick(exp == 0x7c00u, infOrNan, pick(exp == 0, small, normal));
  return bitsToFloat(mag | (uint32_t)(h.bits & 0x8000u) << 16);
}

// Rounds to nearest even. A NaN becomes the quiet NaN 0x7e00 with its sign.
inline half_t toHalf(float x) {
  uint32_t f = floatToBits(x), a = f & 0x7fffffffu;
  // A normal half: rebias, add half an ulp (less one, plus the kept lowest bit: ties to
  // even) and drop 13 bits; a carry into the exponent is the right rounding, inf included.
  uint32_t normal = (a + ((uint32_t)(15 - 127) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
  // A subnormal half (or zero): adding 0.5 puts its 10 bits at the bottom of the float's
  // mantissa, and the float adder rounds them to nearest even.
  uint32_t small = floatToBits(bitsToFloat(a) + 0.5f) - floatToBits(0.5f);
  uint32_t big = 0x7c00u | (uint32_t)(a > 0x7f800000u) << 9;  // inf, or nan made quiet
  uint32_t h = pick(a >= 0x47800000u, big, pick(a < 0x38800000u, small, normal));
  return {(uint16_t)(h | (f >> 16 & 0x8000u))};
}

inline float toFloat(bfloat16_t b) { return bitsToFloat((uint32_t)b.bits << 16); }

inline bfloat16_t toBfloat16(float x) {
  uint32_t f = floatToBits(x);
  uint32_t rounded = (f + 0x7fffu + ((f >> 16) & 1u)) >> 16;  // to nearest even
  uint32_t quietNan = (f >> 16) | 0x40u;
  return {(uint16_t)pick((f & 0x7fffffffu) > 0x7f800000u, quietNan, rounded)};
}
#endif

}  // namespace mncl
