#include "enqueue.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "../../cuda/cpu/run_work.h"
#include "../core/call_log.h"
#include "../core/comm.h"
#include "../core/env.h"
#include "../core/error.h"
#include "../core/log.h"
#include "device_error.h"
#include "executor.h"
#include "gpu_launch.h"
#include "validate.h"
#include "work_plan.h"

namespace mncl {

namespace {

// ---- planning: what each channel runs ----

struct ChannelResult {
  bool ok = true;
  dev::DevError error;
};

// One communicator's share of a launch: per channel, the collectives then the p2p ops.
// Reused from call to call (cleared, not freed), so a small call allocates nothing.
struct CommLaunch {
  Comm* comm = nullptr;
  std::vector<std::vector<dev::DevWork>> colls;  // [channel]
  std::vector<std::vector<dev::P2pOp>> p2p;      // [channel]
  std::vector<ChannelResult> results;            // [channel]
  std::vector<const P2pCall*> selfSends, selfRecvs;
  // Copies from a send to self into its recv: each channel with work copies a slice of
  // every pair (selfSlice[c] of selfSlices; -1: none), so that the copies run on the
  // channels' threads at once, not on the caller's before any channel starts.
  std::vector<int> selfSlice;  // [channel]
  int selfSlices = 0;
  // Its calls run: its call scope was entered, and the communicator had not failed when the
  // launch began (see launch).
  bool usable = true;

