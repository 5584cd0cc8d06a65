// The root of a rendezvous: collects every rank's listening address and tells each rank the
// next one's (the ranks pass the rest around their ring).
// It checks what it can (magic, nonce, nranks, duplicate or out-of-range ranks) and answers
// every waiting rank with an error naming the problem rather than letting anyone hang.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include <poll.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/log.h"
#include "../core/thread_start.h"
#include "bootstrap.h"
#include "wire.h"

namespace mncl {

namespace {

// How long the root waits for a rank's reply to go out (a rank that stopped reading is gone).
constexpr double kReplySeconds = 2.0;
// How often the waits for hellos come up to look at failures and closed connections.
constexpr std::chrono::milliseconds kLookEvery{100};
// The most missing ranks a timeout's story names (then "and N more").
constexpr int kMissingRanksListed = 32;
// How long a failed rendezvous goes on answering ranks still to come (see answerLateRanks).
constexpr double kLateRanksSeconds = 10.0;
// The deadline of a root no rank has come to yet: none (ten years).
constexpr double kNoDeadlineSeconds = 10 * 365 * 86400.0;
// How long a new try of an id from an address waits for the earlier try's root to let go of
// the port (it answers the ranks it holds, kReplySeconds each at most, then stops).
constexpr std::chrono::seconds kEarlierRootWait{10};
// How long a rank of this process that reported to its root waits for the root to act on it
// (a look every kLookEvery; a reply to a rank that stopped reading takes kReplySeconds).
constexpr std::chrono::seconds kReportTakenWait{3};

// What a root and the ranks of its own process tell each other without sockets, which may
// be what failed (no file descriptor left): a rank's failed init (reportToLocalRoot), ranks
// that will not come (leaveLocalRoot), and the root's failure, for the ranks it could not
// answer (localRootWatch). Only in the process that started the root: a forked child has a
// copy of the registry, but not the root's thread.
class LocalRendezvous {
 public:
  const pid_t pid = getpid();

