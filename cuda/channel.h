// What the device code sees of a channel: its connections to every peer, its ring and tree
// positions, and the work item it is running. Plain structs, shared by host and device.
#pragma once

#include "dtypes.h"

namespace mncl::dev {

// A FIFO has kSteps slots; the sender may run at most kSteps steps ahead of the receiver.
constexpr int kSteps = 8;

// LL: 8 payload bytes per 16-byte line: data(4) flag(4) data(4) flag(4). Each 8-byte word
// holds 4 data bytes in its low half and the flag in its high half, so one store publishes
// data and flag together and the reader needs no fence.
struct alignas(16) LLLine {
  uint64_t w[2];
};
// Its StepInfo goes in the slot's first lines, flagged like data.
constexpr int kLLHeaderLines = 2;
// LL128: 120 payload bytes, then the flag word, written last.
constexpr int kLL128Words = 16;             // 8-byte words per line
constexpr int kLL128DataWords = kLL128Words - 1;
struct alignas(128) LL128Line {
  uint64_t w[kLL128Words];
};

// Describes the operation a step belongs to, so that a receiver can tell that its peer is
// running a different call (other collective, count, type, op or root) before it writes
// anything, instead of silently mixing data or hanging.
struct StepInfo {
  uint64_t count;     // elements (collectives) or bytes (send/recv) of the whole operation
  uint8_t coll, dtype, op, algo;
  int32_t root;
};
static_assert(sizeof(StepInfo) == 8 * kLLHeaderLines, "an LL header line carries 8 bytes of it");

// Control words of one connection, each on its own cache line (they are written by different
// sides). Lives, with the FIFOs, in the receiver's memory.
struct ConnCtrl {
  // The FIFO protocol: a connection needs only these three.
  alignas(128) uint64_t tail;  // steps the sender has filled (release): Simple, and LL/LL128 at a proxied end
  alignas(128) uint64_t head;  // all protocols: steps the receiver has consumed (only frees slots)
  alignas(128) StepInfo info[kSteps];

  // Shortcuts around the FIFO's copies, each where the two ends can take it (prims_simple.h
  // shows the FIFO first, then each of them).
  // Simple, pointer steps: where a step's data is. 0: in the FIFO slot, as usual.
  // Otherwise its address in the sender's memory, which the sender keeps unchanged until the
  // receiver has consumed the step, so the receiver reads it there: one copy instead of two.
  alignas(128) uint64_t dataAt[kSteps];
  // Simple, direct writes: the sender already wrote the step's data into the receiver's
  // own memory, at dataAt as the receiver addresses it (see outputAt below).
  uint32_t wroteToReceiver[kSteps];
  // Send/recv: each step's bytes, which the sender chooses (see P2pEngine). Over the
  // network (ConnFifo::proxied), every step's length: Simple bytes, LL / LL128 data lines.
  uint32_t stepLength[kSteps];
  // Over the network: each step's protocol (a Proto), which says where its data lies.
  uint32_t stepProto[kSteps];
  // Simple, premulsum: a pointer step to the sender's own input (not yet scaled), and the
  // sender's scalar (the bits of one element), which the receiver applies as it reads it.
  uint32_t dataIsInput[kSteps];
  uint64_t inputScalar[kSteps];
  // CPU, a pointer step to the sender's input of an allgather or broadcast (0 otherwise):
  // where the channel's share of that input ends. It all stays as it is until the operation
  // ends, and lands in the receiver's output right after the step's data, so a receiver
  // that copies through the kernel may read it all at once (see PrimsSimple::received).
  uint64_t inputEnd[kSteps];
  // Over the network, Simple: where a step's data belongs in the receiver's published output
  // (a byte offset from outputAt; kNotOutput: nowhere, it is not final output), and the
  // first step of the operation it belongs to. The receiving proxy then reads it from the
  // socket straight into that output, as a direct write (see NetProxy::landing).
  uint64_t outputOffset[kSteps];
  uint64_t opFirstStep[kSteps];
  // Set once by the receiver at init: it can read the sender's memory (same process, or
  // cross-memory attach to the sender's process), so the sender may post pointer steps.
  uint32_t readsSenderMemory;
  // Set once by the receiver at init: it maps the sender's window (see DevChannel::window),
  // so the sender may post pointer steps for data that lies there.
  uint32_t mapsSenderWindow;
  // Direct writes, for operations whose output is the same on every rank (allreduce,
  // allgather, broadcast): the receiver publishes its output buffer (its own address and size)
  // when an operation starts, and a sender that can write there puts the final values of a
  // step straight into it at the step's offset, instead of into the FIFO (NCCL's direct
  // write). Valid for the operation whose first step from this sender is outputFromStep - 1,
  // which only that operation has (0: nothing published); outputInfo is checked as well.
  alignas(128) uint64_t outputFromStep;
  uint64_t outputAt, outputBytes;
  StepInfo outputInfo;
};

// What a receiver leaves in ConnCtrl::dataAt once it has taken a pointer step (send/recv;
// a network proxy takes every pointer step it sends).
constexpr uint64_t kPointerTaken = ~uint64_t{0};
// ConnCtrl::outputOffset of a step that is not final output.
constexpr uint64_t kNotOutput = ~uint64_t{0};

// One direction of a (peer, channel) connection, as the device addresses it.
struct ProtoSizes {
  uint32_t simpleSlotBytes;
  uint32_t llSlotLines;
  uint32_t ll128SlotLines;
  // The smallest piece a pipeline (a tree, a ring broadcast or reduce) cuts a message
  // into: a step's handshake must stay cheap next to the bytes it moves.
  uint32_t pipelineChunkBytes;
};

struct ConnFifo {
  // The FIFO: its control words and its slots, one array per protocol.
  ConnCtrl* ctrl = nullptr;
  char* simple = nullptr;          // kSteps * simpleSlotBytes
  LLLine* ll = nullptr;            // kSteps * llSlotLines
  LL128Line* ll128 = nullptr;      // kSteps * ll128SlotLines

