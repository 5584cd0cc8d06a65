// Simple protocol: a FIFO of kSteps slots per connection. The sender waits for a free slot
// (head), fills it, then publishes it by bumping tail with release; the receiver waits for
// tail with acquire, consumes the slot, then bumps head. Full bandwidth; each step costs a
// round of flag traffic, so the latency is the highest of the three protocols.
//
// Between ranks that can reach each other's memory (CPUs; ranks of one process on one GPU),
// big steps may be pointer steps: the sender posts the address of data that is already in a
// stable buffer, and the receiver reads it there (see ConnCtrl::dataAt). And a step of final
// output values may be a direct write: the sender writes it straight into the receiver's
// output, which the receiver published (see ConnCtrl::outputAt), and the receiver finds it
// already in place.
#pragma once

#include <chrono>

#include "prims.h"

namespace mncl::dev {

template <typename T, typename Fn>
class PrimsSimple : public PrimsVocabulary<PrimsSimple<T, Fn>, T> {
 public:
  static constexpr bool kSendsInputInPass = false;  // a step's data moves in one piece
  MNCL_DEV PrimsSimple(PrimsContext<Fn> cx, PeerSet recvPeers, PeerSet sendPeers)
      : cx_(cx), recv_(recvPeers), send_(sendPeers) {
    // Every algorithm receives at least one step from each peer it names when its channel
    // has work (rule 3 in prims.h): a publication never belongs to an operation without steps
    // (see outputFromStep).
    if (tid() == 0 && cx_.work.chanCount > 0 && outputsAlike(cx_.work.coll)) {
      for (int i = 0; i < recv_.n; ++i) publishOutput(recv_.peer[i]);
    }
  }

  MNCL_DEV size_t stepElems() const { return cx_.ch.sizes.simpleSlotBytes / sizeof(T); }

  template <typename Kind>  // StepKind, or a FixedStepKind (see stepKind)
  MNCL_DEV_STEP void genericOp(Kind kind, const T* src, T* dst, size_t n, bool finish) {
    DevChannel& ch = cx_.ch;
    const T* srcs[kMaxSrcs];
    T* dsts[kMaxDsts];
    int nsrc = 0, ndst = 0;
    // Thread 0 waits, then decides where this step's data goes; on a GPU every thread takes
    // that one decision from shared memory (the peers' control words it reads may change
    // while the block's threads look at them, and the data must go to one place).
    MNCL_CHANNEL_SHARED(SendPlan, plan);
    if (tid() == 0) {
      bool ready = (!kind.recv || waitRecv()) && (!kind.send || waitSend());
      if (kind.send && ready) plan = planSend(src, dst, n, kind.recv, finish);
    }
    // Only thread 0 waited: if it gave up, every thread must stop here, together.
    if (barrierAny(cx_.waiter.aborted)) {
      cx_.waiter.aborted = true;
      return;
    }
    const T* published = kind.send ? plan.published : nullptr;
    const DirectWrite* written = plan.written;
    // A plain forward (one peer's data to dst) reads the peer's memory straight into dst.
    T* landing = kind.recv && !src && !finish && recv_.n == 1 ? dst : nullptr;
    PreOps<T> pre;  // premulsum: src (this rank's input) and peers' inputs read where they lie
    // The sources in reduction order: our own input goes in before peer i when i is its place
    // (recv_.srcPos), which may be recv_.n (after every peer): hence one pass more than there
    // are peers (without receiving, the one pass takes src alone).
    for (int i = 0; i <= (kind.recv ? recv_.n : 0); ++i) {
      if (i == (kind.recv ? recv_.srcPos : 0) && src) {
        if constexpr (Fn::kHasPre) pre.add(nsrc, cx_.fn.scalar);
        srcs[nsrc++] = src;
      }
      if (kind.recv && i < recv_.n) {
        srcs[nsrc] = received(i, n, landing, nsrc, pre);
        ++nsrc;
      }
    }
    if (cx_.waiter.aborted) return;
    // Outputs first (ours, then receivers'), FIFO slots last. Data already in dst (a sender
    // wrote it there, or an in-place copy) needs no copy to dst.
    bool inPlace = dst && nsrc == 1 && srcs[0] == dst && !(finish && Fn::kHasPost) && pre.mask == 0;
    if (dst && !inPlace) dsts[ndst++] = dst;
    bool ownOutput = ndst > 0;
    for (int i = 0; kind.send && i < send_.n; ++i) {
      if (written[i].here) dsts[ndst++] = written[i].here;
    }
    int outputs = ndst;
    for (int i = 0; kind.send && !published && i < send_.n; ++i) {
      if (!written[i].done()) dsts[ndst++] = slot(ch.sendTo[send_.peer[i]], ch.sendStep[send_.peer[i]]);
    }
    int nStream = streamedOutputs(published, dst, ownOutput, outputs);
    if (nsrc > 0) reduceCopy(cx_.fn, nsrc, srcs, ndst, dsts, n, finish, nStream, Fn::kHasPre ? &pre : nullptr);
    barrier();
    if (kind.send && tid() == 0) writeThroughKernel(dst, n, written);
    if (tid() == 0 && !cx_.waiter.abortedBeforePost()) {  // (only thread 0 writes through the kernel)
      if (kind.recv) postRecv();
      if (kind.send) postSend(published, plan.publishedInput, plan.inputEnd, written, dst, n);
    }
    barrier();
  }

