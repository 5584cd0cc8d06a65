#include "device.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include "minincl.h"

#ifdef MININCL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace perf {
namespace {

// Page-aligned host memory, touched once so first-touch page faults stay out of the timings.
class HostDevice final : public Device {
 public:
  const char* name() const override { return "cpu"; }
  int mnclDevice() const override { return MNCL_DEVICE_CPU; }
  void* alloc(size_t bytes) override {
    size_t rounded = (bytes + 4095) & ~size_t{4095};
    void* p = std::aligned_alloc(4096, rounded);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, rounded);
    return p;
  }
  void release(void* p) override { std::free(p); }
  void copyFromHost(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copyToHost(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void* stream() override { return nullptr; }
  void synchronize() override {}
};

#ifdef MININCL_HAVE_CUDA

[[noreturn]] void cudaFailed(const char* call, cudaError_t err, int device) {
  throw std::runtime_error(std::string(call) + " on GPU " + std::to_string(device) + " failed: " +
                           cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

#define PERF_CUDA(call)                              \
  do {                                               \
    cudaError_t perf_err_ = (call);                  \
    if (perf_err_ != cudaSuccess) cudaFailed(#call, perf_err_, device_); \
  } while (0)

// One rank's GPU: rank % (GPUs seen), so ranks spread over the GPUs and several share one
// when there are more ranks than GPUs (minincl allows that; each rank runs its own blocks).
// Every rank gets its own non-blocking stream: the legacy default stream would serialise the
// ranks' kernels, and a kernel that spins waiting for a peer's would never let it run.
// Copies are ordered on that stream and waited for, so they can never race a collective
// (a plain cudaMemcpy runs on the legacy stream, which a non-blocking stream ignores, and
// returns before a pageable host-to-device copy has landed).
class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int rank) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
      std::string why = err != cudaSuccess ? std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")"
                                           : std::string("no CUDA device");
      throw std::runtime_error("-D cuda: cudaGetDeviceCount found no usable GPU: " + why);
    }
    device_ = rank % count;
    PERF_CUDA(cudaSetDevice(device_));
    PERF_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~CudaDevice() override {
    if (stream_) {
      cudaSetDevice(device_);
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  const char* name() const override { return "cuda"; }
  int mnclDevice() const override { return device_; }
  void* alloc(size_t bytes) override {
    select();
    void* p = nullptr;
    PERF_CUDA(cudaMalloc(&p, bytes));
    // Zeroed like the host allocator, so an unwritten output reads the same on both.
    PERF_CUDA(cudaMemsetAsync(p, 0, bytes, stream_));
    PERF_CUDA(cudaStreamSynchronize(stream_));
    return p;
  }
  void release(void* p) override {
    // Called from destructors: report nothing, throw nothing.
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    cudaFree(p);
  }
  void copyFromHost(void* dst, const void* src, size_t bytes) override {
    select();
    PERF_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    PERF_CUDA(cudaStreamSynchronize(stream_));
  }
  void copyToHost(void* dst, const void* src, size_t bytes) override {
    select();
    PERF_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    PERF_CUDA(cudaStreamSynchronize(stream_));
  }
  void* stream() override { return static_cast<void*>(stream_); }
  void synchronize() override { PERF_CUDA(cudaStreamSynchronize(stream_)); }

 private:
  // The calling thread's current device: a rank thread may not be the one that built us.
  void select() { PERF_CUDA(cudaSetDevice(device_)); }

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
};

#undef PERF_CUDA

#endif  // MININCL_HAVE_CUDA

}  // namespace

Buffer::Buffer(Device& dev, size_t bytes, mnclComm_t windowOf) : dev_(&dev), bytes_(bytes), fromWindow_(windowOf) {
  if (bytes == 0) return;
  if (!fromWindow_) {
    ptr_ = dev.alloc(bytes);
    return;
  }
  mnclResult_t rc = mnclCommMemAlloc(windowOf, &ptr_, bytes);
  if (rc != mnclSuccess) {
    throw std::runtime_error(std::string("mnclCommMemAlloc of ") + std::to_string(bytes) + " B: " +
                             mnclGetErrorString(rc) + " (" + mnclGetLastError(windowOf) + ")");
  }
}

Buffer::~Buffer() {
  if (!ptr_) return;
  if (fromWindow_) mnclMemFree(ptr_);
  else dev_->release(ptr_);
}

std::unique_ptr<Device> makeDevice(const std::string& kind, int rank) {
  if (kind == "cpu") return std::make_unique<HostDevice>();
  if (kind == "cuda") {
#ifdef MININCL_HAVE_CUDA
    return std::make_unique<CudaDevice>(rank);
#else
    (void)rank;
    throw std::runtime_error(
        "-D cuda: this minincl-perf was built without CUDA (nvcc was not found or -DMININCL_CUDA=OFF); "
        "rebuild with nvcc on the PATH and -DMININCL_CUDA=ON");
#endif
  }
  throw std::runtime_error("-D " + kind + ": expected cpu or cuda");
}

}  // namespace perf