  // Each returns the report's number, for awaitTaken.
  uint64_t rankFailed(int rank, int nranks, const std::string& message) {
    std::lock_guard<std::mutex> lock(mutex_);
    gone_.insert(rank);
    if (!rankFailed_) {  // (the first story is the one told)
      rankFailed_ = true;
      failedRank_ = rank;
      nranks_ = nranks;
      rankMessage_ = message;
    }
    return ++reports_;
  }
  uint64_t rankGone(int rank) {
    std::lock_guard<std::mutex> lock(mutex_);
    gone_.insert(rank);
    return ++reports_;
  }
  // The root took `rank`'s hello by socket. (A rank it heard from, or that reported to it, and
  // comes again is of a later try of an id from an address: the same nonce.)
  void heard(int rank) {
    std::lock_guard<std::mutex> lock(mutex_);
    heard_.insert(rank);
  }
  bool left(int rank) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return gone_.count(rank) > 0;
  }
  bool knows(int rank) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return heard_.count(rank) > 0 || gone_.count(rank) > 0;
  }
  // `upTo`: the reports these ranks are of (for reportsTaken).
  std::set<int> ranksGone(uint64_t* upTo = nullptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (upTo) *upTo = reports_;
    return gone_;
  }
  // The root acted on the reports up to `upTo`: if they accounted for its last ranks, its try
  // is over (Rendezvous::endTry).
  void reportsTaken(uint64_t upTo) {
    std::lock_guard<std::mutex> lock(mutex_);
    taken_ = std::max(taken_, upTo);
    changed_.notify_all();
  }
  // A rank that reported returns once the root acted on it (within kLookEvery), not before:
  // it may try again at once, and the next try must not find this one still running.
  void awaitTaken(uint64_t report, std::chrono::seconds most) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_for(lock, most, [&] { return taken_ >= report || threadEnded_; });
  }
  bool aRankFailed() {
    std::lock_guard<std::mutex> lock(mutex_);
    return rankFailed_;
  }
  // The root's failure for it: "rank R could not make its communicator: ...", as a socket report's.
  std::string rankFailure(int* nranks) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (*nranks < 0) *nranks = nranks_;
    return "rank " + std::to_string(failedRank_) + " could not make its communicator: " + rankMessage_;
  }
  void rootFailed(mnclResult_t status, const std::string& failure) {
    std::lock_guard<std::mutex> lock(mutex_);
    rootStatus_ = status;
    rootFailure_ = failure;
  }
  bool failed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return rootStatus_ != mnclSuccess;
  }
  // When the root's try ended, after a failure (its story stays a while: see localRoot).
  mutable std::optional<std::chrono::steady_clock::time_point> endedAt;  // (under localRootsMutex)
  // Throws the root's failure as its reply would have said it.
  void throwIfRootFailed() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (rootStatus_ != mnclSuccess) throwBootstrapFailure(rootStatus_, rootFailure_);
  }
  // A later try of its id (from an address) began: its rank 0 needs the port, or one of its
  // ranks came here. Late ranks are no longer answered.
  void supersede() { superseded_ = true; }
  bool superseded() const { return superseded_; }
  // Its thread is done with the listener (closed).
  void threadEnded() {
    std::lock_guard<std::mutex> lock(mutex_);
    threadEnded_ = true;
    changed_.notify_all();
  }
  bool waitForThreadEnd(std::chrono::seconds most) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, most, [this] { return threadEnded_; });
  }

 private:
  mutable std::mutex mutex_;
  std::set<int> heard_;  // ranks whose hello came by socket
  std::set<int> gone_;  // ranks of this process that failed before their hello (rank 0 of an id from an address: or after it)
  bool rankFailed_ = false;
  int failedRank_ = -1, nranks_ = -1;
  std::string rankMessage_;
  mnclResult_t rootStatus_ = mnclSuccess;
  std::string rootFailure_;
  std::atomic<bool> superseded_ = false;
  bool threadEnded_ = false;
  uint64_t reports_ = 0, taken_ = 0;  // local reports made, and acted on
  std::condition_variable changed_;  // (threadEnded_, taken_)
};

// The roots this process serves, by nonce, from startRoot until serve ends; a failed one's
// for kFailureKept more, for ranks of this process that come after it ended (a rank thread
// that started late). (An id from an address has the same nonce at each try: a new root of
// it takes the place of the old one, and its rank 0 looks it up after starting it.)
constexpr std::chrono::seconds kFailureKept{10};
std::mutex localRootsMutex;
std::map<uint64_t, std::shared_ptr<LocalRendezvous>>& localRoots() {
  static auto* roots = new std::map<uint64_t, std::shared_ptr<LocalRendezvous>>;  // (never destroyed: threads may outlive main)
  return *roots;
}

// (Under localRootsMutex.)
void dropEndedRoots() {
  auto now = std::chrono::steady_clock::now();
  std::erase_if(localRoots(), [&](const auto& entry) {
    return entry.second->endedAt && now - *entry.second->endedAt >= kFailureKept;
  });
}

// `running`: not one whose thread ended (of an id from an address, it may be an earlier try's).
std::shared_ptr<LocalRendezvous> localRoot(uint64_t nonce, bool running = false) {
  std::lock_guard<std::mutex> lock(localRootsMutex);
  dropEndedRoots();
  auto it = localRoots().find(nonce);
  if (it == localRoots().end() || it->second->pid != getpid() || (running && it->second->endedAt)) return nullptr;
  return it->second;
}

// The root's try is over (see Rendezvous::endTry) or its thread ended: it no longer counts as
// running. A failed one's story stays for kFailureKept; else it leaves the registry.
void endLocalRoot(uint64_t nonce, const LocalRendezvous& local) {
  std::lock_guard<std::mutex> lock(localRootsMutex);
  auto it = localRoots().find(nonce);
  if (it == localRoots().end() || it->second.get() != &local) return;  // (a newer root's, same nonce)
  if (!local.failed()) localRoots().erase(it);
  else if (!local.endedAt) local.endedAt = std::chrono::steady_clock::now();
}

