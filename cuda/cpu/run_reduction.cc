// One reduction of the CPU build, for every type (see run_reductions.h): the unit CMake
// generates for it defines MININCL_CPU_REDUCTION (RedOp::sum, ...) and includes this file.
#include "run_reductions.h"

#include "../dispatch.h"

#if !defined(MININCL_CPU_REDUCTION)
#error "compiled through the units CMakeLists.txt generates, which define MININCL_CPU_REDUCTION"
#endif

namespace mncl::dev {
namespace {

// A reduction's function and whether signed integers run as unsigned (sums and products:
// the same bits, no undefined overflow, one instance fewer).
template <RedOp op> struct Reduction;
template <> struct Reduction<RedOp::sum> { template <class T> using F = FuncSum<T>; static constexpr bool kUnsignedWrap = true; };
template <> struct Reduction<RedOp::prod> { template <class T> using F = FuncProd<T>; static constexpr bool kUnsignedWrap = true; };
template <> struct Reduction<RedOp::max> { template <class T> using F = FuncMax<T>; static constexpr bool kUnsignedWrap = false; };
template <> struct Reduction<RedOp::min> { template <class T> using F = FuncMin<T>; static constexpr bool kUnsignedWrap = false; };
template <> struct Reduction<RedOp::avg> { template <class T> using F = FuncAvg<T>; static constexpr bool kUnsignedWrap = false; };
template <> struct Reduction<RedOp::premulsum> { template <class T> using F = FuncPreMulSum<T>; static constexpr bool kUnsignedWrap = true; };

template <RedOp op, typename T>
bool runOp(DevChannel& ch, const DevWork& w, DevError* err) {
  if constexpr (op == RedOp::avg && !std::is_integral_v<T>) {
    // (Not reached: the host runs a float avg as a premulsum, see mncl::asRun.)
    recordError(err, ch.rank, [](DevError& e) { e.undispatched = Undispatched::reducingCollective; });
    return false;
  } else {
    typename Reduction<op>::template F<T> fn{};
    if constexpr (op == RedOp::avg) fn.nranks = (uint32_t)ch.nranks;
    return runTyped<T>(ch, w, fn, err);
  }
}

template <RedOp op>
bool runForType(DevChannel& ch, const DevWork& w, DevError* err) {
  constexpr bool u = Reduction<op>::kUnsignedWrap;
  switch (w.dtype) {
    case DataType::i8: return u ? runOp<op, uint8_t>(ch, w, err) : runOp<op, int8_t>(ch, w, err);
    case DataType::u8: return runOp<op, uint8_t>(ch, w, err);
    case DataType::i32: return u ? runOp<op, uint32_t>(ch, w, err) : runOp<op, int32_t>(ch, w, err);
    case DataType::u32: return runOp<op, uint32_t>(ch, w, err);
    case DataType::i64: return u ? runOp<op, uint64_t>(ch, w, err) : runOp<op, int64_t>(ch, w, err);
    case DataType::u64: return runOp<op, uint64_t>(ch, w, err);
    case DataType::f16: return runOp<op, half_t>(ch, w, err);
    case DataType::bf16: return runOp<op, bfloat16_t>(ch, w, err);
    case DataType::f8e4m3: return runOp<op, fp8e4m3_t>(ch, w, err);
    case DataType::f8e5m2: return runOp<op, fp8e5m2_t>(ch, w, err);
    case DataType::f32: return runOp<op, float>(ch, w, err);
    case DataType::f64: return runOp<op, double>(ch, w, err);
    default: return false;
  }
}

}  // namespace

template <>
bool runReduction<MININCL_CPU_REDUCTION>(DevChannel& ch, const DevWork& w, DevError* err) {
  return runForType<MININCL_CPU_REDUCTION>(ch, w, err);
}

}  // namespace mncl::dev
