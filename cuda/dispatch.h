// From a work item's run-time (collective, algorithm, protocol, type, op) to the one template
// instance that runs it. Included by the CPU entry point and the CUDA kernel alike.
//
// (type, op) are template parameters of the entry, and the algorithm is switched at run time
// inside it; so is the protocol on CPUs (AnyProtocol), where GPUs have a kernel per protocol
// (OneProtocol) and one for direct LL alone (DirectLLOnly). Signed sums, products and
// premulsums run as unsigned (same bits, and no undefined overflow), and copy-only
// collectives run once, on bytes.
#pragma once

#include <cstdio>

#include "p2p.h"
#include "prims_lines.h"
#include "prims_simple.h"
#include "direct.h"
#include "ring.h"
#include "tree.h"

namespace mncl::dev {

// A work item that no case below runs: an algorithm, protocol or collective added to its enum
// but not here, or a pairing the tuner never offers (Tuner::available), such as a tree
// allgather. Stops loudly instead of returning with nothing done: records why (the host
// fails the communicator with an internal error naming the case, which stops the peers too)
// and stops the operation; a CPU also says so on stderr. (Not __trap() on a GPU: that would
// take the process's CUDA context down with it, every communicator's and the caller's work.)
template <typename Fn>
MNCL_DEV void failUndispatched(PrimsContext<Fn>& cx, Undispatched what) {
  if (tid() == 0) {
#if !defined(__CUDACC__)
    const DevWork& w = cx.work;
    std::fprintf(stderr, "minincl: rank %d: the device code has no %s for collective %d, algorithm %d, protocol %d\n",
                 cx.ch.rank, undispatchedName(what), (int)w.coll, (int)w.algo, (int)w.proto);
#endif
    // (By this rank as the record's peer: a GPU host reads a record once its peer is set.)
    recordError(cx.error, cx.ch.rank, [&](DevError& e) { e.undispatched = what; });
  }
  cx.waiter.aborted = true;
}

// For static_assert in an `if constexpr` chain's last branch (false, but only once instantiated).
template <auto>
constexpr bool kNoCase = false;

// One algorithm's five collectives (copy-only ones for FuncCopy, reducing ones otherwise).
template <typename A, typename T, typename Fn>
MNCL_DEV void runCollectiveOf(PrimsContext<Fn> cx) {
  if constexpr (std::is_same_v<Fn, FuncCopy<T>>) {
    switch (cx.work.coll) {
      case Coll::broadcast: A::broadcast(cx); break;
      case Coll::allgather:
        // (An algorithm without one is compiled here all the same: the algorithm is a run-time
        // choice. Never dispatched: the tuner does not offer it.)
        if constexpr (requires { A::allGather(cx); }) A::allGather(cx);
        else failUndispatched(cx, Undispatched::allgatherInAlgorithm);
        break;
      default: failUndispatched(cx, Undispatched::copyOnlyCollective); break;
    }
  } else {
    switch (cx.work.coll) {
      case Coll::allreduce: A::allReduce(cx); break;
      case Coll::reduce: A::reduce(cx); break;
      case Coll::reducescatter:
        if constexpr (requires { A::reduceScatter(cx); }) A::reduceScatter(cx);
        else failUndispatched(cx, Undispatched::reduceScatterInAlgorithm);  // (as allgather above)
        break;
      default: failUndispatched(cx, Undispatched::reducingCollective); break;
    }
  }
}

template <template <class, class> class Prims, typename T, typename Fn>
MNCL_DEV void runAlgorithm(PrimsContext<Fn> cx) {
  switch (cx.work.algo) {
    case Algo::ring: runCollectiveOf<Ring<Prims, T, Fn>, T, Fn>(cx); break;
    case Algo::tree: runCollectiveOf<Tree<Prims, T, Fn>, T, Fn>(cx); break;
    case Algo::direct: runCollectiveOf<Direct<Prims, T, Fn>, T, Fn>(cx); break;
    default: failUndispatched(cx, Undispatched::algorithm); break;
  }
}

// Before an operation that posted pointer steps returns, its receivers must have read them:
// the caller may overwrite its buffers as soon as the call returns.
MNCL_DEV void drainPointerSteps(DevChannel& ch, Waiter& waiter) {
  for (int p = 0; p < ch.nranks; ++p) {
    ConnCtrl* c = ch.sendTo[p].ctrl;
    if (p == ch.rank || c == nullptr) continue;
    uint64_t sent = ch.sendStep[p];
    waiter.until([&] { return loadAcquire(&c->head) >= sent; }, &c->bell);
  }
  ch.pointerStepsPosted = false;
}

// What an entry point runs: one protocol's every algorithm, fixed at compile time (the GPU
// kernels, one per protocol: ptxas took three times as long over one kernel holding all
// three, whose registers spilled, as over the three apart), ...
template <Proto P>
struct OneProtocol {
  MNCL_HOSTDEV static bool runs(const DevWork& w) { return w.proto == P; }
  template <typename T, typename Fn>
  MNCL_DEV static void run(PrimsContext<Fn> cx) {
    if constexpr (P == Proto::simple) runAlgorithm<PrimsSimple, T, Fn>(cx);
    else if constexpr (P == Proto::ll) runAlgorithm<PrimsLL, T, Fn>(cx);
    else if constexpr (P == Proto::ll128) runAlgorithm<PrimsLL128, T, Fn>(cx);
    else static_assert(kNoCase<P>, "a protocol without a Prims class");
  }
};

// ... every protocol, switched on the work item at run time (the CPU), ...
struct AnyProtocol {
  template <typename T, typename Fn>
  MNCL_DEV static void run(PrimsContext<Fn> cx) {
    switch (cx.work.proto) {
      case Proto::simple: OneProtocol<Proto::simple>::run<T, Fn>(cx); break;
      case Proto::ll: OneProtocol<Proto::ll>::run<T, Fn>(cx); break;
      case Proto::ll128: OneProtocol<Proto::ll128>::run<T, Fn>(cx); break;
      default: failUndispatched(cx, Undispatched::protocol); break;
    }
  }
};

// ... or direct LL only: what small operations on one GPU run (the tuner's choice up to tens
// of KiB), in a kernel of that one path (one of the LL kernel's three algorithms; see
// cuda/gpu/kernels.cu).
struct DirectLLOnly {
  MNCL_HOSTDEV static bool runs(const DevWork& w) { return w.proto == Proto::ll && w.algo == Algo::direct; }
  template <typename T, typename Fn>
  MNCL_DEV static void run(PrimsContext<Fn> cx) {
    runCollectiveOf<Direct<PrimsLL, T, Fn>, T, Fn>(cx);
  }
};

// premulsum's scalar for this work item (see DevWork::scalarBits).
template <typename T>
MNCL_DEV T workScalar(const DevWork& w) {
  T s;
  memcpy(&s, w.scalarAt ? w.scalarAt : &w.scalarBits, sizeof(T));
  return s;
}

// Runs one channel's share of a collective with element type T and reduction Fn.
// Returns false if the operation stopped early (abort, or a mismatched peer in *err).
template <typename T, typename Fn, typename Paths = AnyProtocol>
MNCL_DEV bool runTyped(DevChannel& ch, const DevWork& w, Fn fn, DevError* err) {
  if constexpr (Fn::kHasPre) fn.scalar = workScalar<T>(w);
  Waiter waiter{ch.abortFlag, ch.spinBudget, false, ch.netProgress, ch.netProgressArg};
  PrimsContext<Fn> cx{ch, w, fn, waiter, err};
  // Where this operation's steps start, for direct writes (only thread 0 reads them: it
  // publishes outputs and plans each step's destination).
  if (tid() == 0) {
    for (int p = 0; p < ch.nranks; ++p) {
      ch.opFirstSendStep[p] = ch.sendStep[p];
      ch.opFirstRecvStep[p] = ch.recvStep[p];
    }
  }
  MNCL_TRACE(ch, kTraceDispatch);
  Paths::template run<T, Fn>(cx);
  // (On a GPU a warp may stop on the abort alone, in a pass after the first: the block's verdict.)
  bool aborted = barrierAny(waiter.aborted);
  if (tid() == 0) {
    if (ch.pointerStepsPosted) drainPointerSteps(ch, waiter);
    aborted = aborted || waiter.aborted;  // (or while it drained)
    // Stopped early: take back our published outputs.
    for (int p = 0; aborted && p < ch.nranks; ++p) {
      if (p != ch.rank && ch.recvFrom[p].ctrl) retractOutput(ch, p);
    }
  }
  MNCL_TRACE(ch, kTraceRunDone);
  return !aborted;
}

// Copy-only collectives move bytes: rewrite the element counts once. The steps' StepInfo
// then counts bytes too (the host's error messages count back: see device_error.cc's describe).
MNCL_HOSTDEV bool isCopyOnly(Coll c) { return c == Coll::broadcast || c == Coll::allgather; }

MNCL_HOSTDEV DevWork asBytes(const DevWork& w) {
  size_t sz = dataTypeSize(w.dtype);
  DevWork b = w;
  b.count *= sz;
  b.chanOffset *= sz;
  b.chanCount *= sz;
  return b;
}

}  // namespace mncl::dev