 private:
  // ---- the FIFO protocol: wait for the peers, move the step, post it ----

  struct DirectWrite;  // (with the shortcuts, below)

  // Step `step`'s slot in a connection's FIFO.
  MNCL_DEV T* slot(const ConnFifo& f, uint64_t step) const {
    return reinterpret_cast<T*>(f.simpleSlot(step, cx_.ch.sizes));
  }

  // Thread 0: until every recv peer's current step has arrived, and belongs to this call.
  // False if the operation stopped (waiter.aborted: an abort, or a mismatch, recorded).
  MNCL_DEV bool waitRecv() {
    DevChannel& ch = cx_.ch;
    for (int i = 0; i < recv_.n; ++i) {
      int p = recv_.peer[i];
      ConnCtrl* c = ch.recvFrom[p].ctrl;
      uint64_t step = ch.recvStep[p];
      if (!cx_.waiter.until([&] { return loadAcquire(&c->tail) > step; }, &c->bell)) return false;
      if (!checkStepInfo(cx_, p, c->info[step % kSteps])) return false;
    }
    return true;
  }

  // Thread 0: until every send peer has a free slot for our next step (false: aborted).
  MNCL_DEV bool waitSend() {
    DevChannel& ch = cx_.ch;
    for (int i = 0; i < send_.n; ++i) {
      int p = send_.peer[i];
      if (!cx_.waiter.until([&] { return sendSlotFree(ch, p); }, &ch.sendTo[p].ctrl->bell)) return false;
    }
    return true;
  }

  // Thread 0: hands the slots of the step just consumed back to their senders.
  MNCL_DEV void postRecv() {
    DevChannel& ch = cx_.ch;
    for (int i = 0; i < recv_.n; ++i) {
      int p = recv_.peer[i];
      storeFlag(&ch.recvFrom[p].ctrl->head, ++ch.recvStep[p]);  // only frees the slot
      ring(ch.recvFrom[p].ctrl->bell);
    }
  }

