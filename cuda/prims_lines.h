// LL and LL128: protocols whose flags travel inside the data lines.
//
// The receiver spins on each line until its flag is the one of the step it expects
// (Format::flagOf(step), never 0: the FIFO starts zeroed). A connection's step counter is
// shared by all protocols and only grows, so a line left over from an earlier step, an
// earlier lap of the FIFO or an earlier operation does not carry the flag being waited for:
// LL128's 64-bit flag is the step + 1 itself; LL's 32-bit one comes back after 2^32 - 1
// steps (tens of minutes of back-to-back small calls), as NCCL's LL flag does, and matches
// only a line that no step since has written. The sender still waits for the receiver's head
// before reusing a slot, so it never overwrites a line that has not been read.
//
//   LL    16-byte line = data(4) flag(4) data(4) flag(4); each half carries its own copy of
//         the flag, so no fence is needed (a GPU stores the line with one 16-byte store, a
//         CPU with one 8-byte store per half): lowest latency, half the bytes are payload.
//   LL128 128-byte line = 120 data bytes + an 8-byte flag in the last word: ~94% payload. On a
//         GPU eight lanes of a warp share a line, 16 bytes each (the eighth: 8 data bytes and
//         the flag), so one store instruction of a warp fills four whole lines. The lanes
//         store their data, sync, and the flag lanes fence once and store the flags; the
//         reader's flag lanes acquire the flags, the warp syncs, then every lane reads its
//         part. (NCCL skips both fences, trusting that a warp's 128-byte store arrives whole;
//         the memory model does not promise that.) On a CPU one thread writes all 15 data
//         words, then the flag with a release store.
//
// Each step tells the receiver which call it belongs to (StepInfo, checked before its data is
// used). LL carries it in the slot's first two lines, flagged like data: no fence on either
// side, and the receiver's thread with the first data line polls them in the same loop.
// LL128 writes it to the connection's control block and fences before the lines.
//
// Each thread keeps kLinesInFlight lines per peer in flight: their loads are issued together,
// so a step costs about one memory latency per pass, not one per line.
#pragma once

#include "pack.h"
#include "prims.h"

namespace mncl::dev {

// A CPU thread runs ahead on its own (out-of-order execution, prefetchers): more lines per
// pass measured slower there (LL at 2 KiB-512 KiB, 2 ranks: 5-15%).
#if MNCL_SIMT
constexpr int kLinesInFlight = 4;
#else
constexpr int kLinesInFlight = 1;
#endif

struct LLFormat {
  using Line = LLLine;
  static constexpr Proto kProto = Proto::ll;
  static constexpr int kLinePayloadBytes = 8;
  static constexpr int kLanes = 1;      // threads sharing a line
  static constexpr int kPartBytes = 8;  // payload one lane carries
  static constexpr bool kSeparateFlag = false;
  static constexpr int kHeaderLines = kLLHeaderLines;  // the StepInfo, flagged
  MNCL_DEV static Line* lines(const ConnFifo& f) { return f.ll; }
  MNCL_DEV static uint32_t slotLines(const ProtoSizes& s) { return s.llSlotLines; }
  MNCL_DEV static int dataWords(int /*lane*/) { return 1; }
  using Flag = uint32_t;
  MNCL_DEV static Flag flagOf(uint64_t step) { return (Flag)(step % 0xffffffffull) + 1; }

