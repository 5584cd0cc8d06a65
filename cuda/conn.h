// A connection between two ranks' channels, one direction of it: the FIFO's slots for each
// protocol, the control words both ends share, and what each step says about its call.
// Plain structs, shared by host and device.
#pragma once

#include "doorbell.h"
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
// running a different call (other collective, count, type, op, root or tag) before it writes
// anything, instead of silently mixing data or hanging.
struct StepInfo {
  // Of the whole operation: elements, or bytes where the call runs on bytes (send/recv, and
  // the collectives dispatch.h's asBytes turns into bytes: copies and bitwise ops).
  uint64_t count;
  uint8_t coll, dtype, op, algo;
  int32_t root;  // a send/recv's tag (P2pEngine)
};
static_assert(sizeof(StepInfo) == 8 * kLLHeaderLines, "an LL header line carries 8 bytes of it");

MNCL_HOSTDEV bool sameInfo(const StepInfo& a, const StepInfo& b) {
  return a.count == b.count && a.coll == b.coll && a.dtype == b.dtype && a.op == b.op &&
         a.algo == b.algo && a.root == b.root;
}

// Control words of one connection, each on its own cache line (they are written by different
// sides). Lives, with the FIFOs, in the receiver's memory.
struct ConnCtrl {
  // The FIFO protocol: a connection needs only these three.
  alignas(128) uint64_t tail;  // steps the sender has filled (release): Simple, and LL/LL128 at a proxied end
  alignas(128) uint64_t head;  // all protocols: steps the receiver has consumed (only frees slots)
  alignas(128) StepInfo info[kSteps];
  // Where a CPU thread waiting on this connection, at either end, sleeps (doorbell.h): every
  // post of a tail or a head, and every LL / LL128 step, rings it.
  Doorbell bell;

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

  // Receiver: publishes its output for the operation whose first step from the sender is
  // `firstStep` and which is `info`.
  MNCL_DEV void publishOutput(uint64_t firstStep, uint64_t at, uint64_t bytes, const StepInfo& info) {
    storeRelaxed(&outputAt, at);
    storeRelaxed(&outputBytes, bytes);
    outputInfo = info;
    storeRelease(&outputFromStep, firstStep + 1);
  }
  // Whether the output published is for that operation (acquire: then outputAt and
  // outputBytes are its).
  MNCL_DEV bool outputPublishedFor(uint64_t firstStep, const StepInfo& info) const {
    return loadAcquire(&outputFromStep) == firstStep + 1 && sameInfo(outputInfo, info);
  }
  // Whether the output published is for the operation whose first step is `firstStep`,
  // whatever its description (a sender waiting for its receiver to start).
  MNCL_DEV bool outputPublishedFrom(uint64_t firstStep) const { return loadAcquire(&outputFromStep) == firstStep + 1; }
  // Receiver: takes it back (the operation stopped early).
  MNCL_DEV void retractOutput() { storeRelease(&outputFromStep, (uint64_t)0); }
};

// What a receiver leaves in ConnCtrl::dataAt once it has taken a pointer step (send/recv;
// a network proxy takes every pointer step it sends).
constexpr uint64_t kPointerTaken = ~uint64_t{0};
// ConnCtrl::outputOffset of a step that is not final output.
constexpr uint64_t kNotOutput = ~uint64_t{0};

// The sizes of a channel's FIFO slots, per protocol.
struct ProtoSizes {
  uint32_t simpleSlotBytes;
  uint32_t llSlotLines;
  uint32_t ll128SlotLines;
  // The smallest piece a pipeline (a tree, a ring broadcast or reduce) cuts a message
  // into: a step's handshake must stay cheap next to the bytes it moves.
  uint32_t pipelineChunkBytes;
};

// One direction of a (peer, channel) connection, as the device addresses it.
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

  // Step `step`'s Simple slot.
  MNCL_HOSTDEV char* simpleSlot(uint64_t step, const ProtoSizes& sizes) const {
    return simple + (step % kSteps) * (size_t)sizes.simpleSlotBytes;
  }

  // The peer's `bytes` at `at` (as the peer addresses them) as this process addresses them:
  // the same address (the peer is this process), or through our mapping of its window;
  // null if neither (a kernel copy may still reach them).
  MNCL_HOSTDEV char* mappedHere(uint64_t at, uint64_t bytes) const {
    if (peerPid == 0) return reinterpret_cast<char*>(at);
    uint64_t rel = at - peerWindowAt;
    return rel < peerWindowBytes && bytes <= peerWindowBytes - rel ? peerWindow + rel : nullptr;
  }
};

}  // namespace mncl::dev
