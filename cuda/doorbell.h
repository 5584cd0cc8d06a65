// A doorbell: where a CPU thread waiting on a connection sleeps, so that the peer posting
// what it waits for wakes it at once. Spinning and yielding suit a peer that runs on a core
// of its own; where a busy process shares the core, a waiting thread that yields hands it a
// whole time slice, and one that sleeps on a timer wakes up late (see cpu/spin.cc). One that sleeps on a doorbell
// (a futex, in the memory both ends map) wakes when the step comes, and, having slept, gets
// the core back ahead of a thread that kept it busy.
//
// Every post on a connection (a tail, a head, an LL step's last line) rings its bell, and
// both ends sleep on the same one: a wake-up for the other end's wait only has the sleeper
// look again. A ring costs a fence and a load while nobody sleeps. On a GPU, nothing.
#pragma once

#include "arch.h"

namespace mncl::dev {

// (A line of its own: a ring's bump must not take the line of the head or tail the peer
// polls away from it.)
struct alignas(128) Doorbell {
  uint32_t rings;     // the futex word: bumped by every ring that finds a sleeper
  uint32_t sleepers;  // threads asleep on it, or about to be
};

#if MNCL_CPU_DOORBELLS
void cpuWake(Doorbell* bell);  // (cuda/cpu/spin.cc)
#endif

// After a post that a peer may be waiting for (the post's own store comes first).
MNCL_DEV void ring(Doorbell& bell) {
#if MNCL_CPU_DOORBELLS
  // (Orders the post before the look at `sleepers`; a sleeper counts itself before it looks
  // at what it waits for: one of the two sees the other.)
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (std::atomic_ref<uint32_t>(bell.sleepers).load(std::memory_order_relaxed) != 0) cpuWake(&bell);
#else
  (void)bell;
#endif
}

}  // namespace mncl::dev
