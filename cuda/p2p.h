// Point-to-point: a group of sends and receives, progressed together so that no order of
// calls across ranks can deadlock (rank A sending to B while B sends to A, alltoall, pipeline
// stages exchanging activations and gradients). Each pass tries one step of every op whose
// connection is ready and never blocks on one op while another could move.
//
// Simple protocol. Every op moves at least one step, even with zero bytes, and every step
// says the whole op's byte count and type, so a receiver whose recv does not match the
// peer's send stops before writing anything. Each step also says its own length
// (ConnCtrl::stepLength), which the sender chooses.
//
// Pointer steps (CPU): a big step may post the address of the sender's data instead of a
// copy of it (ConnCtrl::dataAt); the receiver takes the step, swapping the address for
// kPointerTaken, and copies straight from the sender's buffer (the same process, its window,
// or a kernel copy from its process): one copy instead of two. A send still completes
// without its receiver: when the group ends, the steps nobody took go into their FIFO slots
// after all, as they would have without pointers (see settlePointerSteps). A receiver says
// when it has started its recv (it publishes its buffer, as collectives do for direct
// writes); from then on the sender's pointer steps may be longer than a slot, since they will
// be taken: the rest of the op goes as one step. The receiver reads it in one go, or, while
// it has sends of its own to post, in pieces (DevChannel::pointerReadBytes). That is for a
// sender that receives too; one longer than a slot, which its receiver reads through the
// kernel, waits for the receiver to start while the group has recvs to move (slot-long
// steps would cost a kernel read each), and posts slot-long steps only once they are done.
// A sender with nothing else to do keeps the FIFO until its receiver has started, then
// splits the bytes with it (see sendVerdict).
#pragma once

#include "prims.h"
#include "steps.h"

namespace mncl::dev {

// The most channel ops one GPU launch of a group's sends and receives holds: they travel as
// its kernel argument (GpuP2pWorks, 4 KiB).
constexpr int kMaxGpuP2pOps = 56;

struct P2pOp {
  bool isSend;
  bool pointerSteps;    // a send may go as pointer steps and direct writes (see planP2pOps)
  // Thread 0's progress (bits, so that an op stays 64 bytes: see kMaxGpuP2pOps).
  bool started : 1;     // it has begun: firstStep is set (and a recv's buffer published)
  bool moved : 1;       // it moved a step (a zero-byte op moves one)
  bool midStep : 1;     // recv: reading a pointer step in pieces (stepAt, stepLen: the rest)
  bool written : 1;     // the step is a direct write: the sender put it in the receiver's buffer
  DataType dtype;
  int peer;
  char* buf;            // this channel's share of the user buffer
  uint64_t bytes;       // this channel's share
  uint64_t totalBytes;  // the whole op, for the match check
  int32_t tag;          // the caller's (0 by default), which the match check compares too
  // The step thread 0 let go: its length, and a send's posted address or where a recv's
  // data lies (0: in the FIFO slot).
  uint32_t stepLen;
  uint64_t stepAt;
  uint64_t done;        // bytes moved
  uint64_t firstStep;   // the connection's step count when the op started

  MNCL_HOSTDEV bool finished() const { return moved && done == bytes; }
};
static_assert(sizeof(P2pOp) == 64, "kMaxGpuP2pOps ops must fit a kernel's 4 KiB of arguments");

struct P2pEngine {
  DevChannel& ch;
  Waiter& waiter;
  DevError* error;
  // This channel receives in this group too (thread 0): its sends may go as pointer steps.
  bool receivesToo = false;
  int opsLeft = 0;        // the group's unfinished ops
  int sendsLeft = 0;      // ... of them sends
  bool recvsLeft = false; // ... some of them recvs (as this pass began)
  bool opsGrouped = false;  // each connection's ops lie together (see blockedByEarlier)
  uint64_t readLongest = kLongestRead;  // the most the next pointer-step read takes (movePass)

  MNCL_HOSTDEV static StepInfo infoOf(const P2pOp& op) {
    StepInfo s{};
    s.count = op.totalBytes;
    s.coll = (uint8_t)Coll::sendrecv;
    s.dtype = (uint8_t)op.dtype;
    s.root = op.tag;  // (a send/recv has no root: its step carries the tag there)
    return s;
  }