  // Thread 0: tells every send peer about the step just written: which call it belongs to and
  // where its data is (the slot; a pointer step: `published`; or a direct write: `written`),
  // then bumps the tails.
  MNCL_DEV void postSend(const T* published, bool publishedInput, uint64_t inputEnd, const DirectWrite* written,
                         const T* dst, size_t n) {
    DevChannel& ch = cx_.ch;
    StepInfo info = cx_.work.info();
    for (int i = 0; i < send_.n; ++i) {
      int p = send_.peer[i];
      ConnCtrl* c = ch.sendTo[p].ctrl;
      int s = (int)(ch.sendStep[p] % kSteps);
      c->info[s] = info;
      c->dataAt[s] = written[i].done() ? written[i].there : (uint64_t)(uintptr_t)published;
      c->wroteToReceiver[s] = written[i].done() ? 1u : 0u;
      c->inputEnd[s] = written[i].done() ? 0 : inputEnd;
      if constexpr (Fn::kHasPre) {  // (the receiver reads these only when it runs a premulsum too)
        c->dataIsInput[s] = publishedInput && !written[i].done() ? 1u : 0u;
        uint64_t bits = 0;
        memcpy(&bits, &cx_.fn.scalar, sizeof(T));
        c->inputScalar[s] = bits;
      }
      if (written[i].done()) countUp(ch.directWritesSent);
      if (ch.sendTo[p].proxied) {  // (only FIFO steps: a proxied end offers no other way)
        c->stepLength[s] = (uint32_t)(n * sizeof(T));
        c->stepProto[s] = (uint32_t)Proto::simple;
        c->outputOffset[s] = finalOutputOffset(dst, n, publishedInput);
        c->opFirstStep[s] = ch.opFirstSendStep[p];
      }
    }
    fenceFor(ch.systemScope);  // the whole channel's data and the words above, before the tails
    for (int i = 0; i < send_.n; ++i) {
      int p = send_.peer[i];
      storeFlag(&ch.sendTo[p].ctrl->tail, ++ch.sendStep[p]);
      ring(ch.sendTo[p].ctrl->bell);
    }
    if (published) {
      ch.pointerStepsPosted = true;
      countUp(ch.pointerStepsSent, send_.n);
    }
  }

  // How many of the step's outputs, dsts[0, outputs) (ours first, if ownOutput, then the
  // receivers' direct writes), take streaming stores, which bypass the cache: only outputs
  // nobody reads during the operation.
  MNCL_DEV int streamedOutputs(const T* published, const T* dst, bool ownOutput, int outputs) const {
    if (!cx_.work.streamOutput) return 0;
    if (published && published == dst && ownOutput) return 0;  // receivers read ours (a pointer step)
    // A receiver forwards what we write into its output (ring and tree, more than 2 ranks):
    // then only ours streams.
    bool receiversKeepIt = cx_.work.algo == Algo::direct || cx_.ch.nranks == 2;
    if (receiversKeepIt) return outputs;
    return ownOutput ? 1 : 0;
  }

  // ---- optional shortcuts: pointer steps, direct writes (README "Pointer steps") ----

  // (Plain structs: a GPU's shared memory holds no constructors.)
  struct DirectWrite {
    T* here;          // the receiver's output at the step's offset, as we address it (or null)
    uint64_t there;   // the same place as the receiver addresses it
    bool byKernel;    // not mapped here: written there through the kernel, from our output
    MNCL_DEV bool done() const { return here || byKernel; }
  };
  struct SendPlan {
    const T* published;              // a pointer step for every receiver not written directly
    bool publishedInput;             // ... to this rank's input as the caller gave it
    uint64_t inputEnd;               // ... which receivers may read ahead up to here (0: no)
    DirectWrite written[kMaxPeers];  // per send peer
  };

  // Where a step we send goes: straight into receivers' outputs (direct writes), a pointer to
  // where the data already is (pointer steps), or (neither) the FIFO slots.
  MNCL_DEV SendPlan planSend(const T* src, T* dst, size_t n, bool recv, bool finish) {
    SendPlan s;
    s.published = nullptr;
    s.publishedInput = false;
    s.inputEnd = 0;
    for (int i = 0; i < send_.n; ++i) s.written[i] = DirectWrite{nullptr, 0, false};
    // A broadcast's receivers have nothing else to do: they copy for themselves (a pointer
    // step) when they can, rather than leave every copy to the sender's core. A sender with
    // no copy of its own and one receiver (an in-place root of 2 ranks, or of a ring; an
    // in-place ring allgather's own block too) writes every other step itself, so both copy: into the receiver's output where it can, through
    // the kernel if need be (a pointer step and a kernel write, each of 128 KiB, in turn:
    // 8 MiB in ~0.4 ms against ~0.7 ms through the FIFO). (Steps too small for a pointer are
    // written.)
    bool senderIdle = !recv && src == dst && send_.n == 1;
    // (By the step's place in the operation, so that the same core writes the same lines of
    // the receiver's output every time: lines that move between cores' caches cost.)
    int to = send_.peer[0];
    uint64_t stepInOp = cx_.ch.sendStep[to] - cx_.ch.opFirstSendStep[to];
    bool pushThisStep = senderIdle && stepInOp % 2 == 1;
    if (pushThisStep && stepInOp == 1) awaitPublishedOutput(to);
    const DevWork& w = cx_.work;
    bool kernelWrite = n * sizeof(T) >= cx_.ch.pointerStepMinBytes && w.writeByKernel;
    // Likewise an allgather's receivers on the CPU (DevWork::readInputThemselves), but only
    // steps of our input: the lines of our output, just written, are slow for another core
    // to read.
    if ((w.coll == Coll::broadcast || w.readInputThemselves) && !pushThisStep) {
      const T* p = pointerToPublish(src, dst, recv, finish, n, s.written, s.publishedInput);
      if (w.coll == Coll::broadcast || s.publishedInput) s.published = p;
    }
    for (int i = 0; dst && !s.published && i < send_.n; ++i) s.written[i] = directWrite(send_.peer[i], dst, n, kernelWrite);
    if (!s.published) s.published = pointerToPublish(src, dst, recv, finish, n, s.written, s.publishedInput);
    // (Not where we write every other step ourselves: a receiver reading it all would leave
    // those writes nothing to save.)
    if (s.publishedInput && !senderIdle) s.inputEnd = readAheadEnd(s.published, n);
    return s;
  }

