// The call timeout (Comm::callTimeout): a call that stays inside a CPU communicator longer
// than that, or a GPU communicator's launch that has not finished that long after it was
// queued (gpu::LaunchWatch), fails it with mnclTimeout. A peer that stops is caught by its
// heartbeat (MININCL_TIMEOUT); a peer that lives on but never makes the call (stuck in its own
// code, or a call skipped where nothing pairs up to show it) only by a limit on the call
// itself, as torch's process-group timeout and NCCL's watchdog do. The error says where every
// rank is, from the call logs (call_log.h): the ranks that have not reached this call stand out.
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include "../../cuda/arch.h"
#include "../gpu/gpu_comm.h"
#include "comm.h"
#include "monitor.h"

namespace mncl {

namespace {

std::string formatSeconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", s);
  return buf;
}

std::string rankList(uint64_t mask) {
  std::string list;
  for (int p = 0; p < 64; ++p) {
    if (mask >> p & 1) list += (list.empty() ? "" : ", ") + std::to_string(p);
  }
  return list;
}

// "inside collective call 42 (allreduce(count=10, float32, sum))", "in no call", ...
std::string activityOf(const CallLog& log) {
  uint64_t made = dev::loadAcquire(&log.made);
  std::optional<CallActivity> a = callActivity(log);
  if (!a) return "entering a call";
  switch (a->inside) {
    case Inside::nothing:
      return "in no call (" + std::to_string(made) + " collective call(s) made)";
    case Inside::collectives: {
      std::optional<LoggedCall> call = loggedCall(log, made);
      return "inside collective call " + std::to_string(made) + (call ? " (" + describeCall(*call) + ")" : std::string());
    }
    case Inside::sendsAndReceives:
      return "inside sends / receives with rank(s) " + rankList(a->peers) + " (after " + std::to_string(made) +
             " collective call(s))";
    case Inside::both: break;
  }
  return "inside a group of collective call(s) and sends / receives (" + std::to_string(made) +
         " collective call(s) made)";
}

// A GPU rank's calls return at once, so its log says only how far it got:
// "3 collective call(s) made, 2 send(s) and 2 receive(s) posted".
std::string progressOf(const CallLog& log) {
  return std::to_string(dev::loadAcquire(&log.made)) + " collective call(s) made, " +
         std::to_string(dev::loadAcquire(&log.sendsPosted)) + " send(s) and " +
         std::to_string(dev::loadAcquire(&log.recvsPosted)) + " receive(s) posted";
}

// A heartbeat moves every monitor tick (250 ms at most): one still for this long means the rank's process is
// stopped (SIGSTOP, a debugger) or starved of CPU, whatever its call log last said.
constexpr double kStoppedAfterSeconds = 1.0;

// How a call timeout's story ends: what holds the call up.
std::string whatHoldsIt(bool anyStopped, const char* otherwise) {
  return anyStopped ? ". A rank whose heartbeat stopped holds the others (MININCL_TIMEOUT ends the wait for it)"
                    : otherwise;
}

const char* const kWhereTheLimitIsSet =
    "the communicator's call timeout: Communicator.call_timeout (mnclCommSetCallTimeout in C), "
    "MININCL_CALL_TIMEOUT, or torch's process-group timeout";

}  // namespace

void Monitor::checkCallTimeout(double now) {
  double limit = comm_.callTimeout();
  std::optional<CallActivity> me = callActivity(comm_.region_->ctrl()->calls);
  if (!me) return;  // (entering a call: the next tick sees it)
  bool inside = me->inside != Inside::nothing;
  if (!inside || limit <= 0 || me->entered != timedCall_) {
    timedCall_ = inside ? me->entered : 0;
    timedCallSince_ = now;
    return;
  }
  if (now - timedCallSince_ < limit) return;
  bool anyStopped = false;
  std::string where = whereRanksAre(now, &anyStopped);
  fail(mnclTimeout, "call timeout: rank " + std::to_string(comm_.rank()) + " has been " +
                        activityOf(comm_.region_->ctrl()->calls) + " for more than " + formatSeconds(limit) +
                        " (" + kWhereTheLimitIsSet + "); " + where +
                        whatHoldsIt(anyStopped, ". A rank behind the others has not reached this call"));
}

void Monitor::checkGpuCallTimeout(double now) {
#if defined(MININCL_HAVE_CUDA)
  double limit = comm_.callTimeout();
  if (limit <= 0) return;
  std::optional<gpu::LaunchWatch::Launched> late = comm_.gpu()->launchWatch().oldestUnfinished();
  if (!late || now - late->enqueuedAt < limit) return;
  std::string what = "sends / receives (after " + std::to_string(late->call) + " collective call(s))";
  if (!late->p2p) {
    std::optional<LoggedCall> call = loggedCall(comm_.region_->ctrl()->calls, late->call);
    what = "collective call " + std::to_string(late->call) + (call ? " (" + describeCall(*call) + ")" : std::string());
  }
  bool anyStopped = false;
  std::string where = whereRanksAre(now, &anyStopped);
  fail(mnclTimeout, "call timeout: rank " + std::to_string(comm_.rank()) + "'s kernel for " + what +
                        " has not finished " + formatSeconds(limit) + " after it was queued (" +
                        kWhereTheLimitIsSet + "); " + where +
                        whatHoldsIt(anyStopped, ". A rank behind the others has not made this call (or work "
                                                "queued before it on its stream took that long)"));
#else
  (void)now;
#endif
}

// "rank 0: inside collective call 3 (...); rank 1: in no call (2 collective call(s) made)";
// on a GPU "rank 0: 3 collective call(s) made, ...; rank 1: 2 collective call(s) made, ...".
std::string Monitor::whereRanksAre(double now, bool* anyStopped) const {
  std::string where;
  constexpr int kListed = 16;
  for (int r = 0; r < comm_.nranks(); ++r) {
    const RankCtrl* ctrl = comm_.peerRegions_[r]->ctrl();
    bool left = r != comm_.rank() && ctrl->gone();
    // (Only a running peer in another process has a heartbeat of its own that checkPeer times.)
    bool beats = r != comm_.rank() && !left && !inThisProcess(r);
    double still = beats ? now - watch_[r].lastChange : 0;
    bool stopped = still >= kStoppedAfterSeconds;
    *anyStopped |= stopped;
    if (r >= kListed) continue;
    where += (r ? "; rank " : "rank ") + std::to_string(r) + ": " +
             (comm_.onGpu() ? progressOf(ctrl->calls) : activityOf(ctrl->calls));
    if (left) where += ", then it destroyed its communicator";
    if (stopped) where += ", its heartbeat still for " + formatSeconds(std::round(still * 10) / 10) + " (stopped?)";
  }
  if (comm_.nranks() > kListed) where += "; ...";
  return where;
}

}  // namespace mncl
