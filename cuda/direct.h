// Direct algorithms: every rank talks to every other rank at once. For fully connected ranks
// (one host, one GPU, NVSwitch), where one hop reaches anyone: the fewest steps, at the cost
// of n-1 connections per rank (so n <= kMaxPeers + 1).
//
//   allreduce one-shot: every rank sends its whole input to every peer and reduces locally.
//       One step of latency; each rank moves (n-1) times the data. Small messages.
//   allreduce two-shot: direct reduce-scatter (rank r reduces block r), then direct
//       allgather of the reduced blocks. Two steps; bandwidth like the ring's.
//   allgather, reduce_scatter, broadcast, reduce: the same single-hop exchanges.
// Every rank reduces its inputs in rank order, so all ranks end with the same bits.
#pragma once

#include "prims.h"
#include "steps.h"

namespace mncl::dev {

template <template <class, class> class Prims, typename T, typename Fn>
struct Direct {
  using Cx = PrimsContext<Fn>;
  using P = Prims<T, Fn>;

  // One-shot or two-shot is the host's choice, made by the tuner (Tuner::estimate prices both
  // variants; DevWork::algoVariant carries the winner).
  MNCL_DEV static bool oneShot(const Cx& cx) { return cx.work.algoVariant == 0; }

  MNCL_DEV static void allReduce(Cx cx) {
    if (oneShot(cx)) allReduceOneShot(cx);
    else allReduceTwoShot(cx);
  }

  MNCL_DEV static void allReduceOneShot(Cx cx) {
    const DevWork& w = cx.work;
    const DevChannel& ch = cx.ch;
    const T* src = (const T*)w.send + w.chanOffset;
    T* dst = (T*)w.recv + w.chanOffset;
    PeerSet all = PeerSet::allBut(ch.rank, ch.nranks);
    P both(cx, all, all);
    forEachStep(both.stepElems(), w.chanCount, [&](size_t off, size_t len) {
      both.sendRecvReduceCopy(src + off, dst + off, len, kFinish);
    });
  }

  // Per loop, block b of n (one step each) is reduced by rank b, then sent to everyone.
  MNCL_DEV static void allReduceTwoShot(Cx cx) {
    const DevWork& w = cx.work;
    const DevChannel& ch = cx.ch;
    int n = ch.nranks, me = ch.rank;
    const T* src = (const T*)w.send + w.chanOffset;
    T* dst = (T*)w.recv + w.chanOffset;
    P exchange(cx, PeerSet::allBut(me, n), PeerSet::allBut(me, n));
    size_t step = exchange.stepElems();
    for (size_t base = 0; base < w.chanCount;) {
      RingLoop L{base, ringChunk<T>(w.chanCount - base, n, step), w.chanCount};
      for (int p = 0; p < n; ++p) {
        if (p != me) P(cx, PeerSet(), PeerSet(p)).send(src + L.off(p), L.len(p));
      }
      exchange.recvReduceCopySend(src + L.off(me), dst + L.off(me), L.len(me), kFinish);
      for (int p = 0; p < n; ++p) {
        if (p != me) P(cx, PeerSet(p), PeerSet()).recv(dst + L.off(p), L.len(p));
      }
      base += (size_t)n * L.chunk;
    }
  }

  MNCL_DEV static void allGather(Cx cx) {
    const DevWork& w = cx.work;
    const DevChannel& ch = cx.ch;
    int n = ch.nranks, me = ch.rank;
    const T* src = (const T*)w.send + w.chanOffset;
    T* dst = (T*)w.recv + w.chanOffset;
    P out(cx, PeerSet(), PeerSet::allBut(me, n));
    forEachStep(out.stepElems(), w.chanCount, [&](size_t off, size_t len) {
      out.copySend(src + off, dst + (size_t)me * w.count + off, len);
      for (int p = 0; p < n; ++p) {
        if (p != me) P(cx, PeerSet(p), PeerSet()).recv(dst + (size_t)p * w.count + off, len);
      }
    });
  }

  MNCL_DEV static void reduceScatter(Cx cx) {
    const DevWork& w = cx.work;
    const DevChannel& ch = cx.ch;
    int n = ch.nranks, me = ch.rank;
    const T* src = (const T*)w.send + w.chanOffset;
    T* dst = (T*)w.recv + w.chanOffset;
    P in(cx, PeerSet::allBut(me, n), PeerSet());
    forEachStep(in.stepElems(), w.chanCount, [&](size_t off, size_t len) {
      for (int p = 0; p < n; ++p) {
        if (p != me) P(cx, PeerSet(), PeerSet(p)).send(src + (size_t)p * w.count + off, len);
      }
      in.recvReduceCopy(src + (size_t)me * w.count + off, dst + off, len, kFinish);
    });
  }

  MNCL_DEV static void broadcast(Cx cx) {
    const DevWork& w = cx.work;
    const DevChannel& ch = cx.ch;
    const T* src = (const T*)w.send + w.chanOffset;
    T* dst = (T*)w.recv + w.chanOffset;
    bool isRoot = ch.rank == w.root;
    P pr = isRoot ? P(cx, PeerSet(), PeerSet::allBut(ch.rank, ch.nranks)) : P(cx, PeerSet(w.root), PeerSet());
    forEachStep(pr.stepElems(), w.chanCount, [&](size_t off, size_t len) {
      if (isRoot) pr.copySend(src + off, dst + off, len);
      else pr.recv(dst + off, len);
    });
  }

  MNCL_DEV static void reduce(Cx cx) {
    const DevWork& w = cx.work;
    const DevChannel& ch = cx.ch;
    const T* src = (const T*)w.send + w.chanOffset;
    T* dst = (T*)w.recv + w.chanOffset;
    bool isRoot = ch.rank == w.root;
    P pr = isRoot ? P(cx, PeerSet::allBut(ch.rank, ch.nranks), PeerSet()) : P(cx, PeerSet(), PeerSet(w.root));
    forEachStep(pr.stepElems(), w.chanCount, [&](size_t off, size_t len) {
      if (isRoot) pr.recvReduceCopy(src + off, dst + off, len, kFinish);
      else pr.send(src + off, len);
    });
  }
};

}  // namespace mncl::dev
