// CUDA entry point of the device code: one kernel launch per operation, one block per
// channel, each block running its channel's share with the same algorithms and protocols as
// the CPU build. Templated only on (element type, reduction); algorithm and protocol are
// chosen at run time inside, and copy-only collectives use a single byte instance.
//
// The build compiles this file once per (reduction, type) — the defines below come from
// CMakeLists.txt — so the instances spread over parallel compiler jobs; launch.cu picks
// among them.
#include <cuda_runtime.h>

#include "../dispatch.h"
#include "kernels.h"

namespace mncl::dev {
namespace {

template <typename T, typename Fn>
__global__ void __launch_bounds__(kGpuThreads)
    collectiveKernel(DevChannel* channels, const __grid_constant__ GpuWorks works, DevError* errors, Fn fn) {
  DevChannel& ch = channels[blockIdx.x];
  runTyped<T>(ch, works.w[blockIdx.x], fn, errors + blockIdx.x);
}

// avg divides by the rank count; the other reductions carry no state.
template <typename Fn>
void setRanks(Fn& fn, int nranks) {
  if constexpr (requires { fn.nranks; }) fn.nranks = (uint32_t)nranks;
}

template <typename T, typename Fn>
cudaError_t launch(const GpuLaunch& l, Fn fn) {
  collectiveKernel<T, Fn><<<l.nChannels, l.nThreads, 0, l.stream>>>(l.channels, l.works, l.errors, fn);
  return cudaGetLastError();
}

#if defined(MININCL_KERNEL_COPY)
// Sends and receives: the block's ops go to shared memory, where thread 0 advances them and
// every thread reads their progress (see P2pEngine::run).
__global__ void __launch_bounds__(kGpuThreads)
    p2pKernel(DevChannel* channels, const __grid_constant__ GpuP2pWorks works, DevError* errors) {
  __shared__ alignas(P2pOp) unsigned char storage[sizeof(P2pOp) * kMaxGpuP2pOps];
  P2pOp* ops = reinterpret_cast<P2pOp*>(storage);
  int first = works.first[blockIdx.x], n = works.first[blockIdx.x + 1] - first;
  if (tid() == 0) memcpy(ops, &works.ops[first], sizeof(P2pOp) * n);
  barrier();
  DevChannel& ch = channels[blockIdx.x];
  Waiter waiter{ch.abortFlag, ch.spinBudget};
  P2pEngine engine{ch, waiter, errors + blockIdx.x};
  engine.run(ops, n);
}
#endif

}  // namespace

#if defined(MININCL_KERNEL_COPY)
cudaError_t launchCopy(const GpuLaunch& l) { return launch<uint8_t>(l, FuncCopy<uint8_t>{}); }

cudaError_t launchP2p(const GpuP2pLaunch& l) {
  p2pKernel<<<l.nChannels, l.nThreads, 0, l.stream>>>(l.channels, l.works, l.errors);
  return cudaGetLastError();
}

cudaError_t preloadCopy() {
  cudaFuncAttributes a;
  cudaError_t e = cudaFuncGetAttributes(&a, collectiveKernel<uint8_t, FuncCopy<uint8_t>>);
  return e != cudaSuccess ? e : cudaFuncGetAttributes(&a, p2pKernel);
}
#elif defined(MININCL_KERNEL_OP)
cudaError_t MNCL_KERNEL_NAME(MININCL_KERNEL_OP, MININCL_KERNEL_TYPE)(const GpuLaunch& l) {
  using T = MNCL_KERNEL_CTYPE(MININCL_KERNEL_TYPE);
  MNCL_KERNEL_FUNC(MININCL_KERNEL_OP)<T> fn{};
  setRanks(fn, l.nranks);
  return launch<T>(l, fn);
}

cudaError_t MNCL_KERNEL_PRELOAD(MININCL_KERNEL_OP, MININCL_KERNEL_TYPE)() {
  using T = MNCL_KERNEL_CTYPE(MININCL_KERNEL_TYPE);
  cudaFuncAttributes a;
  return cudaFuncGetAttributes(&a, collectiveKernel<T, MNCL_KERNEL_FUNC(MININCL_KERNEL_OP)<T>>);
}
#endif

}  // namespace mncl::dev
