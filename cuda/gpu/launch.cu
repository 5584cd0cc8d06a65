// Chooses the kernel instance for a work item: copy-only collectives use the byte kernel,
// reductions the (op, type) one.
#include "../dispatch.h"
#include "kernels.h"

namespace mncl::dev {

cudaError_t launchCopy(const GpuLaunch& l);
cudaError_t preloadCopy(size_t* mostLocal);
#define MNCL_DECLARE(op, type)                                                        \
  cudaError_t MNCL_KERNEL_NAME(op, type)(const GpuLaunch& l);                        \
  cudaError_t MNCL_KERNEL_PRELOAD(op, type)(size_t* mostLocal);                      \
  cudaError_t MNCL_KERNEL_ALONE(op, type)(const DevWork& w, cudaStream_t stream);
MNCL_KERNEL_INSTANCES(MNCL_DECLARE)
#undef MNCL_DECLARE

namespace {

using Launcher = cudaError_t (*)(const GpuLaunch&);

// [op][type]; null where no instance exists (signed sums, products and premulsums run as
// unsigned: same bits, one instance fewer; bitwise ops as bytes; a float avg comes as a
// premulsum, see mncl::asRun; a quick build has float32 alone of the floats).
struct LauncherTable {
  Launcher at[(int)RedOp::count][(int)DataType::count] = {};
  cudaError_t (*preload[(int)RedOp::count][(int)DataType::count])(size_t*) = {};
  cudaError_t (*alone[(int)RedOp::count][(int)DataType::count])(const DevWork&, cudaStream_t) = {};
  LauncherTable() {
#define MNCL_REGISTER(op, type)                                                    \
  at[(int)RedOp::op][(int)DataType::type] = &MNCL_KERNEL_NAME(op, type);          \
  preload[(int)RedOp::op][(int)DataType::type] = &MNCL_KERNEL_PRELOAD(op, type);  \
  alone[(int)RedOp::op][(int)DataType::type] = &MNCL_KERNEL_ALONE(op, type);
    MNCL_KERNEL_INSTANCES(MNCL_REGISTER)
#undef MNCL_REGISTER
  }
};

const LauncherTable& table() {
  static const LauncherTable t;
  return t;
}

DataType asInstantiated(RedOp op, DataType t) {
  if (op != RedOp::sum && op != RedOp::prod && op != RedOp::premulsum) return t;
  switch (t) {
    case DataType::i8: return DataType::u8;
    case DataType::i32: return DataType::u32;
    case DataType::i64: return DataType::u64;
    default: return t;
  }
}

}  // namespace

cudaError_t launchCollective(const GpuLaunch& l, Coll coll, DataType dtype, RedOp op) {
  if (isCopyOnly(coll) || isBitwise(op)) {
    GpuLaunch bytes = l;
    for (int b = 0; b < l.nBlocks; ++b) bytes.blocks.work[b] = asBytes(l.blocks.work[b]);
    if (isCopyOnly(coll)) return launchCopy(bytes);
    return table().at[(int)op][(int)DataType::u8](bytes);
  }
  if ((unsigned)op >= (unsigned)RedOp::count || (unsigned)dtype >= (unsigned)DataType::count) return cudaErrorInvalidValue;
  Launcher f = table().at[(int)op][(int)asInstantiated(op, dtype)];
  return f ? f(l) : cudaErrorNotSupported;
}

cudaError_t launchPreMulSumAlone(const DevWork& w, cudaStream_t stream) {
  if (w.count == 0) return cudaSuccess;
  if ((unsigned)w.dtype >= (unsigned)DataType::count) return cudaErrorInvalidValue;
  auto f = table().alone[(int)RedOp::premulsum][(int)asInstantiated(RedOp::premulsum, w.dtype)];
  return f ? f(w, stream) : cudaErrorNotSupported;
}

cudaError_t preloadKernels() {
  size_t mostLocal = 0;
  cudaError_t e = preloadCopy(&mostLocal);
  for (int op = 0; op < (int)RedOp::count && e == cudaSuccess; ++op) {
    for (int t = 0; t < (int)DataType::count && e == cudaSuccess; ++t) {
      if (table().preload[op][t]) e = table().preload[op][t](&mostLocal);
    }
  }
  // A kernel needing more stack than the device's limit makes its launch grow the limit,
  // which waits for the device to go idle: never, while ranks' kernels spin on each other.
  // So the first communicator on a device grows it, before any of our kernels runs there
  // (they take just under 1 KiB, CUDA's default).
  size_t limit = 0;
  if (e == cudaSuccess) e = cudaDeviceGetLimit(&limit, cudaLimitStackSize);
  if (e == cudaSuccess && mostLocal > limit) e = cudaDeviceSetLimit(cudaLimitStackSize, mostLocal);
  return e;
}

}  // namespace mncl::dev
