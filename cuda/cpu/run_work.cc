// CPU entry point of the device code: one call runs one channel's share of one operation on
// the calling thread (a channel thread, or the caller itself for channel 0). Copies and
// bitwise ops run here; the other reductions in a unit each (run_reductions.h).
#include "run_work.h"

#include "../dispatch.h"
#include "run_reductions.h"

namespace mncl::dev {
namespace {

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
    case RedOp::sum: return runReduction<RedOp::sum>(ch, w, err);
    case RedOp::prod: return runReduction<RedOp::prod>(ch, w, err);
    case RedOp::max: return runReduction<RedOp::max>(ch, w, err);
    case RedOp::min: return runReduction<RedOp::min>(ch, w, err);
    case RedOp::avg: return runReduction<RedOp::avg>(ch, w, err);
    case RedOp::premulsum: return runReduction<RedOp::premulsum>(ch, w, err);
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
