// The primitives vocabulary shared by every protocol.
//
// A Primitives object connects one channel to a set of peers it receives from and a set it
// sends to, for one operation. Each call moves one step (at most stepElems() elements) on
// every connection it names:
//
//   send(src)                      src            -> peers
//   recv(dst)                      peers          -> dst
//   recvReduceSend(src)            peers (+) src  -> peers
//   recvReduceCopy(src, dst)       peers (+) src  -> dst
//   recvReduceCopySend(src, dst)   peers (+) src  -> dst and peers
//   recvCopySend(dst)              peers          -> dst and peers
//   copySend(src, dst)             src            -> dst and peers
//   sendRecvReduceCopy(src, dst)   src -> peers, and peers (+) src -> dst
//
// `finish` applies the reduction's post-operation to a fully reduced value (avg's division).
// Algorithms (ring.h, tree.h, ...) are written only in these words, so they run under every
// protocol. A protocol class derives from PrimsVocabulary, is made from
// (PrimsContext, PeerSet recv, PeerSet send), and provides three things: stepElems(), the
// most elements one step moves, by which algorithms cut their chunks; kSendsInputInPass,
// whether genericOp can send its input while it receives (sendRecvReduceCopy's one pass);
// and genericOp(kind, src, dst, n, finish), where src / dst may be null, which does the
// work: receiving combines the peers in the order given, with src at PeerSet::srcPos among
// them (0: first).
//
// Rules for algorithms. The Simple protocol's shortcuts (prims_simple.h, README "Pointer
// steps") rely on them: a schedule that breaks one may pass with the shortcuts off and give
// wrong results, or write into a buffer already handed back, with them on.
//   1. Every element of the output the operation defines is written exactly once, with its
//      final value: a receiver may read our output where it lies (a pointer step) until the
//      operation ends.
//   2. The dst of a primitive that also sends (copySend, recvCopySend, recvReduceCopySend)
//      holds final output values, the same on every rank: for allreduce, allgather and
//      broadcast the step may be written straight into each receiver's output at the same
//      offset from the output's start (a direct write). Scratch data goes through primitives
//      without a dst (send, recvReduceSend).
//   3. While the channel has work (chanCount > 0), every peer a Primitives object receives
//      from delivers at least one step in this operation: Simple publishes our output to each
//      of them when the object is made, and a publication no step followed still looks
//      current to the next call of the same description.
// And what every schedule lives with:
//   4. There is no scratch memory. A partial result lives only in a connection's FIFO, from
//      the primitive that sends it to the peer's that receives it. `src` is always this
//      rank's input (the reduction's pre-operation, premulsum's scaling, applies to every
//      src): a result already written to dst goes on by the primitive that received it
//      (recvCopySend, recvReduceCopySend), not by send(dst). So a butterfly that keeps a
//      partial sum to both send and add is not expressible; a halving-doubling allreduce is,
//      as a reduce tree and a broadcast tree per chunk.
//   5. Steps pair up and never wait in a cycle. Both ends of a connection run the same
//      steps (number and sizes); a sender runs at most kSteps (conn.h) steps ahead of its
//      receiver, then waits for a slot; a channel is one thread of blocking calls. Order each
//      rank's primitives so that no ranks wait on one another around a cycle (tree.h's kLag
//      keeps its up and down passes from filling each other's slots).
// To debug a new schedule, run it with MININCL_POINTER_STEPS=0 MININCL_DIRECT_WRITES=0 first
// (every step through the FIFO slots).
#pragma once

#include "channel.h"
#include "reduce_copy.h"