  // Where this channel's share of our input ends, if the step at p lies in it and the share
  // lands in receivers' outputs in one piece, in order (allgather, broadcast); else 0.
  MNCL_DEV uint64_t readAheadEnd(const T* p, size_t n) const {
    const DevWork& w = cx_.work;
    if (w.coll != Coll::allgather && w.coll != Coll::broadcast) return 0;
    const T* begin = (const T*)w.send + w.chanOffset;
    const T* end = begin + w.chanCount;
    return p >= begin && p + n <= end ? (uint64_t)(uintptr_t)end : 0;
  }

  // Pointer steps: instead of copying a step's data into every receiver's FIFO, the sender
  // posts where the data already is, if that memory keeps it until the end of the operation:
  // an input that shares no memory with the output, or our output (every algorithm writes
  // each output element once: rule 1 in prims.h). Worth a synchronisation only for big steps. Every receiver
  // must be able to read it: memory of this process, our window (every peer process maps
  // it), or through a kernel copy (cross-memory attach). Receivers that get a direct write
  // need no pointer.
  //
  // The input first, when the step's values are the input's (no reduction, no post-op): the
  // output's copy has just been written, and another core reads lines that sit modified in
  // this core's cache far slower than lines that were only read. Kernel copies only of such
  // input, and only where the work allows them (DevWork::readByKernel). (*isInput: it is the
  // input: a premulsum's receiver then scales it by our scalar, see postSend.)
  MNCL_DEV const T* pointerToPublish(const T* src, T* dst, bool recv, bool finish, size_t n, const DirectWrite* written,
                                     bool& isInput) const {
    isInput = false;
    if (n * sizeof(T) < cx_.ch.smallestPointerStep()) return nullptr;
    // The caller's input, which keeps its values while receivers read them: where the output
    // does not overlap it (the operation writes nothing else), where this step writes it
    // (in place), or where the operation writes it only once every receiver has read it
    // (DevWork::inputReadBeforeOverwritten). The last only to receivers that map it: 2
    // processes' in-place allreduce took 1.35-2.1x the time at 64 KiB-16 MiB with its reads
    // through the kernel (bench/RESULTS.md, forty-sixth session).
    bool inputHasValues = !recv && src && !(dst && finish && Fn::kHasPost);
    const DevWork& w = cx_.work;
    bool keptAsItIs = src == dst || (inSendBuffer(src) && !inOutput(src, n));
    bool untouched = keptAsItIs || (inSendBuffer(src) && w.inputReadBeforeOverwritten);
    Readers inputReaders = !keptAsItIs ? Readers::mapping : w.readByKernel ? Readers::kernel : Readers::proxies;
    if (inputHasValues && untouched && receiversCanRead(src, n, written, inputReaders)) {
      isInput = true;
      return src;
    }
    return dst && receiversCanRead(dst, n, written, Readers::proxies) ? dst : nullptr;
  }

  // Who may take a pointer step, each kind with those before it: receivers that map the
  // memory (a thread of this process, a process mapping our window); network proxies, which
  // read it in this process; receivers in other processes, through a kernel copy.
  enum class Readers { mapping, proxies, kernel };