struct Joined {
  Socket sock;
  int rank;
};

// `next`: on success, the address of the rank after this one in the ring (the ranks pass the
// others around it).
void reply(Socket& s, uint64_t nonce, int status, const std::string& msg, const sockaddr_storage* next) {
  RootReply r{};
  r.nonce = nonce;
  r.status = status;
  std::strncpy(r.message, msg.c_str(), sizeof(r.message) - 1);
  try {
    Deadline d = deadlineIn(kReplySeconds);
    s.sendAll(&r, sizeof(r), d, "bootstrap root reply");
    if (next) s.sendAll(next, sizeof(*next), d, "bootstrap root: the next rank's address");
  } catch (const Error&) {
    // That rank is gone; the others still get their answer.
  }
}

// What is wrong with rank `h` joining, or "": the ranks must agree on nranks, and each come once.
std::string joiningFailure(const RootHello& h, int nranks, const std::vector<Joined>& joined) {
  if (h.nranks != nranks) {
    return "mismatched nranks: one rank said " + std::to_string(nranks) + ", rank " + std::to_string(h.rank) + " said " +
           std::to_string(h.nranks);
  }
  if (h.rank < 0 || h.rank >= nranks) return "rank " + std::to_string(h.rank) + " is out of range for nranks=" + std::to_string(nranks);
  for (const Joined& j : joined) {
    if (j.rank == h.rank) return "duplicate rank: two processes both said they are rank " + std::to_string(h.rank);
  }
  return "";
}

std::string rankLeftFailure(int rank) {
  return "rank " + std::to_string(rank) + " left before every rank came (its init failed or was aborted, or its "
         "process exited)";
}

// The timeout's story: who is missing, and whether strangers (hellos of another id) came. It
// fits the reply: the list of missing ranks is cut short (32 at most) before the rest is.
std::string missingRanksFailure(int nranks, const std::vector<Joined>& joined, int strangers) {
  std::vector<bool> in(nranks > 0 ? nranks : 0);
  for (const Joined& j : joined) in[j.rank] = true;
  int missing = nranks - (int)joined.size();
  std::string head = "only " + std::to_string(joined.size()) + " of " + std::to_string(nranks) +
                     " ranks joined before the bootstrap timeout; missing ranks: ";
  std::string note;
  if (strangers > 0) {
    note = " (" + std::to_string(strangers) + " process(es) of another unique id came to this address and were " +
           "turned away: another job given the same root address? a missing rank may be among them)";
  }
  const size_t room = sizeof(RootReply::message) - 1 - std::min(head.size() + note.size(), sizeof(RootReply::message) - 1);
  constexpr size_t kMoreSize = 20;  // (" and 4194304 more")
  std::string list;
  int listed = 0;
  for (int r = 0; r < nranks && listed < missing; ++r) {
    if (in[r]) continue;
    std::string item = (list.empty() ? "" : ",") + std::to_string(r);
    bool lastOne = listed + 1 == missing;
    if (listed == kMissingRanksListed || list.size() + item.size() + (lastOne ? 0 : kMoreSize) > room) break;
    list += item;
    ++listed;
  }
  if (listed < missing) list += " and " + std::to_string(missing - listed) + " more";
  return head + list + note;
}

// A connection and its hello, read as it comes.
struct Arriving {
  Socket sock;
  RootHello hello{};
  size_t got = 0;
  Deadline until = deadlineIn(Socket::kOpeningSeconds);  // (a rank sends its hello as it connects)
};

// The connections to the root, their hellos read side by side as they come: one that stays
// silent (a port scan, a health check) holds no rank up, and is dropped after
// Socket::kOpeningSeconds, as one that closes.
class Arrivals {
 public:
  explicit Arrivals(Socket& listener) : listener_(listener) {}