  void reset(Comm* c) {
    comm = c;
    size_t n = (size_t)c->nChannels();
    colls.resize(n);
    p2p.resize(n);
    for (size_t i = 0; i < n; ++i) {
      colls[i].clear();
      p2p[i].clear();
    }
    results.assign(n, ChannelResult{});
    selfSends.clear();
    selfRecvs.clear();
    selfSlice.assign(n, -1);
    selfSlices = 0;
    usable = true;
  }
  bool hasWork(int c) const { return !colls[c].empty() || !p2p[c].empty(); }
  bool runs(int c) const { return hasWork(c) || selfSlice[c] >= 0; }
};

void planColl(CommLaunch& plan, const CollCall& c) {
  if (copyWithoutPeers(*plan.comm, c)) {
    size_t bytes = c.count * dataTypeSize(c.dtype);
    if (scalesWithoutPeers(*plan.comm, c)) dev::preMulSumAlone(workWithoutPeers(c));
    else if (c.recv && c.send && c.recv != c.send && bytes) std::memmove(c.recv, c.send, bytes);
    return;
  }
  thread_local std::vector<dev::DevWork> works;
  works.clear();
  int n = planCollWorks(*plan.comm, c, works);
  for (int ch = 0; ch < n; ++ch) plan.colls[ch].push_back(works[ch]);
}

void planP2p(CommLaunch& plan, const P2pCall& c) {
  if (c.peer == plan.comm->rank()) {
    (c.isSend ? plan.selfSends : plan.selfRecvs).push_back(&c);
    return;
  }
  planP2pOps(*plan.comm, c, plan.p2p);
}

// A slice of a copy to self is at least this long: a shorter one is not worth a thread.
constexpr size_t kMinSelfSlice = 64 << 10;

// Shares the copies to self among the channels that have work (channel 0 when none has).
// (The sends to self were checked against the recvs from self before the group was counted:
// checkGroupSelfPairs.)
void matchSelf(CommLaunch& plan) {
  size_t bytes = 0;
  for (const P2pCall* s : plan.selfSends) bytes += s->count * dataTypeSize(s->dtype);
  if (bytes == 0) return;
  int ways = (int)std::clamp<size_t>(bytes / kMinSelfSlice, 1, (size_t)plan.comm->nChannels());
  for (int c = 0; c < plan.comm->nChannels() && plan.selfSlices < ways; ++c) {
    if (plan.hasWork(c)) plan.selfSlice[c] = plan.selfSlices++;
  }
  if (plan.selfSlices == 0) plan.selfSlice[0] = plan.selfSlices++;
}

// Channel c's slice of every copy to self: slices are 64-byte aligned. A copy whose ends
// overlap (but differ) goes whole, as one memmove, in the first slice.
void copySelfSlice(const CommLaunch& plan, int c) {
  int slice = plan.selfSlice[c];
  if (slice < 0) return;
  for (size_t i = 0; i < plan.selfSends.size(); ++i) {
    const P2pCall& s = *plan.selfSends[i];
    char* to = (char*)plan.selfRecvs[i]->buf;
    const char* from = (const char*)s.buf;
    if (to == from) continue;
    size_t bytes = s.count * dataTypeSize(s.dtype);
    bool apart = to + bytes <= from || from + bytes <= to;
    size_t per = apart ? ((bytes + plan.selfSlices - 1) / plan.selfSlices + 63) / 64 * 64 : bytes;
    size_t at = std::min(bytes, (size_t)slice * per);
    size_t len = std::min(per, bytes - at);
    if (len) std::memmove(to + at, from + at, len);
  }
}

// ---- running ----

void runChannel(CommLaunch& plan, int c) {
  Channel& ch = plan.comm->channel(c);
  ChannelResult& res = plan.results[c];
  for (size_t i = 0; i < plan.colls[c].size() && res.ok; ++i) {
    res.ok = dev::runCollective(ch.dev, plan.colls[c][i], &res.error);
  }
  if (res.ok) copySelfSlice(plan, c);
  if (res.ok && !plan.p2p[c].empty()) {
    res.ok = dev::runP2p(ch.dev, plan.p2p[c].data(), (int)plan.p2p[c].size(), &res.error);
  }
  // A mismatch (or a failed read) found by the device code fails the communicator (at once;
  // with a network peer, once its call log came, 300 ms at most: see deviceErrorMessage): the
  // call's other channels may be waiting for steps that never come (a recv longer than its
  // send spreads over more channels than the send), and the failure ends their waits.
  if (!res.ok && res.error.peer >= 0) {  // (an undispatched work's record names this rank)
    auto [code, message] = deviceErrorMessage(*plan.comm, res.error);
    plan.comm->fail(code, message);
  }
}

// After a launch: the error a channel stopped on (a mismatch, an abort, a peer's failure) is
// stored in the communicator; it becomes this rank's exception.
void throwIfFailed(CommLaunch& plan) {
  Comm& comm = *plan.comm;
  for (const ChannelResult& r : plan.results) {
    if (!r.ok) comm.throwStoredError();
  }
  if (comm.failed()) comm.throwStoredError();
}

// The first failed communicator's error (an unusable one's included), saying how many others
// of the group failed too and the first of those: a group's error that named one alone let its
// other outputs pass for right. (One thread driving several ranks holds a handle per rank.)
void throwIfAnyFailed(CommLaunch* plans, size_t nplans) {
  std::optional<Error> first, second;
  int failed = 0;
  for (size_t i = 0; i < nplans; ++i) {
    try {
      throwIfFailed(plans[i]);
    } catch (const Error& e) {
      if (++failed == 1) first = e;
      else if (failed == 2) second = e;
    }
  }
  if (failed == 0) return;
  if (failed == 1) throw *first;
  throwError(first->code(), std::string(first->what()) + " (in the same group, " + std::to_string(failed - 1) +
                                " other communicator handle(s) failed too, the first: " + second->what() + ")");
}

// The call scopes of a group's communicators, left together when it ends (or one early: see
// launch). A few (a sendrecv's one) live on the stack: a small group allocates nothing.
class CallScopes {
 public:
  void enter(Comm& comm, Inside inside, uint64_t peers) {
    if (few_ < std::size(onStack_)) onStack_[few_++].emplace(comm, inside, peers);
    else onHeap_.push_back(std::make_unique<Comm::CallScope>(comm, inside, peers));
  }
  void leave(const Comm& comm) {
    for (size_t i = 0; i < few_; ++i) {
      if (onStack_[i] && &onStack_[i]->comm == &comm) onStack_[i].reset();
    }
    for (std::unique_ptr<Comm::CallScope>& scope : onHeap_) {
      if (scope && &scope->comm == &comm) scope.reset();
    }
  }

