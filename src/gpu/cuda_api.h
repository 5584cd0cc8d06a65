// What the host runtime uses of CUDA. The runtime is linked statically (no libcuda at link
// time); without a driver every call fails and the process simply has no usable GPU.
#pragma once

#include <string>

namespace mncl::gpu {

// CUDA devices this process can use: 0 when the build has no CUDA, or there is no driver
// (cudaGetDeviceCount's error 35) or no device.
int usableDeviceCount();
// The CUDA device current on this thread (0 when none is usable).
int currentDevice();
// The device that owns the memory at p; -1 for host memory or when CUDA is unusable.
int deviceOfPointer(const void* p);
// Prepares a thread of minincl's that watches a GPU's launches (the monitor) beside the
// application's threads: it works on `device`, so that its first CUDA call makes no context
// on GPU 0, and it is relaxed about stream captures. In CUDA's default (global) capture mode,
// a thread's event query while another thread captures is refused, and that capture then
// ends in an error (PyTorch's torch.cuda.graph captures so). Nothing without CUDA.
void becomeWatcherThread(int device);

}  // namespace mncl::gpu

#if defined(MININCL_HAVE_CUDA)
#include <cuda_runtime.h>

namespace mncl::gpu {
// Throws mnclUnhandledCudaError naming `what` and CUDA's own words for `e`.
void check(cudaError_t e, const char* what);

// For its scope, this thread's stream capture mode is relaxed (see becomeWatcherThread): an
// event query made on the caller's thread, after a launch, must not end another thread's
// capture in global mode.
// (A failed exchange leaves the mode as it was, and no error behind for the next call.)
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() : swapped_(exchange()) {}
  ~RelaxedCaptureMode() {
    if (swapped_) exchange();
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  bool exchange() {
    if (cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess) return true;
    cudaGetLastError();
    return false;
  }
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;  // (then the thread's own, to restore)
  bool swapped_;
};
}  // namespace mncl::gpu

#define MNCL_CUDA_CHECK(call) ::mncl::gpu::check((call), #call)
#endif
