#include "gpu_launch.h"

#include "../core/comm.h"
#include "../core/error.h"
#include "work_plan.h"

#if defined(MININCL_HAVE_CUDA)

#include "../../cuda/gpu/kernels.h"
#include "../gpu/cuda_api.h"
#include "../gpu/gpu_comm.h"

namespace mncl {

namespace {

// Where one communicator's calls from one caller stream run.
struct Lane {
  Comm* comm;
  cudaStream_t caller, run;
};

class Lanes {
 public:
  cudaStream_t runStreamFor(Comm& comm, cudaStream_t caller) {
    for (const Lane& l : lanes_) {
      if (l.comm == &comm && l.caller == caller) return l.run;
    }
    bool taken = false;
    for (const Lane& l : lanes_) taken |= l.run == caller;
    Lane lane{&comm, caller, caller};
    if (taken) {
      gpu::GpuComm& g = *comm.gpu();
      lane.run = g.sideStream();
      MNCL_CUDA_CHECK(cudaEventRecord(g.forkEvent(), caller));
      MNCL_CUDA_CHECK(cudaStreamWaitEvent(lane.run, g.forkEvent(), 0));
    }
    lanes_.push_back(lane);
    return lane.run;
  }

  // The caller's stream continues after the work on every side stream.
  void join() {
    for (const Lane& l : lanes_) {
      if (l.run == l.caller) continue;
      gpu::GpuComm& g = *l.comm->gpu();
      MNCL_CUDA_CHECK(cudaEventRecord(g.joinEvent(), l.run));
      MNCL_CUDA_CHECK(cudaStreamWaitEvent(l.caller, g.joinEvent(), 0));
    }
    lanes_.clear();
  }

 private:
  std::vector<Lane> lanes_;
};

// Makes the communicator's GPU current for the launch, and the caller's one again after.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) MNCL_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

void launchOne(Comm& comm, const CollCall& c, cudaStream_t stream) {
  DeviceScope scope(comm.device());
  if (copyWithoutPeers(comm, c)) {
    if (c.send != c.recv) {
      MNCL_CUDA_CHECK(cudaMemcpyAsync(c.recv, c.send, c.count * dataTypeSize(c.dtype), cudaMemcpyDeviceToDevice, stream));
    }
    return;
  }
  thread_local std::vector<dev::DevWork> works;
  works.clear();
  int n = planCollWorks(comm, c, works);
  if (n == 0) return;
  gpu::GpuComm& g = *comm.gpu();
  dev::GpuLaunch l{};
  l.channels = g.channels();
  for (int ch = 0; ch < n; ++ch) l.works.w[ch] = works[ch];
  l.errors = g.errorsOnDevice();
  l.nChannels = n;
  l.nThreads = dev::kGpuThreads;
  l.nranks = comm.nranks();
  l.stream = stream;
  cudaError_t e = dev::launchCollective(l, c.coll, c.dtype, c.op);
  if (e != cudaSuccess) {
    // The peers already launched would wait for this rank forever: fail it, so they stop too.
    std::string msg = std::string("rank ") + std::to_string(comm.rank()) + ": launching the " + collName(c.coll) +
                      " kernel failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
    cudaGetLastError();
    comm.fail(mnclUnhandledCudaError, msg);
    throwError(mnclUnhandledCudaError, msg);
  }
}

}  // namespace

void launchGpuCalls(const std::vector<GpuCall>& calls) {
  Lanes lanes;
  try {
    for (const GpuCall& gc : calls) {
      auto caller = static_cast<cudaStream_t>(gc.call.stream);
      launchOne(*gc.comm, gc.call, lanes.runStreamFor(*gc.comm, caller));
    }
  } catch (...) {
    lanes.join();  // a capture must end joined, whatever happened
    throw;
  }
  lanes.join();
}

}  // namespace mncl

#else

namespace mncl {

void launchGpuCalls(const std::vector<GpuCall>&) {
  throwError(mnclInvalidUsage, "this build of minincl has no CUDA backend");
}

}  // namespace mncl

#endif