 private:
  std::optional<Comm::CallScope> onStack_[4];
  size_t few_ = 0;
  std::vector<std::unique_ptr<Comm::CallScope>> onHeap_;
};

// Runs the plans of one launch. The caller runs the first communicator's channel 0 itself;
// every other channel (other communicators' too, when one thread drives several ranks) runs
// on its own thread, since any rank may have to wait for another.
// *ran: set once the channels may have exposed the calls' buffers to peers (posted pointer
// steps, published outputs); a failure after that waits for the peers (see recordOrRun).
// `scopes`: a group's (see runRecorded).
void launch(CommLaunch* plans, size_t nplans, bool* ran, CallScopes* scopes = nullptr) {
  // A peer whose call failed may have left pointer steps to buffers it hands back to its
  // caller; it waits until we have failed too, or are outside any call. Having entered ours
  // (CallScope), we look once more: either we see our failure here (our monitor makes it
  // within a tick of the peer's), or the peer sees us inside (the fences pair up; see
  // Comm::peerOutOfCalls).
  // In a group, a communicator that failed since the group logged its calls (its monitor
  // found a peer's mismatch meanwhile, say) runs none of them, and the group's end raises its
  // error. The group's other communicators run theirs all the same: their peers logged the
  // same calls and may be running them already, and a call logged here but never run would
  // pair with their next one (wrong data, no error). Its call scope is left at once: a peer
  // whose call on it failed waits for this rank to leave it (or for MININCL_TIMEOUT), and
  // may be the peer of the others' calls.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (size_t i = 0; i < nplans; ++i) {
    plans[i].usable = plans[i].usable && !plans[i].comm->failed();
    if (!plans[i].usable && scopes) scopes->leave(*plans[i].comm);
    *ran = *ran || plans[i].usable;
  }
  Completion done;
  for (size_t i = 0; i < nplans; ++i) {
    matchSelf(plans[i]);
    for (std::vector<dev::P2pOp>& ops : plans[i].p2p) groupP2pOps(*plans[i].comm, ops);
  }
  for (size_t i = 0; i < nplans; ++i) {
    CommLaunch& plan = plans[i];
    for (int c = i == 0 ? 1 : 0; c < plan.comm->nChannels() && plan.usable; ++c) {
      if (plan.runs(c)) plan.comm->executor().post(c, [&plan, c] { runChannel(plan, c); }, &done);
    }
  }
  if (nplans > 0 && plans[0].usable && plans[0].runs(0)) runChannel(plans[0], 0);
  done.wait();
  throwIfAnyFailed(plans, nplans);
}

// ---- groups ----

struct Recorded {
  Comm* comm;
  bool isP2p;
  CollCall coll;
  P2pCall p2p;
  bool ofCollective = false;  // a send or receive of an alltoall, gather or scatter: part of a collective call
  uint64_t callNumber = 0;  // a collective's number in its communicator's call log (GPU: see GpuCall)
  // Inside a group, the collective call this starts, logged when the group runs (see logCall).
  std::optional<LoggedCall> log;
};

thread_local int tlsGroupDepth = 0;
thread_local std::vector<Recorded> tlsRecorded;
// The first call refused inside the open group (groupRefuse): its code and message.
thread_local std::optional<std::pair<mnclResult_t, std::string>> tlsGroupRefusal;

void plan(CommLaunch& p, const Recorded& r) {
  if (r.isP2p) planP2p(p, r.p2p);
  else planColl(p, r.coll);
}

// A GPU group: every call is of a GPU communicator, launched in the order recorded (each
// communicator's sends and receives together, after its collectives).
void runRecordedOnGpu(std::vector<Recorded>& calls) {
  std::vector<GpuCall> gpuCalls;
  CallScopes scopes;
  for (Recorded& r : calls) gpuCalls.push_back({r.comm, r.isP2p, r.coll, r.p2p, r.callNumber});
  for (Recorded& r : calls) scopes.enter(*r.comm, Inside::both, 0);
  launchGpuCalls(gpuCalls);
}

// What a call is inside, for its communicator's call log (sends and receives with ranks
// from 64 on count as both: the log's peer mask ends there).
std::pair<Inside, uint64_t> insideOf(const Recorded& r) {
  if (!r.isP2p || r.ofCollective) return {Inside::collectives, 0};
  if (r.p2p.peer >= 64) return {Inside::both, 0};
  return {Inside::sendsAndReceives, uint64_t{1} << r.p2p.peer};
}

// ... and what `comm`'s calls among a group's are inside.
std::pair<Inside, uint64_t> insideOf(const std::vector<Recorded>& calls, const Comm* comm) {
  Inside all = Inside::nothing;
  uint64_t peers = 0;
  for (const Recorded& r : calls) {
    if (r.comm != comm) continue;
    auto [inside, p] = insideOf(r);
    all = all == Inside::nothing || all == inside ? inside : Inside::both;
    peers |= p;
  }
  return {all, peers};
}

// Adds a send's bytes to what its group's earlier sends to the same peer put on each channel
// (counted from the first channel of their split, which they share); returns the most on one.
size_t addToChannels(std::vector<size_t>& perChannel, P2pSplit split, size_t bytes) {
  if (perChannel.size() < (size_t)split.channels) perChannel.resize(split.channels);
  for (int ch = 0; ch < split.channels; ++ch) perChannel[ch] += split.bytesOn(ch, bytes);
  return *std::max_element(perChannel.begin(), perChannel.end());
}

// What a group's sends to one peer of one communicator put on each channel so far.
struct SentToPeer {
  const Comm* comm;
  int peer;
  std::vector<size_t> perChannel;
};

// MININCL_DEBUG=INFO with the P2P subsystem: each send and receive as it starts.
void noteP2p(const Recorded& r) {
  if (!r.comm->logsP2p()) return;
  MNCL_INFO(kP2p, "rank %d/%d: %s %s %s rank %d (tag %d)%s", r.comm->rank(), r.comm->nranks(),
            r.p2p.isSend ? "send" : "recv", amountOf(r.p2p.count * dataTypeSize(r.p2p.dtype), r.p2p.dtype).c_str(),
            r.p2p.isSend ? "to" : "from", r.p2p.peer, (int)r.p2p.tag, r.ofCollective ? ", part of a collective" : "");
}

// A group's sends and receives count only now, when it ends: the collective calls it holds
// were logged in the order the ranks made them, and the ranks may order sends and
// collectives differently within a group. Its sends to one peer share the connections (each
// starts on the same channel), so a send counts with the group's sends to that peer so far.
void countGroupP2p(const std::vector<Recorded>& calls) {
  thread_local std::vector<SentToPeer> sent;  // entries [0, used) are this group's; the rest kept for reuse
  size_t used = 0;
  for (const Recorded& r : calls) {
    if (!r.isP2p) continue;
    noteP2p(r);
    size_t bytes = r.p2p.count * dataTypeSize(r.p2p.dtype);
    P2pSplit split = p2pSplit(*r.comm, bytes, r.p2p.peer);
    size_t opBytes = split.bytesOn(0, bytes);
    if (r.p2p.isSend) {
      size_t i = 0;
      while (i < used && (sent[i].comm != r.comm || sent[i].peer != r.p2p.peer)) ++i;
      if (i == used) {
        if (used == sent.size()) sent.emplace_back();
        sent[used].comm = r.comm;
        sent[used].peer = r.p2p.peer;
        sent[used++].perChannel.clear();
      }
      bytes = addToChannels(sent[i].perChannel, split, bytes);
    }
    r.comm->countP2p(r.p2p.isSend, r.p2p.peer, bytes, opBytes);
  }
}

// A group's sends to self must pair with its recvs from self, per communicator: checked
// before anything is counted, so that a group refused here counts on no peer's books (its
// peers' sends to this rank then show as unmatched at the next call, instead of passing for
// the refused recvs and leaving that call waiting).
void checkGroupSelfPairs(const std::vector<Recorded>& calls) {
  thread_local std::vector<const Comm*> comms;
  thread_local std::vector<const P2pCall*> sends, recvs;
  comms.clear();
  for (const Recorded& r : calls) {
    if (std::find(comms.begin(), comms.end(), r.comm) == comms.end()) comms.push_back(r.comm);
  }
  for (const Comm* comm : comms) {
    sends.clear();
    recvs.clear();
    for (const Recorded& r : calls) {
      if (r.comm == comm && r.isP2p && r.p2p.peer == comm->rank()) (r.p2p.isSend ? sends : recvs).push_back(&r.p2p);
    }
    checkSelfPairs(comm->rank(), sends, recvs);
  }
}

// A group's receives must write buffers of their own: one that overlaps another op's buffer
// (a send's, which it would overwrite while the send reads it; a receive's, which both would
// write) gives wrong data, silently (sendrecv(x, x, peer) returned this rank's own values).
// Sorted by address, each receive is compared with the ops before it that reach furthest.
// (An alltoall's, gather's or scatter's sends and receives lay their buffers out themselves;
// a receive from self copies from its send to self as memmove does, overlapping or not: the
// torch backend's gather, scatter and all_to_all in place make such pairs in one buffer.)
void checkGroupReceivesApart(const std::vector<Recorded>& calls) {
  struct Span {
    uintptr_t from, to;
    const P2pCall* op;
  };
  // (On the stack for a small group, a sendrecv's say: no allocation, no thread-local lookup.)
  Span few[16];
  std::vector<Span> many;
  Span* spans = few;
  size_t n = 0;
  if (calls.size() > std::size(few)) {
    many.resize(calls.size());
    spans = many.data();
  }
  for (const Recorded& r : calls) {
    bool fromSelf = !r.p2p.isSend && r.p2p.peer == r.comm->rank();
    size_t bytes = r.isP2p && !r.ofCollective && !fromSelf ? r.p2p.count * dataTypeSize(r.p2p.dtype) : 0;
    auto at = reinterpret_cast<uintptr_t>(r.p2p.buf);
    if (bytes > 0) spans[n++] = {at, at + bytes, &r.p2p};
  }
  std::sort(spans, spans + n, [](const Span& a, const Span& b) { return a.from < b.from; });
  const Span *furthest = nullptr, *furthestRecv = nullptr;  // among the spans so far
  auto describe = [](const P2pCall& op) {
    return std::string(op.isSend ? "a send to" : "a recv from") + " rank " + std::to_string(op.peer) + " (" +
           amountOf(op.count * dataTypeSize(op.dtype), op.dtype) + ")";
  };
  for (const Span& s : std::span(spans, n)) {
    const Span* hit = !s.op->isSend ? furthest : furthestRecv;
    if (hit && hit->to > s.from) {
      const P2pCall& recv = hit->op->isSend ? *s.op : *hit->op;
      const P2pCall& other = hit->op->isSend ? *hit->op : *s.op;
      throwError(mnclInvalidUsage, "in one group, the buffer of " + describe(recv) + " overlaps that of " +
                                       describe(other) + ": the receive would write what " +
                                       (other.isSend ? "the send reads" : "the other receive writes") +
                                       "; pass separate buffers (for sendrecv in place, a copy of the data to send)");
    }
    if (!furthest || s.to > furthest->to) furthest = &s;
    if (!s.op->isSend && (!furthestRecv || s.to > furthestRecv->to)) furthestRecv = &s;
  }
}

// A group's collective calls enter their communicators' call logs when it runs, in the order
// recorded, not when they were recorded: a group refused before its end (groupRefuse) leaves
// no call in a log that its peers would wait to see made.
void logGroupCalls(std::vector<Recorded>& calls) {
  for (Recorded& r : calls) {
    if (!r.log) continue;
    r.comm->logCall(*r.log);
    r.callNumber = r.comm->collectiveCallsMade();
  }
}

// A collective call of count 0 moves nothing, so no step of it meets a peer's: its peers'
// logs say whether they made the same call (Comm::checkZeroCountCall).
void checkIfZeroCount(const Recorded& r) {
  if (!r.isP2p && r.coll.count == 0 && r.callNumber > 0) r.comm->checkZeroCountCall(r.callNumber);
}

void runRecorded(std::vector<Recorded>& calls) {
  for (const Recorded& r : calls) {
    MNCL_CHECK(r.comm->onGpu() == calls[0].comm->onGpu(), mnclInvalidUsage,
               "a group mixes CPU and CUDA communicators: run each kind in a group of its own");
  }
  checkGroupSelfPairs(calls);  // (the checks first: a group refused logs no call)
  checkGroupReceivesApart(calls);
  logGroupCalls(calls);
  countGroupP2p(calls);
  if (!calls.empty() && calls[0].comm->onGpu()) return runRecordedOnGpu(calls);
  // A plan per communicator, in the order of their first calls; reused from group to group
  // (as a single call's), so that a small group allocates nothing.
  thread_local std::vector<CommLaunch> plans;
  size_t nplans = 0;
  auto planOf = [&](Comm* comm) -> CommLaunch& {
    for (size_t i = 0; i < nplans; ++i) {
      if (plans[i].comm == comm) return plans[i];
    }
    if (nplans == plans.size()) plans.emplace_back();
    plans[nplans].reset(comm);
    return plans[nplans++];
  };
  for (Recorded& r : calls) planOf(r.comm);
  bool ran = false;
  std::exception_ptr notEntered;  // why a communicator's call scope refused its calls
  try {
    CallScopes scopes;
    for (size_t i = 0; i < nplans; ++i) {
      auto [inside, peers] = insideOf(calls, plans[i].comm);
      try {
        scopes.enter(*plans[i].comm, inside, peers);
      } catch (...) {  // (a second thread on it, which fails it): its calls do not run, the others do (see launch)
        plans[i].usable = false;
        if (!notEntered) notEntered = std::current_exception();
      }
    }
    for (Recorded& r : calls) plan(planOf(r.comm), r);
    launch(plans.data(), nplans, &ran, &scopes);
    for (const Recorded& r : calls) checkIfZeroCount(r);
  } catch (...) {
    if (ran) {
      for (size_t i = 0; i < nplans; ++i) {
        if (plans[i].usable) plans[i].comm->awaitPeersOutOfCalls();  // (see recordOrRun)
      }
    }
    throw;
  }
  if (notEntered) std::rethrow_exception(notEntered);
}

// Inside a group: appends the call to this thread's group, which runs at groupEnd. Outside one:
// plans and runs it now (on a GPU: launches it on its stream).
void recordOrRun(const Recorded& r) {
  if (tlsGroupDepth > 0) {
    tlsRecorded.push_back(r);
    return;
  }
  if (r.isP2p) {
    MNCL_CHECK(r.p2p.peer != r.comm->rank(), mnclInvalidUsage,
               std::string("a ") + (r.p2p.isSend ? "send to" : "recv from") + " self (rank " +
                   std::to_string(r.p2p.peer) + ") outside a group never meets its other half: post the send and " +
                   "the recv in one group (minincl.group(), mnclGroupStart / mnclGroupEnd)");
    noteP2p(r);
    size_t bytes = r.p2p.count * dataTypeSize(r.p2p.dtype);
    size_t opBytes = p2pSplit(*r.comm, bytes, r.p2p.peer).bytesOn(0, bytes);
    r.comm->countP2p(r.p2p.isSend, r.p2p.peer, opBytes, opBytes);
  }
  auto [inside, peers] = insideOf(r);
  if (r.comm->onGpu()) {
    Comm::CallScope scope(*r.comm, inside, peers);
    launchGpuCalls({{r.comm, r.isP2p, r.coll, r.p2p, r.callNumber}});
    return;
  }
  bool ran = false;
  try {
    Comm::CallScope scope(*r.comm, inside, peers);
    thread_local CommLaunch single;
    single.reset(r.comm);
    plan(single, r);
    launch(&single, 1, &ran);
    checkIfZeroCount(r);
  } catch (...) {
    // A call that ran and failed returns its buffers only once no peer can touch them (after
    // leaving the call: a peer that failed as well waits for that).
    if (ran) r.comm->awaitPeersOutOfCalls();
    throw;
  }
}

// Leaves the group an alltoall, gather or scatter opened for its parts, after one of them was
// refused: the parts already recorded do not run (an enclosing group is refused by the caller).
void leaveGroupAfterError() {
  if (tlsGroupDepth > 1) --tlsGroupDepth;
  else groupDiscard();
}

// A collective call as every rank must make it: the reduction and root only where they matter.
LoggedCall loggedCallOf(const CollCall& c) {
  bool rooted = c.coll == Coll::broadcast || c.coll == Coll::reduce;
  return {(uint8_t)c.coll, (uint8_t)c.dtype, reduces(c.coll) ? (uint8_t)c.op : (uint8_t)0, rooted ? c.root : 0, c.count};
}

// Logs the collective call `r` starts: now, or inside a group when the group runs (logGroupCalls).
void logCall(Recorded& r, const LoggedCall& call) {
  if (tlsGroupDepth > 0) {
    r.log = call;
    return;
  }
  r.comm->logCall(call);
  r.callNumber = r.comm->collectiveCallsMade();
}

}  // namespace

