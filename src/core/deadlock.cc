// Deadlocks the monitor names (see monitor.h and call_log.h): calls that wait on each other
// and cannot end, whose ranks stay alive and keep their heartbeats going. Both checks are for
// CPU communicators, whose calls return only when they are done, so that a rank inside a
// call posts nothing more until it ends.
#include <optional>
#include <string>
#include <vector>

#include "../../cuda/arch.h"
#include "comm.h"
#include "monitor.h"

namespace mncl {

namespace {
// How long a wait must last, unchanged, before it is an error: a rank whose data is there
// finishes far sooner, on a busy machine too.
constexpr double kDeadlockSeconds = 1.0;
// How long this rank's call must have lasted before the monitor looks for waits in a cycle.
constexpr double kSearchAfterSeconds = 0.1;

// A rank inside a call.
bool insideOneCall(const std::optional<CallActivity>& a) { return a && a->inside != Inside::nothing; }
}  // namespace

// Sends and receives that wait for our collective call, which waits for them (see
// call_log.h): we are inside collective call s; peer r has not made it, and is inside sends
// or receives whose every peer is inside a collective call r has not made either, so none of
// them posts the other half. After a second of that, with r still in the same call, it is
// an error.
void Monitor::checkDeadlock(double now) {
  const CallLog& mine = comm_.region_->ctrl()->calls;
  uint64_t s = dev::loadAcquire(&mine.made);
  std::optional<CallActivity> me = callActivity(mine);
  bool inCollective = me && me->inside == Inside::collectives;
  for (int r = 0; r < comm_.nranks(); ++r) {
    PeerWatch& w = watch_[r];
    std::optional<uint64_t> blocked = inCollective && r != comm_.rank() ? blockedBehind(r, s) : std::nullopt;
    if (!blocked || *blocked != w.blockedCall) {
      w.blockedCall = blocked.value_or(0);
      w.blockedSince = now;
      continue;
    }
    if (now - w.blockedSince < kDeadlockSeconds) continue;
    std::string peers;
    uint64_t mask = callActivity(comm_.peerRegions_[r]->ctrl()->calls).value_or(CallActivity{}).peers;
    for (int p = 0; p < kP2pPeers; ++p) {
      if (mask >> p & 1) peers += (peers.empty() ? "" : ", ") + std::to_string(p);
    }
    std::optional<LoggedCall> ours = loggedCall(mine, s);
    fail(mnclInvalidUsage, "deadlock: rank " + std::to_string(r) + " waits in sends or receives with rank(s) " +
                               peers + ", which are inside collective call " + std::to_string(s) +
                               (ours ? " (" + describeCall(*ours) + ")" : std::string()) + ", which rank " +
                               std::to_string(r) + " has not made; every rank must make the same calls in the same order");
    return;
  }
}

// Peer r's call number (CallActivity::entered), if r is inside sends or receives that cannot
// end while our collective call s runs: it has not made call s, every rank it sends to or
// receives from is inside a collective call that r has not made, and r waits on one of them
// (a receive it has not sent, or a long send it has not received: see PeerP2p). Where none
// is, r has only to run, and may not have for a while: stopped, or in a debugger.
std::optional<uint64_t> Monitor::blockedBehind(int r, uint64_t s) const {
  const CallLog& log = comm_.peerRegions_[r]->ctrl()->calls;
  uint64_t made = dev::loadAcquire(&log.made);
  std::optional<CallActivity> a = callActivity(log);
  if (!a || a->inside != Inside::sendsAndReceives || a->peers == 0 || made >= s) return std::nullopt;
  bool waitsForOne = r >= kP2pPeers;  // (its per-peer counts are not kept: taken to wait)
  for (int p = 0; p < comm_.nranks() && p < kP2pPeers; ++p) {
    if (!(a->peers >> p & 1)) continue;
    const CallLog& theirs = comm_.peerRegions_[p]->ctrl()->calls;
    std::optional<CallActivity> b = callActivity(theirs);
    if (!b || b->inside != Inside::collectives || dev::loadAcquire(&theirs.made) <= made) return std::nullopt;
    PeerP2p rWithP = peerP2p(log, p), pWithR = peerP2p(theirs, r);
    waitsForOne = waitsForOne || rWithP.recvs > pWithR.sends ||
                  sendAwaitingReceives(rWithP, pWithR, comm_.shareFifos(r, p)) != 0;
  }
  if (!waitsForOne) return std::nullopt;
  return a->entered;
}

// Why rank r cannot end its call before peer p posts more (see PeerP2p), if it cannot.
// Also, while every rank is inside a call (none can post anything new): r is inside
// collective call s, which p has not made, p being inside sends or receives.
std::optional<Monitor::Wait> Monitor::waitOn(int r, int p, bool everyRankInside) const {
  const CallLog& rLog = comm_.peerRegions_[r]->ctrl()->calls;
  const CallLog& pLog = comm_.peerRegions_[p]->ctrl()->calls;
  PeerP2p rWithP = peerP2p(rLog, p);
  PeerP2p pWithR = peerP2p(pLog, r);
  if (rWithP.recvs > pWithR.sends) return Wait{r, p, false, rWithP.recvs, pWithR.sends};
  if (uint64_t send = sendAwaitingReceives(rWithP, pWithR, comm_.shareFifos(r, p))) {
    return Wait{r, p, true, send, pWithR.recvs};
  }
  if (!everyRankInside) return std::nullopt;
  std::optional<CallActivity> a = callActivity(rLog), b = callActivity(pLog);
  uint64_t s = dev::loadAcquire(&rLog.made), made = dev::loadAcquire(&pLog.made);
  if (a && b && a->inside == Inside::collectives && b->inside == Inside::sendsAndReceives && made < s) {
    return Wait{r, p, false, s, made, true};
  }
  return std::nullopt;
}

// "rank 0 waits for rank 1 to send (its receive 2 from rank 1; rank 1 posted 1 send(s) to it)"
std::string Monitor::describe(const Wait& w) {
  std::string r = "rank " + std::to_string(w.rank), p = "rank " + std::to_string(w.peer);
  if (w.collective) {
    return r + " waits for " + p + " to make collective call " + std::to_string(w.number) + " (" + p + " made " +
           std::to_string(w.peerPosted) + " and is inside sends or receives)";
  }
  if (w.longSend) {
    uint64_t before = w.number - 1 > w.peerPosted ? w.number - 1 - w.peerPosted : 0;  // (not received yet)
    return r + " waits for " + p + " to receive (its send " + std::to_string(w.number) + " to " + p +
           " does not fit in their connections" +
           (before > 0 ? ", with the " + std::to_string(before) + " before it that " + p + " has not received" : "") +
           "; " + p + " posted " + std::to_string(w.peerPosted) + " receive(s) from it)";
  }
  return r + " waits for " + p + " to send (its receive " + std::to_string(w.number) + " from " + p + "; " + p +
         " posted " + std::to_string(w.peerPosted) + " send(s) to it)";
}

// Waits from this rank through others back to it, each rank inside one call (empty if none):
// a breadth-first search over the ranks' waits, so the cycle found is a shortest one.
std::vector<Monitor::Wait> Monitor::waitCycle() const {
  int n = comm_.nranks(), me = comm_.rank();
  if (!insideOneCall(callActivity(comm_.region_->ctrl()->calls))) return {};
  std::vector<bool> inside(n);
  bool everyRankInside = true;
  for (int r = 0; r < n; ++r) {
    inside[r] = insideOneCall(callActivity(comm_.peerRegions_[r]->ctrl()->calls));
    everyRankInside = everyRankInside && inside[r];
  }
  std::vector<std::optional<Wait>> reachedBy(n);  // the wait through which the search got to a rank
  std::vector<int> frontier{me};
  for (size_t i = 0; i < frontier.size(); ++i) {
    int r = frontier[i];
    for (int p = 0; p < n; ++p) {
      if (p == r || !inside[p] || (p != me && reachedBy[p])) continue;
      std::optional<Wait> w = waitOn(r, p, everyRankInside);
      if (!w) continue;
      if (p != me) {
        reachedBy[p] = w;
        frontier.push_back(p);
        continue;
      }
      std::vector<Wait> cycle{*w};
      for (int at = r; at != me; at = reachedBy[at]->rank) cycle.insert(cycle.begin(), *reachedBy[at]);
      return cycle;
    }
  }
  return {};
}

// Sends and receives that wait on each other in a cycle through this rank (see PeerP2p):
// after a second of the same cycle, with every rank in it still in the same call, it is an
// error naming each wait.
void Monitor::checkWaitCycle(double now) {
  if (comm_.nranks() > kP2pPeers) return;
  // (Most calls end within milliseconds: the search waits for one that has not.)
  std::optional<CallActivity> a = callActivity(comm_.region_->ctrl()->calls);
  uint64_t call = a ? a->entered : 0;
  if (call != myCall_) {
    myCall_ = call;
    myCallSince_ = now;
  }
  std::vector<Wait> cycle = now - myCallSince_ >= kSearchAfterSeconds ? waitCycle() : std::vector<Wait>{};
  std::vector<uint64_t> key;  // each rank of the cycle and its call's number
  for (const Wait& w : cycle) {
    key.push_back((uint64_t)w.rank);
    key.push_back(callActivity(comm_.peerRegions_[w.rank]->ctrl()->calls).value_or(CallActivity{}).entered);
  }
  if (cycle.empty() || key != cycleKey_) {
    cycleKey_ = key;
    cycleSince_ = now;
    return;
  }
  if (now - cycleSince_ < kDeadlockSeconds) return;
  std::string waits;
  bool collective = false;
  for (const Wait& w : cycle) {
    waits += (waits.empty() ? "" : ", ") + describe(w);
    collective = collective || w.collective;
  }
  std::string advice = collective ? "every rank must make the same collective calls in the same order (sends and "
                                    "receives that wait for a rank inside a collective call come after it on every rank)"
                                  : "order them so that each receive's send comes first on the other rank, or post "
                                    "both halves of an exchange together (sendrecv, or one minincl.group())";
  fail(mnclInvalidUsage, "deadlock in sends and receives: " + waits +
                             "; each is inside its call, so none posts what the next one waits for: " + advice);
}

}  // namespace mncl