  // Runs ops[0..n) to completion; returns false if aborted or mismatched. On a GPU every
  // thread of the block runs it on the same ops (in shared memory): thread 0 looks at a
  // connection and decides, a barrier shares the verdict, every thread copies, thread 0
  // posts the step and advances the op. (On the CPU the barriers cost nothing.)
  MNCL_DEV bool run(P2pOp* ops, int n) {
    if (tid() == 0) {
      for (int i = 0; i < n; ++i) {
        ops[i].started = ops[i].moved = ops[i].midStep = ops[i].written = false;
        ops[i].done = 0;
        receivesToo |= !ops[i].isSend;
      }
    }
    opsGrouped = groupedByConnection(ops, n);
    barrier();
    bool ok = runOps(ops, n);
    if (tid() == 0) {
      if (ch.pointerStepsPosted) settlePointerSteps(ops, n);
      // Stopped early: take back our published buffers, so that no sender goes on reading
      // into them, or counting on us to take its steps.
      for (int i = 0; !ok && i < n; ++i) {
        if (!ops[i].isSend && ops[i].started) retractOutput(ch, ops[i].peer);
      }
    }
    barrier();
    return ok && !waiter.aborted;
  }

 private:
  enum class Verdict { wait, go, mismatch };

  MNCL_DEV bool runOps(P2pOp* ops, int n) {
    opsLeft = n;
    sendsLeft = 0;
    for (int i = 0; i < n; ++i) sendsLeft += ops[i].isSend ? 1 : 0;
    uint32_t idle = 0;
    while (opsLeft > 0) {
      // Recvs publish their buffers first, then sends post, then recvs read: a peer waiting
      // for our step must not wait for our reads as well (a pass that read 1 MiB before
      // posting its send made a 2-rank exchange take twice as long, the two reads one after
      // the other), and our sends go as soon as their receivers have started.
      if (tid() == 0) {
        for (int i = 0; i < n; ++i) {
          if (!ops[i].isSend && !ops[i].started && !blockedByEarlier(ops, i)) startRecv(ops[i]);
        }
      }
      bool moved = false;
      recvsLeft = unfinished(false);
      if (!movePass<true>(ops, n, &moved) || !movePass<false>(ops, n, &moved)) return false;
      if (moved) {
        idle = 0;
        continue;
      }
      bool look = idle % kSpinsPerAbortCheck == kSpinsPerAbortCheck - 1;
      if (barrierAny(tid() == 0 && look && loadRelaxed(waiter.abortFlag) != 0)) {
        waiter.aborted = true;
        return false;
      }
      idleWait(ops, n, idle++);
    }
    return true;
  }

  // A pass moved nothing: wait a little before the next (Waiter::backoff). On a CPU, where
  // the group waits on one connection only (a recv for its data, a send for a free slot),
  // its sleeps are on that connection's doorbell: the peer's post wakes it at once, where a
  // timer's sleep beside a busy process wakes it ~50 us late (the timer's slack).
  MNCL_DEV void idleWait(const P2pOp* ops, int n, uint32_t idle) {
#if MNCL_CPU_DOORBELLS
    if (!waiter.progress) {  // (a thread moving network steps must keep polling them)
      int64_t ns = cpuBackoffStep(idle, waiter.spinBudget);
      if (ns == 0) return;
      if (const P2pOp* op = onlyAwaited(ops, n)) {
        AwaitedOp awaited{this, op};
        ConnFifo& f = op->isSend ? ch.sendTo[op->peer] : ch.recvFrom[op->peer];
        cpuSleepOn(f.ctrl->bell, ns, AwaitedOp::mayMove, &awaited);
      } else {
        cpuSleep(ns);
      }
      cpuSlept();
      return;
    }
#endif
    waiter.backoff(idle);
  }

#if MNCL_CPU_DOORBELLS
  // The group's one op that waits, if only one does (an op behind another on its connection
  // waits for that one). A lone send waits for a free slot: one that waits for its receiver
  // to start does so only while recvs are left (sendVerdict), and they wait too.
  const P2pOp* onlyAwaited(const P2pOp* ops, int n) const {
    const P2pOp* awaited = nullptr;
    for (int i = 0; i < n; ++i) {
      if (ops[i].finished() || blockedByEarlier(ops, i)) continue;
      if (awaited) return nullptr;
      awaited = &ops[i];
    }
    return awaited;
  }

