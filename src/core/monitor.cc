#include "monitor.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <string>

#include "../../cuda/arch.h"
#include "../gpu/cuda_api.h"
#include "comm.h"
#include "env.h"
#include "thread_start.h"

namespace mncl {

bool processGone(int pid, bool orZombie) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  if (!orZombie) return false;
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return false;
  char state = 0;
  int rc = std::fscanf(f, "%*d (%*[^)]) %c", &state);
  std::fclose(f);
  return rc == 1 && (state == 'Z' || state == 'X');
}

namespace {
double nowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

// (At least 10 of the monitor's 10 ms ticks: below that a rank that is merely descheduled
// for a moment looks hung, and healthy runs fail.)
double Monitor::timeoutSeconds() { return env::limit("MININCL_TIMEOUT", 5.0, 0.1); }

std::chrono::steady_clock::time_point Monitor::timeoutFromNow() {
  using Clock = std::chrono::steady_clock;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeoutSeconds()));
}

Monitor::Monitor(Comm& comm)
    : comm_(comm),
      timeout_(timeoutSeconds()),
      idleTick_(idleTick(comm)),
      watch_(comm.nranks()),
      gaveUp_(std::make_unique<std::atomic<bool>[]>(comm.nranks())) {
  double now = nowSeconds();
  lastTick_ = now;
  for (auto& w : watch_) w.lastChange = now;
  thread_ = startThread("a communicator's monitor thread", [this] { loop(); });
}

Monitor::~Monitor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void Monitor::loop() {
  if (comm_.onGpu()) gpu::becomeWatcherThread(comm_.device());
  RankCtrl* mine = comm_.region_->ctrl();
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait_for(lock, nextTick(), [&] { return stop_ || woken_; });
    if (stop_) return;
    woken_ = false;
    idleWait_.store(false, std::memory_order_relaxed);
    dev::storeRelease(&mine->heartbeat, mine->heartbeat + 1);
    double now = nowSeconds();
    noteOwnStall(now);
    comm_.storeShmFault();  // (tells the peers; a SIGBUS handler only set the abort word)
    if (comm_.failed()) {  // already stopping: nothing to report, only peers to give up on
      giveUpOnStoppedPeers(now);
      continue;
    }
    comm_.checkGpuErrors();
    for (int r = 0; r < comm_.nranks(); ++r) {
      if (r != comm_.rank()) checkPeer(r, now);
    }
    if (!comm_.failed()) checkP2pBalance();
    if (!comm_.onGpu() && !comm_.failed()) checkDeadlock(now);
    if (!comm_.onGpu() && !comm_.failed()) checkWaitCycle(now);
    if (!comm_.failed()) comm_.onGpu() ? checkGpuCallTimeout(now) : checkCallTimeout(now);
  }
}

// kBusyTick while a call runs here (and on a GPU communicator) and after one ran since the
// last tick: a peer's failure, a mismatch or a deadlock should stop it soon. Idle, up to
// kLongestIdleTick (idleTick): enough for the heartbeat its peers time, at a 25th of the
// wake-ups (communicators held idle took a core: 8 processes with 50 splits each, at 10 ms);
// a call that starts meanwhile ends the idle tick (callStarting).
std::chrono::milliseconds Monitor::nextTick() {
  uint64_t calls = callsLogged();
  bool ranCalls = calls != callsSeen_;
  callsSeen_ = calls;
  // (Stored before callsInside_ is read, as callStarting reads it after counting the call:
  // either this loop sees the call, or the call sees the idle tick and ends it.)
  idleWait_.store(true, std::memory_order_seq_cst);
  // (A GPU communicator always: its replayed CUDA graphs run kernels no call announces.)
  if (ranCalls || comm_.onGpu() || comm_.callsInside_.load(std::memory_order_seq_cst) > 0) {
    idleWait_.store(false, std::memory_order_relaxed);
    return kBusyTick;
  }
  return idleTick_;
}

// A twentieth of the shortest MININCL_TIMEOUT among the ranks (the heartbeat must move well
// within each peer's), from kBusyTick to kLongestIdleTick.
std::chrono::milliseconds Monitor::idleTick(const Comm& comm) {
  double shortest = timeoutSeconds();
  for (const PeerInfo& p : comm.peers_) shortest = std::min(shortest, p.timeoutSeconds);
  return std::clamp(std::chrono::milliseconds((long long)(shortest * 1000 / 20)), kBusyTick, kLongestIdleTick);
}

void Monitor::callStarting() {
  if (!idleWait_.load(std::memory_order_seq_cst)) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    woken_ = true;
  }
  cv_.notify_one();
}

