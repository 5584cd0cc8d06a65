#include "call_log.h"

#include <atomic>

#include "../../cuda/conn.h"
#include "../../cuda/dtypes.h"
#include "../tune/tuner.h"

namespace mncl {

namespace {
using Entry = CallLog::Entry;

uint64_t load(const uint64_t& w, std::memory_order order = std::memory_order_relaxed) {
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(w)).load(order);
}
void store(uint64_t& w, uint64_t v, std::memory_order order = std::memory_order_relaxed) {
  std::atomic_ref<uint64_t>(w).store(v, order);
}

Entry& entryOf(CallLog& log, uint64_t seq) { return log.entries[(seq - 1) % kCallLogSize]; }
const Entry& entryOf(const CallLog& log, uint64_t seq) { return log.entries[(seq - 1) % kCallLogSize]; }

struct Words {  // an entry's words after seq
  uint64_t count, what, sends, recvs;
};

void writeEntry(Entry& e, uint64_t seq, const Words& w) {
  store(e.seq, 0);
  std::atomic_thread_fence(std::memory_order_release);  // (readers see 0 before new words)
  store(e.count, w.count);
  store(e.what, w.what);
  store(e.sendsBefore, w.sends);
  store(e.recvsBefore, w.recvs);
  store(e.seq, seq, std::memory_order_release);
}

// Entry `seq`, read whole: false if it holds another call or changed while we read it.
bool readEntry(const Entry& e, uint64_t seq, Words& w) {
  if (load(e.seq, std::memory_order_acquire) != seq) return false;
  w = {load(e.count), load(e.what), load(e.sendsBefore), load(e.recvsBefore)};
  std::atomic_thread_fence(std::memory_order_acquire);
  return load(e.seq) == seq;
}
}  // namespace

void countP2p(CallLog& log, bool isSend, int peer, bool longSend, uint64_t steps) {
  uint64_t& n = isSend ? log.sendsPosted : log.recvsPosted;
  store(n, load(n) + 1);
  if (peer < 0 || peer >= kP2pPeers) return;
  CallLog::PeerWords& w = log.withPeer[peer];
  uint64_t& stepsSoFar = isSend ? w.sendSteps : w.recvSteps;
  store(stepsSoFar, load(stepsSoFar) + steps);
  uint64_t& k = isSend ? w.sends : w.recvs;
  store(k, load(k) + 1);
  if (isSend && longSend) store(w.lastLongSend, load(w.sends));
}

PeerP2p peerP2p(const CallLog& log, int peer) {
  if (peer < 0 || peer >= kP2pPeers) return {};  // (not counted: see kP2pPeers)
  const CallLog::PeerWords& w = log.withPeer[peer];
  return {load(w.sends), load(w.recvs), load(w.lastLongSend), load(w.sendSteps), load(w.recvSteps)};
}

uint64_t sendAwaitingReceives(const PeerP2p& ours, const PeerP2p& theirs, bool sameHost) {
  if (sameHost && ours.sendSteps > theirs.recvSteps + (uint64_t)dev::kSteps) return ours.sends;
  return ours.lastLongSend > theirs.recvs ? ours.lastLongSend : 0;
}

void logCall(CallLog& log, const LoggedCall& c) {
  uint64_t seq = load(log.made) + 1;
  uint64_t what = c.kind | (uint64_t)c.dtype << 8 | (uint64_t)c.op << 16 | (uint64_t)(uint32_t)c.root << 32;
  writeEntry(entryOf(log, seq), seq, {c.count, what, load(log.sendsPosted), load(log.recvsPosted)});
  store(log.made, seq, std::memory_order_release);
}

std::optional<LoggedCall> loggedCall(const CallLog& log, uint64_t seq, P2pBalance* before) {
  Words w{};
  if (seq == 0 || !readEntry(entryOf(log, seq), seq, w)) return std::nullopt;
  if (before) *before = {w.sends, w.recvs};
  return LoggedCall{(uint8_t)w.what, (uint8_t)(w.what >> 8), (uint8_t)(w.what >> 16), (int32_t)(uint32_t)(w.what >> 32),
                    w.count};
}

void enterCall(CallLog& log, Inside inside, uint64_t peers) {
  store(log.inside, (uint64_t)inside);
  store(log.peers, peers);
  store(log.entered, load(log.entered) + 1, std::memory_order_release);
}

void leaveCall(CallLog& log) { store(log.inside, (uint64_t)Inside::nothing, std::memory_order_release); }

std::optional<CallActivity> callActivity(const CallLog& log) {
  CallActivity a;
  a.entered = load(log.entered, std::memory_order_acquire);
  a.inside = (Inside)load(log.inside);
  a.peers = load(log.peers);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (load(log.entered) != a.entered) return std::nullopt;
  return a;
}

void copyCallLog(const CallLog& from, CallLog& to) {
  if (std::optional<CallActivity> a = callActivity(from)) {
    store(to.inside, (uint64_t)a->inside);
    store(to.peers, a->peers);
    store(to.entered, a->entered, std::memory_order_release);
  }
  for (int p = 0; p < kP2pPeers; ++p) {
    PeerP2p c = peerP2p(from, p);
    store(to.withPeer[p].sends, c.sends);
    store(to.withPeer[p].recvs, c.recvs);
    store(to.withPeer[p].lastLongSend, c.lastLongSend);
    store(to.withPeer[p].sendSteps, c.sendSteps);
    store(to.withPeer[p].recvSteps, c.recvSteps);
  }
  uint64_t made = load(from.made, std::memory_order_acquire);
  for (uint64_t seq = made > kCallLogSize ? made - kCallLogSize + 1 : 1; seq <= made; ++seq) {
    Words w{};
    if (readEntry(entryOf(from, seq), seq, w)) writeEntry(entryOf(to, seq), seq, w);
  }
  store(to.made, made, std::memory_order_release);
}

std::string describeCall(const LoggedCall& c, const char* algo) {
  if (c.kind == kBarrierCall) return "barrier()";
  bool rootedExchange = c.kind == kGatherCall || c.kind == kScatterCall;
  std::string name = c.kind == kAlltoallCall ? "alltoall"
                     : c.kind == kGatherCall ? "gather"
                     : c.kind == kScatterCall ? "scatter"
                                             : collName((Coll)c.kind);
  std::string d = name + "(count=" + std::to_string(c.count) + ", " + dataTypeName((DataType)c.dtype);
  bool reduces = c.kind == (uint8_t)Coll::allreduce || c.kind == (uint8_t)Coll::reduce || c.kind == (uint8_t)Coll::reducescatter;
  if (reduces) d += std::string(", ") + redOpName((RedOp)c.op);
  if (c.kind == (uint8_t)Coll::broadcast || c.kind == (uint8_t)Coll::reduce || rootedExchange) {
    d += ", root=" + std::to_string(c.root);
  }
  return d + (algo ? std::string(", ") + algo : "") + ")";
}

}  // namespace mncl
