// The CUDA build of the device code, as the host runtime calls it.
#pragma once

#include <cuda_runtime.h>

#include "../channel.h"

namespace mncl::dev {

struct GpuLaunch {
  DevChannel* channels;  // device-visible, one per block
  const DevWork* works;  // device-visible, one per block (byte counts for copy-only colls)
  DevError* error;       // host-mapped
  int nChannels, nThreads, nranks;
  void* stream;
};

cudaError_t launchCollective(const GpuLaunch& l, Coll coll, DataType dtype, RedOp op);

}  // namespace mncl::dev
