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

}  // namespace

#if defined(MININCL_KERNEL_COPY)
cudaError_t launchCopy(const GpuLaunch& l) { return launch<uint8_t>(l, FuncCopy<uint8_t>{}); }
#elif defined(MININCL_KERNEL_OP)
cudaError_t MNCL_KERNEL_NAME(MININCL_KERNEL_OP, MININCL_KERNEL_TYPE)(const GpuLaunch& l) {
  using T = MNCL_KERNEL_CTYPE(MININCL_KERNEL_TYPE);
  MNCL_KERNEL_FUNC(MININCL_KERNEL_OP)<T> fn{};
  setRanks(fn, l.nranks);
  return launch<T>(l, fn);
}
#endif

}  // namespace mncl::dev
