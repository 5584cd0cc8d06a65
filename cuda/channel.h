// What the device code sees of a channel: its connections to every peer (conn.h), its ring
// (tree.h computes trees from rank numbers), its counters and where its arrays lie. Plain structs, shared by host
// and device. Includes the work item (work.h) and the error record (dev_error.h), which
// every user of a channel needs too.
#pragma once

#include "conn.h"
#include "dev_error.h"
#include "work.h"

namespace mncl::dev {

// The most peers one primitive talks to at once: tree children, or every peer of a direct
// algorithm (which therefore needs nranks <= kMaxPeers + 1).
constexpr int kMaxPeers = 8;

// Development builds with MININCL_GPU_TRACE: where a collective kernel's time goes. Thread 0
// of each block adds the clock cycles from the kernel's start to each point it passes (a
// point passed several times in one launch adds each time); GpuComm prints the means when
// it is destroyed. Without it, MNCL_TRACE compiles to nothing.
enum TracePoint {
  kTraceLoaded,        // the channel is in shared memory
  kTraceDispatch,      // the operation's first steps recorded, protocol dispatch
  kTraceAnnounced,     // a send: slots free, StepInfo published (LL128: and fenced)
  kTraceLinesWritten,  // a send: this thread's lines (or data) written
  kTraceLinesSeen,     // a receive: the first lines of a step arrived
  kTraceInfoChecked,   // a receive: the peer's StepInfo matched
  kTraceStepDone,      // a primitive's step finished (after its closing barrier)
  kTraceRunDone,       // the operation finished on this channel
  kTraceWrittenBack,   // the counters are back in device memory
  kTracePoints
};

struct DevChannel {
  // Who the channel is, its connections and step counts, its ring: what every schedule uses.
  int rank = 0, nranks = 1;
  ConnFifo* sendTo = nullptr;       // [nranks], indexed by peer rank
  ConnFifo* recvFrom = nullptr;     // [nranks]
  uint64_t* sendStep = nullptr;     // [nranks]: steps this side has sent to each peer
  uint64_t* recvStep = nullptr;     // [nranks]: steps this side has received from each peer
  // [nranks]: sendStep and recvStep when the current operation started (direct writes).
  uint64_t* opFirstSendStep = nullptr;
  uint64_t* opFirstRecvStep = nullptr;
  // [nranks]: each receiver's head as this side last read it. Heads only grow, so a slot it
  // shows free is free without reading the receiver's word again (see sendSlotFree).
  uint64_t* peerHeads = nullptr;
  const int* ring = nullptr;        // [nranks]: ring order; ring[ringPos] == rank
  int ringPos = 0;
  // CPU ranks on several hosts of this many ranks each, which the ring visits host after host
  // (src/topo/comm_plan.h): trees then follow the hosts (see hostTreeNode). 0: one host, or
  // hosts of unequal sizes.
  int ranksPerHost = 0;
  ProtoSizes sizes{};
  const uint32_t* abortFlag = nullptr;

  // How its waits behave on this machine.
  // GPU: some connection's memory (or peer) is outside this GPU (pinned host memory, another
  // GPU, another process), so flags need system-wide fences; false when every peer is a rank
  // of this process on this GPU.
  bool systemScope = true;
  // CPU: spins before a wait starts yielding. Long when every channel thread has a core of
  // its own (a yield only adds latency), short when threads outnumber cores (the peer we
  // wait for may need our core to run at all). GPU: hot spins before a wait starts sleeping.
  uint32_t spinBudget = 200;

