// A split's or shrink's rendezvous on the parent communicator: which ranks make the new
// communicator, in what order, and the unique id they init it with (its root started by
// the new group's first rank), which every member then passes to an ordinary init.
#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../bootstrap/bootstrap.h"
#include "../bootstrap/socket.h"
#include "comm.h"
#include "error.h"

namespace mncl {

// Split and shrink talk over the parent's bootstrap, their messages tagged by how many came
// before: two at once, from two threads of a rank, would read each other's messages, and the
// peers could pair one thread's split with the other's. As with calls (CallScope), the second
// is refused and fails the communicator, and with it the first (a split's waits end when it
// fails) and the peers.
Comm::RendezvousScope::RendezvousScope(Comm& c, const char* call) : comm(c) {
  if (comm.rendezvousInside_.fetch_add(1, std::memory_order_acq_rel) == 0) return;
  comm.rendezvousInside_.fetch_sub(1, std::memory_order_acq_rel);
  std::string why = std::string("two threads called split or shrink on rank ") + std::to_string(comm.rank_) +
                    "'s communicator at once (this one " + call + "); it takes one at a time";
  comm.fail(mnclInvalidUsage, why);
  throw Error(mnclInvalidUsage, why);
}

Comm::RendezvousScope::~RendezvousScope() { comm.rendezvousInside_.fetch_sub(1, std::memory_order_acq_rel); }

// An abort() ends a rendezvous's waits at their next check (WaitCheck polls): a few seconds
// at most, after which the next one is refused as usual.
void Comm::awaitRendezvousLeft() const {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  uint32_t spins = 0;
  while (rendezvousInside_.load(std::memory_order_acquire) > 0 && std::chrono::steady_clock::now() < until) {
    dev::cpuBackoff(spins++);
  }
}

bool Comm::splitInfo(int color, int key, int* newRanks, int* newRank, UniqueIdData* id, std::vector<int>* members_,
                     bool refused) {
  RendezvousScope one(*this, "split");
  const uint32_t stops = stops_.load(std::memory_order_acquire);  // (before: a stop meanwhile fails it below)
  MNCL_CHECK(!failed(), asyncError(), errorMessage());
  const int split = splits_;  // (every rank counts its splits alike)
  bool gathering = true, memberLeft = false;
  // (An abort() from another thread, or a failure: a peer's, or a second split meanwhile.)
  WaitCheck untilStopped([&] {
    failIfStoppedSince(stops);
    if (failed()) throwStoredError();
    if (!gathering) return;
    memberLeft = true;  // (its error says all: no rendezvous error around it)
    failIfLeftBeforeSplit(split);
    memberLeft = false;
  });
  struct Entry {
    int32_t color, key, rank, refused;
  };
  std::vector<Entry> all(nranks_);
  all[rank_] = {color, key, rank_, refused};
  try {
    bootstrap_->allgather(all.data(), sizeof(Entry));
  } catch (const Error& e) {
    if (memberLeft) throw;
    failIfStoppedSince(stops);
    if (!failed()) failIfLeftBeforeSplit(split);  // (the rank after it on the ring sees its socket close first)
    throwRendezvousError("split", stops, e);
  }
  gathering = false;
  dev::storeRelease(&region_->ctrl()->splitsGathered, (uint32_t)split + 1);
  int tag = 1000 + splits_++;
  std::string refusers;
  for (const Entry& e : all) {
    if (e.refused) refusers += (refusers.empty() ? "" : ", ") + std::to_string(e.rank);
  }
  if (refused) return false;
  MNCL_CHECK(refusers.empty(), mnclRemoteError,
             "split: rank(s) " + refusers + " refused their arguments (its error says why), so no rank made a new "
             "communicator; this one is as it was");
  if (color < 0) return false;
  std::vector<Entry> members;
  for (const Entry& e : all) {
    if (e.color == color) members.push_back(e);
  }
  std::stable_sort(members.begin(), members.end(), [](const Entry& a, const Entry& b) {
    return a.key != b.key ? a.key < b.key : a.rank < b.rank;
  });
  *newRanks = (int)members.size();
  for (int i = 0; i < *newRanks; ++i) {
    if (members[i].rank == rank_) *newRank = i;
    if (members_) members_->push_back(members[i].rank);
  }
  int leader = members[0].rank;
  if (leader == rank_) {
    std::random_device rd;
    uint64_t nonce = ((uint64_t)rd() << 32) ^ rd();
    SockAddr root = startRoot(bootstrap_->localAddress(), nonce);
    *id = UniqueIdData{};
    id->magic = kIdMagic;
    id->nonce = nonce;
    id->root = WireAddr::from(root);
    try {
      for (size_t i = 1; i < members.size(); ++i) bootstrap_->send(members[i].rank, tag, id, sizeof(*id));
    } catch (const Error& e) {
      throwRendezvousError("split", stops, e);
    }
  } else {
    try {
      bootstrap_->recv(leader, tag, id, sizeof(*id));
    } catch (const Error& e) {
      throwRendezvousError("split", stops, e);
    }
  }
  return true;
}

// A rank of this host that destroyed or aborted its communicator (instead of splitting it)
// before it had every rank's entry of split number `split` never passes them on: the ranks
// after it on the bootstrap ring would wait out its timeout. (One that did so after it had
// them passed ours on: its part of the split is done. One whose process exited fails the
// communicator through the monitor. Over the network, a rank's mirrored state does not say
// how far it got: there the wait ends as before.)
void Comm::failIfLeftBeforeSplit(int split) const {
  std::string ranks;
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_ || overNetwork(r) || !peerRegions_[r]->ctrl()->gone()) continue;
    if (dev::loadAcquire(&peerRegions_[r]->ctrl()->splitsGathered) > (uint32_t)split) continue;
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  MNCL_CHECK(ranks.empty(), mnclRemoteError,
             "split: rank(s) " + ranks + " destroyed or aborted the communicator before the ranks met (lost_ranks() "
             "lists them): every rank must call split (a negative color joins none)");
}