  struct AwaitedOp {
    P2pEngine* engine;
    const P2pOp* op;
    // Whether its next step may go now: what it waited for came (checked after the sleeper
    // counts itself on the bell, so that a post in between is not missed).
    static bool mayMove(void* arg) {
      auto* a = static_cast<AwaitedOp*>(arg);
      DevChannel& ch = a->engine->ch;
      int peer = a->op->peer;
      if (a->op->isSend) return sendSlotFree(ch, peer);
      return a->op->midStep || loadAcquire(&ch.recvFrom[peer].ctrl->tail) > ch.recvStep[peer];
    }
  };
#endif

  // One step of every ready send (or recv) op; false if aborted or mismatched. (A template,
  // so that the recv pass's call to the send pass is no recursion: a GPU's stack size is
  // checked at init from each kernel's frame, which cannot count a recursion's depth.)
  template <bool sends>
  MNCL_DEV bool movePass(P2pOp* ops, int n, bool* moved) {
    for (int i = 0; i < n; ++i) {
      P2pOp& op = ops[i];
      if (op.isSend != sends || op.finished() || blockedByEarlier(ops, i)) continue;
      Verdict v = Verdict::wait;
      if (tid() == 0) v = op.isSend ? sendVerdict(op) : recvVerdict(op);
      if (barrierAny(v == Verdict::mismatch)) {
        waiter.aborted = true;
        return false;
      }
      if (!barrierAny(v == Verdict::go)) continue;
      if (!sends && op.stepAt != 0 && !op.written) {
        // About to read a sender's memory: first post what our sends can (our receiver may
        // have started since the sends' pass: a peer publishes its buffer, then posts).
        if (unfinished(true) && !movePass<true>(ops, n, moved)) return false;
        readLongest = unfinished(true) ? ch.pointerReadBytes : kLongestRead;
      }
      if (!moveStep(op)) return false;
      *moved = true;
      if (op.finished()) {
        --opsLeft;
        sendsLeft -= op.isSend ? 1 : 0;
      }
    }
    return true;
  }

  // Some send has bytes left to post (or some recv bytes left to read).
  MNCL_DEV bool unfinished(bool sends) const { return sends ? sendsLeft > 0 : opsLeft > sendsLeft; }

  // Ops on the same connection (peer and direction) run in the order they were issued. An op
  // waits for the one before it on its connection only (that one waited for its own). Where
  // the ops are grouped by connection, that is the op just before; else (a GPU launch's,
  // kMaxGpuP2pOps at most) a scan finds it. (A pass over thousands of ops to one peer
  // scanned them all for each: a group of 2000 sends and 2000 receives took seconds.)
  MNCL_DEV bool blockedByEarlier(const P2pOp* ops, int i) const {
    if (opsGrouped) return i > 0 && sameConnection(ops[i - 1], ops[i]) && !ops[i - 1].finished();
    for (int j = 0; j < i; ++j) {
      if (!ops[j].finished() && sameConnection(ops[j], ops[i])) return true;
    }
    return false;
  }

  MNCL_HOSTDEV static bool sameConnection(const P2pOp& a, const P2pOp& b) {
    return a.peer == b.peer && a.isSend == b.isSend;
  }

  // Whether ops[0..n) are in connectionOrder (the CPU's host puts them so: groupP2pOps):
  // then each connection's ops lie together.
  MNCL_DEV bool groupedByConnection(const P2pOp* ops, int n) const {
    for (int i = 1; i < n; ++i) {
      if (connectionOrder(ops[i], ch.rank, ch.nranks) < connectionOrder(ops[i - 1], ch.rank, ch.nranks)) return false;
    }
    return true;
  }