  // The next whole hello, with its connection, in the order they came; nullopt after
  // kLookEvery with none. Timeout at `deadline`.
  std::optional<Arriving> next(Deadline deadline) {
    if (whole_.empty()) waitAndRead(deadline);
    if (whole_.empty()) {
      if (int e = std::exchange(acceptFailed_, 0)) {
        throwError(mnclSystemError, std::string(kWhat) + ": accept(): " + std::strerror(e));
      }
      return std::nullopt;
    }
    Arriving a = std::move(whole_.front());
    whole_.pop_front();
    return a;
  }

  // The connections waiting, and those in the listener's queue, with their hellos as they come
  // until `until`: at the end of a try, a later try's ranks, told to try again.
  std::deque<Arriving> takeWaiting(Deadline until) {
    do {
      acceptWaiting();
      readHellos();
      if (coming_.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } while (Clock::now() < until);
    return std::exchange(whole_, {});
  }

 private:
  void waitAndRead(Deadline deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) throwError(mnclTimeout, "bootstrap root waiting for ranks timed out");
    std::vector<pollfd> fds;
    if (!listenerPaused_) fds.push_back({listener_.fd(), POLLIN, 0});
    for (const Arriving& a : coming_) fds.push_back({a.sock.fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), (int)std::min<long long>(left + 1, kLookEvery.count())) < 0 && errno != EINTR) {
      throwSystemError("bootstrap root waiting for ranks: poll()");
    }
    if (!listenerPaused_) acceptWaiting();
    size_t held = coming_.size();
    readHellos();
    if (coming_.size() < held) listenerPaused_ = false;  // (one came whole or was dropped: try again)
  }

  // Out of descriptors while connections are coming: they finish or are dropped within
  // Socket::kOpeningSeconds (strays may have taken the descriptors), so the listener waits
  // for that. Else the failure is told once the hellos that came were read: the ranks hold
  // every descriptor, and none comes back before the rendezvous ends.
  void acceptWaiting() {
    int failed = 0;
    for (Socket s = listener_.acceptPending(kWhat, &failed); s.valid(); s = listener_.acceptPending(kWhat, &failed)) {
      coming_.push_back(Arriving{std::move(s)});
    }
    listenerPaused_ = (failed == EMFILE || failed == ENFILE) && !coming_.empty();
    acceptFailed_ = listenerPaused_ ? 0 : failed;
  }

  void readHellos() {
    for (auto it = coming_.begin(); it != coming_.end();) {
      ssize_t n = it->sock.recvAvailable(reinterpret_cast<char*>(&it->hello) + it->got, sizeof(RootHello) - it->got);
      it->got += n > 0 ? (size_t)n : 0;
      if (it->got == sizeof(RootHello)) {
        whole_.push_back(std::move(*it));
      } else if (n >= 0 && Clock::now() < it->until) {
        ++it;
        continue;
      }
      it = coming_.erase(it);  // (whole, or not a rank)
    }
  }

  static constexpr const char* kWhat = "bootstrap root waiting for ranks";
  Socket& listener_;
  std::list<Arriving> coming_;
  std::deque<Arriving> whole_;
  bool listenerPaused_ = false;
  int acceptFailed_ = 0;  // errno
};

// The ranks accounted for after a failure (joined, answered, or of this process and gone), by
// number: a duplicate, or a rank out of range, is not one still to come. Out of the most ranks
// any hello of this id said (none yet: not every rank).
class RanksAccountedFor {
 public:
  void expect(int nranks) {
    if (nranks > (int)seen_.size() && nranks <= kMaxRanks) seen_.resize(nranks, false);
  }
  void add(int rank) {
    if (rank < 0 || rank >= (int)seen_.size() || seen_[rank]) return;
    seen_[rank] = true;
    ++count_;
  }
  bool all() const { return !seen_.empty() && count_ == (int)seen_.size(); }

 private:
  std::vector<bool> seen_;
  int count_ = 0;
};

