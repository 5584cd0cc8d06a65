// A CUDA block emulated on CPU threads, for the checkers that run the device code's GPU lane
// logic on any machine (MNCL_SIMT_EMULATION in cuda/arch.h): the block- and warp-wide syncs,
// votes and shared memory the device code asks for, ranks of one process whose connections
// live in plain memory, and a runner that starts a block of threads per rank and channel.
// Include it from exactly one translation unit (it defines the emulation's functions).
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "channel.h"

namespace mncl::dev {

// ---- the emulated block: threads, a barrier for the block and one per warp, vote slots ----

struct Block {
  explicit Block(int n) : size(n), all(n), blockVotes(n), warpVotes(n), blockSyncs(n), running(n) {
    for (int w = 0; w < n / 32; ++w) warps.push_back(std::make_unique<std::barrier<>>(32));
  }
  int size;
  std::barrier<> all;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<char> blockVotes, warpVotes;
  // For the report of a checker that gives up (Watch below): each thread's block-wide syncs
  // so far (threads at different counts: a barrier some of them skipped), and how many
  // threads have not yet returned.
  std::vector<std::atomic<uint64_t>> blockSyncs;
  std::atomic<int> running;
  std::mutex sharedLock;  // (only while a variable is first made)
  std::map<const void*, std::unique_ptr<uint64_t[]>> shared;
};

thread_local int gThread = 0;
thread_local Block* gBlock = nullptr;

namespace simt {
int threadIndex() { return gThread; }
int blockThreads() { return gBlock->size; }
void blockSync() {
  gBlock->blockSyncs[gThread].fetch_add(1, std::memory_order_relaxed);
  gBlock->all.arrive_and_wait();
}
bool blockAny(bool p) {
  gBlock->blockVotes[gThread] = p;
  blockSync();
  bool any = false;
  for (char v : gBlock->blockVotes) any |= v != 0;
  blockSync();  // nobody votes again before everyone has counted
  return any;
}
void warpSync() { gBlock->warps[gThread / 32]->arrive_and_wait(); }
static bool warpVote(bool p, bool all) {
  gBlock->warpVotes[gThread] = p;
  warpSync();
  int first = gThread / 32 * 32;
  bool r = all;
  for (int i = first; i < first + 32; ++i) r = all ? (r && gBlock->warpVotes[i]) : (r || gBlock->warpVotes[i]);
  warpSync();
  return r;
}
bool warpAll(bool p) { return warpVote(p, true); }
bool warpAny(bool p) { return warpVote(p, false); }
void* blockStorage(const void* key, size_t bytes) {
  std::lock_guard<std::mutex> hold(gBlock->sharedLock);
  auto& words = gBlock->shared[key];
  if (!words) words = std::make_unique<uint64_t[]>((bytes + 7) / 8);  // (zeroed)
  return words.get();
}
}  // namespace simt

void cpuBackoff(uint32_t, uint32_t) { std::this_thread::yield(); }  // hundreds of threads on a few cores
// Every peer is in this process: no kernel copies.
int readPeerMemory(int, void*, const void*, size_t) { return -1; }
int writePeerMemory(int, void*, const void*, size_t) { return -1; }

// ---- ranks in one process, one channel each, every connection's FIFOs in plain memory ----

// `directAccess`: as GPU ranks of one process on one GPU are set up (Comm::enableGpuPointerSteps):
// big Simple steps may be pointer steps and direct writes. Otherwise every step goes through
// the FIFOs, as between GPU processes (CUDA IPC maps the FIFOs only).
struct Ranks {
  struct alignas(64) Line64 {
    char bytes[64];
  };