  // What the shortcuts around it need.
  int32_t peerPid = 0;             // the process of the peer at the other end, 0 if it is this one
  // The peer's window as mapped in this process, and where it lies in the peer's: a receiving
  // end reads pointer steps into it here, a sending end makes direct writes into it here.
  char* peerWindow = nullptr;
  uint64_t peerWindowAt = 0, peerWindowBytes = 0;
  // Sending end: we may make direct writes into the receiver's published output (it is
  // in this process, or we map its window; see ConnCtrl::outputAt).
  bool directWrites = false;
  // Sending end, CPU: we may also make them through the kernel (cross-memory attach into the
  // receiver's process), wherever its output is.
  bool kernelWrites = false;
  // Sending end, CPU: the peer is reached over the network. This end is a copy of the
  // receiver's in our own memory, which the proxy thread sends on (src/transport/net.h): every
  // protocol publishes each step's length and protocol (Simple: its outputOffset and
  // opFirstStep too), and bumps tail, for the proxy to see. The proxy, in this process, reads
  // pointer steps where they lie (peerPid 0).
  bool proxied = false;
  // Receiving end, CPU: the sender's input [readAheadFrom, readAheadTo) (as the sender
  // addresses it) this end read ahead through the kernel into readAheadInto, during the
  // operation whose first step from the sender is readAheadOp - 1 (0: none).
  uint64_t readAheadOp = 0, readAheadFrom = 0, readAheadTo = 0, readAheadInto = 0;

  // The peer's `bytes` at `at` (as the peer addresses them) as this process addresses them:
  // the same address (the peer is this process), or through our mapping of its window;
  // null if neither (a kernel copy may still reach them).
  // Step `step`'s Simple slot.
  MNCL_HOSTDEV char* simpleSlot(uint64_t step, const ProtoSizes& sizes) const {
    return simple + (step % kSteps) * (size_t)sizes.simpleSlotBytes;
  }

  MNCL_HOSTDEV char* mappedHere(uint64_t at, uint64_t bytes) const {
    if (peerPid == 0) return reinterpret_cast<char*>(at);
    uint64_t rel = at - peerWindowAt;
    return rel < peerWindowBytes && bytes <= peerWindowBytes - rel ? peerWindow + rel : nullptr;
  }
};

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
  // GPU), so flags need system-wide fences; false when every peer shares this GPU's memory.
  bool systemScope = true;
  // CPU: spins before a wait starts yielding. Long when every channel thread has a core of
  // its own (a yield only adds latency), short when threads outnumber cores (the peer we
  // wait for may need our core to run at all). GPU: hot spins before a wait starts sleeping.
  uint32_t spinBudget = 200;