  template <typename P>
  MNCL_DEV static void writePart(Line* l, int /*lane*/, const P& p, Flag flag) {
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

  // Reads the line if it carries `flag` (data and flags arrive in one load).
  template <typename P>
  MNCL_DEV static bool tryRead(const Line* l, P& p, Flag flag) {
    uint64_t lo, hi;
#if defined(__CUDACC__)
    asm volatile("ld.volatile.global.v2.u64 {%0,%1}, [%2];" : "=l"(lo), "=l"(hi) : "l"(l->w) : "memory");
#else
    lo = loadAcquire(&l->w[0]);
    hi = loadAcquire(&l->w[1]);
#endif
    if ((Flag)(lo >> 32) != flag || (Flag)(hi >> 32) != flag) return false;
    p.w[0] = (lo & 0xffffffffull) | (hi << 32);
    return true;
  }
};

struct LL128Format {
  using Line = LL128Line;
  static constexpr Proto kProto = Proto::ll128;
  static constexpr int kLinePayloadBytes = kLL128DataWords * 8;
#if MNCL_SIMT
  static constexpr int kLanes = 8;
#else
  static constexpr int kLanes = 1;
#endif
  static constexpr int kPartWords = kLL128Words / kLanes - (kLanes == 1 ? 1 : 0);
  static constexpr int kPartBytes = kPartWords * 8;
  static constexpr int kFlagLane = kLanes - 1;  // its part ends just before the flag word
  static constexpr bool kSeparateFlag = true;
  static constexpr int kHeaderLines = 0;  // the StepInfo goes to ConnCtrl::info
  MNCL_DEV static Line* lines(const ConnFifo& f) { return f.ll128; }
  MNCL_DEV static uint32_t slotLines(const ProtoSizes& s) { return s.ll128SlotLines; }
  using Flag = uint64_t;
  MNCL_DEV static Flag flagOf(uint64_t step) { return step + 1; }

  // Data words of a lane's part: the flag lane has one less on a GPU.
  MNCL_DEV static int dataWords(int lane) {
    int w = kLL128DataWords - lane * kPartWords;
    return w < kPartWords ? w : kPartWords;
  }

  template <typename P>
  MNCL_DEV static void writePart(Line* l, int lane, const P& p, Flag /*see publish*/) {
    uint64_t* w = l->w + lane * kPartWords;
#if defined(__CUDACC__)
    static_assert(kPartWords == 2, "a GPU lane stores 16 bytes");
    if (lane != kFlagLane) {
      asm volatile("st.volatile.global.v2.u64 [%0], {%1,%2};" ::"l"(w), "l"(p.w[0]), "l"(p.w[1]) : "memory");
    } else {
      asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(w), "l"(p.w[0]) : "memory");
    }
#else
    memcpy(w, p.w, dataWords(lane) * 8);  // one lane on a CPU: 120 bytes, a constant
#endif
  }

  // The flag lane, after every lane's writePart of these lines (and a fence on the GPU).
  MNCL_DEV static void publish(Line* l, Flag flag) {
#if defined(__CUDACC__)
    storeRelaxed(&l->w[kLL128DataWords], flag);
#else
    storeRelease(&l->w[kLL128DataWords], flag);
#endif
  }

  // GPU: a relaxed load, so that a pass's polls are in flight together (acquires would go one
  // after another); the flag lane fences once when all are up. CPU: an acquire.
  MNCL_DEV static bool flagIs(const Line* l, Flag flag) {
#if defined(__CUDACC__)
    return loadRelaxed(&l->w[kLL128DataWords]) == flag;
#else
    return loadAcquire(&l->w[kLL128DataWords]) == flag;
#endif
  }

  // After the flag lane saw the flag (and, on the GPU, the warp synced).
  template <typename P>
  MNCL_DEV static void readPart(const Line* l, int lane, P& p) {
    const uint64_t* w = l->w + lane * kPartWords;
#if defined(__CUDACC__)
    // The flag lane loads the flag word along with its data word: one instruction for all.
    asm volatile("ld.volatile.global.v2.u64 {%0,%1}, [%2];" : "=l"(p.w[0]), "=l"(p.w[1]) : "l"(w) : "memory");
#else
    memcpy(p.w, w, dataWords(lane) * 8);
#endif
  }
};

template <typename T, typename Fn, typename Format>
class PrimsLines : public PrimsVocabulary<PrimsLines<T, Fn, Format>, T> {
  using P = Pack<T, Format::kPartBytes>;
  using Line = typename Format::Line;
  static constexpr int kLanes = Format::kLanes;
  static constexpr int kU = kLinesInFlight;
  using Flag = typename Format::Flag;
  static constexpr size_t kLineElems = Format::kLinePayloadBytes / sizeof(T);
  static constexpr size_t kPartElems = Format::kPartBytes / sizeof(T);

