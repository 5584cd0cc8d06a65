// How a communicator fails and ends: its error state (the first failure's), abort and
// destroy's stops, leaving; and what it knows of its peers' ends: which ranks it lost, why a
// peer failed, and (after its own failure) when its peers are out of their calls.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../transport/net.h"
#include "comm.h"
#include "error.h"
#include "log.h"
#include "monitor.h"

namespace mncl {

void Comm::fail(mnclResult_t code, const std::string& what) {
  std::string message = what + (monitor_ ? monitor_->stallNote() : std::string());
  {
    std::lock_guard<std::mutex> lock(errorMutex_);
    if (error_ != mnclSuccess) return;
    error_ = code;
    errorMessage_ = message;
  }
  dev::storeRelease(abort_, 1u);
  if (region_) {
    RankCtrl* ctrl = region_->ctrl();
    ctrl->failCode = code;
    std::strncpy(ctrl->failMessage, message.c_str(), sizeof(ctrl->failMessage) - 1);
    dev::storeRelease(&ctrl->state, (uint32_t)RankCtrl::kFailed);
  }
  if (code != mnclAborted) MNCL_WARN(kInit, "rank %d: %s", rank_, message.c_str());
}

void Comm::storeShmFault() const {
  if (!shmFaults_.faulted() || asyncErrorStored() != mnclSuccess) return;
  size_t room = ShmMapping::devShmBytes(), free = ShmMapping::devShmFreeBytes();
  std::string sizes = room ? " (" + std::to_string(free >> 20) + " MiB free of " + std::to_string(room >> 20) + ")" : "";
  // (const for the readers' sake; no Comm is ever defined const.)
  const_cast<Comm*>(this)->fail(
      mnclSystemError,
      "/dev/shm had no room for a page of this rank's connection buffers" + sizes +
          ": tmpfs gives pages as they are first touched, and this one gave SIGBUS (caught). Give /dev/shm more (a "
          "container's: docker run --shm-size=1g), or make the buffers smaller (MININCL_NCHANNELS, "
          "MININCL_SIMPLE_SLOT_BYTES)");
}

mnclResult_t Comm::asyncErrorStored() const {
  std::lock_guard<std::mutex> lock(errorMutex_);
  return error_;
}

mnclResult_t Comm::asyncError() const {
  storeShmFault();
  return asyncErrorStored();
}

std::string Comm::errorMessage() const {
  storeShmFault();
  std::lock_guard<std::mutex> lock(errorMutex_);
  return errorMessage_;
}

const char* Comm::failedMessage() const {
  storeShmFault();
  std::lock_guard<std::mutex> lock(errorMutex_);
  return error_ == mnclSuccess ? "" : errorMessage_.c_str();
}

void Comm::throwStoredError() const {
  storeShmFault();
  std::lock_guard<std::mutex> lock(errorMutex_);
  throw Error(error_ == mnclSuccess ? mnclInternalError : error_, errorMessage_);
}

void Comm::stopCallsForDestroy() {
  stop("the communicator was destroyed while this call still waited for its peers (a destroy stops such calls "
       "after MININCL_TIMEOUT; abort() stops them at once)");
}

void Comm::abort() {
  stop("the communicator was aborted (mnclCommAbort / comm.abort())");
  uint32_t spins = 0;
  while (callsInside_.load(std::memory_order_acquire) > 0) dev::cpuBackoff(spins++);
}

void Comm::stop(const std::string& why) {
  fail(mnclAborted, why);  // (first: a rendezvous that sees the count raises `why`)
  {
    std::lock_guard<std::mutex> lock(errorMutex_);
    stopReason_ = why;
  }
  stops_.fetch_add(1, std::memory_order_acq_rel);
}

void Comm::failIfStoppedSince(uint32_t before) const {
  if (stops_.load(std::memory_order_acquire) == before) return;
  std::lock_guard<std::mutex> lock(errorMutex_);
  throwError(mnclAborted, stopReason_);
}

// A mismatch in the last calls before a destroy has no next call to raise it (a broadcast
// whose ranks passed different roots ends on every rank, with wrong results): say so.
void Comm::warnOfUnreportedMismatch() const {
  if (!region_ || failed()) return;  // (a failure was reported when it happened)
  for (int r = 0; r < nranks_; ++r) {
    std::string mismatch = r == rank_ ? "" : loggedCallMismatch(r);
    if (mismatch.empty()) continue;
    MNCL_WARN(kInit, "rank %d, at destroy: %s; that call's results are wrong", rank_, mismatch.c_str());
    return;
  }
}

void Comm::leave() {
  if (!region_) return;
  RankCtrl* ctrl = region_->ctrl();
  dev::storeRelease(&ctrl->destroyed, 1u);
  // Running -> left in one step: a failed rank keeps its state, and so the reason peers read,
  // even where the monitor fails us between a load and a store.
  uint32_t running = RankCtrl::kRunning;
  std::atomic_ref<uint32_t>(ctrl->state).compare_exchange_strong(running, RankCtrl::kLeft, std::memory_order_acq_rel);
}

std::vector<int> Comm::lostRanks() const {
  std::vector<int> gone;
  for (int r = 0; r < nranks_; ++r) {
    if (r != rank_ && lost(r)) gone.push_back(r);
  }
  return gone;
}

bool Comm::lost(int r) const {
  bool left = peerRegions_[r]->ctrl()->gone();
  bool cut = overNetwork(r) && netProxy_ && netProxy_->lost(r);
  return left || exited(r) || cut || givenUpOn(r);
}

// By this rank's monitor, or by a peer's: a peer publishes the rank whose silence failed it,
// or the one that a peer whose failure failed it had published (this rank may hear of the
// failure before its own monitor's time for r runs out). One rank each: a second silent rank
// is listed once this rank's own time for it runs out.
bool Comm::givenUpOn(int r) const {
  if (monitor_ && monitor_->gaveUpOn(r)) return true;
  for (int p = 0; p < nranks_; ++p) {
    if (p != r && p != rank_ && dev::loadAcquire(&peerRegions_[p]->ctrl()->gaveUpOn) == (uint32_t)r + 1) return true;
  }
  return false;
}

bool Comm::exited(int r) const {
  const PeerInfo &peer = peers_[r], &me = peers_[rank_];
  if (overNetwork(r) && netProxy_ && netProxy_->vanished(r)) return true;
  return peer.hostHash == me.hostHash && peer.pid != me.pid && processGone(peer.pid);
}

std::string Comm::peerFailure(int r) const {
  const RankCtrl* ctrl = peerRegions_[r]->ctrl();
  if (dev::loadAcquire(&ctrl->state) != RankCtrl::kFailed) return "";
  return "rank " + std::to_string(r) + " (pid " + std::to_string(peers_[r].pid) + ") failed: " + ctrl->failMessage;
}

bool Comm::peerOutOfCalls(int r) const {
  const RankCtrl* ctrl = peerRegions_[r]->ctrl();
  uint32_t state = dev::loadAcquire(&ctrl->state);
  if (state == RankCtrl::kLeft) return true;
  bool otherProcess = peers_[r].pid != peers_[rank_].pid;
  if (otherProcess && processGone(peers_[r].pid)) return true;
  if (state != RankCtrl::kFailed) return false;
  // (Pairs with the fence in launch (enqueue.cc), after a rank enters a call and before it
  // checks whether it failed: either it sees its failure there, or we see it inside here.)
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::optional<CallActivity> a = callActivity(ctrl->calls);
  return a && a->inside == Inside::nothing;
}

void Comm::awaitPeersOutOfCalls() const {
  if (!failed() || onGpu() || !region_) return;
  using Clock = std::chrono::steady_clock;
  auto deadline = Clock::now() + std::chrono::duration<double>(Monitor::timeoutSeconds());
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_ || netPeer_[r]) continue;  // (a network peer's proxy is ours: see netSettle)
    // A peer whose monitor stopped beating (a stopped process) will not fail: not waited for
    // once its heartbeat stood still for 100 ms (inside a call its monitor beats every 10).
    const RankCtrl* ctrl = peerRegions_[r]->ctrl();
    uint64_t beat = dev::loadAcquire(&ctrl->heartbeat);
    auto beatSeen = Clock::now();
    while (!peerOutOfCalls(r) && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      uint64_t now = dev::loadAcquire(&ctrl->heartbeat);
      if (now != beat) beat = now, beatSeen = Clock::now();
      if (Clock::now() - beatSeen > std::chrono::milliseconds(100)) break;
    }
  }
}

}  // namespace mncl