  // The shortcuts around the FIFO's copies (see ConnCtrl), and their counters.
  // Pointer steps posted during the current operation: before it returns, the channel waits
  // until its receivers have consumed them (the user may reuse the buffers right after).
  bool pointerStepsPosted = false;
  uint32_t pointerStepMinBytes = 32 << 10;  // smaller steps are copied: not worth a handshake
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

// Adds to one of a channel's counters: its thread alone writes it, while the host may read
// it (Comm::stats, during an async call), so the store is atomic, if relaxed.
MNCL_DEV void countUp(uint64_t& counter, int64_t by = 1) { storeRelaxed(&counter, counter + (uint64_t)by); }

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

// Why a channel stopped early, for the host to turn into a message.
struct DevError {
  int peer = -1;
  StepInfo expected{}, got{};
  int copyErrno = 0;  // nonzero: a kernel copy from or to `peer`'s memory failed (CPU)
  bool wrote = false;  // with copyErrno: the copy wrote `peer`'s memory (a direct write), else read it
  const char* undispatched = nullptr;  // CPU: the work had no case in the device code (dispatch.h)
};

// Fills an empty error record: `fill` writes the details, then `peer` is stored with release,
// since a GPU host (GpuComm::firstError) may read the record while the kernel still runs:
// once it sees `peer` (acquire), the details are there. Each channel has a record of its own
// and one thread that writes it (thread 0; LL: the thread with a step's first line, which is
// thread 0's too), so the check for an empty record needs no atomic claim.
template <typename Fill>
MNCL_DEV void recordError(DevError* error, int peer, Fill fill) {
  if (!error || loadRelaxed(&error->peer) >= 0) return;
  fill(*error);
  storeRelease(&error->peer, peer);
}

// One collective (or a channel's share of it).
struct DevWork {
  Coll coll;
  Algo algo;
  Proto proto;
  DataType dtype;
  RedOp op;
  int root;
  const void* send;
  void* recv;
  uint64_t count;       // elements per rank block (allgather: send count; reduce_scatter: recv count)
  uint64_t chanOffset;  // this channel's slice of the block, in elements
  uint64_t chanCount;
  int treeIndex;        // tree: which of the two trees this channel uses
  int algoVariant;      // direct allreduce: 0 one-shot, 1 two-shot
  bool sendApartFromRecv;  // the send buffer overlaps no part of the receive buffer
  bool streamOutput;    // CPU: large output, write it with non-temporal stores
  bool readInputThemselves;  // CPU: allgather receivers read our input, not take direct writes
  // CPU, between processes (cross-memory attach; where each wins, see work_plan.cc):
  bool readByKernel;    // receivers may read a sender's untouched input by a kernel copy
  bool writeByKernel;   // senders may write final values into a receiver's output by one
  // premulsum: this rank's scalar, the bits of one element (in the low bytes); or, where
  // scalarAt is set, the element there, read when the operation runs (NCCL's ncclScalarDevice).
  uint64_t scalarBits;
  const void* scalarAt;

  MNCL_HOSTDEV StepInfo info() const {
    StepInfo s{};
    s.count = count;
    s.coll = (uint8_t)coll;
    s.dtype = (uint8_t)dtype;
    s.op = (uint8_t)op;
    s.algo = (uint8_t)algo;
    s.root = root;
    return s;
  }
};

MNCL_HOSTDEV bool sameInfo(const StepInfo& a, const StepInfo& b) {
  return a.count == b.count && a.coll == b.coll && a.dtype == b.dtype && a.op == b.op &&
         a.algo == b.algo && a.root == b.root;
}

// Thread 0 of a channel that stopped early: takes back the output it published to peer p,
// so that senders still running stop writing into a buffer the caller gets back with the
// error. (A sender on this host already past its check may still land a step; a network
// proxy never does, see netSettle.)
MNCL_DEV void retractOutput(DevChannel& ch, int p) {
  storeRelease(&ch.recvFrom[p].ctrl->outputFromStep, (uint64_t)0);
#if !defined(__CUDACC__)
  if (ch.netSettle) ch.netSettle(ch.netProgressArg);
#endif
}

}  // namespace mncl::dev