bool ofThisId(const RootHello& h, uint64_t nonce) {
  return h.magic == kIdMagic && h.nonce == nonce;
}

// How long a root whose try is over reads the hellos of a later try's ranks that came meanwhile.
constexpr double kLaterTryHelloSeconds = 0.05;

// Tells the ranks of a later try of this id (from an address: the same nonce) that came to
// this root, whose try is over, to connect again: to their try's root, which rank 0 starts.
void tellToTryAgain(Arriving& a, uint64_t nonce) {
  reply(a.sock, nonce, kRootTryAgain, "an earlier init's bootstrap root of this id, whose try is over, took the hello",
        nullptr);
}

// Answers a hello of another id (echoing its nonce: it is talking to a minincl root, of another id).
void turnAway(Arriving& a) {
  reply(a.sock, a.hello.nonce, mnclInvalidUsage,
        "wrong unique id: this bootstrap root serves another id (two jobs given the same root address?)", nullptr);
}

// Ranks still to come after the rendezvous failed (one said it cannot, the ranks disagreed,
// one left): they hear why at once too, instead of waiting for the bootstrap timeout. Until
// every rank is accounted for, or `until`: kLateRanksSeconds at most (an id from a fixed
// address keeps its port until this ends), the deadline where a rank left after it came (the
// others may be far behind it).
// `fromAddress`: a rank it knows that comes again is a later try's (else a duplicate).
void answerLateRanks(Arrivals& arrivals, uint64_t nonce, bool fromAddress, mnclResult_t status,
                     const std::string& failure, RanksAccountedFor accounted, Deadline until, LocalRendezvous& local,
                     const std::function<void()>& endTry) {
  for (;;) {
    uint64_t reports = 0;
    for (int r : local.ranksGone(&reports)) accounted.add(r);
    if (local.superseded()) {  // (a later try began: the ranks still coming here are that try's)
      for (Arriving& a : arrivals.takeWaiting(deadlineIn(kLaterTryHelloSeconds))) {
        if (ofThisId(a.hello, nonce) && a.hello.failCode == 0) tellToTryAgain(a, nonce);
      }
    }
    bool over = accounted.all() || local.superseded();
    if (over) endTry();
    local.reportsTaken(reports);
    if (over) return;
    try {
      std::optional<Arriving> next = arrivals.next(until);
      if (!next) continue;
      const RootHello& h = next->hello;
      if (!ofThisId(h, nonce)) {
        turnAway(*next);
        continue;
      }
      if (fromAddress && local.knows(h.rank)) {  // (a later try's rank: that try began)
        if (h.failCode == 0) tellToTryAgain(*next, nonce);
        local.supersede();
        continue;
      }
      local.heard(h.rank);
      accounted.expect(h.nranks);
      accounted.add(h.rank);
      if (accounted.all()) endTry();  // (before the last rank hears it: it may try again at once)
      if (h.failCode == 0) reply(next->sock, nonce, status, failure, nullptr);  // (else it waits for none)
    } catch (const Error& e) {
      if (e.code() != mnclSystemError) return;  // (until)
      std::this_thread::sleep_for(kLookEvery);  // (no descriptor to accept with: the rank waits)
    }
  }
}

// One id's rendezvous: each rank's hello is checked and kept until every rank came; then each
// hears the next rank's address, or, if it failed, why (and so do the ranks that come late).
class Rendezvous {
 public:
  Rendezvous(Socket& listener, uint64_t nonce, bool fromAddress, double timeout, LocalRendezvous& local)
      : nonce_(nonce), fromAddress_(fromAddress), timeout_(timeout), local_(local), listener_(listener),
        arrivals_(listener) {}

