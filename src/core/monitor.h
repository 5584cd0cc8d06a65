// Watches the peers of a communicator so that a vanished peer becomes an error, not a hang.
//
// Every tick (10 ms while a call runs, up to 250 ms idle: see nextTick) it bumps this rank's
// heartbeat and looks at each peer's control block:
//  - the peer failed (aborted, or hit an error)     -> RemoteError naming it, at once;
//  - the peer's process is gone (same host)         -> RemoteError, at once;
//  - the peer's heartbeat stopped for MININCL_TIMEOUT -> Timeout, and the peer is given up
//    on: lost_ranks() lists it (see gaveUpOn);
//  - the peer destroyed its communicator while this rank is inside a call the peer never
//    made (a later collective, a receive beyond its sends) -> RemoteError, at once; inside
//    another call that waits on it (a collective, or sends and receives with it: the peer
//    may have done its part) that has waited for MININCL_TIMEOUT since the peer left
//                                                    -> RemoteError;
//  - the peer made another collective call than ours under the same number (see
//    call_log.h)                                     -> InvalidUsage naming both, at once;
//  - the ranks' sends and receives before a collective call they all made do not pair up
//    (see call_log.h)                                -> InvalidUsage with each rank's counts;
//  - we are inside a collective call the peer has not made, and it is inside sends or
//    receives none of whose peers can post theirs (see call_log.h) for a second
//                                                    -> InvalidUsage naming the deadlock;
//  - sends and receives wait on each other in a cycle through this rank (see call_log.h)
//    for a second                                    -> InvalidUsage naming each wait;
//  - this rank's call has lasted longer than the communicator's call timeout (on a GPU: a
//    launch has not finished that long after it was queued; off by default: see
//    Comm::callTimeout)                              -> Timeout saying where each rank is.
// fail() sets the abort word, so every spin loop of this rank stops within microseconds. An
// error found just after this process stalled past MININCL_TIMEOUT (SIGSTOP, a debugger)
// says so: its peers may have given up on it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "minincl.h"

namespace mncl {

class Comm;

// Whether process pid (on this host) is gone, or (`orZombie`) a zombie waiting for its parent
// to reap it (a killed child of a launcher).
bool processGone(int pid, bool orZombie = true);

class Monitor {
 public:
  explicit Monitor(Comm& comm);
  ~Monitor();
  static double timeoutSeconds();  // MININCL_TIMEOUT, default 5 s
  static std::chrono::steady_clock::time_point timeoutFromNow();  // now + MININCL_TIMEOUT
  // What an error found now adds when this process did not run for half MININCL_TIMEOUT or
  // more just before (SIGSTOP, a debugger): its peers may have given up on it. "" otherwise. Any
  // thread: a call that learns of a peer's failure may run before this loop's next look.
  std::string stallNote() const;
  // Whether this loop gave up on peer r: its heartbeat stopped for MININCL_TIMEOUT while its
  // state said running (a stopped or hung process). For good, as a peer that left; after this
  // communicator failed the loop still looks, so that every such peer is found. Any thread.
  bool gaveUpOn(int r) const { return gaveUp_[r].load(std::memory_order_acquire); }
  // A call is starting on this communicator (Comm::CallScope): an idle tick ends now, so
  // that the call is watched every kBusyTick from its start.
  void callStarting();

 private:
  static constexpr std::chrono::milliseconds kBusyTick{10}, kLongestIdleTick{250};
  static std::chrono::milliseconds idleTick(const Comm& comm);
  static constexpr double kZombieLookEvery = 0.05;  // seconds
  std::chrono::milliseconds nextTick();
  uint64_t callsLogged() const;  // this rank's collective calls, sends and receives so far
  void loop();
  void noteOwnStall(double now);
  void fail(mnclResult_t code, const std::string& message);  // comm_.fail (which adds stallNote)
  void checkPeer(int r, double now);
  bool heartbeatStopped(int r, double now);  // for MININCL_TIMEOUT (watch_[r] follows it)
  void giveUpOnStoppedPeers(double now);     // (after this communicator failed)
  bool inThisProcess(int r) const;  // (a thread of this process: its heartbeat is ours)
  bool checkCalls(int r);
  std::string callThePeerNeverMade(int r) const;
  // The number (CallActivity::entered) of our call under way if it waits on peer r (a
  // collective, or sends and receives with it), else 0. GPU: 1 while a kernel is pending.
  uint64_t callWaitingOn(int r) const;
  uint64_t stepsMoved() const;  // grows as this rank's connections move steps
  bool waitsForLivePeerBesides(int r) const;
  void checkP2pBalance();
  void checkDeadlock(double now);
  std::optional<uint64_t> blockedBehind(int r, uint64_t collective) const;
  // Rank `rank` cannot end its call before `peer` posts more: its receive `number` from the
  // peer, which posted `peerPosted` sends to it; its long send `number`, against the peer's
  // `peerPosted` receives; or (collective) its collective call `number`, which the peer has
  // not made (it made `peerPosted`).
  struct Wait {
    int rank, peer;
    bool longSend;
    uint64_t number, peerPosted;
    bool collective = false;
  };
  void checkWaitCycle(double now);
  void checkCallTimeout(double now);
  void checkGpuCallTimeout(double now);
  // Where every rank is, from the call logs, each peer whose heartbeat has stopped marked;
  // `anyStopped` says whether one has.
  std::string whereRanksAre(double now, bool* anyStopped) const;
  std::vector<Wait> waitCycle() const;
  std::optional<Wait> waitOn(int r, int p, bool everyRankInside) const;
  static std::string describe(const Wait& w);

  Comm& comm_;
  double timeout_;
  std::chrono::milliseconds idleTick_;
  struct PeerWatch {
    uint64_t lastBeat = 0;
    // leftSince: since when our call leftCall has waited on the peer while it was gone, moving
    // no step (stepsMoved() was leftMoved) nor waiting for a live peer late to it (-1: none has).
    double lastChange = 0, leftSince = -1, zombieLookedAt = -1;
    uint64_t leftCall = 0, leftMoved = 0;
    uint64_t blockedCall = 0;  // the peer's call (CallActivity::entered) blocked behind ours
    double blockedSince = 0;
  };
  std::vector<PeerWatch> watch_;
  std::unique_ptr<std::atomic<bool>[]> gaveUp_;  // [rank]: see gaveUpOn
  std::vector<uint64_t> cycleKey_;  // the wait cycle seen last (its ranks and their calls' numbers)
  double cycleSince_ = 0;
  uint64_t myCall_ = 0;  // this rank's call (CallActivity::entered), and since when
  double myCallSince_ = 0;
  uint64_t timedCall_ = 0;  // this rank's call the call timeout runs for, and since when
  double timedCallSince_ = 0;
  uint64_t balancedUpTo_ = 0;  // the newest collective call whose sends and receives paired up
  // When the loop last looked (a long gap: this process stalled); this process's last stall,
  // and when it ended. (Atomic: stallNote reads them from other threads.)
  std::atomic<double> lastTick_{0}, stall_{0}, stallEnded_{-1e9};
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool woken_ = false;                // (callStarting; under mutex_)
  std::atomic<bool> idleWait_{false};  // the loop is in (or about to enter) an idle tick
  uint64_t callsSeen_ = 0;            // callsLogged() at the last tick
  std::thread thread_;
};

}  // namespace mncl