  // The shortcuts around the FIFO's copies (see ConnCtrl), and their counters.
  // Pointer steps posted during the current operation: before it returns, the channel waits
  // until its receivers have consumed them (the user may reuse the buffers right after).
  bool pointerStepsPosted = false;
  // Smaller steps are copied: not worth a handshake. Per receiver: one that reads the step as
  // its own memory (in this process, or our window that its process maps) from the second;
  // one that reads it through the kernel, or a network proxy that sends it, from the first.
  uint32_t pointerStepMinBytes = 32 << 10;
  uint32_t mappedPointerStepMinBytes = 1 << 10;
  MNCL_HOSTDEV uint32_t smallestPointerStep() const {
    return mappedPointerStepMinBytes < pointerStepMinBytes ? mappedPointerStepMinBytes : pointerStepMinBytes;
  }
  // CPU, between processes: the most a receiver reads through the kernel at once where it
  // chooses (a send/recv pointer step while its group has sends to post; an allgather or
  // broadcast read ahead).
  uint32_t pointerReadBytes = 1 << 20;
  // Counters, for tests and tuning (Comm::stats; changed through countUp):
  uint64_t pointerStepsSent = 0;
  uint64_t directWritesSent = 0;
  uint64_t stepsReadAhead = 0;              // steps whose data a kernel read brought early
  // CPU: this rank's window, shared memory every peer process maps (user buffers allocated
  // with comm.empty live there): data in it can go as pointer steps to other processes.
  const char* window = nullptr;
  uint64_t windowBytes = 0;
  MNCL_HOSTDEV bool inWindow(uintptr_t at, uint64_t bytes) const {
    auto base = (uintptr_t)window;
    return windowBytes && at >= base && at + bytes <= base + windowBytes;
  }
  // CPU: the smallest operation (bytes a rank sends or contributes) whose steps to a network
  // proxy go as pointer steps. Below it a copy into the slot lets the call return before the
  // proxy has sent the data, which back-to-back calls measured faster (2 ranks over loopback:
  // a 64 KiB broadcast took 1.11-1.27x the time with pointer steps; from 128 KiB they win,
  // 0.71-0.89x at 128-256 KiB; bench/RESULTS.md, seventeenth session).
  uint64_t proxiedPointerMinBytes = 128 << 10;
  // CPU: with network peers, what a waiting thread calls to move their steps (Waiter::progress).
  void (*netProgress)(void*) = nullptr;
  void* netProgressArg = nullptr;
  // CPU, with network peers: returns once the proxy is not reading into an output we took
  // back (it checks the publication before every read; see NetProxy::landing).
  void (*netSettle)(void*) = nullptr;
#if defined(MNCL_GPU_TRACE)
  long long traceStart = 0;  // clock64 at this launch's start (thread 0)
  uint64_t traceCycles[kTracePoints] = {};
  uint64_t traceLaunches = 0;
#endif
};

// Adds to one of a channel's counters: its thread alone writes it, while a CPU host may read
// it (Comm::stats, during an async call), so there the store is atomic, if relaxed. (A GPU
// channel's lie in shared memory during a kernel; the host reads the device copy after it.)
MNCL_DEV void countUp(uint64_t& counter, int64_t by = 1) {
#if defined(__CUDACC__)
  counter += (uint64_t)by;
#else
  storeRelaxed(&counter, counter + (uint64_t)by);
#endif
}

#if defined(__CUDACC__) && defined(MNCL_GPU_TRACE)
#define MNCL_TRACE(ch, point)                                                        \
  do {                                                                               \
    if (threadIdx.x == 0) (ch).traceCycles[point] += (uint64_t)(clock64() - (ch).traceStart); \
  } while (0)
#else
#define MNCL_TRACE(ch, point) \
  do {                        \
  } while (0)
#endif

// On a GPU a channel's arrays lie in one block of device memory (GpuComm::upload lays it out,
// a kernel copies it whole into shared memory); the counters a kernel changes come first.
struct ChannelArrays {
  size_t sendStep, recvStep, peerHeads, opFirstSendStep, opFirstRecvStep, sendTo, recvFrom, ring;
  size_t changedBytes;  // sendStep, recvStep, peerHeads: what a launch writes back
  size_t bytes;         // whole words: the copies move 8 bytes at a time

  MNCL_HOSTDEV explicit ChannelArrays(int nranks) {
    size_t steps = sizeof(uint64_t) * (size_t)nranks, fifos = sizeof(ConnFifo) * (size_t)nranks;
    sendStep = 0;
    recvStep = steps;
    peerHeads = 2 * steps;
    changedBytes = 3 * steps;
    opFirstSendStep = 3 * steps;
    opFirstRecvStep = 4 * steps;
    sendTo = 5 * steps;
    recvFrom = sendTo + fifos;
    ring = recvFrom + fifos;
    bytes = (ring + sizeof(int) * (size_t)nranks + 7) / 8 * 8;
  }

  // Points the channel's arrays into the block at `base`.
  MNCL_HOSTDEV void point(DevChannel& d, char* base) const {
    d.sendStep = reinterpret_cast<uint64_t*>(base + sendStep);
    d.recvStep = reinterpret_cast<uint64_t*>(base + recvStep);
    d.peerHeads = reinterpret_cast<uint64_t*>(base + peerHeads);
    d.opFirstSendStep = reinterpret_cast<uint64_t*>(base + opFirstSendStep);
    d.opFirstRecvStep = reinterpret_cast<uint64_t*>(base + opFirstRecvStep);
    d.sendTo = reinterpret_cast<ConnFifo*>(base + sendTo);
    d.recvFrom = reinterpret_cast<ConnFifo*>(base + recvFrom);
    d.ring = reinterpret_cast<const int*>(base + ring);
  }
};

// Whether this channel may fill its next step's slot to `peer`: the receiver's head is within
// kSteps of it. Loads the receiver's word only when the head last seen does not already
// show room (once in kSteps steps, while the receiver keeps up). Thread 0 only.
MNCL_DEV bool sendSlotFree(DevChannel& ch, int peer) {
  uint64_t step = ch.sendStep[peer];
  if (ch.peerHeads[peer] + kSteps > step) return true;
  uint64_t head = loadAcquire(&ch.sendTo[peer].ctrl->head);
  ch.peerHeads[peer] = head;
  return head + kSteps > step;
}

// Whether the receiver at the end of send connection `f` reads `bytes` of ours at `at` as its
// own memory, with no kernel copy: a thread of this process (not a network proxy), or a
// process that maps our window, where they lie. Such a pointer step pays from
// DevChannel::mappedPointerStepMinBytes; any other from pointerStepMinBytes.
MNCL_DEV bool receiverMaps(const DevChannel& ch, const ConnFifo& f, uintptr_t at, uint64_t bytes) {
  bool inProcess = f.peerPid == 0 && !f.proxied && loadRelaxed(&f.ctrl->readsSenderMemory);
  return inProcess || (ch.inWindow(at, bytes) && loadRelaxed(&f.ctrl->mapsSenderWindow));
}

// Thread 0 of a channel that stopped early: takes back the output it published to peer p,
// so that senders still running stop writing into a buffer the caller gets back with the
// error. (A sender on this host already past its check may still land a step; a network
// proxy never does, see netSettle.)
MNCL_DEV void retractOutput(DevChannel& ch, int p) {
  ch.recvFrom[p].ctrl->retractOutput();
#if !defined(__CUDACC__)
  if (ch.netSettle) ch.netSettle(ch.netProgressArg);
#endif
}

}  // namespace mncl::dev