  // The lines one thread works on in one pass of a step, and its part of each.
  struct Pass {
    size_t line[kU];
    bool active[kU];  // the line is part of the step (the last pass may be partly empty)
    size_t first[kU];  // the part's first element in the caller's buffers
    int elems[kU];     // its elements there (0 past the end)
  };

 public:
  MNCL_DEV PrimsLines(PrimsContext<Fn> cx, PeerSet recvPeers, PeerSet sendPeers)
      : cx_(cx), recv_(recvPeers), send_(sendPeers) {}

  MNCL_DEV size_t stepElems() const {
    return (size_t)(Format::slotLines(cx_.ch.sizes) - Format::kHeaderLines) * kLineElems;
  }

  // On a CPU a pass is one line: sending and waiting line by line would make the two ranks
  // wait for each other at every line, where a step sent whole, then received, streams.
  static constexpr bool kSendsInputInPass = MNCL_SIMT != 0;

  // kind.sendInput: each pass first sends this rank's input (src) to the send peers, then
  // waits for the receive peers' lines and reduces (sendRecvReduceCopy): one step for what is
  // otherwise a send step and a receive step.
  template <typename Kind>  // StepKind, or a FixedStepKind (see stepKind)
  MNCL_DEV_STEP void genericOp(Kind kind, const T* src, T* dst, size_t n, bool finish) {
    [[maybe_unused]] DevChannel& ch = cx_.ch;  // (for MNCL_TRACE only)
    if (tid() == 0 && kind.send) {
      waitSendAndAnnounce();
      MNCL_TRACE(ch, kTraceAnnounced);
    }
    if (barrierAny(cx_.waiter.aborted)) {  // thread 0's verdict holds for the whole channel
      cx_.waiter.aborted = true;
      return;
    }
    const int lane = tid() % kLanes;
    const size_t nlines = (n + kLineElems - 1) / kLineElems;
    const size_t linesPerPass = kU * (size_t)(nthreads() / kLanes);
    // A step of this rank's input sent in place (an in-place broadcast root's) leaves the
    // output as it is: it holds those values already, and the root may only read it (the
    // caller's read-only memory; Simple's reduceCopy skips it the same way).
    T* out = !kind.recv && src == dst && !Fn::kHasPre && !(finish && Fn::kHasPost) ? nullptr : dst;
    // The loop bound is the same for every thread, so a warp's lanes stay together.
    for (size_t base = 0; base < nlines && !cx_.waiter.aborted; base += linesPerPass) {
      const Pass ps = planPass(base, lane, n, nlines);
      P input[kU];  // (kind.sendInput)
      if (kind.sendInput) {
        for (int u = 0; u < kU; ++u) {
          loadPackPrefix(input[u], src + ps.first[u], ps.elems[u]);
          prePack(cx_.fn, input[u]);
        }
        writeLines(ps, lane, input);
        if (base == 0) MNCL_TRACE(ch, kTraceLinesWritten);
      }
      P v[kU];  // the value so far
      reduceSources(kind, ps, lane, src, input, v, base == 0);
      // Thread 0 (LL128: a warp) checked the peers' StepInfo with the first lines; if a peer
      // runs another call, no thread stores any of this step: the caller's buffer stays as it was.
      if (kind.recv && base == 0 && barrierAny(cx_.waiter.aborted)) cx_.waiter.aborted = true;
      if (cx_.waiter.aborted) break;
      for (int u = 0; u < kU; ++u) {
        if (finish) postPack(cx_.fn, v[u]);
        if (out && ps.elems[u] > 0) storePackPrefix(v[u], out + ps.first[u], ps.elems[u]);
      }
      if (kind.send && !kind.sendInput) {
        writeLines(ps, lane, v);
        if (base == 0) MNCL_TRACE(ch, kTraceLinesWritten);
      }
    }
    barrier();
    if (tid() == 0 && !cx_.waiter.aborted) endStep(kind, nlines);
    barrier();
    MNCL_TRACE(ch, kTraceStepDone);
  }