  // Whether every receiver without a direct write can read n elements at p, a step big enough
  // for the way it reads (and one needs to).
  MNCL_DEV bool receiversCanRead(const T* p, size_t n, const DirectWrite* written, Readers who) const {
    uint64_t bytes = n * sizeof(T);
    bool needed = false;
    for (int i = 0; i < send_.n; ++i) {
      if (written[i].done()) continue;
      const ConnFifo& f = cx_.ch.sendTo[send_.peer[i]];
      bool readsSender = loadRelaxed(&f.ctrl->readsSenderMemory);
      bool mapped = receiverMaps(cx_.ch, f, (uintptr_t)p, bytes);
      bool byProxy = readsSender && f.proxied && who >= Readers::proxies &&
                     cx_.work.count * sizeof(T) >= cx_.ch.proxiedPointerMinBytes;
      bool byKernel = readsSender && !f.proxied && f.peerPid != 0 && who == Readers::kernel;
      bool canRead = mapped ? bytes >= cx_.ch.mappedPointerStepMinBytes
                            : (byProxy || byKernel) && bytes >= cx_.ch.pointerStepMinBytes;
      if (!canRead) return false;
      needed = true;
    }
    return needed;
  }

  // Direct writes. Only for operations whose output is the same on every rank: there the
  // final values of our output at some offset are the receiver's final values at the same
  // offset (a sending primitive's dst holds final values: rule 2 in prims.h), and writing
  // them early is safe even in place, since they exist only after every rank's input at that
  // offset has been read.
  MNCL_HOSTDEV static bool outputsAlike(Coll c) {
    return c == Coll::allreduce || c == Coll::allgather || c == Coll::broadcast;
  }

  MNCL_DEV uint64_t outputBytes() const {
    const DevWork& w = cx_.work;
    return w.count * recvBlocks(w.coll, cx_.ch.nranks) * sizeof(T);
  }

  // Where a step we send lies in the output (bytes from its start), if it is final output
  // values (dst's, the same at every rank): where a direct write puts it, or a network
  // receiver's proxy lands it. Else kNotOutput. (A premulsum's pointer step to our raw input
  // is not final.)
  MNCL_DEV uint64_t finalOutputOffset(const T* dst, size_t n, bool publishedInput) const {
    if (!dst || !outputsAlike(cx_.work.coll) || (Fn::kHasPre && publishedInput)) return kNotOutput;
    uint64_t off = (uint64_t)((uintptr_t)dst - (uintptr_t)cx_.work.recv), bytes = n * sizeof(T), all = outputBytes();
    return off <= all && bytes <= all - off ? off : kNotOutput;
  }

  // Tells the sender `p` where our output is, for the operation now starting.
  MNCL_DEV void publishOutput(int p) {
    ConnCtrl* c = cx_.ch.recvFrom[p].ctrl;
    uint64_t firstStep = cx_.ch.opFirstRecvStep[p];
    const DevWork& w = cx_.work;
    if (c->outputPublishedFor(firstStep, w.info())) return;  // (by an earlier primitive of this operation)
    c->publishOutput(firstStep, (uint64_t)(uintptr_t)w.recv, outputBytes(), w.info());
  }

  // Where we may write this step's copy for receiver `p`, straight into its output: here,
  // as we address it, and there, as the receiver does. None unless the receiver published
  // its output for this very operation and we can write that memory (same process, or its
  // window, which we map; or, if `kernel`, through the kernel).
  MNCL_DEV DirectWrite directWrite(int p, const T* dst, size_t n, bool kernel) const {
    const DevWork& w = cx_.work;
    const ConnFifo& f = cx_.ch.sendTo[p];
    const ConnCtrl* c = f.ctrl;
    kernel = kernel && f.kernelWrites;
    if (!(f.directWrites || kernel) || !outputsAlike(w.coll)) return {};
    if (!c->outputPublishedFor(cx_.ch.opFirstSendStep[p], w.info())) return {};
    // (The receiver's output is as big as ours: it published it for this very call.)
    uint64_t off = finalOutputOffset(dst, n, false), bytes = n * sizeof(T);
    if (off == kNotOutput) return {};
    uint64_t there = loadRelaxed(&c->outputAt) + off;
    if (char* here = f.directWrites ? f.mappedHere(there, bytes) : nullptr) return {reinterpret_cast<T*>(here), there, false};
    return kernel ? DirectWrite{nullptr, there, true} : DirectWrite{};
  }

