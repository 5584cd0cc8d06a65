// The launches of a GPU communicator that have not finished, each with when it was enqueued:
// what the call timeout (Comm::callTimeout) looks at on a GPU. A GPU call returns as soon as
// its kernel is queued, so a peer that never makes the call shows only as a kernel that never
// ends; NCCL's watchdog (torch's process-group timeout) watches an event per operation the
// same way. A communicator's launches run one after the other (GpuComm::orderAfterPrevious),
// so the oldest unfinished one is the one that waits.
#pragma once

#if defined(MININCL_HAVE_CUDA)

#include <cuda_runtime.h>

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

namespace mncl::gpu {

class LaunchWatch {
 public:
  // What a watched launch ran: collective call `call` of its communicator (its number in
  // the call log), or sends and receives (`call`: the collective calls made before them).
  struct Launched {
    uint64_t call = 0;
    bool p2p = false;
    double enqueuedAt = 0;  // seconds on std::chrono::steady_clock (the monitor's clock)
  };

  LaunchWatch() = default;
  ~LaunchWatch();
  LaunchWatch(const LaunchWatch&) = delete;
  LaunchWatch& operator=(const LaunchWatch&) = delete;

  // After a launch on `stream` (on the stream's device, outside any capture): records an
  // event behind it, enqueued now. At most kMostWatched wait at once; a launch beyond them
  // goes unwatched, which hides nothing: it runs after them, so while it waits they do.
  void record(cudaStream_t stream, uint64_t call, bool p2p);
  // The oldest watched launch that has not finished, after forgetting those that did.
  std::optional<Launched> oldestUnfinished();

  static constexpr size_t kMostWatched = 256;

 private:
  void dropFinished();  // (mutex_ held)

  struct Entry {
    cudaEvent_t done;
    Launched launched;
  };
  std::mutex mutex_;  // the caller's thread records, the monitor's thread looks
  std::deque<Entry> unfinished_;
  std::vector<cudaEvent_t> spare_;  // events of finished launches, for the next ones
};

}  // namespace mncl::gpu

#endif
