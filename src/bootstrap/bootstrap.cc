#include "bootstrap.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "../core/env.h"
#include "../core/error.h"
#include "../core/log.h"
#include "wire.h"

namespace mncl {

namespace {
thread_local double tlsBootstrapCap = 0;  // see capBootstrapTimeout
}  // namespace

double bootstrapTimeout() {
  double t = env::limit("MININCL_BOOTSTRAP_TIMEOUT", 60.0);
  return tlsBootstrapCap > 0 ? std::min(t, tlsBootstrapCap) : t;
}

double capBootstrapTimeout(double seconds) {
  double before = tlsBootstrapCap;
  tlsBootstrapCap = seconds > 0 ? seconds : 0;
  return before;
}

namespace {

// Rank `rank`'s socket to the bootstrap root; rank 0 of an id made from an address starts it.
Socket connectToRoot(const UniqueIdData& id, int rank, Deadline d, const std::string& why) {
  SockAddr root = id.root.toSockAddr();
  if (id.rankZeroStartsRoot && rank == 0) {
    try {
      startRoot(root, id.nonce, true);
    } catch (const Error& e) {
      throwError(e.code(), "rank 0 could not start the bootstrap root at " + root.str() + " (the address the unique id "
                               "names; init_from_env: MININCL_ROOT_PORT, else MASTER_PORT + 1): " + e.what());
    }
  }
  // The root of an id from get_unique_id listens before anyone has the id, until it served
  // the init: refusals say it ended (see registerWithRoot).
  return Socket::connect(root, d, "rank " + std::to_string(rank) + " " + why, !id.rankZeroStartsRoot);
}

RootHello helloFrom(const UniqueIdData& id, int rank, int nranks) {
  RootHello hello{};
  hello.magic = id.magic;
  hello.nonce = id.nonce;
  hello.nranks = nranks;
  hello.rank = rank;
  return hello;
}

}  // namespace

UniqueIdData uniqueIdForAddress(const std::string& host, int port, const std::string& job) {
  MNCL_CHECK(port > 0 && port < 65536, mnclInvalidArgument, "port " + std::to_string(port) + " is out of range (1 to 65535)");
  UniqueIdData d{};
  d.magic = kIdMagic;
  d.nonce = std::hash<std::string>{}(host + ":" + std::to_string(port) + (job.empty() ? "" : "/" + job));
  d.rankZeroStartsRoot = 1;
  d.root = WireAddr::from(SockAddr::resolve(host, port));
  return d;
}

void Bootstrap::checkArguments(const UniqueIdData& id, int rank, int nranks) {
  MNCL_CHECK(id.magic == kIdMagic, mnclInvalidArgument,
        "the unique id is not a minincl unique id (wrong magic): pass the bytes of mnclGetUniqueId / get_unique_id()");
  MNCL_CHECK(nranks >= 1, mnclInvalidArgument, "nranks must be at least 1, got " + std::to_string(nranks));
  MNCL_CHECK(nranks <= kMaxRanks, mnclInvalidArgument, tooManyRanks(nranks));
  MNCL_CHECK(rank >= 0 && rank < nranks, mnclInvalidArgument,
        "rank " + std::to_string(rank) + " is out of range for nranks=" + std::to_string(nranks));
}

Bootstrap::Bootstrap(const UniqueIdData& id, int rank, int nranks)
    : rank_(rank), nranks_(nranks), magic_(id.nonce ^ kIdMagic), timeout_(bootstrapTimeout()) {
  checkArguments(id, rank, nranks);
  try {
    registerWithRoot(id);
  } catch (const Error& e) {
    // (Rank 0 of an id from an address, after its hello too: a retry may come at once, before
    // the root sees the connection close, and must find the root it started done with.)
    if (!saidHello_ || (id.rankZeroStartsRoot && rank == 0)) leaveLocalRoot(id.nonce, rank);
    // A root of this process that failed first closed us out (or could not let us in): its
    // failure is the story.
    if (rootWatch_ && e.code() != mnclTimeout) rootWatch_();
    // Failed before its hello (out of file descriptors, say): the others need not wait for it.
    // (Not after a timeout: the root is out of reach, for the report too.)
    // (Nor where the root is gone: nobody is left to tell.)
    if (!saidHello_ && e.code() != mnclTimeout && !rootGone_) reportInitFailure(id, rank, nranks, e.what());
    throw;
  }
  if (nranks_ == 1) return;
  connectRing();
  shareAddresses();
}

void Bootstrap::reportInitFailure(const UniqueIdData& id, int rank, int nranks, const std::string& message) noexcept {
  if (id.magic != kIdMagic) return;  // (that init's error already says why)
  // (A rank out of range reports too: the root fails the others with its story.)
  if (reportToLocalRoot(id.nonce, id.rankZeroStartsRoot != 0, rank, nranks, message)) return;
  try {
    Deadline d = deadlineIn(std::min(bootstrapTimeout(), 5.0));
    Socket toRoot = connectToRoot(id, rank, d, "reporting its failed init");
    RootHello hello = helloFrom(id, rank, nranks);
    hello.failCode = 1;
    std::strncpy(hello.failMessage, message.c_str(), sizeof(hello.failMessage) - 1);
    toRoot.sendAll(&hello, sizeof(hello), d, "reporting a failed init to the bootstrap root");
  } catch (...) {
    // The others time out instead, naming this rank as missing.
  }
}

void throwBootstrapFailure(mnclResult_t status, const std::string& failure) {
  bool known = status == mnclTimeout || status == mnclRemoteError || status == mnclInvalidArgument || status == mnclSystemError;
  throwError(known ? status : mnclInvalidUsage, "bootstrap failed: " + failure);
}

void Bootstrap::registerWithRoot(const UniqueIdData& id) {
  // A root of this process that fails may have no file descriptor left to answer us with: its
  // failure comes through memory. (Looked up once it runs: rank 0 of an address's id starts
  // it; an earlier root of that address may have failed.)
  bool fromAddress = id.rankZeroStartsRoot != 0;
  bool startsRoot = fromAddress && rank_ == 0;
  std::optional<WaitCheck> rootFailed;
  if (!startsRoot && (rootWatch_ = localRootWatch(id.nonce, fromAddress, rank_))) rootFailed.emplace(rootWatch_);
  Socket toRoot = reachRoot(id);
  if (startsRoot && (rootWatch_ = localRootWatch(id.nonce, true, rank_))) rootFailed.emplace(rootWatch_);
  // Listen on the interface that reaches the root, so peers can reach us the same way.
  SockAddr mine = toRoot.localAddr();
  mine.setPort(0);
  listen_ = Socket::listen(mine);

  RootHello hello = helloFrom(id, rank_, nranks_);
  hello.listen = listen_.localAddr().storage;
  // An id from an address is the same at every try: an earlier try's root (ending, or stopped
  // by this try's rank 0) may take the hello, and tell the rank to try again: this try's root,
  // started by rank 0, takes it then.
  std::optional<Deadline> tryAgainUntil;
  if (fromAddress && !startsRoot) tryAgainUntil = deadline();
  for (;;) {
    toRoot.sendAll(&hello, sizeof(hello), deadline(), "sending hello to the bootstrap root");
    saidHello_ = true;
    if (awaitRootReply(toRoot, id, tryAgainUntil)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // (no busy loop at a port that closes at once)
    toRoot = reachRoot(id);
  }
  // The root names only the next rank's address; the ring passes the others around (see
  // shareAddresses).
  sockaddr_storage next{};
  toRoot.recvAll(&next, sizeof(next), deadline(), "reading the next rank's address from the bootstrap root");
  addrs_.assign(nranks_, WireAddr{});
  addrs_[(rank_ + 1) % nranks_] = WireAddr::from(SockAddr{next, 0});
  addrs_[rank_] = WireAddr::from(listen_.localAddr());
}

Socket Bootstrap::reachRoot(const UniqueIdData& id) {
  try {
    return connectToRoot(id, rank_, deadline(), "registering with the bootstrap root");
  } catch (const Error& e) {
    if (e.code() == mnclRemoteError && !id.rankZeroStartsRoot) {  // (it refused us: see connectToRoot)
      if (rootWatch_) rootWatch_();  // (a root of this process that failed: its story)
      rootGone_ = true;
      SockAddr root = id.root.toSockAddr();
      bool loopback = root.str().rfind("127.", 0) == 0 || root.str().rfind("[::1]", 0) == 0;
      throwError(mnclRemoteError, "rank " + std::to_string(rank_) + ": the bootstrap root of this unique id (" +
                                      root.str() + ") is gone: an id serves one communicator's init, and that "
                                      "init is over, done or failed (an id left from an earlier try, or given "
                                      "to two groups?), or the process that made it (get_unique_id / "
                                      "mnclGetUniqueId) exited" +
                                      (loopback ? " (or this rank runs on another host: a loopback root serves "
                                                  "its own host only; set MININCL_BOOTSTRAP_ADDR)"
                                                : ""));
    }
    if (e.code() != mnclTimeout) throw;
    if (id.rankZeroStartsRoot) {
      throwError(mnclTimeout, std::string(e.what()) + ". Rank 0 starts the root of an id made from an address "
                              "(init_from_env, unique_id_for_address): is rank 0 running, and does that address "
                              "reach its host (MASTER_ADDR or MININCL_ROOT_ADDR, and the port)?");
    }
    throwError(mnclTimeout, std::string(e.what()) + ". The root runs in the process that called get_unique_id() / "
                            "mnclGetUniqueId and serves one communicator's init: has that process exited, or did "
                            "another communicator's init already use this id?");
  }
}

bool Bootstrap::awaitRootReply(Socket& toRoot, const UniqueIdData& id, std::optional<Deadline> tryAgainUntil) {
  RootReply reply{};
  // The root gives up on missing ranks at its own deadline and says which are missing:
  // wait a little longer than it does, to hear that rather than a bare timeout.
  std::string rootAt = "the bootstrap root's address " + id.root.toSockAddr().str();
  try {
    toRoot.recvAll(&reply, sizeof(reply), deadlineIn(timeout_ + 2.0), "waiting for the other ranks at the bootstrap root");
  } catch (const Error& e) {
    if (e.code() == mnclTimeout) throw;  // (a root answers before it closes a connection)
    if (rootWatch_) rootWatch_();  // (one that failed before it took our connection closes it unanswered)
    throwError(e.code(), std::string(e.what()) + "; " + rootAt +
                             " closed it unanswered: is another program listening on that port, or did the root's "
                             "process exit?");
  }
  MNCL_CHECK(reply.nonce == id.nonce, mnclSystemError,
        rootAt + " did not answer as minincl's root: is another program listening on that port?");
  if (reply.status == kRootTryAgain) {
    if (tryAgainUntil && Clock::now() < *tryAgainUntil) return false;
    throwError(mnclTimeout, "rank " + std::to_string(rank_) + ": an earlier init's bootstrap root of this id at " +
                                id.root.toSockAddr().str() + " took the hello, and this init's root did not "
                                "take it before the bootstrap timeout: is rank 0 running?");
  }
  if (reply.status != 0) {
    throwBootstrapFailure((mnclResult_t)reply.status, std::string(reply.message, strnlen(reply.message, sizeof(reply.message))));
  }
  return true;
}

void Bootstrap::shareAddresses() {
  // Around the ring, as NCCL's bootstrap does: the root then sends nranks addresses in all,
  // where a table to every rank would be nranks squared (1.15 GB for 3000 ranks).
  WaitCheck whileNeighboursLive([this] { failIfNeighbourGone(); });  // (as the init's allgathers)
  allgather(addrs_.data(), sizeof(WireAddr));
}

void Bootstrap::connectRing() {
  int next = (rank_ + 1) % nranks_, prev = (rank_ + nranks_ - 1) % nranks_;
  next_ = Socket::connect(addrs_[next].toSockAddr(), deadline(), "bootstrap ring: connecting to rank " + std::to_string(next), true);
  Header h{magic_, rank_, kRing, 0, 0};
  next_.sendAll(&h, sizeof(h), deadline(), "bootstrap ring header");
  WaitCheck whileNextLives([this] { failIfNeighbourGone(); });  // (prev may never come: next hears first)
  prev_ = acceptMatching(kRing, prev, 0, &h);
}

void Bootstrap::failIfNeighbourGone() const {
  int next = (rank_ + 1) % nranks_, prev = (rank_ + nranks_ - 1) % nranks_;
  for (auto [socket, peer] : {std::pair{&next_, next}, std::pair{&prev_, prev}}) {
    if (!socket->closedByPeer()) continue;
    throwError(mnclRemoteError, "rank " + std::to_string(rank_) + ": rank " + std::to_string(peer) +
                                    ", next to it in the bootstrap ring, closed its connection during init: its init "
                                    "failed or its process exited (a rank whose init fails ends its neighbours' in "
                                    "turn: the earliest error says why)");
  }
}

Socket Bootstrap::acceptMatching(int kind, int peer, int tag, Header* header) {
  Deadline d = deadline();
  for (;;) {
    Socket s = listen_.accept(d, "rank " + std::to_string(rank_) + " waiting for rank " + std::to_string(peer));
    Header h{};
    if (!s.recvOpening(&h, sizeof(h), d, "bootstrap: reading a connection header") || h.magic != magic_) {
      MNCL_WARN(kInit, "rank %d: a connection to its bootstrap listener was not from a rank of this communicator; closed",
                rank_);
      continue;
    }
    if (h.kind == kind && h.rank == peer && h.tag == tag) {
      *header = h;
      return s;
    }
    if (h.kind == kP2p) {
      Message m{h.rank, h.tag, std::vector<char>(h.size)};
      s.recvAll(m.data.data(), h.size, d, "bootstrap: reading an early message");
      unexpected_.push_back(std::move(m));
    }
  }
}

void Bootstrap::allgather(void* data, size_t bytes) {
  char* base = static_cast<char*>(data);
  int next = (rank_ + 1) % nranks_, prev = (rank_ + nranks_ - 1) % nranks_;
  std::string sending = "bootstrap allgather: rank " + std::to_string(rank_) + " sending to rank " +
                        std::to_string(next) + ", next in the bootstrap ring";
  std::string receiving = "bootstrap allgather: rank " + std::to_string(rank_) + " receiving from rank " +
                          std::to_string(prev) + ", before it in the bootstrap ring";
  for (int s = 0; s < nranks_ - 1; ++s) {
    int sendSlot = (rank_ - s + nranks_) % nranks_;
    int recvSlot = (rank_ - s - 1 + nranks_) % nranks_;
    next_.sendAll(base + sendSlot * bytes, bytes, deadline(), sending);
    prev_.recvAll(base + recvSlot * bytes, bytes, deadline(), receiving);
  }
}

void Bootstrap::send(int peer, int tag, const void* data, size_t size) {
  Socket s = Socket::connect(addrs_[peer].toSockAddr(), deadline(), "bootstrap send to rank " + std::to_string(peer), true);
  Header h{magic_, rank_, kP2p, tag, size};
  s.sendAll(&h, sizeof(h), deadline(), "bootstrap send header");
  s.sendAll(data, size, deadline(), "bootstrap send");
}

void Bootstrap::recv(int peer, int tag, void* data, size_t size) {
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    if (it->peer == peer && it->tag == tag) {
      MNCL_CHECK(it->data.size() == size, mnclInternalError, "bootstrap message of unexpected size");
      std::memcpy(data, it->data.data(), size);
      unexpected_.erase(it);
      return;
    }
  }
  Header h{};
  Socket s = acceptMatching(kP2p, peer, tag, &h);
  MNCL_CHECK(h.size == size, mnclInternalError, "bootstrap message of unexpected size");
  s.recvAll(data, size, deadline(), "bootstrap recv from rank " + std::to_string(peer));
}

SockAddr Bootstrap::localAddress() const {
  SockAddr a = listen_.localAddr();
  a.setPort(0);
  return a;
}

void Bootstrap::barrier() {
  std::vector<char> dummy(nranks_);
  allgather(dummy.data(), 1);
}

}  // namespace mncl
