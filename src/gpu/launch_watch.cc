#include "launch_watch.h"

#if defined(MININCL_HAVE_CUDA)

#include <chrono>

#include "cuda_api.h"

namespace mncl::gpu {

LaunchWatch::~LaunchWatch() {
  for (Entry& e : unfinished_) cudaEventDestroy(e.done);
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
}

void LaunchWatch::record(cudaStream_t stream, uint64_t call, bool p2p) {
  double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  std::lock_guard<std::mutex> lock(mutex_);
  dropFinished();
  if (unfinished_.size() >= kMostWatched) return;
  cudaEvent_t done = nullptr;
  if (spare_.empty()) {
    MNCL_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  } else {
    done = spare_.back();
    spare_.pop_back();
  }
  cudaError_t e = cudaEventRecord(done, stream);
  if (e != cudaSuccess) {
    spare_.push_back(done);
    MNCL_CUDA_CHECK(e);
  }
  unfinished_.push_back({done, {call, p2p, now}});
}

std::optional<LaunchWatch::Launched> LaunchWatch::oldestUnfinished() {
  std::lock_guard<std::mutex> lock(mutex_);
  dropFinished();
  if (unfinished_.empty()) return std::nullopt;
  return unfinished_.front().launched;
}

void LaunchWatch::dropFinished() {
  RelaxedCaptureMode relaxed;  // (record runs on the caller's thread, which another may capture beside)
  while (!unfinished_.empty()) {
    cudaError_t e = cudaEventQuery(unfinished_.front().done);
    if (e == cudaErrorNotReady) return;
    // (Any other error: the launch will never say more; the communicator's own checks report it.)
    if (e != cudaSuccess) cudaGetLastError();
    spare_.push_back(unfinished_.front().done);
    unfinished_.pop_front();
  }
}

}  // namespace mncl::gpu

#endif
