// Sums, products, averages and pre-multiplied sums of floats narrower than float (16 and 8
// bits) on the CPU, a block at a time, with the vector instructions the CPU has: one element
// at a time in portable code, a half sum was 10x slower than the float32 sum it wraps, and an
// 8-bit float sum 40x.
#pragma once

#include <cstddef>

#include "../dtypes.h"

namespace mncl::dev {

// The instruction sets these loops may use: at load, the widest this CPU has. Every one
// gives the bits ArithNarrow gives (each result computed in float, rounded to nearest even;
// subnormals kept; a NaN comes out as the quiet NaN; 8-bit floats saturate); only the speed
// differs.
enum class VectorIsa : uint8_t { portable, avx2, avx512, count };  // avx2: with F16C
const char* vectorIsaName(VectorIsa isa);
VectorIsa bestVectorIsa();
VectorIsa vectorIsa();
void useVectorIsa(VectorIsa isa);  // (at most bestVectorIsa(); the host checks MININCL_CPU_ISA)

enum class NarrowOp : uint8_t { add, mul };

// For H each of half_t, bfloat16_t, fp8e4m3_t, fp8e5m2_t:
// d[i] = a[i] op b[i] for i < n; d may be a or b.
template <typename H>
void combineNarrow(NarrowOp op, const H* a, const H* b, H* d, size_t n);
// d[i] = a[i] * scalar (premulsum's own input); d may be a.
template <typename H>
void scaleNarrow(const H* a, H scalar, H* d, size_t n);
// Premulsum's two-source step in one pass: d[i] = a'[i] + b'[i], where a' is a[i] * sa
// rounded to H if scaleA, else a[i] itself (b' likewise): the bits of scaleNarrow, then
// combineNarrow. d may be a or b.
template <typename H>
void addScaledNarrow(const H* a, bool scaleA, H sa, const H* b, bool scaleB, H sb, H* d, size_t n);

}  // namespace mncl::dev
