// Sums, products, averages and pre-multiplied sums of 16-bit floats on the CPU, a block at a
// time, with the conversion instructions the CPU has: one element at a time in portable code,
// a half sum was 10x slower than the float32 sum it wraps.
#pragma once

#include <cstddef>

#include "../dtypes.h"

namespace mncl::dev {

// The instruction sets these loops may use: at load, the widest this CPU has. Every one
// gives the bits Arith16 gives (each result computed in float, rounded to nearest even;
// subnormals kept; a NaN comes out as the quiet NaN with its sign); only the speed differs.
enum class VectorIsa : uint8_t { portable, avx2, avx512, count };  // avx2: with F16C
const char* vectorIsaName(VectorIsa isa);
VectorIsa bestVectorIsa();
VectorIsa vectorIsa();
void useVectorIsa(VectorIsa isa);  // (at most bestVectorIsa(); the host checks MININCL_CPU_ISA)

enum class Arith16Op : uint8_t { add, mul };

// d[i] = a[i] op b[i] for i < n; d may be a or b.
void combine16(Arith16Op op, const half_t* a, const half_t* b, half_t* d, size_t n);
void combine16(Arith16Op op, const bfloat16_t* a, const bfloat16_t* b, bfloat16_t* d, size_t n);
// d[i] = a[i] * scalar (premulsum's own input); d may be a.
void scale16(const half_t* a, half_t scalar, half_t* d, size_t n);
void scale16(const bfloat16_t* a, bfloat16_t scalar, bfloat16_t* d, size_t n);
// d[i] = a[i] / divisor (avg's last step); d may be a.
void divide16(const half_t* a, half_t* d, size_t n, uint32_t divisor);
void divide16(const bfloat16_t* a, bfloat16_t* d, size_t n, uint32_t divisor);

}  // namespace mncl::dev