// A socket error in a rendezvous names at most a neighbour in the bootstrap ring, which may
// only have passed another rank's failure on: name the ranks gone, if any show within half
// a second (a process that exited on this host shows at once), or the failure this rank
// heard of meanwhile; an abort() meanwhile ends the look, with Aborted.
void Comm::throwRendezvousError(const char* call, uint32_t stops, const Error& e) const {
  std::vector<int> gone;
  if (e.code() == mnclRemoteError || e.code() == mnclSystemError) {
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    while ((gone = lostRanks()).empty() && !failed() && std::chrono::steady_clock::now() < until) {
      failIfStoppedSince(stops);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  failIfStoppedSince(stops);
  if (gone.empty() && failed()) throw Error(asyncError(), std::string(call) + ": " + errorMessage());
  if (gone.empty()) throw Error(e.code(), std::string(call) + ": " + e.what());
  std::string list;
  for (int r : gone) list += (list.empty() ? "" : ", ") + std::to_string(r);
  throw Error(mnclRemoteError, std::string(call) + ": rank(s) " + list +
                                   " left during the rendezvous (lost_ranks() lists them): " + e.what());
}

// The lowest rank kept (the leader) starts the new group's root and sends its id to the
// others; first each of them sends it the ranks it was told to exclude (a byte per rank), so
// that ranks that disagree fail, naming who, instead of making communicators that never meet.
// A rank kept that is gone (lost_ranks() lists it) can never answer: the leader passes over
// it and fails them all, naming it, and a leader that is gone fails its members at once.
// (Ranks that disagree on the leader wait for one that never answers: the bootstrap timeout
// ends that, with a message saying what to check, and so does a live rank kept that never
// comes.) Each leader-member pair tags its exchange with the exchanges that pair completed
// so far (ranks left out of one shrink make none, so a count over all shrinks would differ
// from rank to rank); an exchange that timed out counts on neither side, so the ranks can try
// again. (A member's message that its leader never read, the leader having timed out on
// another, is what the leader reads on the next try.)
struct Comm::ShrinkReply {
  UniqueIdData id;       // magic 0: no communicator (the lists differ, or see lostRank)
  int32_t lostRank = -1;  // a rank kept that the leader found gone
};

void Comm::shrinkInfo(const std::vector<int>& exclude, bool abortFirst, int* newRanks, int* newRank, UniqueIdData* id,
                      std::vector<int>* members) {
  std::vector<uint8_t> excluded(nranks_, 0);
  for (int r : exclude) {
    MNCL_CHECK(r >= 0 && r < nranks_, mnclInvalidArgument,
               "shrink: rank " + std::to_string(r) + " is out of range for " + std::to_string(nranks_) + " ranks");
    MNCL_CHECK(r != rank_, mnclInvalidArgument,
               "shrink: rank " + std::to_string(r) + " excludes itself; excluded ranks do not call shrink");
    excluded[r] = 1;
  }
  if (abortFirst) {  // (only once the arguments are known good)
    abort();
    awaitRendezvousLeft();  // (an aborted split or shrink on another thread is on its way out)
  }
  RendezvousScope one(*this, "shrink");
  const uint32_t stops = stops_.load(std::memory_order_acquire);
  WaitCheck untilStopped([&] { failIfStoppedSince(stops); });  // (an abort() from another thread)
  std::vector<int> kept;
  for (int r = 0; r < nranks_; ++r) {
    if (!excluded[r]) kept.push_back(r);
  }
  *newRanks = (int)kept.size();
  *newRank = (int)(std::find(kept.begin(), kept.end(), rank_) - kept.begin());
  shrinksWith_.resize(nranks_, 0);
  int leader = kept[0];
  ShrinkReply reply;
  std::string differ;  // (the leader: the ranks whose excluded ranks differ from its own)
  try {
    if (leader != rank_) {
      WaitCheck whileTheLeaderLives([&] { failIfGone(leader); });
      int tag = kShrinkTags + shrinksWith_[leader];
      bootstrap_->send(leader, tag, excluded.data(), excluded.size());
      bootstrap_->recv(leader, tag, &reply, sizeof(reply));
      ++shrinksWith_[leader];
    } else {
      differ = shrinkAsLeader(kept, excluded, &reply);
    }
  } catch (const Error& e) {
    if (e.code() == mnclAborted) throw Error(e.code(), "shrink: " + std::string(e.what()));  // (no advice to give)
    throw Error(e.code(), "shrink: " + std::string(e.what()) +
                              " (every rank kept must call shrink with the same ranks to exclude, and a rank that "
                              "died or will not call must be among them)");
  }
  MNCL_CHECK(reply.lostRank < 0, mnclInvalidUsage,
             "shrink: rank " + std::to_string(reply.lostRank) + " is kept but gone (lost_ranks() lists it" +
                 (leader == rank_ ? "" : " on rank " + std::to_string(leader) + ", the lowest kept") +
                 "): every rank kept must exclude it");
  MNCL_CHECK(differ.empty(), mnclInvalidUsage,
             "shrink: rank(s) " + differ + " were given other ranks to exclude than rank " + std::to_string(rank_) +
                 " was: every rank kept must pass the same ones");
  MNCL_CHECK(reply.id.magic == kIdMagic, mnclInvalidUsage,
             "shrink: the ranks kept were given different ranks to exclude (rank " + std::to_string(leader) +
                 ", the lowest kept, compared them): every rank kept must pass the same ones");
  *id = reply.id;
  if (members) *members = kept;
}

// Only a process that exited or stopped for MININCL_TIMEOUT (hung): a member that destroyed
// this communicator may have done so after its own init of the new one, which is still under
// way on the others.
void Comm::failIfMemberGone(const std::vector<int>& members) const {
  std::string exitedRanks, hungRanks;
  bool overTcp = false;  // (an exited rank reached over the network: or its connection broke)
  for (int r : members) {
    if (r == rank_) continue;
    if (exited(r)) {
      exitedRanks += (exitedRanks.empty() ? "" : ", ") + std::to_string(r);
      overTcp |= overNetwork(r);
    } else if (givenUpOn(r)) {
      hungRanks += (hungRanks.empty() ? "" : ", ") + std::to_string(r);
    }
  }
  if (exitedRanks.empty() && hungRanks.empty()) return;
  const char* hung = " showed no sign of life for MININCL_TIMEOUT (hung or stopped)";
  std::string what = exitedRanks.empty()
                         ? "rank(s) " + hungRanks + " of the communicator split (or shrunk)" + hung
                         : "rank(s) " + exitedRanks + " of the communicator split (or shrunk) exited" +
                               (overTcp ? " (or lost their network connection)" : "") +
                               (hungRanks.empty() ? "" : " and rank(s) " + hungRanks + hung);
  throw Error(exitedRanks.empty() ? mnclTimeout : mnclRemoteError,
              what + " (lost_ranks() lists them), so the new communicator's init cannot complete: shrink them away "
                     "and try again");
}

void Comm::failIfGone(int r) const {
  MNCL_CHECK(!lost(r), mnclInvalidUsage,
             "rank " + std::to_string(r) + " is kept but gone (lost_ranks() lists it): every rank kept must exclude it");
}

std::string Comm::shrinkAsLeader(const std::vector<int>& kept, const std::vector<uint8_t>& excluded,
                                 ShrinkReply* reply) {
  std::vector<int> tags(kept.size());
  std::vector<bool> heard(kept.size(), false);
  std::string others;
  *reply = ShrinkReply{};
  for (size_t i = 1; i < kept.size(); ++i) {
    tags[i] = kShrinkTags + shrinksWith_[kept[i]];
    std::vector<uint8_t> theirs(excluded.size());
    try {
      WaitCheck whileItLives([&] { failIfGone(kept[i]); });
      bootstrap_->recv(kept[i], tags[i], theirs.data(), theirs.size());
    } catch (const Error&) {
      if (!lost(kept[i])) throw;
      if (reply->lostRank < 0) reply->lostRank = kept[i];
      continue;
    }
    heard[i] = true;
    if (theirs != excluded) others += (others.empty() ? "" : ", ") + std::to_string(kept[i]);
  }
  bool failed = !others.empty() || reply->lostRank >= 0;
  if (!failed) {
    std::random_device rd;
    uint64_t nonce = ((uint64_t)rd() << 32) ^ rd();
    reply->id.magic = kIdMagic;
    reply->id.nonce = nonce;
    reply->id.root = WireAddr::from(startRoot(bootstrap_->localAddress(), nonce));
  }
  for (size_t i = 1; i < kept.size(); ++i) {
    if (!heard[i]) continue;  // (gone)
    try {
      WaitCheck whileItLives([&] { failIfGone(kept[i]); });
      bootstrap_->send(kept[i], tags[i], reply, sizeof(*reply));
    } catch (const Error&) {
      if (!failed) throw;  // (failing anyway: a rank that cannot hear it is not waiting)
      continue;
    }
    ++shrinksWith_[kept[i]];
  }
  return others;
}

}  // namespace mncl