 private:
  // This pass's value of every source into v: this rank's input (src, at its place among the
  // receive peers), then each peer's lines. Stops early (waiter.aborted) if a wait stopped or
  // a peer runs another call.
  template <typename Kind>
  MNCL_DEV void reduceSources(Kind kind, const Pass& ps, int lane, const T* src, const P* input, P* v, bool firstPass) {
    P t[kU];  // the next source's packs
    bool have = false;
    for (int r = 0; r <= (kind.recv ? recv_.n : 0); ++r) {
      if (r == (kind.recv ? recv_.srcPos : 0) && src) {
        accumulate(v, t, have, [&](P* into) {
          for (int u = 0; u < kU; ++u) {
            if (kind.sendInput) into[u] = input[u];
            else {
              loadPackPrefix(into[u], src + ps.first[u], ps.elems[u]);
              prePack(cx_.fn, into[u]);
            }
          }
          return true;
        });
      }
      if (!kind.recv || r == recv_.n) continue;
      int peer = recv_.peer[r];
      if (!accumulate(v, t, have, [&](P* into) { return readLines(peer, ps, lane, into); })) return;
      if (firstPass) MNCL_TRACE(cx_.ch, kTraceLinesSeen);
      if (Format::kHeaderLines == 0 && firstPass && !checkFirstLine(peer)) return;  // (LL: in readLines)
      if (firstPass) MNCL_TRACE(cx_.ch, kTraceInfoChecked);
    }
  }

  // Thread 0, once every thread is done with the step: frees the receive slots, and counts
  // the send steps (a proxied connection's is announced to its proxy).
  template <typename Kind>
  MNCL_DEV void endStep(Kind kind, size_t nlines) {
    DevChannel& ch = cx_.ch;
    if (kind.recv) {
      for (int r = 0; r < recv_.n; ++r) {
        int peer = recv_.peer[r];
        storeFlag(&ch.recvFrom[peer].ctrl->head, ++ch.recvStep[peer]);  // only frees the slot
        ring(ch.recvFrom[peer].ctrl->bell);
      }
    }
    if (kind.send) {
      for (int s = 0; s < send_.n; ++s) {
        int peer = send_.peer[s];
        ++ch.sendStep[peer];
        if (ch.sendTo[peer].proxied) announceToProxy(ch.sendTo[peer], ch.sendStep[peer], nlines);
        ring(ch.sendTo[peer].ctrl->bell);  // (its lines are all written)
      }
    }
  }

  // This thread's lines in the pass starting at line `base`, and its part of each.
  MNCL_DEV Pass planPass(size_t base, int lane, size_t n, size_t nlines) const {
    const size_t linesPerRow = (size_t)(nthreads() / kLanes);  // lines one u of a pass covers
    const size_t partCap = (size_t)Format::dataWords(lane) * 8 / sizeof(T);  // elements a part holds
    Pass ps;
    for (int u = 0; u < kU; ++u) {
      ps.line[u] = base + u * linesPerRow + tid() / kLanes;
      ps.active[u] = ps.line[u] < nlines;
      ps.first[u] = ps.line[u] * kLineElems + lane * kPartElems;
      size_t left = ps.active[u] && ps.first[u] < n ? n - ps.first[u] : 0;
      ps.elems[u] = (int)(left < partCap ? left : partCap);
    }
    return ps;
  }

  // After the first lines of a step from `peer`: the sender published its StepInfo before
  // them, so thread 0 checks it. False (for a whole warp at once) if the peer runs another call.
  MNCL_DEV bool checkFirstLine(int peer) {
    DevChannel& ch = cx_.ch;
    if (tid() == 0) {
      fenceFor(ch.systemScope);
      checkStepInfo(cx_, peer, ch.recvFrom[peer].ctrl->info[ch.recvStep[peer] % kSteps]);
    }
    if (kLanes > 1) cx_.waiter.aborted = anyLanes(cx_.waiter.aborted);  // the warp stays together
    return !cx_.waiter.aborted;
  }