  // Thread 0: direct writes need the receiver's output, which it publishes when it starts the
  // operation. A sender with nothing else to do gives a receiver that has not started yet a
  // moment (called back to back, the root of a broadcast is often a microsecond ahead):
  // otherwise the steps meant for it to write go as pointer steps, and the receiver's core
  // makes every copy. A receiver on some other call never publishes this operation: after
  // the moment, the steps go as they can and the receiver finds the mismatch.
  // (CPU only: on a GPU, where it was never measured, such steps go as pointer steps as before.)
  MNCL_DEV void awaitPublishedOutput(int p) {
#if MNCL_SIMT
    (void)p;
#else
    const ConnFifo& f = cx_.ch.sendTo[p];
    if (!(f.directWrites || f.kernelWrites) || !outputsAlike(cx_.work.coll)) return;
    uint64_t firstStep = cx_.ch.opFirstSendStep[p];
    // The spins, then some yields; on a core shared with a busy process the thread sleeps
    // instead of yielding (cpuBackoff): the moment then ends by the clock.
    uint32_t limit = cx_.ch.spinBudget + 256;
    std::chrono::steady_clock::time_point until{};
    for (uint32_t spins = 0; spins < limit && !f.ctrl->outputPublishedFrom(firstStep); ++spins) {
      if (spins == cx_.ch.spinBudget) until = std::chrono::steady_clock::now() + std::chrono::microseconds(100);
      if (spins > cx_.ch.spinBudget && std::chrono::steady_clock::now() >= until) break;
      cx_.waiter.backoff(spins);
    }
#endif
  }

  // Thread 0: the direct writes not mapped here, from our output, which holds the step's
  // final values by now.
  MNCL_DEV void writeThroughKernel(const T* from, size_t n, const DirectWrite* written) {
    for (int i = 0; i < send_.n && !cx_.waiter.aborted; ++i) {
      if (!written[i].byKernel) continue;
      const ConnFifo& f = cx_.ch.sendTo[send_.peer[i]];
      int err = writePeerMemory(f.peerPid, reinterpret_cast<void*>(written[i].there), from, n * sizeof(T));
      if (err != 0) failPeerCopy(cx_.error, cx_.waiter, send_.peer[i], err, true);
    }
  }

  // Whether any of the n elements at p lies in this rank's output.
  MNCL_DEV bool inOutput(const T* p, size_t n) const {
    auto at = (uintptr_t)p, out = (uintptr_t)cx_.work.recv;
    return at < out + outputBytes() && out < at + n * sizeof(T);
  }

  MNCL_DEV bool inSendBuffer(const T* p) const {
    const DevWork& w = cx_.work;
    size_t elems = w.coll == Coll::reducescatter ? w.count * cx_.ch.nranks : w.count;
    const T* base = (const T*)w.send;
    return p >= base && p < base + elems;
  }

