// Bootstrap: how ranks that know only a unique id find each other.
//
// The id names a root listener (address + random nonce). Every rank opens its own listening
// socket, registers with the root and receives the address of the next rank; from then on
// the ranks talk directly: a ring of sockets (which passes every rank's address around first)
// for allgather and barrier, and one-off connections for tagged send/recv. Init uses these to exchange what the transports need.
#pragma once

#include <functional>
#include <list>
#include <optional>
#include <string>
#include <vector>

#include "minincl.h"
#include "socket.h"

namespace mncl {

constexpr uint64_t kIdMagic = 0x4d4e434c49443031ull;  // "MNCLID01"

// An IPv4 or IPv6 address in a fixed, compact form.
struct WireAddr {
  uint16_t family, port;  // port in host order
  uint32_t scope;
  uint8_t addr[16];
  static WireAddr from(const SockAddr& a);
  SockAddr toSockAddr() const;
};

// The 128 bytes of an mnclUniqueId.
struct UniqueIdData {
  uint64_t magic;
  uint64_t nonce;
  uint32_t rankZeroStartsRoot;  // ids built from an address: rank 0 hosts the root itself
  WireAddr root;
};
static_assert(sizeof(UniqueIdData) <= 128, "id layout");

// MININCL_BOOTSTRAP_TIMEOUT, seconds; at most this thread's cap (capBootstrapTimeout).
double bootstrapTimeout();
// Caps the bootstrap timeout of what this thread starts from now on (unique ids, inits), 0:
// no cap; returns the cap before. A torch group's timeout, when shorter: gloo's rendezvous
// keeps to it too.
double capBootstrapTimeout(double seconds);

// The id every rank derives from a root address (rank 0 hosts the root). Its nonce ties it to
// the address and port and to `job` (a launcher's job id, or empty): two jobs given the same
// address then fail at the root ("wrong unique id") instead of joining each other's ranks.
UniqueIdData uniqueIdForAddress(const std::string& host, int port, const std::string& job);

// The most ranks a communicator may have: a world size past it is taken for a mistake, before
// the bootstrap root sizes its address table by it (128 bytes a rank: 512 MiB here).
constexpr int kMaxRanks = 1 << 22;
inline std::string tooManyRanks(int nranks) {
  return "nranks=" + std::to_string(nranks) + " is more than minincl takes (" + std::to_string(kMaxRanks) +
         "); is the world size right?";
}

// Starts a root listener on `bind` in a background thread that serves one rendezvous, then
// exits (also once a rank has come and the bootstrap timeout passed; an id no rank ever uses
// keeps its root until the process exits, as NCCL's). Returns the address it listens on.
// `fromAddress`: of an id from an address, the same at every try (rank 0 starts its root).
SockAddr startRoot(const SockAddr& bind, uint64_t nonce, bool fromAddress = false);
// Tells the root of `nonce`, if this process serves it, that `rank` could not init: it fails
// the other ranks at once, as a report by socket does (see Bootstrap::reportInitFailure), so
// this works without a file descriptor to spare. False if no such root runs here.
// `fromAddress`: an id from an address (rank 0 starts its root).
bool reportToLocalRoot(uint64_t nonce, bool fromAddress, int rank, int nranks, const std::string& message);
// Tells the root of `nonce`, if this process serves it, that `rank` will not come (it failed
// before its hello), so that it stops waiting to answer it.
void leaveLocalRoot(uint64_t nonce, int rank);
// For a rank of the process that serves the root of `nonce`: a check that throws the root's
// failure once it failed (it may have no file descriptor left to answer the rank with).
// Empty if the root runs elsewhere (of an id from an address: a check that finds no root).
std::function<void()> localRootWatch(uint64_t nonce, bool fromAddress, int rank);
// A root's failure as the error its ranks throw ("bootstrap failed: ..."): Timeout (ranks
// never came), RemoteError (one could not init), InvalidArgument (too many ranks),
// SystemError (the root itself failed: out of file descriptors, say), else InvalidUsage
// (they disagree).
[[noreturn]] void throwBootstrapFailure(mnclResult_t status, const std::string& failure);

class Bootstrap {
 public:
  Bootstrap(const UniqueIdData& id, int rank, int nranks);
  // The id's magic, nranks >= 1 and rank in range (the constructor checks them too; a caller
  // that reports a failed init checks first, so that a bad rank is told to the others).
  static void checkArguments(const UniqueIdData& id, int rank, int nranks);
  // For a rank whose init failed before it joined (a bad device, say): tells the root, which
  // fails every other rank's init at once with `message` (mnclRemoteError) instead of letting
  // them wait MININCL_BOOTSTRAP_TIMEOUT for this one. Best effort: never throws.
  static void reportInitFailure(const UniqueIdData& id, int rank, int nranks, const std::string& message) noexcept;

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  // This rank's address (port 0): where a root for a sub-communicator can listen so that
  // every peer reaches it the way it reaches us.
  SockAddr localAddress() const;
  // data holds nranks slots of `bytes` each; this rank's slot is filled in, the rest is filled.
  void allgather(void* data, size_t bytes);
  void send(int peer, int tag, const void* data, size_t size);
  void recv(int peer, int tag, void* data, size_t size);
  void barrier();
  // Throws RemoteError if a ring neighbour closed its connection: during init (before its
  // last barrier) only a rank whose init failed, or whose process exited, does that.
  void failIfNeighbourGone() const;

 private:
  struct Header {
    uint64_t magic;
    int32_t rank, kind, tag;
    uint64_t size;
  };
  enum Kind { kRing = 1, kP2p = 2 };
  struct Message {
    int peer, tag;
    std::vector<char> data;
  };

  // Says hello to the root of `id`; learns the next rank's address (or the init's failure).
  void registerWithRoot(const UniqueIdData& id);
  Socket reachRoot(const UniqueIdData& id);  // its connection, or an error that says why not
  // Throws the failure the root tells. False where it says to try again (kRootTryAgain) and
  // `tryAgainUntil` is given and not past.
  bool awaitRootReply(Socket& toRoot, const UniqueIdData& id, std::optional<Deadline> tryAgainUntil);
  void connectRing();
  void shareAddresses();  // fills addrs_ (the root told this rank only its own and next's)
  // Accepts connections until one matches (kind, peer, tag); stashes p2p messages that arrive
  // early. Returns the matching socket with its header consumed.
  Socket acceptMatching(int kind, int peer, int tag, Header* header);
  Deadline deadline() const { return deadlineIn(timeout_); }

  int rank_, nranks_;
  uint64_t magic_;
  double timeout_;
  bool saidHello_ = false;  // the root has our hello (it counts us as come)
  bool rootGone_ = false;   // the root of our id refused us: it ended
  std::function<void()> rootWatch_;  // (see localRootWatch; empty if the root runs elsewhere)
  Socket listen_, next_, prev_;
  std::vector<WireAddr> addrs_;  // each rank's listener, by rank
  std::list<Message> unexpected_;
};

}  // namespace mncl
