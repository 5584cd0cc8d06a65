// What a rank's peers can read of its calls, in its control block: the collective calls it
// made last, the sends and receives it posted, and the call it is inside now.
//
// Ranks that make different collective calls usually meet in a FIFO, where every step carries
// its call (dev::StepInfo) and the receiver names the mismatch. But calls that differ in size
// may take different protocols or algorithms, whose steps never meet: each rank would wait for
// ever on a FIFO the other never fills. So every rank logs each collective call it starts,
// and its monitor compares its peers' logs with its own (Monitor::checkCalls): the same call
// number with a different call is an error naming both, whatever the ranks are waiting on.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace mncl {

// One logged call, as every rank must make it: what, how many elements of which type, and,
// where they matter, the reduction and the root (0 where they do not).
struct LoggedCall {
  uint8_t kind;  // a Coll, or a k...Call below
  uint8_t dtype, op;
  int32_t root;
  uint64_t count;
  bool operator==(const LoggedCall&) const = default;
};
// The calls that run as groups of sends and receives (no Coll), and the barrier (an allreduce
// of one int32 on the CPU):
constexpr uint8_t kAlltoallCall = 0x40;
constexpr uint8_t kBarrierCall = 0x41;
constexpr uint8_t kGatherCall = 0x42;
constexpr uint8_t kScatterCall = 0x43;

// The last kCallLogSize calls of a rank, in shared memory: written by the rank, read by its
// peers' monitors (and its network proxy, which sends them on). Each entry is five words;
// `seq` is 0 while the other four change, so a reader that sees the same seq before and after
// reading them has read one call.
constexpr int kCallLogSize = 16;
// The peers whose sends and receives a log counts: as many as fit a uint64_t bitmask
// (CallActivity::peers).
constexpr int kP2pPeers = 64;
struct CallLog {
  alignas(128) uint64_t made;  // collective calls this rank started
  struct Entry {
    uint64_t seq;    // the call's number, from 1
    uint64_t count;
    uint64_t what;   // kind | dtype << 8 | op << 16 | root << 32
    uint64_t sendsBefore, recvsBefore;  // sends and receives the rank posted before the call
  } entries[kCallLogSize];
  // Sends and receives posted so far (see P2pBalance).
  uint64_t sendsPosted, recvsPosted;
  // ... and with each peer below kP2pPeers (see PeerP2p).
  struct PeerWords {
    uint64_t sends, recvs, lastLongSend, sendSteps, recvSteps;
  } withPeer[kP2pPeers];
  // What the rank's thread is inside now (CPU communicators, one call at a time): see
  // CallActivity. `entered` is bumped (release) after the other two words change.
  uint64_t entered, inside, peers;
};

// Sends and receives wait for each other in a cycle (Monitor::checkWaitCycle): rank A cannot
// end its call before B posts more, B not before C, ..., and Z not before A, while each is
// inside its call and so posts nothing. A rank waits on peer P when it is inside a call and
//  - it has posted more receives from P than P has posted sends to it (a receive never ends
//    without its send), or
//  - its newest long send to P, one that does not fit in its connections to P (with the
//    sends to P before it in its group, which start on the same channel), is beyond the
//    receives P has posted from it (a send that fits ends without its receive, so only a
//    long one counts; over the network, one longer than twice what the sockets and FIFOs on
//    the way hold: see Comm::countP2p), or
//  - on one host, its sends to P that P has posted no receives for take more FIFO steps than
//    a connection holds (dev::kSteps): each op takes a step at least, and a slot's worth of
//    bytes a step (small sends queued one call after another fill the FIFO as surely as one
//    long send does).
// Sends and receives pair up in order, so the counts say it; an op of an earlier, finished
// call was paired, so whatever is unpaired belongs to the call the rank is inside now.
// And, while every rank is inside a call (none can post anything new), a rank inside
// collective call s waits on a peer inside sends or receives that has not made call s.
struct PeerP2p {
  uint64_t sends = 0, recvs = 0;  // posted to and from the peer so far
  uint64_t lastLongSend = 0;      // the number (from 1, among `sends`) of the newest long send
  uint64_t sendSteps = 0, recvSteps = 0;  // the FIFO steps of `sends` and `recvs` (Comm::countP2p)
};
// The number of the newest send in `ours` (a rank's ops with peer P) that cannot end before P
// posts more receives, by what P posted (`theirs`, P's ops with the rank); 0 if none. The
// steps count between ranks of one host only (over the network the sockets hold more).
uint64_t sendAwaitingReceives(const PeerP2p& ours, const PeerP2p& theirs, bool sameHost);

// A rank inside sends and receives whose every peer is inside a later collective call waits
// for ever: those peers post nothing until that collective ends, and it needs this rank
// (Monitor::checkDeadlock). What the log says a rank is inside (one call at a time: see
// Comm::CallScope):
enum class Inside : uint64_t { nothing, collectives, sendsAndReceives, both };
struct CallActivity {
  uint64_t entered = 0;  // calls entered so far: a new call, a new number
  Inside inside = Inside::nothing;
  uint64_t peers = 0;    // sendsAndReceives: bit p for each peer p (all ranks below 64)
};

// Sends and receives between collective calls must pair up before the next one: a send
// nobody receives leaves its connection's steps one ahead, and the collective that follows
// waits for ever on a slot the sender never writes. So each logged call also holds the sends
// and receives its rank posted before it, and the monitors compare the totals of all ranks.
struct P2pBalance {
  uint64_t sends = 0, recvs = 0;  // before the call
};

// Counts a send or receive the rank posts (its owner only; those of a group when it ends).
// `peer` is counted only below kP2pPeers; `longSend` and `steps`: see PeerP2p.
void countP2p(CallLog& log, bool isSend, int peer, bool longSend, uint64_t steps);
// What the rank posted with `peer` so far (zeros for a peer from kP2pPeers on: not counted).
PeerP2p peerP2p(const CallLog& log, int peer);
// Logs the rank's next call (its owner only; calls of one communicator come one at a time).
void logCall(CallLog& log, const LoggedCall& call);
// Call number `seq` of the log, if it still holds it.
std::optional<LoggedCall> loggedCall(const CallLog& log, uint64_t seq, P2pBalance* before = nullptr);
// The rank enters a call (its owner only), or leaves it.
void enterCall(CallLog& log, Inside inside, uint64_t peers);
void leaveCall(CallLog& log);
// What the rank is inside, if it read consistently (it was not entering a call meanwhile).
std::optional<CallActivity> callActivity(const CallLog& log);
// Copies `from` into `to` entry by entry (a network peer's log into its mirror).
void copyCallLog(const CallLog& from, CallLog& to);
// "allreduce(count=10, float32, sum)", as the user called it ("..., sum, ring)" with `algo`).
std::string describeCall(const LoggedCall& call, const char* algo = nullptr);

}  // namespace mncl
