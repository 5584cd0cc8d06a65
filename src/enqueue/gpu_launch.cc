#include "gpu_launch.h"

#include <algorithm>

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

[[noreturn]] void failLaunch(Comm& comm, const char* what, cudaError_t e) {
  // The peers already launched would wait for this rank forever: fail it, so they stop too.
  std::string msg = std::string("rank ") + std::to_string(comm.rank()) + ": launching the " + what +
                    " kernel failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  cudaGetLastError();
  comm.fail(mnclUnhandledCudaError, msg);
  throwError(mnclUnhandledCudaError, msg);
}

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
  if (e != cudaSuccess) failLaunch(comm, collName(c.coll), e);
}

// One communicator's sends and receives of a group: one kernel, each channel progressing its
// ops together (so no order of calls across ranks deadlocks); sends to self are copies.
void launchP2p(Comm& comm, const std::vector<const P2pCall*>& calls, cudaStream_t stream) {
  DeviceScope scope(comm.device());
  std::vector<const P2pCall*> selfSends, selfRecvs;
  std::vector<std::vector<dev::P2pOp>> perChannel(comm.nChannels());
  for (const P2pCall* c : calls) {
    if (c->peer == comm.rank()) (c->isSend ? selfSends : selfRecvs).push_back(c);
    else planP2pOps(comm, *c, perChannel);
  }
  checkSelfPairs(comm.rank(), selfSends, selfRecvs);
  for (size_t i = 0; i < selfSends.size(); ++i) {
    size_t bytes = selfSends[i]->count * dataTypeSize(selfSends[i]->dtype);
    if (bytes && selfRecvs[i]->buf != selfSends[i]->buf) {
      MNCL_CUDA_CHECK(cudaMemcpyAsync(selfRecvs[i]->buf, selfSends[i]->buf, bytes, cudaMemcpyDeviceToDevice, stream));
    }
  }
  int nch = 0, total = 0;
  for (int c = 0; c < comm.nChannels(); ++c) {
    if (!perChannel[c].empty()) nch = c + 1;
    total += (int)perChannel[c].size();
  }
  if (nch == 0) return;
  MNCL_CHECK(total <= dev::kMaxGpuP2pOps, mnclInvalidUsage,
        "a group of " + std::to_string(calls.size()) + " sends/recvs on a CUDA communicator needs " + std::to_string(total) +
            " channel ops, more than one launch holds (" + std::to_string(dev::kMaxGpuP2pOps) +
            "): split it into smaller groups, or lower MININCL_NCHANNELS");
  gpu::GpuComm& g = *comm.gpu();
  dev::GpuP2pLaunch l{};
  l.channels = g.channels();
  int at = 0;
  for (int c = 0; c < nch; ++c) {
    l.works.first[c] = (int16_t)at;
    for (const dev::P2pOp& op : perChannel[c]) l.works.ops[at++] = op;
  }
  l.works.first[nch] = (int16_t)at;
  l.errors = g.errorsOnDevice();
  l.nChannels = nch;
  l.nThreads = dev::kGpuThreads;
  l.stream = stream;
  cudaError_t e = dev::launchP2p(l);
  if (e != cudaSuccess) failLaunch(comm, "send/recv", e);
}

}  // namespace

void launchGpuCalls(const std::vector<GpuCall>& calls) {
  Lanes lanes;
  try {
    std::vector<std::pair<Comm*, std::vector<const P2pCall*>>> p2p;  // by communicator, in order
    for (const GpuCall& gc : calls) {
      if (gc.isP2p) {
        auto it = std::find_if(p2p.begin(), p2p.end(), [&](const auto& e) { return e.first == gc.comm; });
        if (it == p2p.end()) it = p2p.insert(p2p.end(), {gc.comm, {}});
        it->second.push_back(&gc.p2p);
        continue;
      }
      auto caller = static_cast<cudaStream_t>(gc.coll.stream);
      launchOne(*gc.comm, gc.coll, lanes.runStreamFor(*gc.comm, caller));
    }
    for (auto& [comm, ops] : p2p) {
      auto caller = static_cast<cudaStream_t>(ops.front()->stream);
      launchP2p(*comm, ops, lanes.runStreamFor(*comm, caller));
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
