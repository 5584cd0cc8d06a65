// Ring algorithms: every rank receives from its ring predecessor and sends to its successor.
// Bandwidth-optimal (each rank sends (n-1)/n of the data per phase); latency grows with n.
//
// A channel works on its slice [chanOffset, chanOffset + chanCount) of the buffer: allreduce
// in loops of n chunks of at most one step each (RingLoop), so successive chunks pipeline
// through the FIFO; broadcast and reduce in pipeline pieces (pipelineStep); allgather and
// reduce_scatter a step of every rank block at a time. (The step helpers: steps.h.)
#pragma once

#include "prims.h"
#include "steps.h"

namespace mncl::dev {

template <template <class, class> class Prims, typename T, typename Fn>
struct Ring {
  using Cx = PrimsContext<Fn>;

  MNCL_DEV static int mod(int x, int n) { return ((x % n) + n) % n; }
  // The rank at ring position pos (any integer: taken modulo the rank count).
  MNCL_DEV static int at(const DevChannel& ch, int pos) { return ch.ring[mod(pos, ch.nranks)]; }
  MNCL_DEV static Prims<T, Fn> prims(Cx cx) {
    return Prims<T, Fn>(cx, PeerSet(at(cx.ch, cx.ch.ringPos - 1)), PeerSet(at(cx.ch, cx.ch.ringPos + 1)));
  }

  // Reduce-scatter then allgather, both around the ring. The rank at ring position p
  // finishes chunk p, applies the post-operation and passes the result on.
  MNCL_DEV static void allReduce(Cx cx) {
    const DevWork& w = cx.work;
    int n = cx.ch.nranks, p = cx.ch.ringPos;
    const T* src = (const T*)w.send + w.chanOffset;
    T* dst = (T*)w.recv + w.chanOffset;
    size_t cnt = w.chanCount;
    auto pr = prims(cx);
    for (size_t base = 0; base < cnt;) {
      RingLoop L{base, ringChunk<T>(cnt - base, n, pr.stepElems()), cnt};
      int c = mod(p - 1, n);
      pr.send(src + L.off(c), L.len(c));
      for (int s = 1; s < n - 1; ++s) {
        c = mod(p - 1 - s, n);
        pr.recvReduceSend(src + L.off(c), L.len(c));
      }
      pr.recvReduceCopySend(src + L.off(p), dst + L.off(p), L.len(p), kFinish);
      for (int s = 1; s < n - 1; ++s) {
        c = mod(p - s, n);
        pr.recvCopySend(dst + L.off(c), L.len(c));
      }
      c = mod(p + 1, n);
      pr.recv(dst + L.off(c), L.len(c));
      base += (size_t)n * L.chunk;
    }
  }

  // Root sends, the others forward down the ring; the rank before the root only receives.
  MNCL_DEV static void broadcast(Cx cx) {
    const DevWork& w = cx.work;
    const DevChannel& ch = cx.ch;
    const T* src = (const T*)w.send + w.chanOffset;
    T* dst = (T*)w.recv + w.chanOffset;
    bool isRoot = ch.rank == w.root;
    bool isLast = at(ch, ch.ringPos + 1) == w.root;
    auto pr = Prims<T, Fn>(cx, PeerSet(isRoot ? -1 : at(ch, ch.ringPos - 1)), PeerSet(isLast ? -1 : at(ch, ch.ringPos + 1)));
    size_t step = pipelineStep<T>(ch.sizes, pr.stepElems(), w.chanCount, ch.nranks - 1);
    forEachStep(step, w.chanCount, [&](size_t off, size_t len) {
      if (isRoot) pr.copySend(src + off, dst + off, len);
      else if (isLast) pr.recv(dst + off, len);
      else pr.recvCopySend(dst + off, len);
    });
  }

  // Partial results flow around the ring and end at the root.
  MNCL_DEV static void reduce(Cx cx) {
    const DevWork& w = cx.work;
    const DevChannel& ch = cx.ch;
    const T* src = (const T*)w.send + w.chanOffset;
    T* dst = (T*)w.recv + w.chanOffset;
    bool isRoot = ch.rank == w.root;
    bool isFirst = at(ch, ch.ringPos - 1) == w.root;
    auto pr = Prims<T, Fn>(cx, PeerSet(isFirst ? -1 : at(ch, ch.ringPos - 1)), PeerSet(isRoot ? -1 : at(ch, ch.ringPos + 1)));
    size_t step = pipelineStep<T>(ch.sizes, pr.stepElems(), w.chanCount, ch.nranks - 1);
    forEachStep(step, w.chanCount, [&](size_t off, size_t len) {
      if (isRoot) pr.recvReduceCopy(src + off, dst + off, len, kFinish);
      else if (isFirst) pr.send(src + off, len);
      else pr.recvReduceSend(src + off, len);
    });
  }

  // Each rank's block travels n-1 hops; every rank keeps a copy as it passes.
  MNCL_DEV static void allGather(Cx cx) {
    const DevWork& w = cx.work;
    const DevChannel& ch = cx.ch;
    int n = ch.nranks;
    const T* src = (const T*)w.send + w.chanOffset;
    T* dst = (T*)w.recv + w.chanOffset;
    auto pr = prims(cx);
    forEachStep(pr.stepElems(), w.chanCount, [&](size_t off, size_t len) {
      pr.copySend(src + off, dst + (size_t)ch.rank * w.count + off, len);
      for (int s = 1; s < n - 1; ++s) pr.recvCopySend(dst + (size_t)at(ch, ch.ringPos - s) * w.count + off, len);
      pr.recv(dst + (size_t)at(ch, ch.ringPos + 1) * w.count + off, len);
    });
  }

  // Block b accumulates as it travels and is complete when it reaches rank b.
  MNCL_DEV static void reduceScatter(Cx cx) {
    const DevWork& w = cx.work;
    const DevChannel& ch = cx.ch;
    int n = ch.nranks;
    const T* src = (const T*)w.send + w.chanOffset;
    T* dst = (T*)w.recv + w.chanOffset;
    auto pr = prims(cx);
    forEachStep(pr.stepElems(), w.chanCount, [&](size_t off, size_t len) {
      pr.send(src + (size_t)at(ch, ch.ringPos - 1) * w.count + off, len);
      for (int s = 1; s < n - 1; ++s) pr.recvReduceSend(src + (size_t)at(ch, ch.ringPos - 1 - s) * w.count + off, len);
      pr.recvReduceCopy(src + (size_t)ch.rank * w.count + off, dst + off, len, kFinish);
    });
  }
};

}  // namespace mncl::dev