  // Takes the next source's packs through `fill`: the first source fills v itself, a later
  // one the scratch t, which is reduced into v (no pack is ever copied whole).
  template <typename Fill>
  MNCL_DEV bool accumulate(P* v, P* t, bool& have, Fill fill) {
    if (!have) {
      have = true;
      return fill(v);
    }
    if (!fill(t)) return false;
    for (int u = 0; u < kU; ++u) reducePack(cx_.fn, v[u], t[u]);
    return true;
  }

  // The slot of `step`: its header lines (LL), then its data lines.
  MNCL_DEV Line* headerOf(const ConnFifo& f, uint64_t step) const {
    return Format::lines(f) + (step % kSteps) * Format::slotLines(cx_.ch.sizes);
  }
  MNCL_DEV Line* slotOf(const ConnFifo& f, uint64_t step) const { return headerOf(f, step) + Format::kHeaderLines; }

  struct Word {  // a header line's payload, as writePart and tryRead take it
    uint64_t w[1];
  };

  // Waits for this pass's lines from `peer` and reads this lane's part of each.
  MNCL_DEV bool readLines(int peer, const Pass& ps, int lane, P* x) {
    DevChannel& ch = cx_.ch;
    const Line* slot = slotOf(ch.recvFrom[peer], ch.recvStep[peer]);
    Flag flag = Format::flagOf(ch.recvStep[peer]);
    if constexpr (Format::kSeparateFlag) {
      auto flagsUp = [&] {  // no early return: the loads do not wait for each other
        bool up = true;
        for (int u = 0; u < kU; ++u) {
          bool mine = ps.active[u] && lane == Format::kFlagLane;
          up &= !mine || Format::flagIs(slot + ps.line[u], flag);
        }
        return up;
      };
      bool ok = kLanes > 1 ? cx_.waiter.untilAllLanes(flagsUp) : cx_.waiter.until(flagsUp, &ch.recvFrom[peer].ctrl->bell);
      if (!ok) return false;
      if (lane == Format::kFlagLane) fenceFor(ch.systemScope);  // GPU: with the flag loads, an acquire
      syncLanes();  // the flag lanes' acquires come before every lane's reads
      for (int u = 0; u < kU; ++u) {
        if (ps.active[u]) Format::readPart(slot + ps.line[u], lane, x[u]);
      }
      return true;
    } else {
      if (ps.active[0] && ps.line[0] == 0) return readFirstLines(peer, ps, x, slot, flag);
      unsigned got = 0;  // lines read, by u
      return cx_.waiter.until(
          [&] {
            bool all = true;
            for (int u = 0; u < kU; ++u) {
              if (!ps.active[u] || (got >> u & 1u)) continue;
              if (Format::tryRead(slot + ps.line[u], x[u], flag)) got |= 1u << u;
              else all = false;
            }
            return all;
          },
          &ch.recvFrom[peer].ctrl->bell);
    }
  }

  // LL: readLines for the thread with the step's first line, which polls the header lines in
  // the same loop and checks the StepInfo they carry. (Apart, so that the loop every other
  // pass runs stays as small as it was: on a CPU a pass is one line.)
  MNCL_DEV bool readFirstLines(int peer, const Pass& ps, P* x, const Line* slot, Flag flag) {
    const Line* head = slot - Format::kHeaderLines;
    Word h[Format::kHeaderLines];
    unsigned got = 0;  // lines read: bit u, then bit kU + i for header line i
    bool ok = cx_.waiter.until([&] {
      bool all = true;
      for (int u = 0; u < kU; ++u) {
        if (!ps.active[u] || (got >> u & 1u)) continue;
        if (Format::tryRead(slot + ps.line[u], x[u], flag)) got |= 1u << u;
        else all = false;
      }
      for (int i = 0; i < Format::kHeaderLines; ++i) {
        if (got >> (kU + i) & 1u) continue;
        if (Format::tryRead(head + i, h[i], flag)) got |= 1u << (kU + i);
        else all = false;
      }
      return all;
    }, &cx_.ch.recvFrom[peer].ctrl->bell);
    if (!ok) return false;
    StepInfo info;
    for (int i = 0; i < Format::kHeaderLines; ++i) memcpy(reinterpret_cast<char*>(&info) + 8 * i, h[i].w, 8);
    return checkStepInfo(cx_, peer, info);
  }

