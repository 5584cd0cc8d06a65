// How a CPU channel waits. Spinning is cheapest while the peer is running on another core;
// yielding lets the peer run when ranks outnumber cores (8 ranks on 2 cores must progress);
// sleeping keeps a long wait (a peer still computing) from burning a core.
#include <sched.h>
#include <time.h>

#include "../arch.h"

namespace mncl::dev {

thread_local LongWaitHook tlsLongWaitHook;

// A 50 us sleep takes 50-100 us: the hook runs every 25-50 ms of a long wait.
constexpr uint32_t kSleepsPerHook = 512;

// spinBudget: spins before the first yield (see DevChannel::spinBudget).
void cpuBackoff(uint32_t spins, uint32_t spinBudget) {
  uint32_t kSpin = spinBudget, kYield = kSpin + 20000;
  if (spins < kSpin) {
    // No PAUSE here: inside a VM, a run of PAUSEs trips the hypervisor's pause-loop exiting,
    // which takes the vCPU away for ~100 us, far longer than the wait itself.
    asm volatile("" ::: "memory");
  } else if (spins < kYield) {
    sched_yield();
  } else {
    timespec ts{0, 50 * 1000};  // 50 us: waits this long are waits for a peer's caller
    nanosleep(&ts, nullptr);
    if (tlsLongWaitHook.fn && (spins - kYield) % kSleepsPerHook == 0) tlsLongWaitHook.fn(tlsLongWaitHook.arg);
  }
}

}  // namespace mncl::dev
