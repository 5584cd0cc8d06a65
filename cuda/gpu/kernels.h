// The CUDA build of the device code, as the host runtime calls it.
#pragma once

#include <cuda_runtime.h>

#include "../channel.h"

namespace mncl::dev {

// The most channels (blocks) one GPU operation runs on. The work items travel as a kernel
// argument (no copy to the device before each launch, and a CUDA graph captures them).
constexpr int kMaxGpuChannels = 32;
// Threads per block. The kernels are compiled for it (__launch_bounds__), which caps their
// registers so that a block of this size always fits on an SM.
constexpr int kGpuThreads = 512;
struct GpuWorks {
  DevWork w[kMaxGpuChannels];
};
static_assert(sizeof(GpuWorks) + 64 <= 4096, "kernel arguments are limited to 4 KiB");

struct GpuLaunch {
  DevChannel* channels;  // device memory, one per block, persistent across launches
  GpuWorks works;        // one per block (byte counts for copy-only collectives)
  DevError* errors;      // host-mapped, one per block
  int nChannels, nThreads, nranks;
  cudaStream_t stream;
};

cudaError_t launchCollective(const GpuLaunch& l, Coll coll, DataType dtype, RedOp op);

}  // namespace mncl::dev