void enqueueColl(Comm& comm, const CollCall& call) {
  validate(comm, call);
  Recorded r{&comm, false, asRun(comm, call), {}};
  logCall(r, loggedCallOf(call));  // (as made: avg, not the premulsum it runs as)
  recordOrRun(r);
}

void enqueueBarrier(Comm& comm, int32_t* word) {
  CollCall call{Coll::allreduce, word, word, 1, DataType::i32, RedOp::sum, 0};
  call.runtimesOwn = true;
  validate(comm, call);
  Recorded r{&comm, false, call, {}};
  logCall(r, {kBarrierCall, (uint8_t)DataType::i32, 0, 0, 0});
  recordOrRun(r);
}

void enqueueP2p(Comm& comm, const P2pCall& call) {
  validate(comm, call);
  recordOrRun({&comm, true, {}, call});
}

void enqueueSendRecv(Comm& comm, const P2pCall& send, const P2pCall& recv) {
  validate(comm, send);
  validate(comm, recv);
  groupStart();
  recordOrRun({&comm, true, {}, send});
  recordOrRun({&comm, true, {}, recv});
  groupEnd();
}

void enqueueExchange(Comm& comm, const std::vector<P2pCall>& calls, const LoggedCall& logged) {
  groupStart();  // (with no part, the root of one rank in place, there is no peer to see the log)
  try {
    for (size_t i = 0; i < calls.size(); ++i) {
      Recorded r{&comm, true, {}, calls[i], true};
      if (i == 0) logCall(r, logged);
      recordOrRun(r);
    }
  } catch (...) {
    leaveGroupAfterError();
    throw;
  }
  groupEnd();
}

