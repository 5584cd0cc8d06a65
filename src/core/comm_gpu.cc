// GPU: FIFOs in device memory. Where a GPU communicator's FIFOs lie (its own in device
// memory; each peer's by address, through CUDA IPC, or else in pinned host memory for every
// rank), how many channels its SMs hold, and its kernels' state. Without CUDA, stubs: such a
// build refuses GPU ranks (Comm::prepareDevice).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "../enqueue/device_error.h"
#include "../gpu/cuda_api.h"
#include "../gpu/gpu_comm.h"
#if defined(MININCL_HAVE_CUDA)
#include "../../cuda/gpu/kernels.h"
#endif
#include "comm.h"
#include "comm_settings.h"
#include "env.h"
#include "error.h"
#include "log.h"

namespace mncl {

std::string gpuTransportFromEnv() {
  std::string mode = env::str("MININCL_GPU_TRANSPORT");
  MNCL_CHECK(mode.empty() || mode == "ipc" || mode == "host", mnclInvalidArgument,
             "MININCL_GPU_TRANSPORT must be ipc or host (or unset: ipc, host if IPC fails)");
  return mode;
}

#if defined(MININCL_HAVE_CUDA)

void Comm::createGpuRegion(size_t bytes) {
  gpu_ = std::make_unique<gpu::GpuComm>(device_);
  auto region = std::make_shared<gpu::DeviceRegion>(bytes, gpu_->sideStream());
  gpuRegion_ = region;
  peers_[rank_].gpuRegionId = registerRegion(region);
  bool otherProcess = false;
  for (const PeerInfo& p : peers_) otherProcess |= p.pid != peers_[rank_].pid;
  if (otherProcess) {
    try {
      cudaIpcMemHandle_t h = region->ipcHandle();
      static_assert(sizeof(h) <= sizeof(PeerInfo::gpuIpcHandle), "IPC handle does not fit");
      std::memcpy(peers_[rank_].gpuIpcHandle, &h, sizeof(h));
      peers_[rank_].gpuIpcOk = 1;
    } catch (const Error& e) {
      MNCL_WARN(kInit, "rank %d: %s", rank_, e.what());
    }
  }
}

// Where each rank's FIFOs are. Ranks of this process: device memory, by address (after
// enabling peer access when the peer is on another GPU); ranks of other processes: device
// memory through CUDA IPC, or else, for every rank alike, pinned host memory: the shared
// host regions registered with CUDA (MININCL_GPU_TRANSPORT=ipc|host forces one).
void Comm::openPeerGpuRegions() {
  const std::string mode = gpuTransportFromEnv();
  bool otherProcess = false;
  for (const PeerInfo& p : peers_) otherProcess |= p.pid != peers_[rank_].pid;
  bool hostFifos = false;
  if (otherProcess) {
    // A receiver's FIFOs are all in one place, so every rank must agree.
    std::vector<int32_t> ok(nranks_, 0);
    ok[rank_] = mode != "host" && openPeerIpcRegions();
    bootstrap_->allgather(ok.data(), sizeof(int32_t));
    hostFifos = std::find(ok.begin(), ok.end(), 0) != ok.end();
    MNCL_CHECK(!(hostFifos && mode == "ipc"), mnclSystemError,
          "MININCL_GPU_TRANSPORT=ipc, but CUDA IPC does not work between these ranks (see the warnings above)");
    if (hostFifos && rank_ == 0 && mode != "host") {
      MNCL_WARN(kInit, "CUDA IPC is unavailable between some ranks: every rank's FIFOs are in pinned host memory (slower)");
    }
  }
  for (int r = 0; r < nranks_; ++r) {
    const PeerInfo& p = peers_[r];
    if (hostFifos) {
      peerFifos_[r] = gpu::registeredHostMemory(peerRegions_[r]);
    } else if (r == rank_) {
      peerFifos_[r] = gpuRegion_;
    } else if (p.pid == peers_[rank_].pid) {
      gpu::enablePeerAccess(device_, p.device);
      peerFifos_[r] = findRegion(p.gpuRegionId);
    }  // (other processes: opened by openPeerIpcRegions)
    MNCL_CHECK(peerFifos_[r] != nullptr, mnclInternalError, "rank " + std::to_string(r) + "'s FIFO memory vanished during init");
  }
  if (hostFifos) gpuRegion_.reset();
}

bool Comm::openPeerIpcRegions() {
  for (int r = 0; r < nranks_; ++r) {
    const PeerInfo& p = peers_[r];
    if (p.pid == peers_[rank_].pid) continue;
    if (!p.gpuIpcOk) return false;
    try {
      cudaIpcMemHandle_t h;
      std::memcpy(&h, p.gpuIpcHandle, sizeof(h));
      peerFifos_[r] = std::make_shared<gpu::IpcRegion>(h, gpuRegion_->size());
    } catch (const Error& e) {
      MNCL_WARN(kInit, "rank %d: opening rank %d's device memory: %s", rank_, r, e.what());
      return false;
    }
  }
  return true;
}

// Every block of every rank on a GPU must be resident at once (they wait on each other), so
// the ranks sharing it split its SMs (up to 32 channels each); the tuner gives small
// operations fewer. (256 MiB on 8 ranks of one H200 ran 1.5x faster on 16 channels than on 8.)
int Comm::gpuChannelsWanted(int ranksOnDevice) const {
  int sms = 0;
  MNCL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_));
  int fallback = std::clamp(sms / ranksOnDevice, 1, dev::kMaxGpuChannels);
  int64_t wanted = env::integer("MININCL_NCHANNELS", fallback);  // (range-checked before the cast)
  MNCL_CHECK(wanted >= 1 && wanted <= dev::kMaxGpuChannels, mnclInvalidArgument,
        "MININCL_NCHANNELS must be between 1 and " + std::to_string(dev::kMaxGpuChannels) + " on a GPU");
  int want = withinChannelBounds((int)wanted, dev::kMaxGpuChannels);
  MNCL_CHECK(want * ranksOnDevice <= sms, mnclInvalidArgument,
        std::to_string(ranksOnDevice) + " ranks x " + std::to_string(want) + " channels on cuda:" + std::to_string(device_) +
            " need more blocks than its " + std::to_string(sms) +
            " SMs can hold at once, and the ranks' blocks wait on each other: lower MININCL_NCHANNELS (or the "
            "config's minCTAs)");
  return want;
}

bool Comm::gpuWorkPending() const { return gpu_ && gpu_->mayBeRunning(); }

void Comm::checkGpuErrors() {
  dev::DevError e;
  if (gpu_ && !failed() && gpu_->firstError(&e)) {
    auto [code, message] = deviceErrorMessage(*this, e);
    fail(code, message);
  }
}

#else

int Comm::gpuChannelsWanted(int) const { return 1; }
bool Comm::gpuWorkPending() const { return false; }
void Comm::createGpuRegion(size_t) {}
void Comm::openPeerGpuRegions() {}
bool Comm::openPeerIpcRegions() { return false; }
void Comm::checkGpuErrors() {}

#endif

}  // namespace mncl
