// Simple protocol: a FIFO of kSteps slots per connection. The sender waits for a free slot
// (head), fills it, then publishes it by bumping tail with release; the receiver waits for
// tail with acquire, consumes the slot, then bumps head. Full bandwidth; each step costs a
// round of flag traffic, so the latency is the highest of the three protocols.
#pragma once

#include "prims.h"

namespace mncl::dev {

template <typename T, typename Fn>
class PrimsSimple : public PrimsVocabulary<PrimsSimple<T, Fn>, T> {
 public:
  MNCL_DEV PrimsSimple(PrimsContext<Fn> cx, PeerSet recvPeers, PeerSet sendPeers)
      : cx_(cx), recv_(recvPeers), send_(sendPeers) {}

  MNCL_DEV size_t stepElems() const { return cx_.ch.sizes.simpleSlotBytes / sizeof(T); }

  template <bool RECV, bool SEND>
  MNCL_DEV void genericOp(const T* src, T* dst, size_t n, bool post) {
    DevChannel& ch = cx_.ch;
    const T* srcs[kMaxSrcs];
    T* dsts[kMaxDsts];
    int nsrc = 0, ndst = 0;
    if (dst) dsts[ndst++] = dst;
    if (tid() == 0) {
      if (RECV) waitRecv();
      if (SEND) waitSend();
    }
    barrier();
    if (cx_.waiter.aborted) return;
    for (int i = 0; i <= (RECV ? recv_.n : 0); ++i) {
      if (i == (RECV ? recv_.srcPos : 0) && src) srcs[nsrc++] = src;
      if (RECV && i < recv_.n) srcs[nsrc++] = slot(ch.recvFrom[recv_.peer[i]], ch.recvStep[recv_.peer[i]]);
    }
    if (SEND) {
      for (int i = 0; i < send_.n; ++i) dsts[ndst++] = slot(ch.sendTo[send_.peer[i]], ch.sendStep[send_.peer[i]]);
    }
    if (nsrc > 0) reduceCopy(cx_.fn, nsrc, srcs, ndst, dsts, n, post);
    barrier();
    if (tid() == 0) {
      fenceSystem();
      if (RECV) postRecv();
      if (SEND) postSend();
    }
    barrier();
  }

 private:
  MNCL_DEV T* slot(const ConnFifo& f, uint64_t step) const {
    return reinterpret_cast<T*>(f.simple + (step % kSteps) * (size_t)cx_.ch.sizes.simpleSlotBytes);
  }

  MNCL_DEV bool waitRecv() {
    DevChannel& ch = cx_.ch;
    for (int i = 0; i < recv_.n; ++i) {
      int p = recv_.peer[i];
      ConnCtrl* c = ch.recvFrom[p].ctrl;
      uint64_t step = ch.recvStep[p];
      if (!cx_.waiter.until([&] { return loadAcquire(&c->tail) > step; })) return false;
      if (!checkStepInfo(cx_, p, c->info[step % kSteps])) return false;
    }
    return true;
  }

  MNCL_DEV bool waitSend() {
    DevChannel& ch = cx_.ch;
    for (int i = 0; i < send_.n; ++i) {
      int p = send_.peer[i];
      ConnCtrl* c = ch.sendTo[p].ctrl;
      uint64_t step = ch.sendStep[p];
      if (!cx_.waiter.until([&] { return loadAcquire(&c->head) + kSteps > step; })) return false;
    }
    return true;
  }

  MNCL_DEV void postRecv() {
    DevChannel& ch = cx_.ch;
    for (int i = 0; i < recv_.n; ++i) {
      int p = recv_.peer[i];
      storeRelease(&ch.recvFrom[p].ctrl->head, ++ch.recvStep[p]);
    }
  }

  MNCL_DEV void postSend() {
    DevChannel& ch = cx_.ch;
    StepInfo info = cx_.work.info();
    for (int i = 0; i < send_.n; ++i) {
      int p = send_.peer[i];
      ConnCtrl* c = ch.sendTo[p].ctrl;
      c->info[ch.sendStep[p] % kSteps] = info;
      storeRelease(&c->tail, ++ch.sendStep[p]);
    }
  }

  PrimsContext<Fn> cx_;
  PeerSet recv_, send_;
};

}  // namespace mncl::dev