void groupStart() { ++tlsGroupDepth; }

void groupRefuse(mnclResult_t code, const std::string& why) {
  if (tlsGroupDepth > 0 && !tlsGroupRefusal) tlsGroupRefusal.emplace(code, why);
}

bool groupRefused() { return tlsGroupRefusal.has_value(); }

void groupDiscard() {
  if (tlsGroupDepth == 0) return;
  if (--tlsGroupDepth > 0) {
    groupRefuse(mnclInvalidUsage, "an exception left an inner group");
    return;
  }
  tlsRecorded.clear();
  tlsGroupRefusal.reset();
}

void groupEnd() {
  MNCL_CHECK(tlsGroupDepth > 0, mnclInvalidUsage, "mnclGroupEnd without a matching mnclGroupStart");
  if (--tlsGroupDepth > 0) return;
  if (tlsGroupRefusal) {
    auto [code, why] = std::move(*tlsGroupRefusal);
    tlsGroupRefusal.reset();
    tlsRecorded.clear();
    throwError(code, "none of the group's calls ran, as one of them was refused: " + why);
  }
  thread_local std::vector<Recorded> calls;  // (swapped with tlsRecorded: both keep their memory)
  calls.clear();
  calls.swap(tlsRecorded);
  if (!calls.empty()) runRecorded(calls);
}

void groupForget(const Comm* comm) {
  std::erase_if(tlsRecorded, [comm](const Recorded& r) { return r.comm == comm; });
}

int groupDepth() { return tlsGroupDepth; }

void checkNoOpenGroup(const std::string& what) {
  MNCL_CHECK(tlsGroupDepth == 0, mnclInvalidUsage,
             what + " inside a group is not supported: it blocks until every rank joins, so one thread could "
                    "wait for itself; call it outside the group (one thread per rank when a thread drives several)");
}

}  // namespace mncl