 public:
  // An op's place when a group's ops are grouped by connection: by peer from the next rank
  // on (as the ranks of an alltoall go), each peer's recvs before its sends.
  MNCL_HOSTDEV static int64_t connectionOrder(const P2pOp& op, int rank, int nranks) {
    return 2 * (int64_t)((op.peer - rank + nranks) % nranks) + (op.isSend ? 1 : 0);
  }

 private:
  MNCL_DEV char* slot(const ConnFifo& f, uint64_t step) const {
    return f.simpleSlot(step, ch.sizes);
  }

  // Thread 0: may this send fill its next slot (the receiver has freed it)? If so, how long
  // the step is and how it goes (op.stepLen; op.stepAt: 0 through the slot, else the
  // address of a pointer step, or of a direct write if op.written).
  //
  // - A sender that receives too (its core has copies of its own to make) posts pointer
  //   steps: the rest of the op as one, once the receiver has started.
  // - A sender with nothing else to do fills FIFO slots while the receiver empties them: two
  //   cores on every byte beat one (64 MiB between 2 processes: 5.8 ms against 9.4 by pointer
  //   steps). Once the receiver has started, they split the bytes instead: every other step
  //   the sender writes straight into the receiver's buffer, the others it posts as pointers.
  MNCL_DEV Verdict sendVerdict(P2pOp& op) const {
    if (!op.started) {  // where the op starts, to know a publication meant for it
      op.firstStep = ch.sendStep[op.peer];
      op.started = true;
    }
    if (!sendSlotFree(ch, op.peer)) return Verdict::wait;
    uint64_t left = op.bytes - op.done, slotBytes = ch.sizes.simpleSlotBytes;
    bool started = receiverStarted(op);
    op.written = false;
    op.stepLen = (uint32_t)minSize(slotBytes, left);
    op.stepAt = 0;
    if (receivesToo) {
      // Before the receiver starts, a pointer step could only be a slot long, and a kernel
      // read per slot costs: 1 MiB read 128 KiB at a time took 91 us here, in one read 62.
      // So a send longer than a slot that its receiver would read through the kernel waits
      // for the receiver instead, then goes as one step, while the group has recvs to move
      // meanwhile. (After them, it fills slots, so that it completes without its receiver, as
      // a FIFO send does. Plain reads of our memory, in this process or our window, cost no
      // such thing; nor does a network proxy's, and its receiver's start is not seen here.)
      if (!started && left > slotBytes && recvsLeft) {
        uint64_t at = pointerFor(op, op.stepLen);
        if (at != 0 && readByKernel(op, at, op.stepLen)) return Verdict::wait;
      }
      uint64_t len = started ? minSize(kLongestStep, left) : op.stepLen;
      op.stepAt = pointerFor(op, len);
      if (op.stepAt != 0) op.stepLen = (uint32_t)len;
    } else if (started && op.pointerSteps) {
      splitStep(op);
    }
    return Verdict::go;
  }

  // An idle sender's step once its receiver has started: odd steps of the op written into
  // the receiver's buffer, even ones posted as pointers (either falls back to the slot where
  // it cannot be done). An eighth of the op, between a slot and a read piece, so that small
  // messages split too.
  MNCL_DEV void splitStep(P2pOp& op) const {
    uint64_t piece = minSize(ch.pointerReadBytes, op.bytes / 8);
    if (piece < ch.sizes.simpleSlotBytes) piece = ch.sizes.simpleSlotBytes;
    uint32_t len = (uint32_t)minSize(piece, op.bytes - op.done);
    if ((ch.sendStep[op.peer] - op.firstStep) % 2 == 1) {
      op.stepAt = directWriteTarget(op, len);
      op.written = op.stepAt != 0;
    } else {
      op.stepAt = pointerFor(op, len);
    }
    if (op.stepAt != 0) op.stepLen = len;
  }

