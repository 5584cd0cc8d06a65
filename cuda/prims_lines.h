// LL and LL128: protocols whose flags travel inside the data lines.
//
// The receiver spins on each line until its flag equals (step + 1) for the step it expects.
// Flags only grow, and a connection's step counter is shared by all protocols, so a line
// left over from an earlier step, an earlier lap of the FIFO or an earlier operation can
// never carry the flag being waited for. The sender still waits for the receiver's head
// before reusing a slot, so it never overwrites a line that has not been read.
//
//   LL    16-byte line = data(4) flag(4) data(4) flag(4); one 8-byte (CPU) or 16-byte (GPU)
//         store writes data with its flags, so no fence is needed: lowest latency, half the
//         bytes are payload.
//   LL128 128-byte line = 120 data bytes + an 8-byte flag written last (release on the CPU;
//         on the GPU a release store by the thread that wrote the line): ~94% payload.
#pragma once

#include "pack.h"
#include "prims.h"

namespace mncl::dev {

struct LLFormat {
  static constexpr int kPayload = 8;
  using Line = LLLine;
  MNCL_DEV static Line* lines(const ConnFifo& f) { return f.ll; }
  MNCL_DEV static uint32_t slotLines(const ProtoSizes& s) { return s.llSlotLines; }

  template <typename P>
  MNCL_DEV static void write(Line* l, const P& p, uint32_t flag, bool /*system*/) {
    uint64_t v = p.w[0];
    uint64_t lo = (v & 0xffffffffull) | ((uint64_t)flag << 32);
    uint64_t hi = (v >> 32) | ((uint64_t)flag << 32);
#if defined(__CUDACC__)
    asm volatile("st.volatile.global.v2.u64 [%0], {%1,%2};" ::"l"(l->w), "l"(lo), "l"(hi) : "memory");
#else
    storeRelease(&l->w[0], lo);
    storeRelease(&l->w[1], hi);
#endif
  }

  template <typename P>
  MNCL_DEV static bool read(const Line* l, P& p, uint32_t flag) {
    uint64_t lo, hi;
#if defined(__CUDACC__)
    asm volatile("ld.volatile.global.v2.u64 {%0,%1}, [%2];" : "=l"(lo), "=l"(hi) : "l"(l->w) : "memory");
#else
    lo = loadAcquire(&l->w[0]);
    hi = loadAcquire(&l->w[1]);
#endif
    if ((uint32_t)(lo >> 32) != flag || (uint32_t)(hi >> 32) != flag) return false;
    p.w[0] = (lo & 0xffffffffull) | (hi << 32);
    return true;
  }
};

struct LL128Format {
  static constexpr int kPayload = kLL128DataWords * 8;
  using Line = LL128Line;
  MNCL_DEV static Line* lines(const ConnFifo& f) { return f.ll128; }
  MNCL_DEV static uint32_t slotLines(const ProtoSizes& s) { return s.ll128SlotLines; }

  template <typename P>
  MNCL_DEV static void write(Line* l, const P& p, uint32_t flag, bool system) {
    for (int j = 0; j < kLL128DataWords; ++j) l->w[j] = p.w[j];
#if defined(__CUDACC__)
    fenceFor(system);  // this thread's data words before its flag
    storeRelaxed(&l->w[kLL128DataWords], (uint64_t)flag);
#else
    storeRelease(&l->w[kLL128DataWords], (uint64_t)flag);
#endif
  }

  template <typename P>
  MNCL_DEV static bool read(const Line* l, P& p, uint32_t flag) {
    if (loadAcquire(&l->w[kLL128DataWords]) != (uint64_t)flag) return false;
    for (int j = 0; j < kLL128DataWords; ++j) p.w[j] = l->w[j];
    return true;
  }
};

template <typename T, typename Fn, typename Format>
class PrimsLines : public PrimsVocabulary<PrimsLines<T, Fn, Format>, T> {
  using P = Pack<T, Format::kPayload>;
  using Line = typename Format::Line;

 public:
  MNCL_DEV PrimsLines(PrimsContext<Fn> cx, PeerSet recvPeers, PeerSet sendPeers)
      : cx_(cx), recv_(recvPeers), send_(sendPeers) {}

