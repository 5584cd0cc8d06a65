// A page of /dev/shm that tmpfs cannot give when it is first touched kills the toucher with
// SIGBUS. Connection buffers are not claimed up front (most of them are never touched: see
// warnIfDevShmTooSmall in comm.cc), so a rank whose traffic reaches past what /dev/shm holds
// would die of it, with no word of why. A ShmFaultWatch turns such a fault into its
// communicator's error instead:
//
//   - a SIGBUS handler, installed once per process, looks the faulting address up in the
//     ranges watches registered. A fault in one maps a private zero page over the page that
//     could not be had (so the faulting thread goes on), marks the watch faulted, and sets its
//     communicator's abort word: every wait ends, and the call fails.
//   - the communicator then stores "/dev/shm ran out" as its error (Comm::storeShmFault) and
//     tells its peers, as with any failure.
//
// The private page is never shared: what the rank wrote there, no peer sees, and what it reads
// there are zeros. So nothing that went through it may count as done: the abort word is set
// before the faulting access is retried; a CPU channel looks at it before it posts a Simple
// step (a step's data and its counter lie on different pages: Waiter::abortedBeforePost), so
// neither lost data nor zeros read in its place reach a peer (LL and LL128 lines carry their
// flags with their data: a lost line is never taken); and each call checks it at its end.
// (A network proxy's recv into such a page fails with EFAULT instead: see touchIfWatched.)
//
// Any other SIGBUS (another address, another cause, one sent by kill) goes to the handler that
// was there before, or to the default action (the process dies as it would have).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mncl {

class ShmFaultWatch {
 public:
  ShmFaultWatch() = default;
  ~ShmFaultWatch();  // stops watching its ranges (before they are unmapped)
  ShmFaultWatch(const ShmFaultWatch&) = delete;
  ShmFaultWatch& operator=(const ShmFaultWatch&) = delete;

  // Watches [base, base + bytes), a shared-memory mapping; a fault there sets *abortWord.
  void watch(const void* base, size_t bytes, uint32_t* abortWord);
  // Whether a page of a watched range could not be had.
  bool faulted() const { return faulted_.load(std::memory_order_acquire) != 0; }

  // Called from the signal handler only: async-signal-safe.
  void noteFault();

  // For a system call that failed with EFAULT writing [at, at + bytes) (recv into a FIFO: the
  // kernel's copy does not raise SIGBUS where /dev/shm has no page to give, and it may have
  // failed at any page of the range): reads each page of it that a watch holds, so that one
  // that cannot be had goes through the handler, as a channel's access does; then the call
  // can be made again. Returns whether any page was watched.
  static bool touchIfWatched(const void* at, size_t bytes);

 private:
  std::atomic<uint32_t> faulted_{0};
  std::atomic<uint32_t*> abortWord_{nullptr};
  std::vector<int> slots_;  // its entries in the process's table of watched ranges
};

}  // namespace mncl
