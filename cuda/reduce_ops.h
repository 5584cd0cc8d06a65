// Reduction operators: sum, prod, max, min, premulsum over the twelve element types, avg over
// the integer ones (a float avg runs as a premulsum by 1/n); band, bor, bxor over the integer
// types (as bytes).
//
// Integer sums and products wrap around in the type's width (done in unsigned arithmetic, so
// signed types wrap as two's complement without undefined behaviour). Max and min propagate
// NaN as NumPy does. avg on integers = sum, then a post-operation dividing by the rank count:
// applied once by whichever rank finishes a reduction, so every rank ends with the same bits
// (a float avg is a premulsum by 1/nranks: the host makes it one, as NCCL does). premulsum
// (NCCL's ncclRedOpCreatePreMulSum) = sum, after a pre-operation multiplying each rank's own
// input by that rank's scalar, applied where the input is loaded: by the rank itself, or by a
// peer that reads the raw input through a pointer step, which scales it by the scalar the
// step carries (PrimsSimple::scaleIfInput).
#pragma once

#include <type_traits>

#include "dtypes.h"

namespace mncl::dev {

template <typename T>
struct Arith {
  using Wide = std::conditional_t<(sizeof(T) <= 4), uint32_t, uint64_t>;
  MNCL_HOSTDEV static T add(T a, T b) {
    if constexpr (std::is_integral_v<T>) return (T)(Wide)((Wide)a + (Wide)b);
    else return a + b;
  }
  MNCL_HOSTDEV static T mul(T a, T b) {
    if constexpr (std::is_integral_v<T>) return (T)(Wide)((Wide)a * (Wide)b);
    else return a * b;
  }
  MNCL_HOSTDEV static T max(T a, T b) { return (a > b || a != a) ? a : b; }
  MNCL_HOSTDEV static T min(T a, T b) { return (a < b || a != a) ? a : b; }
  MNCL_HOSTDEV static T div(T a, uint32_t n) {  // (integers only: see FuncAvg)
    if constexpr (std::is_signed_v<T>) return (T)(a / (int64_t)n);
    else return (T)(a / (uint64_t)n);
  }
};

// Floats narrower than float (16 and 8 bits): compute in float, round once, as the GPU's
// native instructions do (8-bit: as NCCL's reductions do, saturating: see toFp8e4m3).
template <typename H>
struct ArithNarrow {
#if defined(__CUDACC__)
  MNCL_DEV static float f(H x) { return static_cast<float>(x); }
  MNCL_DEV static H h(float x) { return H(x); }
#else
  static float f(H x) { return toFloat(x); }
  static H h(float x) {
    if constexpr (std::is_same_v<H, half_t>) return toHalf(x);
    else if constexpr (std::is_same_v<H, bfloat16_t>) return toBfloat16(x);
    else if constexpr (std::is_same_v<H, fp8e4m3_t>) return toFp8e4m3(x);
    else return toFp8e5m2(x);
  }
#endif
  MNCL_HOSTDEV static H add(H a, H b) { return h(f(a) + f(b)); }
  MNCL_HOSTDEV static H mul(H a, H b) { return h(f(a) * f(b)); }
  // max and min pick an input; an 8-bit one comes out saturated too, as every 8-bit result
  // does (NCCL's max of E5M2 infinities is 57344).
#if defined(__CUDACC__)
  MNCL_HOSTDEV static H max(H a, H b) {
    float x = f(a), y = f(b);
    return saturated((x > y || x != x) ? a : b);
  }
  MNCL_HOSTDEV static H min(H a, H b) {
    float x = f(a), y = f(b);
    return saturated((x < y || x != x) ? a : b);
  }
  MNCL_HOSTDEV static H saturated(H x) {
    if constexpr (std::is_same_v<H, fp8e5m2_t>) return h(f(x));  // (E4M3FN has no infinity)
    else return x;
  }
#else
  // The same choices as the float comparisons above, made on the bits (no conversion, and
  // no branch, so loops vectorise): the magnitude with the sign applied orders non-NaN
  // values as floats do, -0 equal to +0.
  using Bits = decltype(H::bits);
  static constexpr unsigned kSign = 1u << (8 * sizeof(Bits) - 1);
  static constexpr unsigned kLargestNotNan = std::is_same_v<H, half_t>       ? 0x7c00  // (infinity)
                                             : std::is_same_v<H, bfloat16_t> ? 0x7f80
                                             : std::is_same_v<H, fp8e4m3_t>  ? 0x7e  // (448)
                                                                             : 0x7c;
  // (Always inlined: a call per element, which GCC chose in the big CPU entry point, kept a
  // bfloat16 max 3-4x slower than a sum.)
  [[gnu::always_inline]] static bool isNan(H x) { return (x.bits & (kSign - 1)) > kLargestNotNan; }
  using Order = std::make_signed_t<Bits>;  // (the type's own width: no widening in the vector loops)
  [[gnu::always_inline]] static Order order(H x) {
    auto m = (Order)(x.bits & (kSign - 1));
    return (x.bits & kSign) ? (Order)-m : m;
  }
  [[gnu::always_inline]] static H pickBits(bool c, H a, H b) {
    auto m = (Bits)(0u - (unsigned)c);
    return {(Bits)((a.bits & m) | (b.bits & (Bits)~m))};
  }
  [[gnu::always_inline]] static H max(H a, H b) {
    return saturated(pickBits(isNan(a) | (!isNan(b) & (order(a) > order(b))), a, b));
  }
  [[gnu::always_inline]] static H min(H a, H b) {
    return saturated(pickBits(isNan(a) | (!isNan(b) & (order(a) < order(b))), a, b));
  }
  // E5M2's infinities (0x7c, 0xfc) one step down, to +-57344 (E4M3FN has none).
  [[gnu::always_inline]] static H saturated(H x) {
    if constexpr (std::is_same_v<H, fp8e5m2_t>) return {(Bits)(x.bits - ((x.bits & 0x7f) == 0x7c))};
    else return x;
  }
#endif
};
template <>
struct Arith<half_t> : ArithNarrow<half_t> {};
template <>
struct Arith<bfloat16_t> : ArithNarrow<bfloat16_t> {};
template <>
struct Arith<fp8e4m3_t> : ArithNarrow<fp8e4m3_t> {};
template <>
struct Arith<fp8e5m2_t> : ArithNarrow<fp8e5m2_t> {};

// Each functor: operator() combines two values; post() finishes a fully reduced value
// (kHasPost: post() is not the identity, so a finished value needs the extra pass); pre()
// turns this rank's input into what it contributes (kHasPre: pre() is not the identity).
template <typename T>
struct FuncSum {
  static constexpr bool kHasPre = false;
  static constexpr bool kHasPost = false;
  MNCL_HOSTDEV T operator()(T a, T b) const { return Arith<T>::add(a, b); }
  MNCL_HOSTDEV T post(T x) const { return x; }
};
template <typename T>
struct FuncProd {
  static constexpr bool kHasPre = false;
  static constexpr bool kHasPost = false;
  MNCL_HOSTDEV T operator()(T a, T b) const { return Arith<T>::mul(a, b); }
  MNCL_HOSTDEV T post(T x) const { return x; }
};
template <typename T>
struct FuncMax {
  static constexpr bool kHasPre = false;
  static constexpr bool kHasPost = false;
  MNCL_HOSTDEV T operator()(T a, T b) const { return Arith<T>::max(a, b); }
  MNCL_HOSTDEV T post(T x) const { return x; }
};
template <typename T>
struct FuncMin {
  static constexpr bool kHasPre = false;
  static constexpr bool kHasPost = false;
  MNCL_HOSTDEV T operator()(T a, T b) const { return Arith<T>::min(a, b); }
  MNCL_HOSTDEV T post(T x) const { return x; }
};
// avg on integers (NCCL's SumPostDiv). A float avg runs as a premulsum instead (see
// mncl::asRun), so that its sum cannot overflow where the average does not.
template <typename T>
struct FuncAvg {
  static_assert(std::is_integral_v<T>, "a float avg runs as a premulsum by 1/nranks");
  static constexpr bool kHasPre = false;
  static constexpr bool kHasPost = true;
  uint32_t nranks = 1;
  MNCL_HOSTDEV T operator()(T a, T b) const { return Arith<T>::add(a, b); }
  MNCL_HOSTDEV T post(T x) const { return Arith<T>::div(x, nranks); }
};
template <typename T>
struct FuncPreMulSum {
  static constexpr bool kHasPre = true;
  static constexpr bool kHasPost = false;
  T scalar{};  // this rank's (set per work item: see runTyped)
  MNCL_HOSTDEV T pre(T x) const { return Arith<T>::mul(x, scalar); }
  MNCL_HOSTDEV T preWith(T x, T rankScalar) const { return Arith<T>::mul(x, rankScalar); }  // (a peer's input)
  MNCL_HOSTDEV T operator()(T a, T b) const { return Arith<T>::add(a, b); }
  MNCL_HOSTDEV T post(T x) const { return x; }
};
// Bitwise ops: the host runs them on bytes (see asBytes), whatever the integer type, since
// each byte of the result depends only on that byte of the inputs.
template <typename T>
struct FuncBitAnd {
  static constexpr bool kHasPre = false;
  static constexpr bool kHasPost = false;
  MNCL_HOSTDEV T operator()(T a, T b) const { return (T)(a & b); }
  MNCL_HOSTDEV T post(T x) const { return x; }
};
template <typename T>
struct FuncBitOr {
  static constexpr bool kHasPre = false;
  static constexpr bool kHasPost = false;
  MNCL_HOSTDEV T operator()(T a, T b) const { return (T)(a | b); }
  MNCL_HOSTDEV T post(T x) const { return x; }
};
template <typename T>
struct FuncBitXor {
  static constexpr bool kHasPre = false;
  static constexpr bool kHasPost = false;
  MNCL_HOSTDEV T operator()(T a, T b) const { return (T)(a ^ b); }
  MNCL_HOSTDEV T post(T x) const { return x; }
};
// Copy-only collectives move bytes; they never combine two values.
template <typename T>
struct FuncCopy {
  static constexpr bool kHasPre = false;
  static constexpr bool kHasPost = false;
  MNCL_HOSTDEV T operator()(T a, T) const { return a; }
  MNCL_HOSTDEV T post(T x) const { return x; }
};

}  // namespace mncl::dev