namespace mncl::dev {

// The peers a primitive receives from or sends to. For receiving, srcPos says where this
// rank's own input goes in the reduction order (0: first). Direct algorithms list peers by
// rank and put their own input at its rank's place, so every rank reduces in the same order
// and gets the same bits.
struct PeerSet {
  int n = 0;
  int srcPos = 0;
  int peer[kMaxPeers];
  MNCL_HOSTDEV PeerSet() {}
  MNCL_HOSTDEV explicit PeerSet(int p) {
    if (p >= 0) peer[n++] = p;
  }
  MNCL_HOSTDEV void add(int p) {
    if (p >= 0) peer[n++] = p;
  }
  // Every rank but `self`, in rank order, with self's input at its place.
  MNCL_HOSTDEV static PeerSet allBut(int self, int nranks) {
    PeerSet s;
    for (int r = 0; r < nranks; ++r) {
      if (r != self) s.peer[s.n++] = r;
    }
    s.srcPos = self;
    return s;
  }
};

// Everything a protocol needs about the operation it serves.
template <typename Fn>
struct PrimsContext {
  DevChannel& ch;
  const DevWork& work;
  Fn fn;
  Waiter& waiter;
  DevError* error;  // set when a peer's step belongs to a different call
};

// What one step does: receive from the receive peers, send to the send peers, or both.
// sendInput (with both): send this rank's input, not the reduced result (see
// sendRecvReduceCopy).
struct StepKind {
  bool recv;
  bool send;
  bool sendInput = false;
};
template <bool Recv, bool Send, bool SendInput>
struct FixedStepKind {
  static constexpr bool recv = Recv, send = Send, sendInput = SendInput;
};

// The kind a primitive passes to its protocol's genericOp. On a GPU (and in the tests'
// emulation of one) a run-time value: one copy of genericOp serves every primitive (a copy
// per kind made each kernel compile 1.6-2x as long and spill more registers; the branches
// on it are uniform, once per pass). On the CPU a type whose members are constants: a copy
// per kind, each with its branches folded away, as a CPU step may be a single line.
template <bool Recv, bool Send, bool SendInput = false>
MNCL_HOSTDEV constexpr auto stepKind() {
#if MNCL_SIMT
  return StepKind{Recv, Send, SendInput};
#else
  return FixedStepKind<Recv, Send, SendInput>{};
#endif
}

// What an algorithm passes as `finish` to the primitive whose step completes a value's
// reduction (the default, false, leaves it unfinished).
constexpr bool kFinish = true;

template <typename Derived, typename T>
class PrimsVocabulary {
 public:
  MNCL_DEV void send(const T* src, size_t n) { self().genericOp(stepKind<false, true>(), src, nullptr, n, false); }
  MNCL_DEV void recv(T* dst, size_t n, bool finish = false) {
    self().genericOp(stepKind<true, false>(), nullptr, dst, n, finish);
  }
  MNCL_DEV void recvReduceSend(const T* src, size_t n) {
    self().genericOp(stepKind<true, true>(), src, nullptr, n, false);
  }
  MNCL_DEV void recvReduceCopy(const T* src, T* dst, size_t n, bool finish = false) {
    self().genericOp(stepKind<true, false>(), src, dst, n, finish);
  }
  MNCL_DEV void recvReduceCopySend(const T* src, T* dst, size_t n, bool finish = false) {
    self().genericOp(stepKind<true, true>(), src, dst, n, finish);
  }
  MNCL_DEV void recvCopySend(T* dst, size_t n, bool finish = false) {
    self().genericOp(stepKind<true, true>(), nullptr, dst, n, finish);
  }
  MNCL_DEV void copySend(const T* src, T* dst, size_t n, bool finish = false) {
    self().genericOp(stepKind<false, true>(), src, dst, n, finish);
  }
  // What a one-shot allreduce does: every rank sends its input to every peer and reduces all
  // of them. A protocol that can sends its input and polls the peers' in one pass of a step
  // (StepKind::sendInput); the others send the step, then receive it.
  MNCL_DEV void sendRecvReduceCopy(const T* src, T* dst, size_t n, bool finish = false) {
    if constexpr (Derived::kSendsInputInPass) {
      self().genericOp(stepKind<true, true, true>(), src, dst, n, finish);
    } else {
      send(src, n);
      recvReduceCopy(src, dst, n, finish);
    }
  }

 private:
  MNCL_DEV Derived& self() { return *static_cast<Derived*>(this); }
};

// Records a failed kernel copy to (wrote) or from `peer` and stops the operation; returns
// false. (Thread 0 records.)
MNCL_DEV bool failPeerCopy(DevError* error, Waiter& waiter, int peer, int err, bool wrote) {
  if (tid() == 0) {
    recordError(error, peer, [&](DevError& e) {
      e.copyErrno = err;
      e.wrote = wrote;
    });
  }
  waiter.aborted = true;
  return false;
}

// Records a mismatch between what this rank runs and what a peer's step says it runs, and
// stops the operation (the host turns the record into an error naming both calls).
template <typename Fn>
MNCL_DEV bool checkStepInfo(PrimsContext<Fn>& cx, int peer, const StepInfo& got) {
  StepInfo want = cx.work.info();
  if (sameInfo(want, got)) return true;
  recordError(cx.error, peer, [&](DevError& e) {
    e.expected = want;
    e.got = got;
  });
  cx.waiter.aborted = true;
  return false;
}

}  // namespace mncl::dev
