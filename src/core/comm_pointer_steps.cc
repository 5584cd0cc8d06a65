// Pointer steps from each peer whose memory this rank reads directly: in this process; in
// another one where cross-memory attach works (checked by reading a known word of the
// peer's), unless MININCL_POINTER_STEPS=1 keeps them in the process, or cores are
// oversubscribed and the variable is unset (see below; work_plan.cc says which copies go
// through the kernel). Also from any peer process whose window this rank maps, for data in
// that window (no kernel involved: a plain read of shared memory). The receiving end says
// so in its control words; the sender reads them before each step.
// Direct writes (MININCL_DIRECT_WRITES, default 1) go the other way: into the output of a
// receiver in this process, or into its window when the output lies there.
#include <unistd.h>

#include <cstdlib>
#include <memory>

#include "../gpu/cuda_api.h"
#include "../gpu/gpu_comm.h"
#include "../transport/peer_memory.h"
#include "comm.h"
#include "comm_settings.h"
#include "env.h"
#include "error.h"
#include "log.h"

namespace mncl {

// The default mode is 2 (the fastest where it works): it matters to CPU ranks in different
// processes only, and GPU communicators take every nonzero mode alike.
PointerStepSettings pointerStepSettings(int64_t defaultMinBytes, int64_t defaultMappedMinBytes) {
  bool minChosen = !env::str("MININCL_POINTER_STEP_BYTES").empty();  // (empty: unset, as env::bytes takes it)
  int64_t minBytes = env::bytes("MININCL_POINTER_STEP_BYTES", defaultMinBytes);
  PointerStepSettings s{env::integer("MININCL_POINTER_STEPS", 2), env::integer("MININCL_DIRECT_WRITES", 1), minBytes,
                        minChosen ? minBytes : defaultMappedMinBytes, std::getenv("MININCL_POINTER_STEPS") != nullptr};
  MNCL_CHECK(s.mode >= 0 && s.mode <= 2, mnclInvalidArgument, "MININCL_POINTER_STEPS must be 0, 1 or 2");
  MNCL_CHECK(s.directWrites == 0 || s.directWrites == 1, mnclInvalidArgument, "MININCL_DIRECT_WRITES must be 0 or 1");
  MNCL_CHECK(s.minBytes >= 0 && s.minBytes <= (1ll << 31), mnclInvalidArgument,
             "MININCL_POINTER_STEP_BYTES must be between 0 and 2^31");
  s.readBytes = env::bytes("MININCL_POINTER_READ_BYTES", 1 << 20);
  s.netPointerBytes = env::bytes("MININCL_NET_POINTER_BYTES", 128 << 10);
  MNCL_CHECK(s.readBytes >= 4096 && s.readBytes <= (1ll << 30), mnclInvalidArgument,
             "MININCL_POINTER_READ_BYTES must be between 4K and 1G");
  return s;
}

// Smallest pointer steps on CPUs by default. A receiver in another process reads a step
// through the kernel, a system call a step, worth it from 32 KiB (a network proxy, which
// sends what it reads, likewise). One that reads the step as its own memory (a thread of this
// process, or a process that maps our window) pays no call, and a FIFO step costs two copies
// through lines that move between cores: from 1 KiB. (2 thread-ranks' allreduce took
// 1.9-10x the time at 4-32 KiB with 32 KiB, forty-fifth session; 2 processes' windows
// 2.2-2.8x at 8-32 KiB, forty-sixth: bench/RESULTS.md.)
constexpr int64_t kCpuPointerStepMinBytes = 32 << 10;
constexpr int64_t kCpuMappedPointerStepMinBytes = 1 << 10;

void Comm::enablePointerSteps() {
  auto [mode, directWrites, minBytes, mappedMinBytes, modeChosen, readBytes, netPointerBytes] =
      pointerStepSettings(kCpuPointerStepMinBytes, kCpuMappedPointerStepMinBytes);
  for (auto& ch : channels_) {
    ch->dev.pointerStepMinBytes = (uint32_t)minBytes;
    ch->dev.mappedPointerStepMinBytes = (uint32_t)mappedMinBytes;
    ch->dev.pointerReadBytes = (uint32_t)readBytes;
    if (window_) {
      ch->dev.window = window_->base();
      ch->dev.windowBytes = window_->size();
    }
  }
  pid_t me = getpid();
  for (int p = 0; p < nranks_; ++p) {
    if (p == rank_) continue;
    if (netPeer_[p]) {  // our proxy reads pointer steps, and sends them from where they lie
      for (auto& ch : channels_) {
        dev::storeRelease(&ch->sendTo[p].ctrl->readsSenderMemory, (uint32_t)(mode >= 1));
        ch->dev.proxiedPointerMinBytes = (uint64_t)netPointerBytes;
      }
      continue;
    }
    bool local = peers_[p].pid == me;
    bool readable = mode >= 1 && local;
    // Kernel copies make senders wait for their receivers' reads, and cores shared by more
    // ranks than they hold spend that wait switching between them (4 ranks on 2 cores: ~1.3x
    // slower with them): by default only where every channel has a core.
    if (mode == 2 && !local && (modeChosen || !oversubscribed_)) {
      readable = canReadPeerMemory(peers_[p].pid, peers_[p].probeAddr);
      if (!readable && modeChosen) {
        MNCL_WARN(kInit, "rank %d: cannot read rank %d's memory (cross-memory attach); its steps go through the FIFO", rank_, p);
      } else if (!readable) {
        MNCL_INFO(kInit, "rank %d: cannot read rank %d's memory (cross-memory attach); its steps go through the FIFO", rank_, p);
      }
    }
    const std::shared_ptr<Mapping>& theirs = peerWindows_[p];
    for (auto& ch : channels_) {
      for (dev::ConnFifo* f : {&ch->recvFrom[p], &ch->sendTo[p]}) {
        f->peerPid = local ? 0 : peers_[p].pid;
        if (theirs && mode >= 1) {  // the peer's window, through our own mapping of it
          f->peerWindow = theirs->base();
          f->peerWindowAt = peers_[p].windowAt;
          f->peerWindowBytes = peers_[p].windowBytes;
        }
      }
      dev::storeRelease(&ch->recvFrom[p].ctrl->readsSenderMemory, (uint32_t)readable);
      if (theirs && mode >= 1) dev::storeRelease(&ch->recvFrom[p].ctrl->mapsSenderWindow, 1u);
      ch->sendTo[p].directWrites = directWrites == 1 && mode >= 1 && (local || theirs);
      // We can read p, so the kernel lets us write into it too (the same permission check).
      ch->sendTo[p].kernelWrites = directWrites == 1 && !local && readable;
    }
  }
}

// On a GPU, pointer steps and direct writes between ranks of this process on the same GPU:
// their buffers are device memory at addresses valid in every kernel of the process. (Not
// across processes: CUDA IPC maps the FIFOs, not the callers' buffers.) The receiving end's
// flag is in device memory, set with a copy.
void Comm::enableGpuPointerSteps() {
#if defined(MININCL_HAVE_CUDA)
  auto [mode, directWrites, minBytes, mappedMinBytes, modeChosen, readBytes, netPointerBytes] = pointerStepSettings(0, 0);
  for (auto& ch : channels_) {
    ch->dev.pointerStepMinBytes = (uint32_t)minBytes;
    ch->dev.mappedPointerStepMinBytes = (uint32_t)mappedMinBytes;
  }
  pid_t me = getpid();
  for (int p = 0; p < nranks_; ++p) {
    if (p == rank_) continue;
    bool local = peers_[p].pid == me && peers_[p].device == device_;
    bool readable = mode >= 1 && local;
    gpuReadablePeers_ += readable;
    for (auto& ch : channels_) {
      for (dev::ConnFifo* f : {&ch->recvFrom[p], &ch->sendTo[p]}) f->peerPid = peers_[p].pid == me ? 0 : peers_[p].pid;
      if (readable) {  // (the FIFO memory starts zeroed: nothing to write for 0)
        static const uint32_t one = 1;
        MNCL_CUDA_CHECK(cudaMemcpyAsync(&ch->recvFrom[p].ctrl->readsSenderMemory, &one, sizeof(one), cudaMemcpyDefault,
                                        gpu_->sideStream()));
      }
      ch->sendTo[p].directWrites = directWrites == 1 && readable;
    }
  }
  MNCL_CUDA_CHECK(cudaStreamSynchronize(gpu_->sideStream()));
#endif
}

}  // namespace mncl