  // Where the next `len` bytes go in the started receiver's buffer, as it addresses it, if we
  // can write there (its process is ours, or through its window or the kernel); else 0.
  MNCL_DEV uint64_t directWriteTarget(const P2pOp& op, size_t len) const {
    const ConnFifo& f = ch.sendTo[op.peer];
    if (len < ch.smallestPointerStep() || !(f.directWrites || f.kernelWrites)) return 0;
    uint64_t there = loadRelaxed(&f.ctrl->outputAt) + op.done;
    if (f.directWrites && f.mappedHere(there, len)) return len >= ch.mappedPointerStepMinBytes ? there : 0;
    return f.kernelWrites && len >= ch.pointerStepMinBytes ? there : 0;
  }

  // Whether the receiver has started the recv this send matches (its buffer is published
  // for the op's first step): then it takes every step we post, whatever its length.
  MNCL_DEV bool receiverStarted(const P2pOp& op) const {
    const ConnCtrl* c = ch.sendTo[op.peer].ctrl;
    return c->outputPublishedFor(op.firstStep, infoOf(op)) && loadRelaxed(&c->outputBytes) == op.bytes;
  }

  // The address to post for a send's next `len` bytes, or 0 to copy them into the slot:
  // pointers only for big steps, which the receiver can read where they are.
  MNCL_DEV uint64_t pointerFor(const P2pOp& op, size_t len) const {
#if MNCL_SIMT
    return 0;  // CPU only: settlePointerSteps copies with one thread
#endif
    if (!op.pointerSteps || len == 0 || len < ch.smallestPointerStep()) return 0;
    const ConnFifo& f = ch.sendTo[op.peer];
    if (f.proxied && op.totalBytes < ch.proxiedPointerMinBytes) return 0;
    auto at = (uintptr_t)(op.buf + op.done);
    if (receiverMaps(ch, f, at, len)) return len >= ch.mappedPointerStepMinBytes ? (uint64_t)at : 0;
    return loadRelaxed(&f.ctrl->readsSenderMemory) && len >= ch.pointerStepMinBytes ? (uint64_t)at : 0;
  }

  // Whether the receiver would read a pointer step at `at` through the kernel: it is in
  // another process and does not map that memory (our window).
  MNCL_DEV bool readByKernel(const P2pOp& op, uintptr_t at, size_t len) const {
    const ConnFifo& f = ch.sendTo[op.peer];
    return f.peerPid != 0 && !f.proxied && !(ch.inWindow(at, len) && loadRelaxed(&f.ctrl->mapsSenderWindow));
  }

  // Thread 0: has this recv's next step arrived, and does the sender's op match ours? If it
  // is a pointer step, takes it (op.stepAt: where to read it), unless the sender took it
  // back first (then it is in the slot).
  MNCL_DEV Verdict recvVerdict(P2pOp& op) {
    if (op.midStep) return Verdict::go;
    ConnCtrl* c = ch.recvFrom[op.peer].ctrl;
    uint64_t step = ch.recvStep[op.peer];
    if (!op.started) startRecv(op);  // (an earlier op on its connection just finished)
    if (loadAcquire(&c->tail) <= step) return Verdict::wait;
    int s = (int)(step % kSteps);
    StepInfo want = infoOf(op), got = c->info[s];
    uint32_t len = c->stepLength[s];
    if (!sameInfo(want, got) || len > op.bytes - op.done) return mismatch(op, want, got);
    op.stepLen = len;
    op.written = c->wroteToReceiver[s] != 0;
    if (op.written) {  // already in our buffer: it must be where the step's data belongs
      op.stepAt = 0;
      return loadRelaxed(&c->dataAt[s]) == (uint64_t)(uintptr_t)(op.buf + op.done) ? Verdict::go : mismatch(op, want, got);
    }
    op.stepAt = take(c, step);
    if (op.stepAt == 0 && len > ch.sizes.simpleSlotBytes) return mismatch(op, want, got);
    return Verdict::go;
  }

  MNCL_DEV Verdict mismatch(const P2pOp& op, const StepInfo& want, const StepInfo& got) const {
    recordError(error, op.peer, [&](DevError& e) {
      e.expected = want;
      e.got = got;
    });
    return Verdict::mismatch;
  }

