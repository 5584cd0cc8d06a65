#include "gpu_launch.h"

#include <algorithm>

#include "../core/comm.h"
#include "../core/env.h"
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
      // On the communicator's GPU, where its events live and where its kernel will run on
      // the caller's stream (a null stream is each device's own).
      gpu::DeviceScope scope(comm.device());
      gpu::GpuComm& g = *comm.gpu();
      lane.run = g.sideStream();
      MNCL_CUDA_CHECK(cudaEventRecord(g.forkEvent(), caller));
      MNCL_CUDA_CHECK(cudaStreamWaitEvent(lane.run, g.forkEvent(), 0));
    }
    lanes_.push_back(lane);
    return lane.run;
  }

  // A group's sends and receives on one communicator run as one kernel on `run`, the first
  // op's lane; ops that came on another stream: `run` starts after that stream's work so far,
  // and the stream continues after `run`'s (join), as NCCL orders every stream of a group.
  void alsoOrder(Comm& comm, cudaStream_t other, cudaStream_t run) {
    for (const Lane& l : lanes_) {
      if (l.comm == &comm && (l.caller == other || l.run == other)) return;
    }
    gpu::DeviceScope scope(comm.device());
    gpu::GpuComm& g = *comm.gpu();
    MNCL_CUDA_CHECK(cudaEventRecord(g.forkEvent(), other));
    MNCL_CUDA_CHECK(cudaStreamWaitEvent(run, g.forkEvent(), 0));
    lanes_.push_back({&comm, other, run});
  }

  // The caller's stream continues after the work on every side stream.
  void join() {
    for (const Lane& l : lanes_) {
      if (l.run == l.caller) continue;
      gpu::DeviceScope scope(l.comm->device());
      gpu::GpuComm& g = *l.comm->gpu();
      MNCL_CUDA_CHECK(cudaEventRecord(g.joinEvent(), l.run));
      MNCL_CUDA_CHECK(cudaStreamWaitEvent(l.caller, g.joinEvent(), 0));
    }
    lanes_.clear();
  }

 private:
  std::vector<Lane> lanes_;
};

[[noreturn]] void failLaunch(const std::vector<Comm*>& comms, const char* what, cudaError_t e) {
  std::string who = comms.size() > 1 ? "ranks " : "rank ";
  for (size_t i = 0; i < comms.size(); ++i) who += (i ? ", " : "") + std::to_string(comms[i]->rank());
  std::string msg = who + ": launching the " + what + " kernel failed: " + cudaGetErrorName(e) + " (" +
                    cudaGetErrorString(e) + ")";
  cudaGetLastError();
  // The peers already launched would wait for these ranks forever: fail them, so they stop too.
  for (Comm* comm : comms) comm->fail(mnclUnhandledCudaError, msg);
  throwError(mnclUnhandledCudaError, msg);
}

