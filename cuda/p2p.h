// Point-to-point: a group of sends and receives, progressed together so that no order of
// calls across ranks can deadlock (rank A sending to B while B sends to A, alltoall, pipeline
// stages exchanging activations and gradients). Each pass tries one step of every op whose
// connection is ready and never blocks on one op while another could move.
//
// Simple protocol. Every op moves at least one step, even with zero bytes, and every step
// says the whole op's byte count and type, so a receiver whose recv does not match the
// peer's send stops before writing anything.
#pragma once

#include "prims.h"

namespace mncl::dev {

struct P2pOp {
  bool isSend;
  int peer;
  char* buf;            // this channel's share of the user buffer
  uint64_t bytes;       // this channel's share
  uint64_t totalBytes;  // the whole op, for the match check
  DataType dtype;
  // progress
  uint64_t done = 0;
  uint64_t stepsLeft = 0;
};

struct P2pEngine {
  DevChannel& ch;
  Waiter& waiter;
  DevError* error;

  MNCL_HOSTDEV static StepInfo infoOf(const P2pOp& op) {
    StepInfo s{};
    s.count = op.totalBytes;
    s.coll = (uint8_t)Coll::sendrecv;
    s.dtype = (uint8_t)op.dtype;
    s.root = -1;
    return s;
  }

  // Runs ops[0..n) to completion; returns false if aborted or mismatched. On a GPU every
  // thread of the block runs it on the same ops (in shared memory): thread 0 looks at a
  // connection and decides, a barrier shares the verdict, every thread copies, thread 0
  // posts the step and advances the op. (On the CPU the barriers cost nothing.)
  MNCL_DEV bool run(P2pOp* ops, int n) {
    size_t stepBytes = ch.sizes.simpleSlotBytes;
    if (tid() == 0) {
      for (int i = 0; i < n; ++i) {
        ops[i].done = 0;
        ops[i].stepsLeft = ops[i].bytes == 0 ? 1 : divUpBytes(ops[i].bytes, stepBytes);
      }
    }
    barrier();
    int left = n;
    uint32_t idle = 0;
    while (left > 0) {
      bool moved = false;
      for (int i = 0; i < n; ++i) {
        P2pOp& op = ops[i];
        if (op.stepsLeft == 0 || blockedByEarlier(ops, i)) continue;
        Verdict v = Verdict::wait;
        if (tid() == 0) v = op.isSend ? sendVerdict(op) : recvVerdict(op);
        if (barrierAny(v == Verdict::mismatch)) {
          waiter.aborted = true;
          return false;
        }
        if (!barrierAny(v == Verdict::go)) continue;
        moveStep(op, stepBytes);
        moved = true;
        if (op.stepsLeft == 0) --left;
      }
      if (moved) {
        idle = 0;
        continue;
      }
      bool look = idle % kSpinsPerAbortCheck == kSpinsPerAbortCheck - 1;
      if (barrierAny(tid() == 0 && look && loadRelaxed(waiter.abortFlag) != 0)) {
        waiter.aborted = true;
        return false;
      }
      waiter.backoff(idle++);
    }
    return true;
  }

 private:
  enum class Verdict { wait, go, mismatch };

  MNCL_HOSTDEV static uint64_t divUpBytes(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

  // Ops on the same connection (peer and direction) run in the order they were issued.
  MNCL_DEV static bool blockedByEarlier(const P2pOp* ops, int i) {
    for (int j = 0; j < i; ++j) {
      if (ops[j].stepsLeft != 0 && ops[j].peer == ops[i].peer && ops[j].isSend == ops[i].isSend) return true;
    }
    return false;
  }

  MNCL_DEV char* slot(const ConnFifo& f, uint64_t step) const {
    return f.simple + (step % kSteps) * (size_t)ch.sizes.simpleSlotBytes;
  }

  // Thread 0: may this send fill its next slot (the receiver has freed it)?
  MNCL_DEV Verdict sendVerdict(const P2pOp& op) const { return sendSlotFree(ch, op.peer) ? Verdict::go : Verdict::wait; }

  // Thread 0: has this recv's next step arrived, and does the sender's op match ours?
  MNCL_DEV Verdict recvVerdict(const P2pOp& op) const {
    const ConnFifo& f = ch.recvFrom[op.peer];
    uint64_t step = ch.recvStep[op.peer];
    if (loadAcquire(&f.ctrl->tail) <= step) return Verdict::wait;
    StepInfo want = infoOf(op), got = f.ctrl->info[step % kSteps];
    if (sameInfo(want, got)) return Verdict::go;
    if (error && error->peer < 0) {
      error->peer = op.peer;
      error->expected = want;
      error->got = got;
    }
    return Verdict::mismatch;
  }

  // Every thread copies one step; thread 0 then publishes it and advances the op.
  MNCL_DEV void moveStep(P2pOp& op, size_t stepBytes) {
    uint64_t step = op.isSend ? ch.sendStep[op.peer] : ch.recvStep[op.peer];
    ConnFifo& f = op.isSend ? ch.sendTo[op.peer] : ch.recvFrom[op.peer];
    size_t len = minBytes(stepBytes, op.bytes - op.done);
    if (op.isSend) copyElems(slot(f, step), op.buf + op.done, len);
    else copyElems(op.buf + op.done, slot(f, step), len);
    barrier();
    if (tid() == 0) {
      if (op.isSend) {
        f.ctrl->info[step % kSteps] = infoOf(op);
        fenceFor(ch.systemScope);  // the step's data and its StepInfo, before the tail
        storeFlag(&f.ctrl->tail, ++ch.sendStep[op.peer]);
      } else {
        storeFlag(&f.ctrl->head, ++ch.recvStep[op.peer]);  // only frees the slot
      }
      op.done += len;
      --op.stepsLeft;
    }
    barrier();
  }

  MNCL_HOSTDEV static size_t minBytes(size_t a, uint64_t b) { return a < b ? a : (size_t)b; }
};

}  // namespace mncl::dev