  void run() {
    try {
      gatherRanks();
    } catch (const Error& e) {
      failFrom(e);
    }
    if (!failure_.empty()) local_.rootFailed(status_, failure_);  // (for ranks of this process it cannot answer)
    bool answersLateRanks = !failure_.empty() && status_ != mnclTimeout;
    uint64_t reports = 0;
    std::set<int> gone = local_.ranksGone(&reports);
    if (answersLateRanks) {
      accounted_.expect(nranks_);  // (where a rank of this process told it)
      for (int r : gone) accounted_.add(r);
    }
    if (!answersLateRanks || accounted_.all()) endTry();
    local_.reportsTaken(reports);
    answerJoined();
    if (answersLateRanks) {
      answerLateRanks(arrivals_, nonce_, fromAddress_, status_, failure_, std::move(accounted_),
                      leftRank_ >= 0 ? deadline_ : std::min(deadline_, deadlineIn(kLateRanksSeconds)), local_,
                      [this] { endTry(); });
    }
    endTry();
  }

 private:
  // Takes hellos until every rank joined, or one ends the rendezvous (failure_ says why).
  void gatherRanks() {
    while (nranks_ < 0 || (int)joined_.size() < nranks_) {
      throwIfFailedOrLeft(false);  // (Arrivals::next waits kLookEvery at most)
      std::optional<Arriving> next = arrivals_.next(deadline_);
      if (!next) continue;
      if (!ofThisId(next->hello, nonce_)) {
        turnAway(*next);
        ++strangers_;
        continue;
      }
      if (!admit(*next)) return;
    }
    throwIfFailedOrLeft(true);  // (the last rank came: is every other one still there?)
  }

  // A hello of this id: the rank joins, or (false) it ends the rendezvous.
  bool admit(Arriving& a) {
    const RootHello& h = a.hello;
    // The clock starts when the first rank of this id arrives: an id may be made long before
    // its ranks start (a job that loads its data first). Until then the root waits, as NCCL's.
    if (!started_) deadline_ = deadlineIn(timeout_);
    started_ = true;
    local_.heard(h.rank);
    accounted_.expect(h.nranks);
    accounted_.add(h.rank);
    if (h.failCode != 0) {  // (that rank waits for no answer)
      status_ = mnclRemoteError;
      failure_ = "rank " + std::to_string(h.rank) + " could not make its communicator: " +
                 std::string(h.failMessage, strnlen(h.failMessage, sizeof(h.failMessage)));
      if (nranks_ < 0) nranks_ = h.nranks;
      return false;
    }
    if (nranks_ < 0 && !sizeFrom(a)) return false;
    failure_ = joiningFailure(h, nranks_, joined_);
    if (!failure_.empty()) {
      // A duplicate whose first connection is closed is that rank come back (a restarted
      // process): that it left is the story, as it is when it does not come back.
      auto first = std::find_if(joined_.begin(), joined_.end(), [&](const Joined& j) { return j.rank == h.rank; });
      if (first != joined_.end() && first->sock.closedByPeer()) {
        leftRank_ = h.rank;
        status_ = mnclRemoteError;
        failure_ = rankLeftFailure(leftRank_);
      }
      reply(a.sock, nonce_, status_, failure_, nullptr);
      return false;
    }
    table_[h.rank] = h.listen;
    joined_.push_back({std::move(a.sock), h.rank});
    return true;
  }

  // The first hello sets the rank count, unless the root cannot hold that many (false).
  bool sizeFrom(Arriving& a) {
    const RootHello& h = a.hello;
    nranks_ = h.nranks;
    if (nranks_ > kMaxRanks) {  // (its rank checked it too: another build's, say)
      return refuse(a, mnclInvalidArgument, "rank " + std::to_string(h.rank) + ": " + tooManyRanks(nranks_));
    }
    try {
      table_.assign(nranks_ > 0 ? nranks_ : 0, sockaddr_storage{});
    } catch (const std::bad_alloc&) {  // (a wrong world size must not take this process down)
      return refuse(a, mnclInvalidArgument,
                    "rank " + std::to_string(h.rank) + " says nranks=" + std::to_string(nranks_) +
                        ": more ranks than the bootstrap root can hold addresses for; is the world size right?");
    }
    return true;
  }

