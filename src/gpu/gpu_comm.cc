#include "gpu_comm.h"

#if defined(MININCL_HAVE_CUDA)

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "../../cuda/gpu/kernels.h"
#include "../core/comm.h"
#include "../core/env.h"
#include "../core/error.h"
#include "cuda_api.h"

namespace mncl::gpu {

DeviceRegion::DeviceRegion(size_t bytes, cudaStream_t stream) {
  void* p = nullptr;
  MNCL_CUDA_CHECK(cudaMalloc(&p, bytes));
  base_ = static_cast<char*>(p);
  size_ = bytes;
  cudaError_t e = cudaMemsetAsync(p, 0, bytes, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) {
    cudaFree(p);  // (no destructor runs for a constructor that throws)
    check(e, "zero-filling a connection region (cudaMemsetAsync, cudaStreamSynchronize)");
  }
}

DeviceRegion::~DeviceRegion() { cudaFree(base_); }

cudaIpcMemHandle_t DeviceRegion::ipcHandle() const {
  cudaIpcMemHandle_t h{};
  MNCL_CUDA_CHECK(cudaIpcGetMemHandle(&h, base_));
  return h;
}

IpcRegion::IpcRegion(const cudaIpcMemHandle_t& handle, size_t bytes) {
  void* p = nullptr;
  MNCL_CUDA_CHECK(cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess));
  base_ = static_cast<char*>(p);
  size_ = bytes;
}

IpcRegion::~IpcRegion() { cudaIpcCloseMemHandle(base_); }

namespace {

class HostRegistered : public Mapping {
 public:
  explicit HostRegistered(std::shared_ptr<Mapping> host) : host_(std::move(host)) {
    MNCL_CUDA_CHECK(cudaHostRegister(host_->base(), host_->size(), cudaHostRegisterMapped | cudaHostRegisterPortable));
    void* d = nullptr;
    cudaError_t e = cudaHostGetDevicePointer(&d, host_->base(), 0);
    if (e != cudaSuccess) cudaHostUnregister(host_->base());
    MNCL_CUDA_CHECK(e);
    base_ = static_cast<char*>(d);
    size_ = host_->size();
  }
  ~HostRegistered() override { cudaHostUnregister(host_->base()); }

 private:
  std::shared_ptr<Mapping> host_;
};

std::mutex registeredMutex;
std::map<const char*, std::weak_ptr<Mapping>> registered;  // by host address

}  // namespace

std::shared_ptr<Mapping> registeredHostMemory(const std::shared_ptr<Mapping>& host) {
  std::lock_guard<std::mutex> lock(registeredMutex);
  if (auto m = registered[host->base()].lock()) return m;
  auto m = std::make_shared<HostRegistered>(host);
  registered[host->base()] = m;
  return m;
}

HostMapped::HostMapped(size_t bytes) {
  MNCL_CUDA_CHECK(cudaHostAlloc(&host_, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(host_, 0, bytes);
  cudaError_t e = cudaHostGetDevicePointer(&device_, host_, 0);
  if (e != cudaSuccess) {
    cudaFreeHost(host_);
    check(e, "cudaHostGetDevicePointer(&device_, host_, 0)");
  }
}

HostMapped::~HostMapped() { cudaFreeHost(host_); }

void preloadKernels() { MNCL_CUDA_CHECK(dev::preloadKernels()); }

void useDevice(int device) {
  int n = usableDeviceCount();
  MNCL_CHECK(n > 0, mnclInvalidArgument, "device cuda:" + std::to_string(device) + ": no usable CUDA GPU (no driver or no device)");
  MNCL_CHECK(device < n, mnclInvalidArgument,
        "device cuda:" + std::to_string(device) + " does not exist: this process sees " + std::to_string(n) + " GPU(s)");
  MNCL_CUDA_CHECK(cudaSetDevice(device));
}

void enablePeerAccess(int device, int peer) {
  if (device == peer) return;
  int can = 0;
  MNCL_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device, peer));
  MNCL_CHECK(can, mnclInvalidUsage,
        "cuda:" + std::to_string(device) + " cannot access cuda:" + std::to_string(peer) +
            "'s memory (no peer-to-peer path); put these ranks in separate processes");
  cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    return;
  }
  MNCL_CUDA_CHECK(e);
}

GpuComm::GpuComm(int device) : device_(device), errors_(sizeof(dev::DevError) * dev::kMaxGpuChannels) {
  auto* errs = static_cast<dev::DevError*>(errors_.host());
  for (int c = 0; c < dev::kMaxGpuChannels; ++c) errs[c] = dev::DevError{};
  try {
    MNCL_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    MNCL_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    MNCL_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
    MNCL_CUDA_CHECK(cudaEventCreateWithFlags(&last_, cudaEventDisableTiming));
    preloadKernels();
  } catch (...) {
    release();  // (no destructor runs for a constructor that throws)
    throw;
  }
}

