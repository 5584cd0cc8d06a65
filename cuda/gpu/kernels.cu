// CUDA entry point of the device code: one kernel launch per operation, one block per
// channel, each block running its channel's share with the same algorithms and protocols as
// the CPU build. Templated only on (element type, reduction); algorithm and protocol are
// chosen at run time inside, and copy-only collectives use a single byte instance.
//
// The build compiles this file once per reduction (MININCL_KERNEL_OP_<op>), so the
// instantiations spread over parallel compiler jobs; launch.cu picks among them.
#include <cuda_runtime.h>

#include "../dispatch.h"
#include "kernels.h"

namespace mncl::dev {
namespace {

template <typename T, typename Fn>
__global__ void __launch_bounds__(kGpuThreads) collectiveKernel(DevChannel* channels, const __grid_constant__ GpuWorks works, DevError* errors, Fn fn) {
  DevChannel& ch = channels[blockIdx.x];
  runTyped<T>(ch, works.w[blockIdx.x], fn, errors + blockIdx.x);
}

template <typename T, typename Fn>
cudaError_t launch(const GpuLaunch& l, Fn fn) {
  collectiveKernel<T, Fn><<<l.nChannels, l.nThreads, 0, l.stream>>>(l.channels, l.works, l.errors, fn);
  return cudaGetLastError();
}

template <template <class> class F, typename T>
cudaError_t launchOp(const GpuLaunch& l) {
  if constexpr (std::is_same_v<F<T>, FuncAvg<T>>) {
    FuncAvg<T> fn;
    fn.nranks = (uint32_t)l.nranks;
    return launch<T>(l, fn);
  } else {
    return launch<T>(l, F<T>{});
  }
}

// Signed sums and products run as unsigned: same bits, one instantiation fewer.
template <template <class> class F, bool kUnsignedWrap>
cudaError_t launchForType(const GpuLaunch& l, DataType t) {
  switch (t) {
    case DataType::i8: if constexpr (kUnsignedWrap) return launchOp<F, uint8_t>(l); else return launchOp<F, int8_t>(l);
    case DataType::u8: return launchOp<F, uint8_t>(l);
    case DataType::i32: if constexpr (kUnsignedWrap) return launchOp<F, uint32_t>(l); else return launchOp<F, int32_t>(l);
    case DataType::u32: return launchOp<F, uint32_t>(l);
    case DataType::i64: if constexpr (kUnsignedWrap) return launchOp<F, uint64_t>(l); else return launchOp<F, int64_t>(l);
    case DataType::u64: return launchOp<F, uint64_t>(l);
    case DataType::f32: return launchOp<F, float>(l);
#if !defined(MININCL_CUDA_QUICK)
    case DataType::f16: return launchOp<F, half_t>(l);
    case DataType::bf16: return launchOp<F, bfloat16_t>(l);
    case DataType::f64: return launchOp<F, double>(l);
#endif
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

#if defined(MININCL_KERNEL_OP_sum)
cudaError_t launchSum(const GpuLaunch& l, DataType t) { return launchForType<FuncSum, true>(l, t); }
#elif defined(MININCL_KERNEL_OP_prod)
cudaError_t launchProd(const GpuLaunch& l, DataType t) { return launchForType<FuncProd, true>(l, t); }
#elif defined(MININCL_KERNEL_OP_max)
cudaError_t launchMax(const GpuLaunch& l, DataType t) { return launchForType<FuncMax, false>(l, t); }
#elif defined(MININCL_KERNEL_OP_min)
cudaError_t launchMin(const GpuLaunch& l, DataType t) { return launchForType<FuncMin, false>(l, t); }
#elif defined(MININCL_KERNEL_OP_avg)
cudaError_t launchAvg(const GpuLaunch& l, DataType t) { return launchForType<FuncAvg, false>(l, t); }
#elif defined(MININCL_KERNEL_OP_copy)
cudaError_t launchCopy(const GpuLaunch& l) { return launch<uint8_t>(l, FuncCopy<uint8_t>{}); }
#endif

}  // namespace mncl::dev
