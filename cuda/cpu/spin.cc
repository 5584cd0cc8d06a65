// How a CPU channel waits. Spinning is cheapest while the peer is running on another core;
// yielding lets the peer run when ranks outnumber cores (8 ranks on 2 cores must progress);
// sleeping keeps a long wait (a peer still computing) from burning a core.
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>

#include "../arch.h"

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
// The hook runs about this often in a long wait (Ctrl-C within a tenth of a second).
constexpr auto kHookEvery = milliseconds(50);

// This thread's current wait: when it started yielding, and when its hook last ran.
thread_local Clock::time_point tlsYieldsFrom, tlsHookRan;

void sleepFor(Clock::duration d) {
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  timespec ts{(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
  nanosleep(&ts, nullptr);
}

}  // namespace

// spinBudget: spins before the first yield (see DevChannel::spinBudget). `spins` counts from
// 0 in each wait, so spins == spinBudget marks the start of its yields.
void cpuBackoff(uint32_t spins, uint32_t spinBudget) {
  if (spins < spinBudget) {
    // No PAUSE here: inside a VM, a run of PAUSEs trips the hypervisor's pause-loop exiting,
    // which takes the vCPU away for ~100 us, far longer than the wait itself.
    asm volatile("" ::: "memory");
    return;
  }
  Clock::time_point now = Clock::now();  // (vDSO: tens of ns, next to a yield's microsecond)
  if (spins == spinBudget) tlsYieldsFrom = tlsHookRan = now;
  Clock::duration waited = now - tlsYieldsFrom;
  if (waited < kYieldFor && spins - spinBudget < kMaxYields) {
    sched_yield();
    return;
  }
  sleepFor(std::clamp<Clock::duration>(waited / 64, kMinSleep, kMaxSleep));
  if (tlsLongWaitHook.fn && now - tlsHookRan >= kHookEvery) {
    tlsHookRan = now;
    tlsLongWaitHook.fn(tlsLongWaitHook.arg);
  }
}

}  // namespace mncl::dev