  // Writes this pass's lines to every peer we send to; LL128 then publishes their flags.
  MNCL_DEV void writeLines(const Pass& ps, int lane, const P* v) {
    DevChannel& ch = cx_.ch;
    for (int s = 0; s < send_.n; ++s) {
      int peer = send_.peer[s];
      Line* slot = slotOf(ch.sendTo[peer], ch.sendStep[peer]);
      Flag flag = Format::flagOf(ch.sendStep[peer]);
      for (int u = 0; u < kU; ++u) {
        if (ps.active[u]) Format::writePart(slot + ps.line[u], lane, v[u], flag);
      }
    }
    if constexpr (Format::kSeparateFlag) {
      syncLanes();  // every lane's data before the flag lane's fence
      if (lane != Format::kFlagLane) return;
      fenceFor(ch.systemScope);  // GPU: the data words before the flags (CPU: the flags are releases)
      for (int s = 0; s < send_.n; ++s) {
        int peer = send_.peer[s];
        Line* slot = slotOf(ch.sendTo[peer], ch.sendStep[peer]);
        for (int u = 0; u < kU; ++u) {
          if (ps.active[u]) Format::publish(slot + ps.line[u], Format::flagOf(ch.sendStep[peer]));
        }
      }
    }
  }

  // A proxied connection (the network): the step's lines are all written (a CPU channel is
  // one thread); its line count and protocol, then the tail, tell the proxy to send them.
  MNCL_DEV static void announceToProxy(const ConnFifo& f, uint64_t sent, size_t nlines) {
    int s = (int)((sent - 1) % kSteps);
    f.ctrl->stepLength[s] = (uint32_t)nlines;
    f.ctrl->stepProto[s] = (uint32_t)Format::kProto;
    storeRelease(&f.ctrl->tail, sent);
  }

  // Waits until every send slot is free, then writes this step's StepInfo: LL into the slot's
  // header lines, LL128 into the control block, fenced before any line (its data stores are
  // not releases).
  MNCL_DEV void waitSendAndAnnounce() {
    DevChannel& ch = cx_.ch;
    StepInfo info = cx_.work.info();
    for (int s = 0; s < send_.n; ++s) {
      int peer = send_.peer[s];
      if (!cx_.waiter.until([&] { return sendSlotFree(ch, peer); }, &ch.sendTo[peer].ctrl->bell)) return;
      uint64_t step = ch.sendStep[peer];
      if constexpr (Format::kHeaderLines > 0) {
        static_assert(sizeof(StepInfo) == 8 * Format::kHeaderLines, "a header line carries 8 bytes");
        Line* head = headerOf(ch.sendTo[peer], step);
        for (int i = 0; i < Format::kHeaderLines; ++i) {
          Word w;
          memcpy(w.w, reinterpret_cast<const char*>(&info) + 8 * i, 8);
          Format::writePart(head + i, 0, w, Format::flagOf(step));
        }
      } else {
        ch.sendTo[peer].ctrl->info[step % kSteps] = info;
      }
    }
    if constexpr (Format::kHeaderLines == 0) fenceFor(ch.systemScope);
  }

  PrimsContext<Fn> cx_;
  PeerSet recv_, send_;
};

template <typename T, typename Fn>
using PrimsLL = PrimsLines<T, Fn, LLFormat>;
template <typename T, typename Fn>
using PrimsLL128 = PrimsLines<T, Fn, LL128Format>;

}  // namespace mncl::dev