  Ranks(int n, ProtoSizes sizes, bool directAccess = false) : n(n) {
    ctrls.resize(n * n);
    simple.resize(n * n);
    ll.resize(n * n);
    ll128.resize(n * n);
    fifos.assign(n * n, ConnFifo{});
    for (int s = 0; s < n; ++s) {
      for (int r = 0; r < n; ++r) {
        if (s == r) continue;
        int c = s * n + r;  // s sends to r
        ctrls[c] = std::make_unique<ConnCtrl>();
        ctrls[c]->readsSenderMemory = directAccess ? 1u : 0u;
        simple[c] = std::make_unique<Line64[]>((size_t)kSteps * sizes.simpleSlotBytes / 64);
        ll[c] = std::make_unique<LLLine[]>((size_t)kSteps * sizes.llSlotLines);
        ll128[c] = std::make_unique<LL128Line[]>((size_t)kSteps * sizes.ll128SlotLines);
        fifos[c].ctrl = ctrls[c].get();
        fifos[c].simple = simple[c][0].bytes;
        fifos[c].ll = ll[c].get();
        fifos[c].ll128 = ll128[c].get();
      }
    }
    // Each rank's arrays in one block, as the GPU's device memory holds them (ChannelArrays).
    const ChannelArrays layout(n);
    channels.resize(n);
    for (int me = 0; me < n; ++me) {
      arrays.push_back(std::make_unique<uint64_t[]>(layout.bytes / 8));  // (zeroed: the step counters)
      char* base = reinterpret_cast<char*>(arrays.back().get());
      DevChannel& ch = channels[me];
      layout.point(ch, base);
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        ch.sendTo[p] = fifos[me * n + p];
        ch.sendTo[p].directWrites = directAccess;
        ch.recvFrom[p] = fifos[p * n + me];
      }
      int* ring = reinterpret_cast<int*>(base + layout.ring);
      for (int r = 0; r < n; ++r) ring[r] = r;
      ch.rank = me;
      ch.nranks = n;
      ch.ringPos = me;
      ch.sizes = sizes;
      ch.abortFlag = &abortFlag;
      ch.systemScope = false;
      ch.spinBudget = 0;
      if (directAccess) ch.pointerStepMinBytes = ch.mappedPointerStepMinBytes = 0;  // (a GPU's default)
    }
  }
  int n;
  uint32_t abortFlag = 0;
  std::vector<std::unique_ptr<ConnCtrl>> ctrls;
  std::vector<std::unique_ptr<Line64[]>> simple;
  std::vector<std::unique_ptr<LLLine[]>> ll;
  std::vector<std::unique_ptr<LL128Line[]>> ll128;
  std::vector<ConnFifo> fifos;
  std::vector<std::unique_ptr<uint64_t[]>> arrays;  // per rank: its ChannelArrays
  std::vector<DevChannel> channels;
};

// ---- what a checker says when it gives up: slow, or hung, and where ----

// The case running and its blocks, for the report a checker prints when it gives up
// (failAfter) or when nothing has moved for a while: counters still moving mean a slow
// machine; a block's threads at different barrier counts, or every block waiting on
// connections whose counters stand still, mean a hang, and say where.
struct Watch {
  std::mutex lock;
  std::string what = "setting up";
  int cases = 0;
  std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
  std::vector<Ranks*> channels;  // the case's ranks, a Ranks per channel (runBlocks)
  std::vector<Block*> blocks;    // channel c of rank r: blocks[c * n + r]
};
inline Watch gWatch;

// Checkers name each case before they run it.
inline void watchCase(std::string what) {
  std::lock_guard<std::mutex> hold(gWatch.lock);
  gWatch.what = std::move(what);
  gWatch.since = std::chrono::steady_clock::now();
  ++gWatch.cases;
}

inline void printWatch(const std::string& why) {
  std::lock_guard<std::mutex> hold(gWatch.lock);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - gWatch.since).count();
  std::printf("%s: case %d (%s), running for %.1f s\n", why.c_str(), gWatch.cases, gWatch.what.c_str(), secs);
  int n = gWatch.channels.empty() ? 0 : gWatch.channels[0]->n;
  for (size_t b = 0; b < gWatch.blocks.size(); ++b) {
    Block& block = *gWatch.blocks[b];
    int left = block.running.load();
    if (left == 0) continue;
    uint64_t least = UINT64_MAX, most = 0;
    for (auto& c : block.blockSyncs) least = std::min(least, c.load()), most = std::max(most, c.load());
    std::printf("  rank %d channel %zu: %d of %d threads running; block syncs %llu to %llu; behind:", (int)(b % n),
                b / n, left, block.size, (unsigned long long)least, (unsigned long long)most);
    for (int t = 0, shown = 0; t < block.size && shown < 8; ++t) {
      if (block.blockSyncs[t].load() == least && least != most) std::printf(" %d", t), ++shown;
    }
    std::printf("\n");
  }
  for (size_t c = 0; c < gWatch.channels.size(); ++c) {
    std::printf("  channel %zu connections (sender->receiver tail/head):", c);
    for (int s = 0; s < n; ++s) {
      for (int r = 0; r < n; ++r) {
        if (s == r) continue;
        ConnCtrl* ctrl = gWatch.channels[c]->ctrls[s * n + r].get();
        std::printf(" %d->%d %llu/%llu", s, r, (unsigned long long)loadRelaxed(&ctrl->tail),
                    (unsigned long long)loadRelaxed(&ctrl->head));
      }
    }
    std::printf("\n");
  }
  std::fflush(stdout);
}