namespace {
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MNCL_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}
}  // namespace

void GpuComm::orderAfterPrevious(cudaStream_t stream) {
  // (cudaStreamPerThread is one handle for a different stream on each thread: never the same.)
  bool same = stream == lastStream_ && stream != cudaStreamPerThread;
  if (!haveLast_.load(std::memory_order_relaxed) || same) return;
  // (Not inside a capture: a graph cannot wait for work outside it.)
  if (!capturing(stream)) MNCL_CUDA_CHECK(cudaStreamWaitEvent(stream, last_, 0));
}

bool GpuComm::recordLaunch(cudaStream_t stream) {
  // A captured launch runs when the graph is replayed, which the caller orders; the last real
  // launch stays the one that later launches wait for and that destroy waits for or aborts.
  if (capturing(stream)) return false;
  MNCL_CUDA_CHECK(cudaEventRecord(last_, stream));
  lastStream_ = stream;
  haveLast_.store(true, std::memory_order_release);
  return true;
}

bool GpuComm::mayBeRunning() const {
  if (!haveLast_.load(std::memory_order_acquire)) return false;
  RelaxedCaptureMode relaxed;  // (finalize and destroy ask on the caller's thread)
  cudaError_t e = cudaEventQuery(last_);
  if (e != cudaSuccess && e != cudaErrorNotReady) cudaGetLastError();
  return e == cudaErrorNotReady;
}