uint64_t Monitor::callsLogged() const {
  const CallLog& log = comm_.region_->ctrl()->calls;
  return dev::loadRelaxed(&log.made) + dev::loadRelaxed(&log.sendsPosted) + dev::loadRelaxed(&log.recvsPosted);
}

// This process did not run for a while (SIGSTOP, a debugger, a suspended machine): the peers'
// heartbeats and waits it could not watch meanwhile are timed afresh (their stale look is no
// sign of a hang), and errors found soon after say that it stopped, since its peers may have
// given up on it.
void Monitor::noteOwnStall(double now) {
  double gap = now - lastTick_;
  lastTick_ = now;
  if (gap < std::min(1.0, timeout_ / 2)) return;
  stall_ = gap;
  stallEnded_ = now;
  for (auto& w : watch_) w.lastChange = w.blockedSince = now;
  myCallSince_ = cycleSince_ = now;
}

void Monitor::fail(mnclResult_t code, const std::string& message) { comm_.fail(code, message); }

std::string Monitor::stallNote() const {
  double now = nowSeconds(), stall = stall_, ended = stallEnded_;
  // (Half the timeout: the peers time our heartbeat from the last one that reached them,
  // which may be older than this loop's last look, so a stop they gave up on can look
  // shorter than MININCL_TIMEOUT here.)
  if (now - lastTick_ >= timeout_ / 2) {  // a stall this loop has not looked past yet
    stall = now - lastTick_;
    ended = now;
  }
  if (stall < timeout_ / 2 || now - ended >= 2 * timeout_ + 1) return "";
  char note[192];
  std::snprintf(note, sizeof(note),
                " (this process did not run for %.1f s just before: stopped, or in a debugger? Its peers may have "
                "given up on it after MININCL_TIMEOUT, %g s)",
                stall, timeout_);
  return note;
}

bool Monitor::inThisProcess(int r) const {
  const PeerInfo &peer = comm_.peers_[r], &me = comm_.peers_[comm_.rank()];
  return peer.pid == me.pid && peer.hostHash == me.hostHash;
}

void Monitor::checkPeer(int r, double now) {
  const PeerInfo& peer = comm_.peers_[r];
  RankCtrl* ctrl = comm_.peerRegions_[r]->ctrl();
  PeerWatch& w = watch_[r];
  auto who = [&] { return "rank " + std::to_string(r) + " (pid " + std::to_string(peer.pid) + ")"; };
  uint32_t state = dev::loadAcquire(&ctrl->state);
  if (state == RankCtrl::kFailed) {
    // (The rank it gave up on, if any, passed on with the failure and on the same links: a
    // rank that hears of it from us first lists that rank as lost too.)
    uint32_t gaveUpOn = dev::loadAcquire(&ctrl->gaveUpOn);
    RankCtrl* mine = comm_.region_->ctrl();
    if (gaveUpOn != 0 && dev::loadAcquire(&mine->gaveUpOn) == 0) dev::storeRelease(&mine->gaveUpOn, gaveUpOn);
    fail(mnclRemoteError, who() + " failed: " + std::string(ctrl->failMessage));
    return;
  }
  bool sameProcess = inThisProcess(r);
  if (state == RankCtrl::kLeft) {
    // (The time counts from when a call that waits on the peer began to wait with it gone,
    // or last moved a step, or last waited for a live rank late to it: not from its leaving,
    // nor for a call with other peers, nor while the call goes on without it.)
    uint64_t call = callWaitingOn(r);
    if (call == 0) {
      w.leftSince = -1;
      return;
    }
    uint64_t moved = stepsMoved();
    if (w.leftSince < 0 || w.leftCall != call || w.leftMoved != moved || waitsForLivePeerBesides(r)) {
      w.leftSince = now;
      w.leftCall = call;
      w.leftMoved = moved;
    }
    std::string never = callThePeerNeverMade(r);
    if (!never.empty()) {
      fail(mnclRemoteError, who() + " destroyed its communicator (or its process exited) " + never);
    } else if (now - w.leftSince > timeout_) {  // (it made our call: it may have done its part)
      fail(mnclRemoteError, who() + " destroyed its communicator (or its process exited) while this rank was "
                            "still waiting on it (this rank's call moved no step for MININCL_TIMEOUT)");
    }
    return;
  }
  if (checkCalls(r)) return;
  if (sameProcess) return;  // a thread of this process cannot vanish on its own
  // (A pid means something on this host only; over the network a vanished peer's
  // connections close, and its mirrored state says so.)
  bool sameHost = peer.hostHash == comm_.peers_[comm_.rank()].hostHash;
  // (A zombie, through /proc, every kZombieLookEvery: each look costs as much as the rest of
  // a tick, and many communicators watch the same processes.)
  bool lookForZombie = now - w.zombieLookedAt >= kZombieLookEvery;
  if (lookForZombie) w.zombieLookedAt = now;
  if (sameHost && processGone(peer.pid, lookForZombie)) {
    fail(mnclRemoteError, who() + " exited (or was killed) without destroying its communicator");
    return;
  }
  if (!heartbeatStopped(r, now)) return;
  gaveUp_[r].store(true, std::memory_order_release);
  // (Published before the failure it explains: a survivor that hears of this rank's failure
  // first lists r in lost_ranks() too, so the survivors agree on the ranks to shrink away.)
  RankCtrl* mine = comm_.region_->ctrl();
  if (dev::loadAcquire(&mine->gaveUpOn) == 0) dev::storeRelease(&mine->gaveUpOn, (uint32_t)r + 1);
  char limit[32];
  std::snprintf(limit, sizeof limit, "%g", timeout_);  // (0.2, not the 0 an int cast gave)
  fail(mnclTimeout, who() + " has shown no sign of life for " + limit + " s (MININCL_TIMEOUT); it is hung or unreachable");
}

