// The calls inside a communicator: CallScope counts them (one at a time on the CPU) and says
// in this rank's call log what each is inside; the log's entries, compared with the peers'
// (see call_log.h), name mismatched calls and the sender a receive from any source waits for.
#include <cstdio>
#include <optional>
#include <string>

#include "../transport/net.h"
#include "comm.h"
#include "error.h"
#include "log.h"
#include "monitor.h"

namespace mncl {

void Comm::logCall(const LoggedCall& call) {
  if (region_) mncl::logCall(region_->ctrl()->calls, call);
  if (logsCalls_) {
    MNCL_INFO(kColl, "rank %d/%d: collective call %llu: %s", rank_, nranks_,
              (unsigned long long)collectiveCallsMade(), describeCall(call).c_str());
  }
}

uint64_t Comm::collectiveCallsMade() const { return region_ ? dev::loadAcquire(&region_->ctrl()->calls.made) : 0; }
uint64_t Comm::peerCollectiveCallsMade(int r) const {
  return peerRegions_[r] ? dev::loadAcquire(&peerRegions_[r]->ctrl()->calls.made) : 0;
}

void Comm::countP2p(bool isSend, int peer, size_t channelBytes, size_t opBytes) {
  if (!region_) return;
  // (A send that puts more on a channel than its way to the peer holds cannot end before its
  // receive: over the network, sockets and FIFOs, NetProxy::mostHeldPerChannel.)
  bool longSend = false;
  uint64_t steps = 0;
  if (!onGpu() && peer != rank_ && nChannels() > 0) {
    size_t slot = channel(0).dev.sizes.simpleSlotBytes;
    size_t held = (size_t)dev::kSteps * slot;
    if (netPeer_[peer]) held = netProxy_->mostHeldPerChannel();
    longSend = isSend && held > 0 && channelBytes > held;
    // (Before its receive starts, an op takes a step at least, and at most a slot a step.)
    steps = std::max<uint64_t>(1, (opBytes + slot - 1) / slot);
  }
  mncl::countP2p(region_->ctrl()->calls, isSend, peer == rank_ ? -1 : peer, longSend, steps);
}

int Comm::pendingSender() const {
  if (!region_ || rank_ >= kP2pPeers) return -1;
  const CallLog& mine = region_->ctrl()->calls;
  for (int p = 0; p < nranks_ && p < kP2pPeers; ++p) {
    if (p == rank_ || !peerRegions_[p]) continue;
    if (peerP2p(peerRegions_[p]->ctrl()->calls, rank_).sends > peerP2p(mine, p).recvs) return p;
  }
  return -1;
}

void Comm::checkZeroCountCall(uint64_t seq) {
  if (onGpu() || nranks_ == 1) return;
  if (netProxy_) netProxy_->sendCallLogNow();  // (network peers' waits for it: a round trip, not a heartbeat)
  uint32_t spins = 0;
  for (int r = 0; r < nranks_; ++r) {
    // (A peer that dies or hangs meanwhile fails the communicator: the monitor sees this
    // rank inside a collective call.)
    while (r != rank_ && peerRegions_[r] && peerCollectiveCallsMade(r) < seq) {
      if (failed()) throwStoredError();
      dev::cpuBackoff(spins++);
    }
  }
  for (int r = 0; r < nranks_; ++r) {
    std::string mismatch = r == rank_ ? "" : loggedCallMismatch(r);
    if (mismatch.empty()) continue;
    fail(mnclInvalidUsage, mismatch);
    throwStoredError();
  }
}

std::string Comm::loggedCallMismatch(int r) const {
  if (!region_ || !peerRegions_[r]) return "";
  const CallLog& mine = region_->ctrl()->calls;
  const CallLog& theirs = peerRegions_[r]->ctrl()->calls;
  uint64_t both = std::min(dev::loadAcquire(&mine.made), dev::loadAcquire(&theirs.made));
  for (uint64_t seq = both; seq > 0 && seq + kCallLogSize > both; --seq) {
    std::optional<LoggedCall> a = loggedCall(mine, seq), b = loggedCall(theirs, seq);
    if (!a || !b || *a == *b) continue;
    return "mismatched calls: rank " + std::to_string(rank_) + " called " + describeCall(*a) + " but rank " +
           std::to_string(r) + " (pid " + std::to_string(peers_[r].pid) + ") called " + describeCall(*b) +
           " (collective call " + std::to_string(seq) +
           " of this communicator); every rank must make the same collective calls in the same order";
  }
  return "";
}

std::string Comm::collectiveInside() const {
  if (!region_) return "";
  const CallLog& log = region_->ctrl()->calls;
  std::optional<CallActivity> a = callActivity(log);
  if (!a || a->inside != Inside::collectives) return "";
  uint64_t made = dev::loadAcquire(&log.made);
  std::optional<LoggedCall> call = loggedCall(log, made);
  return "collective call " + std::to_string(made) + (call ? ", " + describeCall(*call) : std::string());
}

void Comm::awaitQueuedWork() const {
  uint32_t spins = 0;
  while ((callsInside_.load(std::memory_order_acquire) > 0 || gpuWorkPending()) && !failed()) dev::cpuBackoff(spins++);
}

void Comm::setCallTimeout(double seconds) {
  char shown[32];
  std::snprintf(shown, sizeof(shown), "%g", seconds);  // (to_string wrote 1e300 as 301 digits)
  MNCL_CHECK(seconds >= 0 && seconds < 1e9, mnclInvalidArgument,
             std::string("a call timeout must be 0 (none) or a positive number of seconds below 1e9, not ") + shown);
  callTimeout_.store(seconds, std::memory_order_relaxed);
}

Comm::CallScope::CallScope(Comm& c, Inside inside, uint64_t peers) : comm(c) {
  // (seq_cst: see Monitor::nextTick)
  int before = comm.callsInside_.fetch_add(1, std::memory_order_seq_cst);
  if (before > 0 && !comm.onGpu()) refuseSecondThread();
  if (comm.region_ && !comm.onGpu()) enterCall(comm.region_->ctrl()->calls, inside, peers);
  if (comm.netProxy_) comm.netProxy_->wake();
  if (comm.monitor_) comm.monitor_->callStarting();
}

// A CPU call runs on the communicator's channels (their connections, FIFOs and step counts)
// from start to end: a second call entering meanwhile, from another thread, would mix its
// steps with the first's, and both (and their peers) would read wrong data or wait for ever.
// As in NCCL, a communicator takes one call at a time. Both calls fail, and the peers with
// them: the second was already logged for the peers to compare with theirs.
void Comm::CallScope::refuseSecondThread() {
  comm.callsInside_.fetch_sub(1, std::memory_order_acq_rel);
  std::string why = "two threads called on rank " + std::to_string(comm.rank_) +
                    "'s communicator at once; it takes one call at a time (use a communicator per thread, or "
                    "make the calls from one thread)";
  comm.fail(mnclInvalidUsage, why);
  throw Error(mnclInvalidUsage, why);
}

Comm::CallScope::~CallScope() {
  comm.callsInside_.fetch_sub(1, std::memory_order_acq_rel);
  if (comm.region_ && !comm.onGpu()) leaveCall(comm.region_->ctrl()->calls);
}

}  // namespace mncl