  // Thread 0: starts a recv, telling its sender where its buffer is (ConnCtrl::outputAt;
  // valid for the op whose first step is op.firstStep).
  MNCL_DEV void startRecv(P2pOp& op) const {
    ConnCtrl* c = ch.recvFrom[op.peer].ctrl;
    op.firstStep = ch.recvStep[op.peer];
    op.started = true;
    c->publishOutput(op.firstStep, (uint64_t)(uintptr_t)op.buf, op.bytes, infoOf(op));
  }

  // Takes step `step` if it is a pointer step: its address, or 0 (in the slot; acquire: the
  // sender may have just put it there and taken the pointer back).
  MNCL_DEV static uint64_t take(ConnCtrl* c, uint64_t step) {
    uint64_t* word = &c->dataAt[step % kSteps];
    uint64_t at = loadAcquire(word);
    return at != 0 && compareExchange(word, at, kPointerTaken) ? at : 0;
  }

  // Every thread copies one step (a recv: at most a piece of a pointer step, so that a long
  // one does not hold up the group's other ops); thread 0 then publishes it and advances the
  // op. False if reading the sender's memory failed, or (a send's step, on a CPU) the
  // communicator was aborted before the step was posted (see Waiter::abortedBeforePost).
  MNCL_DEV bool moveStep(P2pOp& op) {
    uint64_t step = op.isSend ? ch.sendStep[op.peer] : ch.recvStep[op.peer];
    ConnFifo& f = op.isSend ? ch.sendTo[op.peer] : ch.recvFrom[op.peer];
    size_t len = op.stepLen;
    if (op.isSend) {
      if (op.written && !writeDirect(op, len)) return false;
      if (op.stepAt == 0) copyElems(slot(f, step), op.buf + op.done, len);
    } else if (op.written) {
      // (the sender put it in place)
    } else if (op.stepAt == 0) {
      copyElems(op.buf + op.done, slot(f, step), len);
    } else {
      len = minSize(len, readLongest);
      if (!readPointerStep(op, len)) return false;
    }
    barrier();
#if !defined(__CUDACC__)
    if (op.isSend && barrierAny(tid() == 0 && waiter.abortedBeforePost())) return false;
#endif
    if (tid() == 0) {
      if (op.isSend) {
        int s = (int)(step % kSteps);
        f.ctrl->info[s] = infoOf(op);
        f.ctrl->dataAt[s] = op.stepAt;
        f.ctrl->wroteToReceiver[s] = op.written ? 1u : 0u;
        f.ctrl->stepLength[s] = (uint32_t)len;
        f.ctrl->stepProto[s] = (uint32_t)Proto::simple;
        if (f.proxied) {  // (its place in the receiver's buffer, for the proxy to land it there)
          f.ctrl->outputOffset[s] = op.done;
          f.ctrl->opFirstStep[s] = op.firstStep;
        }
        fenceFor(ch.systemScope);  // the step's data and the words above, before the tail
        storeFlag(&f.ctrl->tail, ++ch.sendStep[op.peer]);
        ring(f.ctrl->bell);
        if (op.written) {
          countUp(ch.directWritesSent);
        } else if (op.stepAt != 0) {
          ch.pointerStepsPosted = true;
          countUp(ch.pointerStepsSent);
        }
      } else {
        op.stepLen -= (uint32_t)len;
        op.midStep = op.stepLen > 0;
        if (op.stepAt != 0) op.stepAt += len;
        if (!op.midStep) {
          storeFlag(&f.ctrl->head, ++ch.recvStep[op.peer]);  // only frees the slot
          ring(f.ctrl->bell);
        }
      }
      op.done += len;
      op.moved = true;
    }
    barrier();
    return true;
  }

  // A pointer step's data, from the sender's buffer: in this process, in its window as
  // mapped here, or through the kernel from its process.
  MNCL_DEV bool readPointerStep(const P2pOp& op, size_t len) {
    const ConnFifo& f = ch.recvFrom[op.peer];
    char* dst = op.buf + op.done;
    if (const char* here = f.mappedHere(op.stepAt, len)) {
      copyElems(dst, here, len);
      return true;
    }
    int err = tid() == 0 ? readPeerMemory(f.peerPid, dst, reinterpret_cast<const void*>(op.stepAt), len) : 0;
    return !barrierAny(err != 0) || failPeerCopy(error, waiter, op.peer, err, false);
  }