  MNCL_DEV size_t stepElems() const {
    return (size_t)Format::slotLines(cx_.ch.sizes) * Format::kPayload / sizeof(T);
  }

  template <bool RECV, bool SEND>
  MNCL_DEV_STEP void genericOp(const T* src, T* dst, size_t n, bool post) {
    DevChannel& ch = cx_.ch;
    if (tid() == 0 && SEND) waitSendAndAnnounce();
    if (barrierAny(cx_.waiter.aborted)) {  // thread 0's verdict holds for the whole channel
      cx_.waiter.aborted = true;
      return;
    }
    size_t nlines = (n * sizeof(T) + Format::kPayload - 1) / Format::kPayload;
    for (size_t i = tid(); i < nlines && !cx_.waiter.aborted; i += nthreads()) {
      P v;
      bool have = false;
      for (int r = 0; r <= (RECV ? recv_.n : 0); ++r) {
        if (r == (RECV ? recv_.srcPos : 0) && src) {
          P own;
          loadPack(own, src, i * P::kElems, n);
          combine(v, own, have);
        }
        if (!RECV || r == recv_.n) continue;
        P x;
        int peer = recv_.peer[r];
        const Line* l = lineAt(ch.recvFrom[peer], ch.recvStep[peer], i);
        uint32_t flag = (uint32_t)(ch.recvStep[peer] + 1);
        if (!cx_.waiter.until([&] { return Format::read(l, x, flag); })) break;
        if (i == 0) {  // the sender published its StepInfo before the step's first line
          fenceFor(ch.systemScope);
          if (!checkStepInfo(cx_, peer, ch.recvFrom[peer].ctrl->info[ch.recvStep[peer] % kSteps])) break;
        }
        combine(v, x, have);
      }
      if (cx_.waiter.aborted) break;
      if (post) postPack(cx_.fn, v);
      if (dst) storePack(v, dst, i * P::kElems, n);
      if (SEND) {
        for (int s = 0; s < send_.n; ++s) {
          int peer = send_.peer[s];
          Format::write(lineAt(ch.sendTo[peer], ch.sendStep[peer], i), v, (uint32_t)(ch.sendStep[peer] + 1),
                        ch.systemScope);
        }
      }
    }
    barrier();
    if (tid() == 0 && !cx_.waiter.aborted) {
      if (RECV) {
        for (int r = 0; r < recv_.n; ++r) {
          int peer = recv_.peer[r];
          storeFlag(&ch.recvFrom[peer].ctrl->head, ++ch.recvStep[peer]);  // only frees the slot
        }
      }
      if (SEND) {
        for (int s = 0; s < send_.n; ++s) ++ch.sendStep[send_.peer[s]];
      }
    }
    barrier();
  }

 private:
  MNCL_DEV void combine(P& acc, const P& x, bool& have) const {
    if (have) {
      reducePack(cx_.fn, acc, x);
    } else {
      acc = x;
      have = true;
    }
  }

  MNCL_DEV Line* lineAt(const ConnFifo& f, uint64_t step, size_t i) const {
    return Format::lines(f) + (step % kSteps) * Format::slotLines(cx_.ch.sizes) + i;
  }

  // Waits until every send slot is free, then writes this step's StepInfo; the release on
  // the first line's flag makes it visible before the receiver checks it.
  MNCL_DEV void waitSendAndAnnounce() {
    DevChannel& ch = cx_.ch;
    StepInfo info = cx_.work.info();
    for (int s = 0; s < send_.n; ++s) {
      int peer = send_.peer[s];
      ConnCtrl* c = ch.sendTo[peer].ctrl;
      uint64_t step = ch.sendStep[peer];
      if (!cx_.waiter.until([&] { return loadAcquire(&c->head) + kSteps > step; })) return;
      c->info[step % kSteps] = info;
    }
    fenceFor(ch.systemScope);  // GPU: the StepInfo lands before any line (line stores are not releases)
  }

  PrimsContext<Fn> cx_;
  PeerSet recv_, send_;
};

template <typename T, typename Fn>
using PrimsLL = PrimsLines<T, Fn, LLFormat>;
template <typename T, typename Fn>
using PrimsLL128 = PrimsLines<T, Fn, LL128Format>;

}  // namespace mncl::dev