  bool refuse(Arriving& a, mnclResult_t status, const std::string& failure) {
    status_ = status;
    failure_ = failure;
    reply(a.sock, nonce_, status_, failure_, nullptr);
    return false;
  }

  // A failure reported in this process, or a joined rank that left: the others cannot init
  // without it, and it would otherwise hold them (and this thread) until the timeout. The
  // joined connections every kLookEvery (`always`: now): a look at each per hello would cost the
  // square of nranks.
  void throwIfFailedOrLeft(bool always) {
    if (local_.aRankFailed()) throwError(mnclRemoteError, "a rank of this process reported its failed init");
    if (!always && Clock::now() - lookedAtJoined_ < kLookEvery) return;
    lookedAtJoined_ = Clock::now();
    for (const Joined& j : joined_) {
      if (!j.sock.closedByPeer()) continue;
      leftRank_ = j.rank;
      throwError(mnclRemoteError, "a rank left");
    }
  }

  // The story of what interrupted gatherRanks.
  void failFrom(const Error& e) {
    bool reportedHere = local_.aRankFailed();  // (as a failure reported by socket, in admit)
    status_ = e.code();
    if (reportedHere) {
      status_ = mnclRemoteError;
      failure_ = local_.rankFailure(&nranks_);
    } else if (leftRank_ >= 0) {
      status_ = mnclRemoteError;
      failure_ = rankLeftFailure(leftRank_);
    } else if (e.code() == mnclTimeout) {  // (the deadline: ranks never came)
      failure_ = missingRanksFailure(nranks_, joined_, strangers_);
    } else {  // (accept() failed: out of file descriptors, say)
      failure_ = std::string("the bootstrap root failed: ") + e.what();
    }
    if (!reportedHere) MNCL_WARN(kInit, "bootstrap root: %s", failure_.c_str());
  }

  // No rank still to come will be answered: the port is let go, and the root no longer counts
  // as running in this process, before any rank of this try hears its answer. A rank may try
  // again as soon as it hears it, with the same nonce and port if the id is from an address,
  // and must then reach the next try's root, not this one (a helper's trial saw the old
  // failure taken by the next try's rank 1 in 10-21 of 100 tries under load).
  void endTry() {
    if (tryEnded_) return;
    tryEnded_ = true;
    listener_.close();
    endLocalRoot(nonce_, local_);
  }

  // Every joined rank hears the next one's address, or the failure; their sockets then close
  // (not held while late ranks are answered).
  void answerJoined() {
    for (Joined& j : joined_) {
      const sockaddr_storage* next = failure_.empty() ? &table_[(j.rank + 1) % nranks_] : nullptr;
      reply(j.sock, nonce_, failure_.empty() ? mnclSuccess : status_, failure_, next);
    }
    joined_.clear();
  }

  const uint64_t nonce_;
  const bool fromAddress_;
  const double timeout_;
  LocalRendezvous& local_;
  Socket& listener_;
  bool tryEnded_ = false;
  Arrivals arrivals_;
  Deadline deadline_ = deadlineIn(kNoDeadlineSeconds);  // (until the first rank comes: see admit)
  bool started_ = false;
  int nranks_ = -1;  // (from the first hello)
  std::vector<Joined> joined_;
  std::vector<sockaddr_storage> table_;  // each joined rank's listening address, by rank
  std::string failure_;
  mnclResult_t status_ = mnclInvalidUsage;  // of a failure: the ranks disagree, or (Timeout) some never came
  int strangers_ = 0;  // hellos with another id: a second job at this address, say
  RanksAccountedFor accounted_;  // every rank of this id that came (for answerLateRanks)
  int leftRank_ = -1;  // a rank that closed its connection before every rank came
  Clock::time_point lookedAtJoined_{};
};

void serve(Socket listener, uint64_t nonce, bool fromAddress, double timeout, LocalRendezvous& local) {
  Rendezvous(listener, nonce, fromAddress, timeout, local).run();
}

}  // namespace

