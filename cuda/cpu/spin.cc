// How a CPU channel waits. Spinning is cheapest while the peer is running on another core;
// yielding lets the peer run when ranks outnumber cores (8 ranks on 2 cores must progress);
// sleeping keeps a long wait (a peer still computing) from burning a core, and a wait on a
// core a busy process shares from handing it a time slice at each yield.
#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "../arch.h"
#include "../doorbell.h"

namespace mncl::dev {

thread_local LongWaitHook tlsLongWaitHook;

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::microseconds;
using std::chrono::milliseconds;

// Yields end after this long (or this many): a wait that outlasts them waits for a peer's
// caller (its computation, its late start), and every yield after that is CPU taken from the
// threads doing that work, sometimes this process's own (PyTorch's).
constexpr auto kYieldFor = milliseconds(2);
constexpr uint32_t kMaxYields = 20000;
// Then sleeps, each 1/64 of the wait so far (at least 50 us, at most 1 ms): a long wait costs
// next to no CPU (50 us sleeps took 14% of a core), and ends at most ~2% late.
constexpr Clock::duration kMinSleep = microseconds(50), kMaxSleep = milliseconds(1);
// A yield that took this long gave the core to a thread that wanted it for a while: a busy
// process beside the rank (a data loader, another job). Every yield then hands it a whole
// time slice (2-8 ms here, where the peer's step takes microseconds), and the time this
// thread spends spinning and yielding counts against it when the scheduler picks who runs.
// So, once that happened a few times, the thread sleeps for a while instead of yielding: on
// the connection's doorbell where the wait has one (doorbell.h), woken by the post; else in
// short sleeps. A thread that slept gets the core back at once when it wakes. (Ranks that
// outnumber the cores yield to each other in turn, briefly, and stay with yields: they run
// those faster.)
constexpr auto kLongYield = milliseconds(1);
// Three within the window: a single long yield now and then is a VM's hiccup, not a busy
// neighbour. Then the thread sleeps instead of yielding, for a second.
constexpr int kLongYieldsForSharedCore = 3;
constexpr auto kLongYieldWindow = milliseconds(1000);
constexpr auto kSleepInsteadOfYieldFor = milliseconds(1000);
constexpr Clock::duration kSharedCoreSleep = microseconds(5);
// The hook runs about this often in a long wait (Ctrl-C within a tenth of a second).
constexpr auto kHookEvery = milliseconds(50);

// MININCL_BUSY_CORES (cpuSetSleepOnBusyCores): which long yields count. Not those that went to
// the ranks' own work by default: a DDP step, whose all_reduce waits beside the rank's own
// computing thread, took 1.2x as long when they did (the yields there hand the core to work
// that has to be done anyway, and a thread woken from its sleep waits for the computing one's
// time slice). othersWantCpu tells them apart (src/core/busy_cores.cc).
std::atomic<SleepOnBusyCores> sleepOnBusyCores{SleepOnBusyCores::never};
std::atomic<bool (*)(int)> othersWantCpuCheck{nullptr};
std::atomic<uint64_t> sleepSpells{0};  // times a thread began to sleep instead of yielding
std::atomic<uint64_t> bellSleeps{0}, bellWakes{0};  // sleeps on a doorbell; those a ring ended

// This thread's current wait: when it started yielding, and when its hook last ran.
thread_local Clock::time_point tlsYieldsFrom, tlsHookRan;
// Until then this thread sleeps where it would yield (see kLongYield); the long yields seen
// since tlsLongYieldsFrom.
thread_local Clock::time_point tlsSharedCoreUntil, tlsLongYieldsFrom;
thread_local int tlsLongYields = 0;

void noteLongYield(Clock::time_point now) {
  SleepOnBusyCores when = sleepOnBusyCores.load(std::memory_order_relaxed);
  if (when == SleepOnBusyCores::never) return;
  if (when == SleepOnBusyCores::whereOthersRun) {
    bool (*othersWant)(int) = othersWantCpuCheck.load(std::memory_order_relaxed);
    if (!othersWant || !othersWant(sched_getcpu())) return;
  }
  if (now - tlsLongYieldsFrom > kLongYieldWindow) {
    tlsLongYieldsFrom = now;
    tlsLongYields = 0;
  }
  if (++tlsLongYields < kLongYieldsForSharedCore) return;
  if (now >= tlsSharedCoreUntil) sleepSpells.fetch_add(1, std::memory_order_relaxed);
  tlsSharedCoreUntil = now + kSleepInsteadOfYieldFor;
}

void sleepFor(Clock::duration d) {
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  timespec ts{(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
  nanosleep(&ts, nullptr);
}

}  // namespace

int64_t cpuBackoffStep(uint32_t spins, uint32_t spinBudget) {
  if (spins < spinBudget) {
    // No PAUSE here: inside a VM, a run of PAUSEs trips the hypervisor's pause-loop exiting,
    // which takes the vCPU away for ~100 us, far longer than the wait itself.
    asm volatile("" ::: "memory");
    return 0;
  }
  Clock::time_point now = Clock::now();  // (vDSO: tens of ns, next to a yield's microsecond)
  if (spins == spinBudget) tlsYieldsFrom = tlsHookRan = now;
  Clock::duration waited = now - tlsYieldsFrom;
  bool sharedCore = now < tlsSharedCoreUntil;  // (never set where sleepOnBusyCores is never)
  if (!sharedCore && waited < kYieldFor && spins - spinBudget < kMaxYields) {
    sched_yield();
    // (The yield alone: between two steps the caller may move network steps for a while.)
    Clock::time_point after = Clock::now();
    if (after - now > kLongYield) noteLongYield(after);
    return 0;
  }
  Clock::duration sleep = std::clamp<Clock::duration>(waited / 64, sharedCore ? kSharedCoreSleep : kMinSleep, kMaxSleep);
  return std::chrono::duration_cast<std::chrono::nanoseconds>(sleep).count();
}

void cpuSetSleepOnBusyCores(SleepOnBusyCores when, bool (*othersWantCpu)(int cpu)) {
  othersWantCpuCheck.store(othersWantCpu, std::memory_order_relaxed);
  sleepOnBusyCores.store(when, std::memory_order_relaxed);
}

uint64_t cpuSleepSpells() { return sleepSpells.load(std::memory_order_relaxed); }

CpuDoorbellSleeps cpuDoorbellSleeps() {
  return {bellSleeps.load(std::memory_order_relaxed), bellWakes.load(std::memory_order_relaxed)};
}

void cpuSlept() {
  Clock::time_point now = Clock::now();
  if (tlsLongWaitHook.fn && now - tlsHookRan >= kHookEvery) {
    tlsHookRan = now;
    tlsLongWaitHook.fn(tlsLongWaitHook.arg);
  }
}

// spinBudget: spins before the first yield (see DevChannel::spinBudget). `spins` counts from
// 0 in each wait, so spins == spinBudget marks the start of its yields.
void cpuBackoff(uint32_t spins, uint32_t spinBudget) {
  int64_t ns = cpuBackoffStep(spins, spinBudget);
  if (ns == 0) return;
  cpuSleep(ns);
  cpuSlept();
}

void cpuSleep(int64_t ns) { sleepFor(std::chrono::nanoseconds(ns)); }

void cpuSleepOn(Doorbell& bell, int64_t ns, bool (*ready)(void*), void* readyArg) {
  // A ring wakes it: no need for the short sleeps of a core shared (kSharedCoreSleep).
  ns = std::max<int64_t>(ns, std::chrono::duration_cast<std::chrono::nanoseconds>(kMinSleep).count());
  std::atomic_ref<uint32_t> sleepers(bell.sleepers), rings(bell.rings);
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // (pairs with ring's: before ready()'s loads)
  uint32_t seen = rings.load(std::memory_order_seq_cst);
  if (!ready(readyArg)) {
    timespec ts{(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    // (Not FUTEX_PRIVATE: the bell may lie in memory another process maps. A ring between
    // the look at `rings` and the sleep changed it: the wait returns at once.)
    long r = syscall(SYS_futex, &bell.rings, FUTEX_WAIT, seen, &ts, nullptr, 0);
    bellSleeps.fetch_add(1, std::memory_order_relaxed);
    if (r == 0 || errno == EAGAIN) bellWakes.fetch_add(1, std::memory_order_relaxed);
  }
  sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

void cpuWake(Doorbell* bell) {
  std::atomic_ref<uint32_t>(bell->rings).fetch_add(1, std::memory_order_seq_cst);
  syscall(SYS_futex, &bell->rings, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

}  // namespace mncl::dev