bool Monitor::heartbeatStopped(int r, double now) {
  PeerWatch& w = watch_[r];
  uint64_t beat = dev::loadAcquire(&comm_.peerRegions_[r]->ctrl()->heartbeat);
  if (beat != w.lastBeat) {
    w.lastBeat = beat;
    w.lastChange = now;
  }
  return now - w.lastChange > timeout_;
}

// A failed peer's heartbeat goes on while its process lives; a peer that stopped or hung
// keeps saying it runs. (Threads of this process share its heartbeat: none to give up on.)
void Monitor::giveUpOnStoppedPeers(double now) {
  for (int r = 0; r < comm_.nranks(); ++r) {
    if (r == comm_.rank() || inThisProcess(r) || gaveUp_[r].load(std::memory_order_relaxed)) continue;
    bool running = dev::loadAcquire(&comm_.peerRegions_[r]->ctrl()->state) == RankCtrl::kRunning;
    if (heartbeatStopped(r, now) && running) gaveUp_[r].store(true, std::memory_order_release);
  }
}

// A sum that grows whenever this rank's connections move a step (CPU): the heads it and its
// receivers posted, and the tails of its sends. (A GPU's are in device memory: 0.)
uint64_t Monitor::stepsMoved() const {
  if (comm_.onGpu()) return 0;
  uint64_t sum = 0;
  for (int c = 0; c < comm_.nChannels(); ++c) {
    const Channel& ch = comm_.channel(c);
    for (int p = 0; p < comm_.nranks(); ++p) {
      if (p == comm_.rank()) continue;
      if (const dev::ConnCtrl* out = ch.sendTo[p].ctrl) sum += dev::loadRelaxed(&out->head) + dev::loadRelaxed(&out->tail);
      if (const dev::ConnCtrl* in = ch.recvFrom[p].ctrl) sum += dev::loadRelaxed(&in->head);
    }
  }
  return sum;
}

// Whether this rank's call waits for a live peer other than r that has yet to reach it: a
// collective call that peer has not made, or sends to this rank (or receives of a long send)
// it has not posted. Then the call waits on that peer (its heartbeat, the call timeout), not
// on r. (GPU: calls log no activity.)
bool Monitor::waitsForLivePeerBesides(int r) const {
  const CallLog& mine = comm_.region_->ctrl()->calls;
  std::optional<CallActivity> me = callActivity(mine);
  if (!me || me->inside == Inside::nothing) return false;
  bool inCollective = me->inside == Inside::collectives || me->inside == Inside::both;
  bool inP2p = me->inside == Inside::sendsAndReceives || me->inside == Inside::both;
  uint64_t made = dev::loadAcquire(&mine.made);
  int rank = comm_.rank();
  for (int q = 0; q < comm_.nranks(); ++q) {
    const RankCtrl* peer = comm_.peerRegions_[q]->ctrl();
    if (q == rank || q == r || peer->gone() || dev::loadAcquire(&peer->state) != RankCtrl::kRunning) continue;
    if (inCollective && dev::loadAcquire(&peer->calls.made) < made) return true;
    if (!inP2p || q >= kP2pPeers || rank >= kP2pPeers || !(me->peers >> q & 1)) continue;
    PeerP2p ours = peerP2p(mine, q), its = peerP2p(peer->calls, rank);
    if (ours.recvs > its.sends || sendAwaitingReceives(ours, its, comm_.shareFifos(rank, q))) return true;
  }
  return false;
}

