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

int usableDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

int currentDevice() {
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return d;
}

int deviceOfPointer(const void* p) {
  if (p == nullptr || usableDeviceCount() == 0) return -1;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
}

#else

int usableDeviceCount() { return 0; }
int currentDevice() { return 0; }
int deviceOfPointer(const void*) { return -1; }

#endif

}  // namespace mncl::gpu