// Fails every communicator of a group whose launching stopped part-way, with the exception in
// flight: kernels of the group already queued (here, and peers') wait for kernels that will
// never come, and a failed communicator's kernels stop (its abort word), its peers' too (they
// see it failed). Call it from a catch block.
void failPartlyLaunched(const std::vector<Comm*>& comms) {
  mnclResult_t code = mnclInternalError;
  std::string what = "unknown error";
  try {
    throw;
  } catch (const Error& e) {
    code = e.code();
    what = e.what();
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  for (Comm* comm : comms) {
    if (!comm->failed()) comm->fail(code, "rank " + std::to_string(comm->rank()) + ": launching a group stopped part-way: " + what);
  }
}

// Records a launch of `comm` just queued on `stream` as its last one; with a call timeout set,
// also where the monitor watches it until it ends (see gpu::LaunchWatch). `callNumber`: the
// collective's (for sends and receives, the collective calls made before them).
void recordLaunch(Comm& comm, cudaStream_t stream, bool p2p, uint64_t callNumber) {
  bool outsideCapture = comm.gpu()->recordLaunch(stream);
  if (outsideCapture && comm.callTimeout() > 0) comm.gpu()->launchWatch().record(stream, callNumber, p2p);
}

// One launch of a communicator, planned in full before anything of the group is launched.
struct Launch {
  Comm* comm;
  cudaStream_t stream;
  const char* what;
  uint64_t callNumber = 0;  // see recordLaunch
  std::vector<std::pair<const P2pCall*, const P2pCall*>> selfCopies;  // (send, recv) to self
  bool kernel = false, isP2p = false;
  CollCall coll{};
  dev::GpuLaunch collLaunch{};
  dev::GpuP2pLaunch p2pLaunch{};
};

// Threads per block, for collectives and groups of sends and receives alike: a whole block
// where there is data to move, fewer for small operations, where each barrier of the block's
// 16 warps costs more than the copy (a thread moves 16 bytes per pass). MININCL_GPU_THREADS
// fixes it (GpuComm::threadsPerBlock).
int threadsForBytes(const Comm& comm, size_t perChannel) {
  if (int fixed = comm.gpu()->threadsPerBlock()) return fixed;
  size_t warps = (perChannel / 16 + 31) / 32;
  return (int)std::clamp<size_t>(warps, 1, dev::kGpuThreads / 32) * 32;
}

int threadsFor(const Comm& comm, const CollCall& c, int nChannels) {
  size_t bytes = c.count * dataTypeSize(c.dtype) * opBlocks(c.coll, comm.nranks());
  return threadsForBytes(comm, bytes / (size_t)std::max(nChannels, 1));
}

Launch planColl(Comm& comm, const CollCall& c, cudaStream_t stream) {
  Launch L{&comm, stream, collName(c.coll)};
  L.coll = c;
  if (copyWithoutPeers(comm, c)) return L;  // launch() copies send to recv
  thread_local std::vector<dev::DevWork> works;
  works.clear();
  int n = planCollWorks(comm, c, works);
  if (n == 0) return L;
  gpu::GpuComm& g = *comm.gpu();
  dev::GpuLaunch& l = L.collLaunch;
  l.blocks.channels[0] = g.channels();
  l.blocks.errors[0] = g.errorsOnDevice();
  l.blocks.arrays[0] = g.channelArrays();
  l.blocks.arraysStride = g.channelArraysStride();
  for (int ch = 0; ch < n; ++ch) {
    l.blocks.rank[ch] = 0;
    l.blocks.channel[ch] = (uint8_t)ch;
    l.blocks.work[ch] = works[ch];
  }
  l.blocks.cachedArraysBytes = g.cachedArraysBytes();
  l.pathKernels = g.pathKernels();
  l.nBlocks = n;
  l.nThreads = threadsFor(comm, c, n);
  l.nranks = comm.nranks();
  l.stream = stream;
  L.kernel = true;
  return L;
}

// One communicator's sends and receives of a group: one kernel, each channel progressing its
// ops together (so no order of calls across ranks deadlocks); sends to self are copies.
Launch planP2p(Comm& comm, const std::vector<const P2pCall*>& calls, cudaStream_t stream) {
  Launch L{&comm, stream, "send/recv"};
  L.isP2p = true;
  std::vector<const P2pCall*> selfSends, selfRecvs;
  std::vector<std::vector<dev::P2pOp>> perChannel(comm.nChannels());
  for (const P2pCall* c : calls) {
    if (c->peer == comm.rank()) (c->isSend ? selfSends : selfRecvs).push_back(c);
    else planP2pOps(comm, *c, perChannel);
  }
  // (They pair up: checked before the group was counted, checkGroupSelfPairs in enqueue.cc.)
  for (size_t i = 0; i < selfSends.size(); ++i) L.selfCopies.push_back({selfSends[i], selfRecvs[i]});
  int nch = 0, total = 0;
  size_t mostBytes = 0;  // the busiest channel's, which sizes every block
  for (int c = 0; c < comm.nChannels(); ++c) {
    if (!perChannel[c].empty()) nch = c + 1;
    total += (int)perChannel[c].size();
    size_t bytes = 0;
    for (const dev::P2pOp& op : perChannel[c]) bytes += op.bytes;
    mostBytes = std::max(mostBytes, bytes);
  }
  if (nch == 0) return L;
  MNCL_CHECK(total <= dev::kMaxGpuP2pOps, mnclInvalidUsage,
        "a group of " + std::to_string(calls.size()) + " sends/recvs on a CUDA communicator needs " + std::to_string(total) +
            " channel ops, more than one launch holds (" + std::to_string(dev::kMaxGpuP2pOps) +
            "; a send and a receive with each of up to " + std::to_string(dev::kMaxGpuP2pOps / 2) +
            " peers fit): split it into smaller groups");
  gpu::GpuComm& g = *comm.gpu();
  dev::GpuP2pLaunch& l = L.p2pLaunch;
  l.channels = g.channels();
  int at = 0;
  for (int c = 0; c < nch; ++c) {
    l.works.first[c] = (int16_t)at;
    for (const dev::P2pOp& op : perChannel[c]) l.works.ops[at++] = op;
  }
  l.works.first[nch] = (int16_t)at;
  l.errors = g.errorsOnDevice();
  l.nChannels = nch;
  l.nThreads = threadsForBytes(comm, mostBytes);
  l.stream = stream;
  L.kernel = true;
  return L;
}

void launch(const Launch& L) {
  Comm& comm = *L.comm;
  gpu::DeviceScope scope(comm.device());
  gpu::GpuComm& g = *comm.gpu();
  g.orderAfterPrevious(L.stream);
  if (!L.isP2p && scalesWithoutPeers(comm, L.coll)) {
    cudaError_t e = dev::launchPreMulSumAlone(workWithoutPeers(L.coll), L.stream);
    if (e != cudaSuccess) failLaunch({&comm}, L.what, e);
  } else if (!L.isP2p && copyWithoutPeers(comm, L.coll) && L.coll.send != L.coll.recv) {
    size_t bytes = L.coll.count * dataTypeSize(L.coll.dtype);
    MNCL_CUDA_CHECK(cudaMemcpyAsync(L.coll.recv, L.coll.send, bytes, cudaMemcpyDeviceToDevice, L.stream));
  }
  for (auto [send, recv] : L.selfCopies) {
    size_t bytes = send->count * dataTypeSize(send->dtype);
    if (bytes && recv->buf != send->buf) {
      MNCL_CUDA_CHECK(cudaMemcpyAsync(recv->buf, send->buf, bytes, cudaMemcpyDeviceToDevice, L.stream));
    }
  }
  if (L.kernel) {
    cudaError_t e = L.isP2p ? dev::launchP2p(L.p2pLaunch)
                            : dev::launchCollective(L.collLaunch, L.coll.coll, L.coll.dtype, L.coll.op);
    if (e != cudaSuccess) failLaunch({&comm}, L.what, e);
  }
  recordLaunch(comm, L.stream, L.isP2p, L.callNumber);
}

// Whether a group may run its ranks of one GPU in one kernel (MININCL_GPU_FUSE=0: never).
// Read at every group, so that a program (or a test) can switch it between calls.
bool fusionEnabled() { return env::integer("MININCL_GPU_FUSE", 1) != 0; }

// A group whose every call is one collective of a different rank, all on one GPU and one
// caller stream, with the same kernel (collective, type, op, rank count, protocol): one launch
// runs every rank's channels (see dev::GpuBlocks). Instead of a kernel per rank on side
// streams forked from the caller's and joined back, which costs a launch and two stream
// dependencies per rank, in a graph as well. Returns false, launching nothing, where the
// group is not of that shape or its blocks do not fit one launch.
bool launchFused(const std::vector<GpuCall>& calls) {
  if (!fusionEnabled() || calls.size() < 2 || calls.size() > (size_t)dev::kMaxFusedRanks) return false;
  const GpuCall& first = calls.front();
  for (size_t i = 0; i < calls.size(); ++i) {
    const GpuCall& gc = calls[i];
    if (gc.isP2p || gc.comm->device() != first.comm->device() || gc.coll.stream != first.coll.stream ||
        gc.coll.coll != first.coll.coll || gc.coll.dtype != first.coll.dtype || gc.coll.op != first.coll.op ||
        gc.comm->nranks() != first.comm->nranks()) {
      return false;
    }
    for (size_t j = 0; j < i; ++j) {
      if (calls[j].comm == gc.comm) return false;
    }
  }
  auto stream = static_cast<cudaStream_t>(first.coll.stream);
  std::vector<Launch> plans;
  plans.reserve(calls.size());
  int nBlocks = 0;
  for (const GpuCall& gc : calls) {
    plans.push_back(planColl(*gc.comm, gc.coll, stream));
    if (!plans.back().kernel) return false;  // a copy, or nothing to do
    // (one kernel per protocol: ranks whose tuners chose differently launch apart)
    if (plans.back().collLaunch.blocks.work[0].proto != plans.front().collLaunch.blocks.work[0].proto) return false;
    nBlocks += plans.back().collLaunch.nBlocks;
  }
  if (nBlocks > dev::kMaxGpuChannels) return false;
  Launch& fused = plans.front();  // the others' blocks join its launch
  dev::GpuLaunch& l = fused.collLaunch;
  for (size_t r = 1; r < plans.size(); ++r) {
    const dev::GpuLaunch& p = plans[r].collLaunch;
    l.blocks.channels[r] = p.blocks.channels[0];
    l.blocks.errors[r] = p.blocks.errors[0];
    l.blocks.arrays[r] = p.blocks.arrays[0];  // (the same stride: the same rank count)
    for (int b = 0; b < p.nBlocks; ++b, ++l.nBlocks) {
      l.blocks.rank[l.nBlocks] = (uint8_t)r;
      l.blocks.channel[l.nBlocks] = p.blocks.channel[b];
      l.blocks.work[l.nBlocks] = p.blocks.work[b];
    }
    l.nThreads = std::max(l.nThreads, p.nThreads);
  }
  std::vector<Comm*> comms;
  for (const GpuCall& gc : calls) comms.push_back(gc.comm);
  gpu::DeviceScope scope(first.comm->device());
  for (const GpuCall& gc : calls) gc.comm->gpu()->orderAfterPrevious(stream);
  cudaError_t e = dev::launchCollective(l, first.coll.coll, first.coll.dtype, first.coll.op);
  if (e != cudaSuccess) failLaunch(comms, fused.what, e);
  try {
    for (const GpuCall& gc : calls) recordLaunch(*gc.comm, stream, false, gc.callNumber);
  } catch (...) {
    failPartlyLaunched(comms);
    throw;
  }
  return true;
}

}  // namespace

