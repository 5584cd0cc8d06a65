#include "device_error.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "../core/call_log.h"
#include "../core/comm.h"
#include "../tune/tuner.h"

namespace mncl {

namespace {

// A call as a step carries it: `ours` for the receiver's own (its half of a send is a recv);
// its algorithm where the two calls differ in that alone.
std::string describe(const dev::StepInfo& s, bool ours, bool withAlgo) {
  if (s.coll == (uint8_t)Coll::sendrecv) {
    return std::string(ours ? "recv" : "send") + " of " + amountOf(s.count, (DataType)s.dtype);
  }
  // (Copy-only collectives and bitwise ops run, and so check their steps, in bytes.)
  bool inBytes = s.coll == (uint8_t)Coll::broadcast || s.coll == (uint8_t)Coll::allgather || isBitwise((RedOp)s.op);
  uint64_t count = inBytes ? s.count / dataTypeSize((DataType)s.dtype) : s.count;
  return describeCall({s.coll, s.dtype, s.op, s.root, count}, withAlgo ? algoName((Algo)s.algo) : nullptr);
}

std::string mismatchMessage(int rank, const dev::DevError& e) {
  std::string me = "rank " + std::to_string(rank), peer = "rank " + std::to_string(e.peer);
  if (e.expected.coll == (uint8_t)Coll::sendrecv && e.got.coll == (uint8_t)Coll::sendrecv) {
    bool tags = e.expected.root != e.got.root;  // (StepInfo::root carries a send/recv's tag)
    auto tag = [&](int32_t t) { return tags ? " with tag " + std::to_string(t) : std::string(); };
    return "mismatched send/recv: " + me + " posted a recv of " + amountOf(e.expected.count, (DataType)e.expected.dtype) +
           tag(e.expected.root) + " from " + peer + ", but " + peer + " sent " + amountOf(e.got.count, (DataType)e.got.dtype) +
           tag(e.got.root) + (tags ? ": a send and its receive pair in the order they are posted, and their tags must agree" : "");
  }
  dev::StepInfo sameAlgo = e.got;
  sameAlgo.algo = e.expected.algo;
  bool withAlgo = dev::sameInfo(e.expected, sameAlgo);  // (MININCL_ALGO differs between the ranks)
  return "mismatched calls: " + me + " called " + describe(e.expected, true, withAlgo) + " but " + peer + " called " +
         describe(e.got, false, withAlgo) +
         "; every rank must make the same collective calls in the same order";
}

std::string copyFailureMessage(int rank, const dev::DevError& e) {
  return "rank " + std::to_string(rank) + (e.wrote ? " could not write into rank " : " could not read rank ") +
         std::to_string(e.peer) + "'s buffer (cross-memory attach: " + std::strerror(e.copyErrno) +
         "); set MININCL_POINTER_STEPS=1 to send data between processes through shared memory";
}

// The logs' view of the mismatch with `peer`. A network peer's log reaches this host with its
// heartbeats, after the steps that showed the mismatch: it is given a moment (a few of the
// proxy's ticks) to reach the call this rank is in, so that both ranks name the calls alike.
std::string loggedMismatch(Comm& comm, int peer) {
  std::string logged = comm.loggedCallMismatch(peer);
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (logged.empty() && comm.overNetwork(peer) && comm.peerCollectiveCallsMade(peer) < comm.collectiveCallsMade() &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    logged = comm.loggedCallMismatch(peer);
  }
  return logged;
}

}  // namespace

std::pair<mnclResult_t, std::string> deviceErrorMessage(Comm& comm, const dev::DevError& e) {
  if (e.undispatched != dev::Undispatched::none) {
    return {mnclInternalError, "rank " + std::to_string(comm.rank()) + ": the device code has no " +
                                   dev::undispatchedName(e.undispatched) +
                                   ": the tuner chose an algorithm without that case (cuda/dispatch.h)"};
  }
  // A peer that failed mid-operation leaves partial steps behind: that is its failure
  // showing, not a mismatched call.
  std::string why = comm.peerFailure(e.peer);
  if (!why.empty()) return {mnclRemoteError, why};
  if (e.copyErrno) return {mnclSystemError, copyFailureMessage(comm.rank(), e)};
  // The call logs name the calls as the user made them (an alltoall runs as receives, a
  // barrier as an allreduce of one int32), where they already show the difference.
  std::string logged = loggedMismatch(comm, e.peer);
  if (!logged.empty()) return {mnclInvalidUsage, logged};
  std::string message = mismatchMessage(comm.rank(), e), inside = comm.collectiveInside();
  if (!inside.empty() && message.rfind("mismatched send/recv", 0) == 0) {  // (an alltoall, gather or scatter)
    message += " (rank " + std::to_string(comm.rank()) + " was inside " + inside + ")";
  }
  return {mnclInvalidUsage, message};
}

}  // namespace mncl
