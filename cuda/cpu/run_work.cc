// CPU entry point of the device code: one call runs one channel's share of one operation on
// the calling thread (a channel thread, or the caller itself for channel 0).
#include "run_work.h"

#include "../dispatch.h"

namespace mncl::dev {
namespace {

template <template <class> class F, typename T>
bool runOp(DevChannel& ch, const DevWork& w, DevError* err, uint32_t nranks) {
  if constexpr (std::is_same_v<F<T>, FuncAvg<T>>) {
    FuncAvg<T> fn;
    fn.nranks = nranks;
    return runTyped<T>(ch, w, fn, err);
  } else {
    return runTyped<T>(ch, w, F<T>{}, err);
  }
}

template <template <class> class F, bool kUnsignedWrap>
bool runForType(DevChannel& ch, const DevWork& w, DevError* err) {
  uint32_t n = (uint32_t)ch.nranks;
  switch (w.dtype) {
    case DataType::i8: return kUnsignedWrap ? runOp<F, uint8_t>(ch, w, err, n) : runOp<F, int8_t>(ch, w, err, n);
    case DataType::u8: return runOp<F, uint8_t>(ch, w, err, n);
    case DataType::i32: return kUnsignedWrap ? runOp<F, uint32_t>(ch, w, err, n) : runOp<F, int32_t>(ch, w, err, n);
    case DataType::u32: return runOp<F, uint32_t>(ch, w, err, n);
    case DataType::i64: return kUnsignedWrap ? runOp<F, uint64_t>(ch, w, err, n) : runOp<F, int64_t>(ch, w, err, n);
    case DataType::u64: return runOp<F, uint64_t>(ch, w, err, n);
    case DataType::f16: return runOp<F, half_t>(ch, w, err, n);
    case DataType::bf16: return runOp<F, bfloat16_t>(ch, w, err, n);
    case DataType::f8e4m3: return runOp<F, fp8e4m3_t>(ch, w, err, n);
    case DataType::f8e5m2: return runOp<F, fp8e5m2_t>(ch, w, err, n);
    case DataType::f32: return runOp<F, float>(ch, w, err, n);
    case DataType::f64: return runOp<F, double>(ch, w, err, n);
    default: return false;
  }
}

// Bitwise ops combine bytes: one instance each, for every integer type.
bool runBitwise(DevChannel& ch, const DevWork& w, DevError* err) {
  switch (w.op) {
    case RedOp::band: return runTyped<uint8_t>(ch, asBytes(w), FuncBitAnd<uint8_t>{}, err);
    case RedOp::bor: return runTyped<uint8_t>(ch, asBytes(w), FuncBitOr<uint8_t>{}, err);
    case RedOp::bxor: return runTyped<uint8_t>(ch, asBytes(w), FuncBitXor<uint8_t>{}, err);
    default: return false;
  }
}

}  // namespace

bool runCollective(DevChannel& ch, const DevWork& w, DevError* err) {
  if (isCopyOnly(w.coll)) return runTyped<uint8_t>(ch, asBytes(w), FuncCopy<uint8_t>{}, err);
  if (isBitwise(w.op)) return runBitwise(ch, w, err);
  switch (w.op) {
    case RedOp::sum: return runForType<FuncSum, true>(ch, w, err);
    case RedOp::prod: return runForType<FuncProd, true>(ch, w, err);
    case RedOp::max: return runForType<FuncMax, false>(ch, w, err);
    case RedOp::min: return runForType<FuncMin, false>(ch, w, err);
    case RedOp::avg: return runForType<FuncAvg, false>(ch, w, err);
    case RedOp::premulsum: return runForType<FuncPreMulSum, true>(ch, w, err);
    default: return false;
  }
}

namespace {
template <typename T>
void scaleAlone(const DevWork& w) {
  FuncPreMulSum<T> fn;
  fn.scalar = workScalar<T>(w);
  const T* src = static_cast<const T*>(w.send);
  T* dst = static_cast<T*>(w.recv);
  for (size_t i = 0; i < w.count; ++i) dst[i] = fn.pre(src[i]);
}
}  // namespace

void preMulSumAlone(const DevWork& w) {
  switch (w.dtype) {  // (signed types as unsigned: the same bits, and no undefined overflow)
    case DataType::i8: case DataType::u8: return scaleAlone<uint8_t>(w);
    case DataType::i32: case DataType::u32: return scaleAlone<uint32_t>(w);
    case DataType::i64: case DataType::u64: return scaleAlone<uint64_t>(w);
    case DataType::f16: return scaleAlone<half_t>(w);
    case DataType::bf16: return scaleAlone<bfloat16_t>(w);
    case DataType::f8e4m3: return scaleAlone<fp8e4m3_t>(w);
    case DataType::f8e5m2: return scaleAlone<fp8e5m2_t>(w);
    case DataType::f32: return scaleAlone<float>(w);
    case DataType::f64: return scaleAlone<double>(w);
    default: return;
  }
}

bool runP2p(DevChannel& ch, P2pOp* ops, int nops, DevError* err) {
  Waiter waiter{ch.abortFlag, ch.spinBudget, false, ch.netProgress, ch.netProgressArg};
  P2pEngine engine{ch, waiter, err};
  return engine.run(ops, nops);
}

}  // namespace mncl::dev