// Two passes. First every stream is forked and every launch planned, so that nothing is
// launched before a fork (a side stream forked after a peer's kernel would wait for that
// kernel, which waits for this one) and nothing throws once kernels wait for each other.
// Then the launches, breadth-first: every communicator's first kernel before any second one,
// so that no kernel queued behind a waiting one (in a stream, or in a hardware queue that
// streams share) holds up a kernel it waits for.
void launchGpuCalls(const std::vector<GpuCall>& calls) {
  if (launchFused(calls)) return;
  Lanes lanes;
  std::vector<std::pair<Comm*, std::vector<Launch>>> byComm;  // in order of first appearance
  auto queueOf = [&](Comm* c) -> std::vector<Launch>& {
    for (auto& [comm, q] : byComm) {
      if (comm == c) return q;
    }
    return byComm.emplace_back(c, std::vector<Launch>{}).second;
  };
  try {
    std::vector<std::pair<Comm*, std::vector<const P2pCall*>>> p2p;
    for (const GpuCall& gc : calls) {
      if (gc.isP2p) {
        auto it = std::find_if(p2p.begin(), p2p.end(), [&](const auto& e) { return e.first == gc.comm; });
        if (it == p2p.end()) it = p2p.insert(p2p.end(), {gc.comm, {}});
        it->second.push_back(&gc.p2p);
        continue;
      }
      cudaStream_t run = lanes.runStreamFor(*gc.comm, static_cast<cudaStream_t>(gc.coll.stream));
      queueOf(gc.comm).push_back(planColl(*gc.comm, gc.coll, run));
      queueOf(gc.comm).back().callNumber = gc.callNumber;
    }
    for (auto& [comm, ops] : p2p) {
      cudaStream_t run = lanes.runStreamFor(*comm, static_cast<cudaStream_t>(ops.front()->stream));
      for (const P2pCall* op : ops) lanes.alsoOrder(*comm, static_cast<cudaStream_t>(op->stream), run);
      queueOf(comm).push_back(planP2p(*comm, ops, run));
      queueOf(comm).back().callNumber = comm->collectiveCallsMade();
    }
  } catch (...) {
    // Nothing of this group launched here, but peer processes may have launched their side
    // (a root of many ranks can fail alone): failing the communicators ends their wait.
    std::vector<Comm*> comms;
    for (const GpuCall& gc : calls) {
      if (std::find(comms.begin(), comms.end(), gc.comm) == comms.end()) comms.push_back(gc.comm);
    }
    failPartlyLaunched(comms);
    lanes.join();  // a capture must end joined, whatever happened
    throw;
  }
  try {
    for (size_t k = 0;; ++k) {
      bool any = false;
      for (auto& [comm, queue] : byComm) {
        if (k < queue.size()) {
          launch(queue[k]);
          any = true;
        }
      }
      if (!any) break;
    }
  } catch (...) {
    std::vector<Comm*> comms;
    for (auto& entry : byComm) comms.push_back(entry.first);
    failPartlyLaunched(comms);
    lanes.join();
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
