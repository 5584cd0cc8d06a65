// Chooses the kernel instance for a work item: copy-only collectives use the byte kernel,
// reductions the (op, type) one.
#include "../dispatch.h"
#include "kernels.h"

namespace mncl::dev {

cudaError_t launchSum(const GpuLaunch& l, DataType t);
cudaError_t launchProd(const GpuLaunch& l, DataType t);
cudaError_t launchMax(const GpuLaunch& l, DataType t);
cudaError_t launchMin(const GpuLaunch& l, DataType t);
cudaError_t launchAvg(const GpuLaunch& l, DataType t);
cudaError_t launchCopy(const GpuLaunch& l);

cudaError_t launchCollective(const GpuLaunch& l, Coll coll, DataType dtype, RedOp op) {
  if (isCopyOnly(coll)) {
    GpuLaunch bytes = l;
    for (int c = 0; c < l.nChannels; ++c) bytes.works.w[c] = asBytes(l.works.w[c]);
    return launchCopy(bytes);
  }
  switch (op) {
    case RedOp::sum: return launchSum(l, dtype);
    case RedOp::prod: return launchProd(l, dtype);
    case RedOp::max: return launchMax(l, dtype);
    case RedOp::min: return launchMin(l, dtype);
    case RedOp::avg: return launchAvg(l, dtype);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace mncl::dev