  // A direct write's data, into the receiver's buffer at op.stepAt (as it addresses it): in
  // this process, in its window as mapped here, or through the kernel into its process.
  MNCL_DEV bool writeDirect(const P2pOp& op, size_t len) {
    const ConnFifo& f = ch.sendTo[op.peer];
    const char* src = op.buf + op.done;
    if (char* here = f.directWrites ? f.mappedHere(op.stepAt, len) : nullptr) {
      copyElems(here, src, len);
      return true;
    }
    int err = tid() == 0 ? writePeerMemory(f.peerPid, reinterpret_cast<void*>(op.stepAt), src, len) : 0;
    return !barrierAny(err != 0) || failPeerCopy(error, waiter, op.peer, err, true);
  }

  // Thread 0 (CPU), when the group's ops are done: a receiver may still be reading the
  // pointer steps posted to it, and the caller may reuse its buffers once we return. Steps it
  // took are waited for (it is copying them), and so are steps longer than a slot (posted
  // only to a receiver that had started, which takes them). The others it has not taken yet
  // are copied into their slots and taken back, so that a send still completes without its
  // receiver, as a FIFO send does.
  MNCL_DEV void settlePointerSteps(const P2pOp* ops, int n) {
    for (int p = 0; p < ch.nranks; ++p) {
      uint64_t sent = ch.sendStep[p], first = firstSendStepOfGroup(ops, n, p);
      if (first == sent) continue;
      // (Steps more than kSteps back were consumed: their slots were used again.)
      if (sent - first > (uint64_t)kSteps) first = sent - kSteps;
      ConnFifo& f = ch.sendTo[p];
      uint64_t readUntil = 0;  // the receiver reads our memory for every step before this
      for (uint64_t s = first; s < sent; ++s) {
        int i = (int)(s % kSteps);
        uint64_t* word = &f.ctrl->dataAt[i];
        uint64_t at = loadAcquire(word);
        // In its slot, written into the receiver's buffer, or consumed.
        if (at == 0 || f.ctrl->wroteToReceiver[i] || loadAcquire(&f.ctrl->head) > s) continue;
        uint32_t len = f.ctrl->stepLength[i];
        if (at != kPointerTaken && len <= ch.sizes.simpleSlotBytes) {
          copyElems(slot(f, s), reinterpret_cast<const char*>(at), len);
          if (compareExchange(word, at, uint64_t{0})) {  // taken back: it reads the slot
            countUp(ch.pointerStepsSent, -1);
            continue;
          }
        }
        readUntil = s + 1;
      }
      waiter.until([&] { return loadAcquire(&f.ctrl->head) >= readUntil; }, &f.ctrl->bell);
    }
    ch.pointerStepsPosted = false;
  }

  // The first step this group sent to peer p (its send count if none).
  MNCL_DEV uint64_t firstSendStepOfGroup(const P2pOp* ops, int n, int p) const {
    for (int i = 0; i < n; ++i) {  // (ops to one peer start in order)
      if (ops[i].isSend && ops[i].peer == p && ops[i].started) return ops[i].firstStep;
    }
    return ch.sendStep[p];
  }

  // The longest step (ConnCtrl::stepLength is 32 bits).
  static constexpr uint64_t kLongestStep = uint64_t{1} << 30;
  static_assert(kLongestStep <= UINT32_MAX);
  // The most a receiver reads of a pointer step at once when it has no sends left to post
  // (with some, DevChannel::pointerReadBytes, so that it soon posts them). One kernel read is
  // cheaper than several (2 processes reading 64 MiB from each other: 11.0 ms in one read,
  // 11.6 in 1 MiB pieces), but it is not interrupted: this bounds how late an abort is seen.
  static constexpr uint64_t kLongestRead = uint64_t{64} << 20;
};

}  // namespace mncl::dev
