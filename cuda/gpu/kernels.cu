// CUDA entry point of the device code: one kernel launch per operation, one block per
// channel, each block running its channel's share with the same algorithms and protocols as
// the CPU build. Templated on (element type, reduction) and on the protocol: a kernel per
// protocol, its algorithm chosen at run time inside, and copy-only collectives use a single
// byte instance. Each instance also has a kernel for direct LL alone, the small operations'
// path: a launch whose every block runs it takes that one, everything else its protocol's.
//
// The build compiles this file once per (reduction, type) — the defines below come from
// CMakeLists.txt — so the instances spread over parallel compiler jobs; launch.cu picks
// among them.
#include <cuda_runtime.h>

#include "../channel_cache.h"
#include "../dispatch.h"
#include "kernels.h"

namespace mncl::dev {
namespace {

template <typename T, typename Fn, typename Paths>
__global__ void __launch_bounds__(kGpuThreads) collectiveKernel(const __grid_constant__ GpuBlocks blocks, Fn fn) {
  __shared__ alignas(DevChannel) unsigned char storage[sizeof(DevChannel)];
  extern __shared__ uint64_t arrays[];
  int rank = blocks.rank[blockIdx.x], channel = blocks.channel[blockIdx.x];
#if defined(MNCL_GPU_TRACE)
  long long start = clock64();
#endif
  CachedChannel cache(blocks.channels[rank] + channel, reinterpret_cast<DevChannel*>(storage),
                      blocks.arrays[rank] + (size_t)channel * blocks.arraysStride, arrays, blocks.cachedArraysBytes);
#if defined(MNCL_GPU_TRACE)
  if (tid() == 0) cache.shared->traceStart = start;  // (traced with the channel cache only)
  MNCL_TRACE(*cache.shared, kTraceLoaded);
#endif
  runTyped<T, Fn, Paths>(*cache.shared, blocks.work[blockIdx.x], fn, blocks.errors[rank] + channel);
  cache.writeBack();
}

// An (integer) avg divides by the rank count; the other reductions carry no state.
template <typename Fn>
void setRanks(Fn& fn, int nranks) {
  if constexpr (requires { fn.nranks; }) fn.nranks = (uint32_t)nranks;
}

// Every block's work runs direct LL: the launch may use that path's own kernel.
bool allDirectLL(const GpuLaunch& l) {
  for (int b = 0; b < l.nBlocks; ++b) {
    if (!DirectLLOnly::runs(l.blocks.work[b])) return false;
  }
  return true;
}

// The protocol every block of the launch runs (the ranks of one collective agree on it);
// Proto::count where they differ, which no kernel runs.
Proto launchProtocol(const GpuLaunch& l) {
  for (int b = 1; b < l.nBlocks; ++b) {
    if (l.blocks.work[b].proto != l.blocks.work[0].proto) return Proto::count;
  }
  return l.blocks.work[0].proto;
}

template <typename T, typename Fn, typename Paths>
cudaError_t launchKernel(const GpuLaunch& l, Fn fn) {
  cudaGetLastError();  // an earlier call's unread error must not pass for this launch's
  collectiveKernel<T, Fn, Paths><<<l.nBlocks, l.nThreads, l.blocks.cachedArraysBytes, l.stream>>>(l.blocks, fn);
  return cudaGetLastError();
}

template <typename T, typename Fn>
cudaError_t launch(const GpuLaunch& l, Fn fn) {
  if (l.pathKernels && allDirectLL(l)) return launchKernel<T, Fn, DirectLLOnly>(l, fn);
  switch (launchProtocol(l)) {
    case Proto::simple: return launchKernel<T, Fn, OneProtocol<Proto::simple>>(l, fn);
    case Proto::ll: return launchKernel<T, Fn, OneProtocol<Proto::ll>>(l, fn);
    case Proto::ll128: return launchKernel<T, Fn, OneProtocol<Proto::ll128>>(l, fn);
    default: return cudaErrorInvalidValue;
  }
}

// A premulsum on a single rank: each element of the input times the scalar.
template <typename T>
__global__ void __launch_bounds__(kGpuThreads) preMulSumAloneKernel(const __grid_constant__ DevWork w) {
  FuncPreMulSum<T> fn;
  fn.scalar = workScalar<T>(w);
  const T* src = static_cast<const T*>(w.send);
  T* dst = static_cast<T*>(w.recv);
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < w.count; i += (size_t)gridDim.x * blockDim.x) {
    dst[i] = fn.pre(src[i]);
  }
}

// Loads a kernel and raises *mostLocal to its per-thread local memory (stack) if larger.
template <typename Kernel>
cudaError_t load(Kernel kernel, size_t* mostLocal) {
  cudaFuncAttributes a;
  cudaError_t e = cudaFuncGetAttributes(&a, kernel);
  if (e == cudaSuccess && a.localSizeBytes > *mostLocal) *mostLocal = a.localSizeBytes;
  return e;
}

template <typename T, typename Fn>
cudaError_t preload(size_t* mostLocal) {
  cudaError_t e = load(collectiveKernel<T, Fn, OneProtocol<Proto::simple>>, mostLocal);
  if (e == cudaSuccess) e = load(collectiveKernel<T, Fn, OneProtocol<Proto::ll>>, mostLocal);
  if (e == cudaSuccess) e = load(collectiveKernel<T, Fn, OneProtocol<Proto::ll128>>, mostLocal);
  if (e == cudaSuccess) e = load(collectiveKernel<T, Fn, DirectLLOnly>, mostLocal);
  if constexpr (Fn::kHasPre) {
    if (e == cudaSuccess) e = load(preMulSumAloneKernel<T>, mostLocal);
  }
  return e;
}

template <typename T, typename Fn>
cudaError_t launchAlone(const DevWork& w, cudaStream_t stream) {
  if constexpr (!Fn::kHasPre) {
    return cudaErrorNotSupported;  // (a single rank's other reductions are copies)
  } else {
    size_t blocks = (w.count + kGpuThreads - 1) / kGpuThreads;
    cudaGetLastError();  // (as in launchKernel)
    preMulSumAloneKernel<T><<<(unsigned)(blocks < 1024 ? blocks : 1024), kGpuThreads, 0, stream>>>(w);
    return cudaGetLastError();
  }
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
  cudaGetLastError();  // (as in launchKernel)
  p2pKernel<<<l.nChannels, l.nThreads, 0, l.stream>>>(l.channels, l.works, l.errors);
  return cudaGetLastError();
}

cudaError_t preloadCopy(size_t* mostLocal) {
  cudaError_t e = preload<uint8_t, FuncCopy<uint8_t>>(mostLocal);
  return e != cudaSuccess ? e : load(p2pKernel, mostLocal);
}
#elif defined(MININCL_KERNEL_OP)
cudaError_t MNCL_KERNEL_NAME(MININCL_KERNEL_OP, MININCL_KERNEL_TYPE)(const GpuLaunch& l) {
  using T = MNCL_KERNEL_CTYPE(MININCL_KERNEL_TYPE);
  MNCL_KERNEL_FUNC(MININCL_KERNEL_OP)<T> fn{};
  setRanks(fn, l.nranks);
  return launch<T>(l, fn);
}

cudaError_t MNCL_KERNEL_PRELOAD(MININCL_KERNEL_OP, MININCL_KERNEL_TYPE)(size_t* mostLocal) {
  using T = MNCL_KERNEL_CTYPE(MININCL_KERNEL_TYPE);
  return preload<T, MNCL_KERNEL_FUNC(MININCL_KERNEL_OP)<T>>(mostLocal);
}

cudaError_t MNCL_KERNEL_ALONE(MININCL_KERNEL_OP, MININCL_KERNEL_TYPE)(const DevWork& w, cudaStream_t stream) {
  using T = MNCL_KERNEL_CTYPE(MININCL_KERNEL_TYPE);
  return launchAlone<T, MNCL_KERNEL_FUNC(MININCL_KERNEL_OP)<T>>(w, stream);
}
#endif

}  // namespace mncl::dev