// What moves while a case makes progress: connection counters, barriers passed, threads done
// (not warp votes: a lane-wide wait votes on every spin).
inline uint64_t progressMark() {
  std::lock_guard<std::mutex> hold(gWatch.lock);
  uint64_t mark = 0;
  for (Block* block : gWatch.blocks) {
    mark += (uint64_t)block->running.load();
    for (auto& c : block->blockSyncs) mark += c.load();
  }
  for (Ranks* ranks : gWatch.channels) {
    for (auto& ctrl : ranks->ctrls) {
      if (ctrl) mark += loadRelaxed(&ctrl->tail) + loadRelaxed(&ctrl->head);
    }
  }
  return mark;
}

// How long a case's blocks and connections may stand still before runBlocks calls it a hang.
constexpr int kStallSeconds = 60;

// Runs body(rank, channel) on a block of `threads` threads for each channel of ranks
// [0, present) (default: all), every block at once; channels[c] holds channel c of every
// rank. Plays the host monitor's part too (src/core/monitor.cc): a channel's error record
// (a peer running another call) sets the abort word, which stops the blocks still waiting.
// Returns false if any block's body returned false. errors[c * n + r]: channel c of rank r.
inline bool runBlocks(std::vector<Ranks*> channels, int threads, const std::function<bool(int, int)>& body,
                      std::vector<DevError>& errors, int present = -1) {
  int n = channels[0]->n, nch = (int)channels.size();
  if (present < 0) present = n;
  errors.assign((size_t)n * nch, DevError{});
  std::vector<std::unique_ptr<Block>> blocks;
  for (int b = 0; b < n * nch; ++b) blocks.push_back(std::make_unique<Block>(threads));
  {
    std::lock_guard<std::mutex> hold(gWatch.lock);
    gWatch.channels = channels;
    gWatch.blocks.clear();
    for (int c = 0; c < nch; ++c) {
      for (int r = 0; r < n; ++r) {
        if (r < present) gWatch.blocks.push_back(blocks[c * n + r].get());
        else blocks[c * n + r]->running = 0;  // (never started)
      }
    }
  }
  std::atomic<bool> done{false};
  std::thread monitor([&] {
    auto movedAt = std::chrono::steady_clock::now();
    uint64_t lastMark = 0;
    for (int tick = 0; !done.load(); ++tick) {
      bool failed = false;  // (a communicator's channels share its abort word)
      for (DevError& e : errors) failed |= loadRelaxed(&e.peer) >= 0;
      for (Ranks* ch : channels) {
        if (failed) storeRelease(&ch->abortFlag, 1u);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (tick % 1000 != 0) continue;
      // Once a second: has anything moved? A minute standing still is a hang, however slow
      // the machine (a loaded one slows these hundreds of threads far more than itself).
      auto now = std::chrono::steady_clock::now();
      if (uint64_t mark = progressMark(); mark != lastMark) lastMark = mark, movedAt = now;
      if (now - movedAt > std::chrono::seconds(kStallSeconds)) {
        printWatch("FAIL: nothing moved for " + std::to_string(kStallSeconds) + " s (a hang)");
        std::_Exit(3);
      }
    }
  });
  std::vector<char> ok((size_t)n * nch, 1);
  std::vector<std::thread> pool;
  for (int c = 0; c < nch; ++c) {
    for (int r = 0; r < present; ++r) {
      for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, c, r, t] {
          gThread = t;
          gBlock = blocks[c * n + r].get();
          bool fine = body(r, c);
          if (barrierAny(!fine) && t == 0) ok[c * n + r] = 0;
          gBlock->running.fetch_sub(1);
        });
      }
    }
  }
  for (std::thread& th : pool) th.join();
  done = true;
  monitor.join();
  {
    std::lock_guard<std::mutex> hold(gWatch.lock);
    gWatch.blocks.clear();  // (freed below)
    gWatch.channels.clear();
  }
  for (char o : ok) {
    if (!o) return false;
  }
  return true;
}

// A hang is a failure too: the checker ends itself after `seconds`, saying where it stood.
// (A backstop: runBlocks ends a case that stands still for kStallSeconds much sooner.)
inline void failAfter(int seconds) {
  std::thread([seconds] {
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    printWatch("FAIL: still running after " + std::to_string(seconds) + " s");
    std::_Exit(3);
  }).detach();
}

}  // namespace mncl::dev