bool reportToLocalRoot(uint64_t nonce, bool fromAddress, int rank, int nranks, const std::string& message) {
  // (Rank 0 of an id from an address starts a new root where the last one ended: an earlier
  // try's, whose story would keep this report from the ranks of this one. Another rank's
  // report may follow its leaving in the same init, after the root's try ended.)
  std::shared_ptr<LocalRendezvous> local = localRoot(nonce, fromAddress && rank == 0);
  if (local) local->awaitTaken(local->rankFailed(rank, nranks, message), kReportTakenWait);
  return local != nullptr;
}

void leaveLocalRoot(uint64_t nonce, int rank) {
  std::shared_ptr<LocalRendezvous> local = localRoot(nonce);
  if (!local) return;
  uint64_t report = local->rankGone(rank);
  if (local->failed()) local->awaitTaken(report, kReportTakenWait);  // (else no rank is answered yet)
}

std::function<void()> localRootWatch(uint64_t nonce, bool fromAddress, int rank) {
  // An id from an address: the root is looked up at each look, and one whose try ended, or
  // that knows this rank already, is an earlier try's (rank 0 may start this try's after this
  // rank began). (A root that took this rank's hello answers it by socket.)
  if (fromAddress) {
    return [nonce, rank] {
      std::shared_ptr<LocalRendezvous> local = localRoot(nonce, true);
      if (local && !local->knows(rank)) local->throwIfRootFailed();
    };
  }
  std::shared_ptr<LocalRendezvous> local = localRoot(nonce);
  if (!local) return {};
  return [local] { local->throwIfRootFailed(); };
}

namespace {

// An id from an address has the same nonce at each try, and its port: an earlier try's root
// in this process that failed (or whose rank 0 left) may still hold it, replying to its ranks
// or answering late ones. It stops answering late ones, and its thread's end is waited for (else the bind
// failed now and then with "Address already in use", a CI run found). (One still gathering
// ranks is another init of this id under way: the bind fails.)
Socket listenAfterAnEarlierTry(const SockAddr& bind, uint64_t nonce) {
  std::shared_ptr<LocalRendezvous> earlier = localRoot(nonce, true);
  if (earlier && (earlier->failed() || earlier->aRankFailed() || earlier->left(0))) {
    earlier->supersede();
    if (!earlier->waitForThreadEnd(kEarlierRootWait)) {
      MNCL_WARN(kInit, "bootstrap root: an earlier init's root of this id still runs after %llds",
                (long long)kEarlierRootWait.count());
    }
  }
  return Socket::listen(bind);
}

}  // namespace

SockAddr startRoot(const SockAddr& bind, uint64_t nonce, bool fromAddress) {
  Socket listener = listenAfterAnEarlierTry(bind, nonce);
  SockAddr actual = listener.localAddr();
  double timeout = bootstrapTimeout();  // (read here: a bad setting is the caller's error, not the thread's)
  auto local = std::make_shared<LocalRendezvous>();
  {
    std::lock_guard<std::mutex> lock(localRootsMutex);
    dropEndedRoots();
    localRoots()[nonce] = local;
  }
  auto root = [listener = std::move(listener), nonce, fromAddress, timeout, local]() mutable {
    try {
      serve(std::move(listener), nonce, fromAddress, timeout, *local);
    } catch (const std::exception& e) {  // (the ranks see their connections close; this process goes on)
      MNCL_WARN(kInit, "bootstrap root stopped: %s", e.what());
    }
    endLocalRoot(nonce, *local);  // (where serve stopped before its try ended)
    local->threadEnded();  // (serve took the listener, and closed it)
  };
  try {
    startThread("the bootstrap root's thread", std::move(root)).detach();
  } catch (const Error&) {
    endLocalRoot(nonce, *local);
    local->threadEnded();
    throw;
  }
  return actual;
}

}  // namespace mncl