uint64_t Monitor::callWaitingOn(int r) const {
  // (A GPU call returns at once: what may still wait on the peer is its kernel.)
  if (comm_.onGpu()) return comm_.gpuWorkPending() ? 1 : 0;
  if (comm_.callsInside_.load() == 0) return 0;
  std::optional<CallActivity> me = callActivity(comm_.region_->ctrl()->calls);
  if (!me || me->inside == Inside::nothing) return 0;
  bool p2pWithIt = me->inside != Inside::collectives &&
                   (r >= kP2pPeers || comm_.rank() >= kP2pPeers || me->inside == Inside::both || (me->peers >> r & 1));
  return me->inside == Inside::collectives || p2pWithIt ? me->entered : 0;
}

// Whether this rank waits in a call that peer r, which left, never made: a collective call
// after its last, or a receive beyond the sends it posted to this rank. Then nothing can end
// the wait, and the peer's leaving is an error at once; says so, or returns "".
std::string Monitor::callThePeerNeverMade(int r) const {
  const CallLog& mine = comm_.region_->ctrl()->calls;
  const CallLog& theirs = comm_.peerRegions_[r]->ctrl()->calls;
  // (A GPU communicator's calls return at once and log no activity: its kernels wait.)
  CallActivity me = comm_.onGpu() ? CallActivity{0, Inside::collectives, 0}
                                  : callActivity(mine).value_or(CallActivity{});
  bool inCollective = me.inside == Inside::collectives || me.inside == Inside::both;
  uint64_t made = dev::loadAcquire(&mine.made), theirMade = dev::loadAcquire(&theirs.made);
  if (inCollective && made > theirMade) {
    std::optional<LoggedCall> call = loggedCall(mine, made);
    return "after " + std::to_string(theirMade) + " collective call(s): this rank is in call " + std::to_string(made) +
           (call ? " (" + describeCall(*call) + ")" : std::string()) + ", which it never made";
  }
  bool inP2p = me.inside == Inside::sendsAndReceives || me.inside == Inside::both;
  int rank = comm_.rank();
  // (Ranks past kP2pPeers have no bit in `peers` and no per-peer counts: tested first.)
  if (!inP2p || r >= kP2pPeers || rank >= kP2pPeers || !(me.peers >> r & 1)) return "";
  PeerP2p ours = peerP2p(mine, r), its = peerP2p(theirs, rank);
  if (ours.recvs > its.sends) {
    return "having posted " + std::to_string(its.sends) + " send(s) to this rank, which waits on its receive " +
           std::to_string(ours.recvs) + " from it";
  }
  if (uint64_t send = sendAwaitingReceives(ours, its, comm_.shareFifos(rank, r))) {
    return "having posted " + std::to_string(its.recvs) + " receive(s) from this rank, whose send " +
           std::to_string(send) + " to it cannot end without one";
  }
  return "";
}

// Whether peer r made a collective call other than ours under the same number (it then fails
// the communicator, naming both). The newest calls both ranks logged are compared, so a
// mismatch is found within a tick of the later of the two calls.
bool Monitor::checkCalls(int r) {
  std::string mismatch = comm_.loggedCallMismatch(r);
  if (mismatch.empty()) return false;
  fail(mnclInvalidUsage, mismatch);
  return true;
}

// The sends and receives all ranks posted before the newest collective call they all logged
// must pair up (see P2pBalance); if not, fails the communicator with each rank's counts.
void Monitor::checkP2pBalance() {
  uint64_t s = UINT64_MAX;
  for (int r = 0; r < comm_.nranks(); ++r) s = std::min(s, dev::loadAcquire(&comm_.peerRegions_[r]->ctrl()->calls.made));
  if (s == 0 || s == balancedUpTo_) return;
  std::vector<P2pBalance> before(comm_.nranks());
  uint64_t sends = 0, recvs = 0;
  for (int r = 0; r < comm_.nranks(); ++r) {
    if (!loggedCall(comm_.peerRegions_[r]->ctrl()->calls, s, &before[r])) return;  // (overwritten: a later tick)
    sends += before[r].sends;
    recvs += before[r].recvs;
  }
  if (sends == recvs) {
    balancedUpTo_ = s;
    return;
  }
  std::string each;
  for (int r = 0; r < comm_.nranks() && r < 8; ++r) {
    each += std::string(r ? "; " : "") + "rank " + std::to_string(r) + ": " + std::to_string(before[r].sends) + ", " +
            std::to_string(before[r].recvs);
  }
  std::optional<LoggedCall> call = loggedCall(comm_.region_->ctrl()->calls, s);
  fail(mnclInvalidUsage, "unmatched sends and receives before collective call " + std::to_string(s) +
                             (call ? " (" + describeCall(*call) + ")" : std::string()) + ": the ranks posted " +
                             std::to_string(sends) + " send(s) but " + std::to_string(recvs) +
                             " receive(s) before it (sends, receives: " + each + (comm_.nranks() > 8 ? "; ..." : "") +
                             "); every send needs its receive before either rank's next collective call");
}

}  // namespace mncl
