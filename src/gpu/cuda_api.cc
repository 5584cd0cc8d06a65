#include "cuda_api.h"

#include "../core/error.h"

namespace mncl::gpu {

#if defined(MININCL_HAVE_CUDA)

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear it: a failed call must not poison the next one
  throwError(mnclUnhandledCudaError, std::string(what) + " failed: " + cudaGetErrorName(e) + " (" +
                                         cudaGetErrorString(e) + ")");
}

namespace {
// A query whose failure only means "no answer": clears the error so the next call is unaffected.
bool answered(cudaError_t e) {
  if (e == cudaSuccess) return true;
  cudaGetLastError();
  return false;
}
}  // namespace

int usableDeviceCount() {
  int n = 0;
  return answered(cudaGetDeviceCount(&n)) ? n : 0;
}

int currentDevice() {
  int d = 0;
  return answered(cudaGetDevice(&d)) ? d : 0;
}

int deviceOfPointer(const void* p) {
  if (p == nullptr || usableDeviceCount() == 0) return -1;
  cudaPointerAttributes a{};
  if (!answered(cudaPointerGetAttributes(&a, p))) return -1;
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
}

void becomeWatcherThread(int device) {
  answered(cudaSetDevice(device));
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  answered(cudaThreadExchangeStreamCaptureMode(&mode));
}

#else

void becomeWatcherThread(int) {}
int usableDeviceCount() { return 0; }
int currentDevice() { return 0; }
int deviceOfPointer(const void*) { return -1; }

#endif

}  // namespace mncl::gpu
