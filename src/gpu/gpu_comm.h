// The device side of a GPU communicator: its connection FIFOs in device memory (peers in
// this process reach them by address, peers in other processes through CUDA IPC), the
// channels as the kernels see them, where kernels leave error records, and the stream and
// events a launch uses to run beside the caller's stream.
#pragma once

#if defined(MININCL_HAVE_CUDA)

#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <vector>

#include "../../cuda/channel.h"
#include "../transport/region.h"
#include "cuda_api.h"
#include "launch_watch.h"

namespace mncl {

struct Channel;

namespace gpu {

// One rank's receiving ends, in device memory; base() is a device address.
class DeviceRegion : public Mapping {
 public:
  // Zero-filled through `stream`: the legacy default stream would wait for kernels of other
  // communicators, which may be waiting for this one to come up.
  DeviceRegion(size_t bytes, cudaStream_t stream);
  ~DeviceRegion() override;
  cudaIpcMemHandle_t ipcHandle() const;
};

// A DeviceRegion of another process, opened through CUDA IPC.
class IpcRegion : public Mapping {
 public:
  IpcRegion(const cudaIpcMemHandle_t& handle, size_t bytes);
  ~IpcRegion() override;
};

// Host memory (a rank's shared region) registered with CUDA, so kernels reach it directly;
// base() is its device address. One registration per process, shared by whoever asks.
std::shared_ptr<Mapping> registeredHostMemory(const std::shared_ptr<Mapping>& host);

// Pinned host memory that kernels read and write directly: the abort word (the host sets
// it, every spin loop on the GPU sees it) and the error records (kernels write, host reads).
class HostMapped {
 public:
  explicit HostMapped(size_t bytes);  // zero-filled
  ~HostMapped();
  HostMapped(const HostMapped&) = delete;
  HostMapped& operator=(const HostMapped&) = delete;
  void* host() const { return host_; }
  void* device() const { return device_; }

 private:
  void* host_ = nullptr;
  void* device_ = nullptr;
};

class GpuComm {
 public:
  explicit GpuComm(int device);
  ~GpuComm();
  GpuComm(const GpuComm&) = delete;
  GpuComm& operator=(const GpuComm&) = delete;

  // The settings upload() follows, read from the environment. Comm reads them before it
  // joins the others too, so that a malformed one fails this rank before they wait for it.
  struct Settings {
    bool cacheChannels = true;  // MININCL_GPU_CHANNEL_CACHE (0: arrays stay in device memory)
    bool pathKernels = true;    // MININCL_GPU_PATH_KERNELS (0: always the protocol's kernel)
    int threadsPerBlock = 0;    // MININCL_GPU_THREADS (0: by each operation's size)
  };
  static Settings settingsFromEnv();

  int device() const { return device_; }
  // Copies every channel (its struct and the arrays it points to) to device memory, where
  // the kernels use them from now on; step counters start at zero there.
  void upload(const std::vector<std::unique_ptr<Channel>>& channels, const uint32_t* abortWordOnDevice);
  dev::DevChannel* channels() const { return channels_; }
  // Every channel's arrays (dev::ChannelArrays), channel c's at channelArrays() + c * channelArraysStride().
  char* channelArrays() const { return static_cast<char*>(arrays_); }
  uint32_t channelArraysStride() const { return arraysStride_; }
  // Shared memory a collective kernel's block copies its channel's arrays into (see
  // dev::CachedChannel); 0 keeps them in device memory: many ranks, or
  // MININCL_GPU_CHANNEL_CACHE=0 when the communicator was made.
  uint32_t cachedArraysBytes() const { return cachedArraysBytes_; }
  // Whether small operations run the kernel of their one path (dev::GpuLaunch::pathKernels);
  // MININCL_GPU_PATH_KERNELS=0 when the communicator was made: always their protocol's kernel.
  bool pathKernels() const { return pathKernels_; }
  // Threads per block, MININCL_GPU_THREADS when the communicator was made; 0: by size.
  int threadsPerBlock() const { return threadsPerBlock_; }
  int nChannels() const { return nChannels_; }
  dev::DevError* errorsOnDevice() const { return static_cast<dev::DevError*>(errors_.device()); }
  // The first error record a kernel of this communicator left; false if there is none.
  bool firstError(dev::DevError* out) const;
  // Sums the channels' pointer-step and direct-write counters as they stand on the device
  // (copied on a stream of its own, so running kernels are not waited for).
  void sumCounters(uint64_t* pointerSteps, uint64_t* directWrites) const;

  // A stream of this communicator's own, for running beside the caller's stream (several
  // ranks of one process launched on one caller stream would otherwise wait for each other).
  cudaStream_t sideStream() const { return side_; }
  cudaEvent_t forkEvent() const { return fork_; }
  cudaEvent_t joinEvent() const { return join_; }

  // A communicator's kernels share its channels' step counters, so they must run one after
  // the other even when the caller alternates streams (NCCL orders them the same way): a
  // launch on another stream than the last one first waits for the last one.
  void orderAfterPrevious(cudaStream_t stream);
  // Returns false inside a capture (nothing recorded: a graph's replays are not tracked).
  bool recordLaunch(cudaStream_t stream);
  // Whether the last launch outside a capture may not have finished.
  bool mayBeRunning() const;
  // The launches the call timeout watches (Comm::callTimeout).
  LaunchWatch& launchWatch() { return watch_; }

 private:
  void release();  // what the constructor and upload() made

  int device_;
  int nChannels_ = 0;
  dev::DevChannel* channels_ = nullptr;  // device memory
  void* arrays_ = nullptr;               // device memory: every channel's peer arrays
  uint32_t arraysStride_ = 0;
  uint32_t cachedArraysBytes_ = 0;
  bool pathKernels_ = true;
  int threadsPerBlock_ = 0;
  HostMapped errors_;
  cudaStream_t side_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  cudaEvent_t last_ = nullptr;
  cudaStream_t lastStream_ = nullptr;
  // last_ holds the last launch outside a capture (read by the monitor thread too).
  std::atomic<bool> haveLast_{false};
  LaunchWatch watch_;
};

// Loads every kernel now. With lazy loading (CUDA's default since 12.2) the first launch of a
// kernel may wait for the device to go idle, which never happens while ranks' kernels spin
// on each other.
void preloadKernels();

// Makes `device` current on this thread after checking it exists.
void useDevice(int device);

// Makes a communicator's GPU current for a scope, and the caller's one again after.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) MNCL_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() {
    // (A failed restore must not stay behind as the thread's last error, for the caller's
    // next cudaGetLastError to report. NCCL restores the same way.)
    if (cudaSetDevice(previous_) != cudaSuccess) cudaGetLastError();
  }

 private:
  int previous_ = 0;
};

// Lets this device's kernels reach `peer`'s memory (ranks of one process on two GPUs).
void enablePeerAccess(int device, int peer);

}  // namespace gpu
}  // namespace mncl

#endif

#if !defined(MININCL_HAVE_CUDA)
// Without CUDA the communicator still names these types (always null there).
namespace mncl::gpu {
class GpuComm {};
class HostMapped {};
}  // namespace mncl::gpu
#endif