  // Where the data of recv peer i's current step is: its FIFO slot; or, for a pointer step,
  // the sender's memory itself (same process), the sender's window as mapped here, or a
  // kernel copy of it into `landing` (or into the slot) for a sender in another process.
  // A premulsum's pointer step to the sender's input goes in `pre` as source srcIndex, with the
  // sender's scalar (and never lands in dst: it is not yet the output's value).
  MNCL_DEV const T* received(int i, size_t n, T* landing, int srcIndex, PreOps<T>& pre) {
    int p = recv_.peer[i];
    const ConnFifo& f = cx_.ch.recvFrom[p];
    uint64_t step = cx_.ch.recvStep[p];
    T* inSlot = slot(f, step);
    // (Atomic loads: on a GPU they skip L1, which may still hold an earlier lap's words.)
    uint64_t at = loadRelaxed(&f.ctrl->dataAt[step % kSteps]);
    if (at == 0) {
      // (Over the network, a premulsum's pointer step to the sender's input arrives in the
      // slot, still to be scaled by the sender's scalar, which comes with it.)
      scaleIfInput(f, step, srcIndex, pre);
      return inSlot;
    }
    // Our own memory (a direct write); or the sender's: in this process, or its window as
    // mapped here.
    if (loadRelaxed(&f.ctrl->wroteToReceiver[step % kSteps])) return reinterpret_cast<const T*>(at);
    if (scaleIfInput(f, step, srcIndex, pre)) landing = nullptr;
    if (const char* here = f.mappedHere(at, n * sizeof(T))) return reinterpret_cast<const T*>(here);
    if (landing && readAlready(p, at, landing, n)) {
      if (tid() == 0) countUp(cx_.ch.stepsReadAhead);
      return landing;
    }
    T* to = landing ? landing : inSlot;
    size_t bytes = landing ? readAheadBytes(p, step, at, landing, n) : n * sizeof(T);
#if MNCL_SIMT
    // (A GPU reads no other process's memory: every thread fails alike, none alone stops
    // short of a barrier the others wait at. Not reached: a GPU's pointer steps all map here.)
    int err = readPeerMemory(f.peerPid, to, reinterpret_cast<const void*>(at), bytes);
#else
    int err = tid() == 0 ? readPeerMemory(f.peerPid, to, reinterpret_cast<const void*>(at), bytes) : 0;
#endif
    if (err != 0) failPeerCopy(cx_.error, cx_.waiter, p, err, false);
    if (tid() == 0 && err == 0 && bytes > n * sizeof(T)) {
      ConnFifo& from = cx_.ch.recvFrom[p];
      from.readAheadOp = cx_.ch.opFirstRecvStep[p] + 1;
      from.readAheadFrom = at;
      from.readAheadTo = at + bytes;
      from.readAheadInto = (uint64_t)(uintptr_t)landing;
    }
    return to;
  }

  // Read ahead: a kernel copy costs per call (1 MiB between 2 processes: 62 us in one read,
  // 91 in 128 KiB reads), so a receiver copying a sender's input into its output through the
  // kernel reads on into the rest of the sender's share (ConnCtrl::inputEnd), up to
  // DevChannel::pointerReadBytes (4 MiB reads were slower from 16 MiB) and to the end of our
  // output, whatever the peer says. Later steps find their data in place (it is the same
  // wherever it comes from: final output values).
  MNCL_DEV size_t readAheadBytes(int p, uint64_t step, uint64_t at, const T* landing, size_t n) const {
    size_t bytes = n * sizeof(T);
    uint64_t end = loadRelaxed(&cx_.ch.recvFrom[p].ctrl->inputEnd[step % kSteps]);
    uint64_t out = (uint64_t)(uintptr_t)cx_.work.recv, into = (uint64_t)(uintptr_t)landing;
    if (into < out || into >= out + outputBytes()) return bytes;
    uint64_t room = out + outputBytes() - into, want = end > at ? end - at : 0;
    if (want > room) want = room;
    if (want > cx_.ch.pointerReadBytes) want = cx_.ch.pointerReadBytes;
    return want > bytes ? (size_t)want : bytes;
  }

  MNCL_DEV bool readAlready(int p, uint64_t at, const T* landing, size_t n) const {
    const ConnFifo& f = cx_.ch.recvFrom[p];
    return f.readAheadOp == cx_.ch.opFirstRecvStep[p] + 1 && at >= f.readAheadFrom &&
           at + n * sizeof(T) <= f.readAheadTo && (uint64_t)(uintptr_t)landing == f.readAheadInto + (at - f.readAheadFrom);
  }

  // Premulsum: if the step is the sender's raw input, source srcIndex is scaled by the
  // sender's scalar, which came with it (true then; such data never lands in the output).
  MNCL_DEV bool scaleIfInput(const ConnFifo& f, uint64_t step, int srcIndex, PreOps<T>& pre) const {
    if constexpr (Fn::kHasPre) {
      if (loadRelaxed(&f.ctrl->dataIsInput[step % kSteps])) {
        uint64_t bits = loadRelaxed(&f.ctrl->inputScalar[step % kSteps]);
        T rankScalar;
        memcpy(&rankScalar, &bits, sizeof(T));
        pre.add(srcIndex, rankScalar);
        return true;
      }
    }
    return false;
  }

  PrimsContext<Fn> cx_;
  PeerSet recv_, send_;
};

}  // namespace mncl::dev