#if defined(MNCL_GPU_TRACE)
namespace {
// MININCL_GPU_TRACE builds: the mean clock cycles from a collective kernel's start to each
// point, per channel (see dev::TracePoint), on stderr.
void printTrace(const dev::DevChannel* channelsOnDevice, int nChannels, int device) {
  static const char* const names[] = {"loaded", "dispatch", "announced", "lines-written", "lines-seen",
                                      "info-checked", "step-done", "run-done", "written-back"};
  static_assert(sizeof(names) / sizeof(names[0]) == dev::kTracePoints);
  std::vector<dev::DevChannel> snapshot(nChannels);
  if (cudaMemcpy(snapshot.data(), channelsOnDevice, sizeof(dev::DevChannel) * nChannels, cudaMemcpyDeviceToHost) !=
      cudaSuccess) {
    cudaGetLastError();
    return;
  }
  for (int c = 0; c < nChannels; ++c) {
    const dev::DevChannel& ch = snapshot[c];
    if (ch.traceLaunches == 0) continue;
    std::string line = "minincl trace: device " + std::to_string(device) + " rank " + std::to_string(ch.rank) +
                       " channel " + std::to_string(c) + ", " + std::to_string(ch.traceLaunches) +
                       " launches, mean cycles from kernel start (summed where a point repeats):";
    for (int i = 0; i < dev::kTracePoints; ++i) {
      line += std::string(" ") + names[i] + "=" + std::to_string(ch.traceCycles[i] / ch.traceLaunches);
    }
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}
}  // namespace
#endif

GpuComm::~GpuComm() {
  RelaxedCaptureMode relaxed;  // (destroy runs on the caller's thread: its syncs and frees too)
  if (side_) cudaStreamSynchronize(side_);
#if defined(MNCL_GPU_TRACE)
  if (channels_) printTrace(channels_, nChannels_, device_);
#endif
  release();
}

void GpuComm::release() {
  for (cudaEvent_t e : {fork_, join_, last_}) {
    if (e) cudaEventDestroy(e);
  }
  if (side_) cudaStreamDestroy(side_);
  if (channels_) cudaFree(channels_);
  if (arrays_) cudaFree(arrays_);
  cudaGetLastError();  // (whatever failed here, nothing is left to undo)
}

namespace {
size_t alignUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Whether the channel's flags need system-wide fences: some FIFO lies outside `device`'s
// memory (pinned host memory, another GPU, or anything CUDA cannot place), or its peer is
// another process, even on this GPU (its FIFOs through CUDA IPC look like this device's): the
// PTX memory model's .gpu scope covers the grids of this program only, not another process's
// kernels (under MPS, both run at once).
bool needsSystemScope(const Channel& ch, int device) {
  for (const auto* fifos : {&ch.sendTo, &ch.recvFrom}) {
    for (const dev::ConnFifo& f : *fifos) {
      if (f.ctrl && (f.peerPid != 0 || deviceOfPointer(f.ctrl) != device)) return true;
    }
  }
  return false;
}
}  // namespace

GpuComm::Settings GpuComm::settingsFromEnv() {
  Settings s;
  s.cacheChannels = env::integer("MININCL_GPU_CHANNEL_CACHE", 1) != 0;
  s.pathKernels = env::integer("MININCL_GPU_PATH_KERNELS", 1) != 0;
  int64_t t = env::integer("MININCL_GPU_THREADS", 0);
  MNCL_CHECK(t == 0 || (t % 32 == 0 && t >= 32 && t <= dev::kGpuThreads), mnclInvalidArgument,
             "MININCL_GPU_THREADS must be 0 (by size) or a multiple of 32 up to " + std::to_string(dev::kGpuThreads));
  s.threadsPerBlock = (int)t;
  return s;
}

void GpuComm::upload(const std::vector<std::unique_ptr<Channel>>& channels, const uint32_t* abortWordOnDevice) {
  nChannels_ = (int)channels.size();
  MNCL_CHECK(nChannels_ <= dev::kMaxGpuChannels, mnclInvalidArgument,
        "a GPU communicator runs at most " + std::to_string(dev::kMaxGpuChannels) + " channels (MININCL_NCHANNELS)");
  int n = channels.empty() ? 0 : channels[0]->dev.nranks;
  const dev::ChannelArrays layout(n);
  size_t per = alignUp(layout.bytes, 256);
  arraysStride_ = (uint32_t)per;
  const Settings settings = settingsFromEnv();
  bool cache = settings.cacheChannels && layout.bytes <= dev::kMaxCachedArraysBytes;
  cachedArraysBytes_ = cache ? (uint32_t)layout.bytes : 0;
  pathKernels_ = settings.pathKernels;
  threadsPerBlock_ = settings.threadsPerBlock;
  std::vector<char> staging(per * nChannels_, 0);
  std::vector<dev::DevChannel> devChannels(nChannels_);
  MNCL_CUDA_CHECK(cudaMalloc(&arrays_, std::max<size_t>(staging.size(), 1)));
  MNCL_CUDA_CHECK(cudaMalloc(&channels_, sizeof(dev::DevChannel) * std::max(nChannels_, 1)));
  for (int c = 0; c < nChannels_; ++c) {
    const Channel& ch = *channels[c];
    char* host = staging.data() + per * c;
    std::memcpy(host + layout.sendTo, ch.sendTo.data(), sizeof(dev::ConnFifo) * n);
    std::memcpy(host + layout.recvFrom, ch.recvFrom.data(), sizeof(dev::ConnFifo) * n);
    std::memcpy(host + layout.ring, ch.ring.data(), sizeof(int) * n);  // step counters stay zero
    dev::DevChannel d = ch.dev;
    layout.point(d, static_cast<char*>(arrays_) + per * c);
    d.abortFlag = abortWordOnDevice;
    d.systemScope = needsSystemScope(ch, device_);
    devChannels[c] = d;
  }
  // (On the side stream: the legacy one would wait for other communicators' kernels.)
  MNCL_CUDA_CHECK(cudaMemcpyAsync(arrays_, staging.data(), staging.size(), cudaMemcpyHostToDevice, side_));
  MNCL_CUDA_CHECK(cudaMemcpyAsync(channels_, devChannels.data(), sizeof(dev::DevChannel) * nChannels_,
                                  cudaMemcpyHostToDevice, side_));
  MNCL_CUDA_CHECK(cudaStreamSynchronize(side_));
}

void GpuComm::sumCounters(uint64_t* pointerSteps, uint64_t* directWrites) const {
  std::vector<dev::DevChannel> snapshot(nChannels_);
  cudaStream_t s = nullptr;
  DeviceScope scope(device_);
  MNCL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaError_t e = cudaMemcpyAsync(snapshot.data(), channels_, snapshot.size() * sizeof(dev::DevChannel),
                                  cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  check(e, "copying the channels' counters from the device");
  for (const dev::DevChannel& ch : snapshot) {
    *pointerSteps += ch.pointerStepsSent;
    *directWrites += ch.directWritesSent;
  }
}

bool GpuComm::firstError(dev::DevError* out) const {
  const dev::DevError* errs = static_cast<const dev::DevError*>(errors_.host());
  for (int c = 0; c < nChannels_; ++c) {
    // The kernel writes the details first and `peer` last, with release (dev::recordError).
    if (__atomic_load_n(&errs[c].peer, __ATOMIC_ACQUIRE) >= 0) {
      std::memcpy(out, &errs[c], sizeof(*out));
      return true;
    }
  }
  return false;
}

}  // namespace mncl::gpu

#endif
