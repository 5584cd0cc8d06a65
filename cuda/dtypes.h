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
enum class RedOp : uint8_t { sum, prod, max, min, avg, count };
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

inline float toFloat(half_t h) {
  uint32_t sign = (uint32_t)(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1f, man = h.bits & 0x3ffu, f;
  if (exp == 0x1f) {
    f = sign | 0x7f800000u | (man << 13);  // inf / nan
  } else if (exp != 0) {
    f = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    f = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do { man <<= 1; ++e; } while (!(man & 0x400u));
    f = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float out;
  std::memcpy(&out, &f, 4);
  return out;
}

inline half_t toHalf(float x) {
  uint32_t f;
  std::memcpy(&f, &x, 4);
  uint32_t sign = (f >> 16) & 0x8000u;
  uint32_t absf = f & 0x7fffffffu;
  if (absf >= 0x7f800000u) {  // inf or nan
    return {(uint16_t)(sign | 0x7c00u | (absf > 0x7f800000u ? 0x200u : 0))};
  }
  if (absf >= 0x477ff000u) return {(uint16_t)(sign | 0x7c00u)};  // rounds to inf
  if (absf < 0x38800000u) {  // subnormal or zero in half
    if (absf < 0x33000000u) return {(uint16_t)sign};
    uint32_t man = (absf & 0x7fffffu) | 0x800000u;
    int shift = 126 - (int)(absf >> 23);  // 14..24
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return {(uint16_t)(sign | half)};
  }
  uint32_t h = ((absf >> 13) - (112u << 10));
  uint32_t rem = absf & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
  return {(uint16_t)(sign | h)};
}

inline float toFloat(bfloat16_t b) {
  uint32_t f = (uint32_t)b.bits << 16;
  float out;
  std::memcpy(&out, &f, 4);
  return out;
}

inline bfloat16_t toBfloat16(float x) {
  uint32_t f;
  std::memcpy(&f, &x, 4);
  if ((f & 0x7fffffffu) > 0x7f800000u) return {(uint16_t)((f >> 16) | 0x40u)};  // quiet nan
  f += 0x7fffu + ((f >> 16) & 1);  // round to nearest even
  return {(uint16_t)(f >> 16)};
}
#endif

}  // namespace mncl
