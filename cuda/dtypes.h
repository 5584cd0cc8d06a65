// Element types the device code reduces, and the enums shared by host and device.
#pragma once

#include <cstring>

#include "arch.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace mncl {

// Numbering matches mnclDataType_t / mnclRedOp_t in minincl.h (up to avg: premulsum is what
// C's created ops run as; band, bor and bxor, Python's only, act on bytes of any integer type).
enum class DataType : uint8_t { i8, u8, i32, u32, i64, u64, f16, f32, f64, bf16, f8e4m3, f8e5m2, count };
enum class RedOp : uint8_t { sum, prod, max, min, avg, premulsum, band, bor, bxor, count };
enum class Coll : uint8_t { allreduce, broadcast, reduce, allgather, reducescatter, sendrecv, count };
enum class Algo : uint8_t { ring, tree, direct, count };
enum class Proto : uint8_t { simple, ll, ll128, count };

MNCL_HOSTDEV bool isBitwise(RedOp op) { return op == RedOp::band || op == RedOp::bor || op == RedOp::bxor; }

// The shapes of the collectives' buffers, in blocks of a call's `count` elements: allgather
// receives one block from each rank, reduce_scatter sends one to each; the others' buffers
// are one block. Whether a collective reduces (and so takes an op).
MNCL_HOSTDEV bool reduces(Coll c) { return c == Coll::allreduce || c == Coll::reduce || c == Coll::reducescatter; }
MNCL_HOSTDEV size_t sendBlocks(Coll c, int nranks) { return c == Coll::reducescatter ? (size_t)nranks : 1; }
MNCL_HOSTDEV size_t recvBlocks(Coll c, int nranks) { return c == Coll::allgather ? (size_t)nranks : 1; }
// The blocks the whole operation moves: the size the tuner weighs.
MNCL_HOSTDEV size_t opBlocks(Coll c, int nranks) {
  return c == Coll::allgather || c == Coll::reducescatter ? (size_t)nranks : 1;
}

MNCL_HOSTDEV size_t dataTypeSize(DataType t) {
  switch (t) {
    case DataType::i8: case DataType::u8: case DataType::f8e4m3: case DataType::f8e5m2: return 1;
    case DataType::f16: case DataType::bf16: return 2;
    case DataType::i32: case DataType::u32: case DataType::f32: return 4;
    default: return 8;
  }
}

MNCL_HOSTDEV bool isFloat(DataType t) {
  return t == DataType::f16 || t == DataType::bf16 || t == DataType::f32 || t == DataType::f64 ||
         t == DataType::f8e4m3 || t == DataType::f8e5m2;
}

#if defined(__CUDACC__)
using half_t = __half;
using bfloat16_t = __nv_bfloat16;
using fp8e4m3_t = __nv_fp8_e4m3;  // (converting from float saturates to the largest finite value)
using fp8e5m2_t = __nv_fp8_e5m2;
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

// 8-bit floats (OCP FP8), as NCCL and CUDA's cuda_fp8.h define them. E4M3: exponent bias 7,
// 3 mantissa bits, no infinity, NaN = S.1111.111, largest 448. E5M2: bias 15, 2 mantissa bits,
// infinity and NaN as a half's (an E5M2 value is a half's upper byte), largest 57344.
struct fp8e4m3_t {
  uint8_t bits;
};
struct fp8e5m2_t {
  uint8_t bits;
};

// Exact.
inline float toFloat(fp8e4m3_t x) {
  uint32_t em = x.bits & 0x7fu;
  uint32_t normal = (em << 20) + (120u << 23);                 // rebias the exponent: 7 -> 127
  uint32_t small = floatToBits((float)(int32_t)em * 0x1p-9f);  // zero or subnormal, exact
  uint32_t mag = pick(em == 0x7fu, 0x7fc00000u, pick(em < 0x08u, small, normal));
  return bitsToFloat(mag | (uint32_t)(x.bits & 0x80u) << 24);
}
inline float toFloat(fp8e5m2_t x) { return toFloat(half_t{(uint16_t)(x.bits << 8)}); }

// Both round to nearest even and saturate, as CUDA's conversions with __NV_SATFINITE do (and
// NCCL's reductions with them): a result beyond the largest finite value, infinity included,
// becomes the largest finite value; a NaN becomes 0x7f (their canonical NaN, whatever its sign).
inline fp8e4m3_t toFp8e4m3(float x) {
  uint32_t f = floatToBits(x), a = f & 0x7fffffffu;
  uint32_t normal = (a - (120u << 23) + 0x7ffffu + ((a >> 20) & 1u)) >> 20;  // as toHalf's
  uint32_t small = floatToBits(bitsToFloat(a) + 0x1p14f) - floatToBits(0x1p14f);  // units of 2^-9
  uint32_t e = pick(a >= 0x43e00000u, 0x7eu, pick(a < 0x3c800000u, small, normal));  // 448 (saturated), 2^-6
  return {(uint8_t)pick(a > 0x7f800000u, 0x7fu, e | (f >> 24 & 0x80u))};
}
inline fp8e5m2_t toFp8e5m2(float x) {
  uint32_t f = floatToBits(x), a = f & 0x7fffffffu;
  uint32_t normal = (a - (112u << 23) + 0xfffffu + ((a >> 21) & 1u)) >> 21;
  uint32_t small = floatToBits(bitsToFloat(a) + 0x1p7f) - floatToBits(0x1p7f);  // units of 2^-16
  uint32_t e = pick(a >= 0x47600000u, 0x7bu, pick(a < 0x38800000u, small, normal));  // 57344 (saturated), 2^-14
  return {(uint8_t)pick(a > 0x7f800000u, 0x7fu, e | (f >> 24 & 0x80u))};
}

// `v` rounded to float type `t`, as the bits of one element of it (in the low bytes). The
// 16- and 8-bit types round through float, as NumPy's float16(float32(v)) does; the 8-bit ones
// saturate, as the reductions do. 0 for a type that is not a float.
inline uint64_t floatBitsOf(double v, DataType t) {
  uint64_t out = 0;
  switch (t) {
    case DataType::f64: std::memcpy(&out, &v, 8); break;
    case DataType::f32: out = floatToBits((float)v); break;
    case DataType::f16: out = toHalf((float)v).bits; break;
    case DataType::bf16: out = toBfloat16((float)v).bits; break;
    case DataType::f8e4m3: out = toFp8e4m3((float)v).bits; break;
    case DataType::f8e5m2: out = toFp8e5m2((float)v).bits; break;
    default: break;
  }
  return out;
}
#endif

}  // namespace mncl
