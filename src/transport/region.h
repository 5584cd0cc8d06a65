// Where connection memory lives.
//
// Each rank owns one region: a small control block that peers watch (heartbeat, failure,
// departure), then, for every peer and channel, the receiving end of that connection (its
// control words and the FIFOs of all three protocols). A sender writes straight into the
// receiver's region. The transport decides only how a peer's region is reached:
//   local — a rank in this process: a plain pointer, shared ownership through a registry;
//   shm   — a process on this host: a POSIX shared-memory segment, unlinked as soon as every
//           peer has mapped it, so nothing is left behind whatever happens next.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "../../cuda/channel.h"
#include "../core/call_log.h"

namespace mncl {

// Watched by peers; lives at the start of each rank's region.
struct RankCtrl {
  enum State : uint32_t { kRunning = 0, kFailed = 1, kLeft = 2 };
  alignas(128) uint64_t heartbeat;  // bumped by the rank's monitor thread
  alignas(128) uint32_t state;
  uint32_t destroyed;               // 1 once the rank destroyed (or aborted) its communicator, whatever its state
  uint32_t failCode;                // an mnclResult_t when state == kFailed
  uint32_t gaveUpOn;                // 1 + a peer given up on, by this rank or the one whose failure failed it (0: none)
  uint32_t splitsGathered;          // the splits whose every rank's entry this rank has (Comm::splitInfo)
  char failMessage[1024];           // (room for a deadlock message naming every wait)
  CallLog calls;                    // the collective calls the rank made last

  // The rank left, or destroyed or aborted its communicator (failed or not): no more calls.
  bool gone() const { return dev::loadAcquire(&state) == kLeft || dev::loadAcquire(&destroyed) == 1; }
};

class RegionLayout {
 public:
  RegionLayout(int nranks, int nChannels, const dev::ProtoSizes& sizes);
  size_t totalBytes() const { return ctrlBytes_ + (size_t)nranks_ * nChannels_ * connBytes_; }
  // The receiving end, in the receiver's region, of `sender`'s connection on `channel`.
  dev::ConnFifo conn(char* regionBase, int sender, int channel) const;
  // One connection's memory (control words, then the FIFOs), laid out as in a region.
  size_t connBytes() const { return connBytes_; }
  const dev::ProtoSizes& sizes() const { return sizes_; }
  dev::ConnFifo connAt(char* block) const;

 private:
  int nranks_, nChannels_;
  dev::ProtoSizes sizes_;
  size_t ctrlBytes_, simpleOff_, llOff_, ll128Off_, connBytes_;
};

class Mapping {
 public:
  virtual ~Mapping() = default;
  char* base() const { return base_; }
  size_t size() const { return size_; }
  RankCtrl* ctrl() const { return reinterpret_cast<RankCtrl*>(base_); }

 protected:
  char* base_ = nullptr;
  size_t size_ = 0;
};

// This process's memory for a rank: zero-filled, page-aligned.
std::shared_ptr<Mapping> createLocalRegion(size_t bytes);
// In-process peers find a rank's region (local or shm) through this registry.
uint64_t registerRegion(const std::shared_ptr<Mapping>& m);
std::shared_ptr<Mapping> findRegion(uint64_t registryId);  // null if gone

// A shared-memory segment for a rank; `name` receives its name for peers to open.
class ShmMapping : public Mapping {
 public:
  // (tmpfs gives its pages as they are first touched: one that /dev/shm cannot give then
  // raises SIGBUS. See Window::claim, ShmFaultWatch, and warnIfDevShmTooSmall in comm.cc.)
  static std::shared_ptr<ShmMapping> create(size_t bytes, const std::string& tag);
  // `whose`: what the segment is, for errors ("rank 3's connection buffers").
  static std::shared_ptr<ShmMapping> open(const std::string& name, size_t bytes, const std::string& whose);
  ~ShmMapping() override;
  const std::string& name() const { return name_; }
  void unlink();  // after every peer has mapped it
  // "/dev/shm has no room for `bytes` more bytes of `what` (... MiB free of ...): give it more ...".
  static std::string noRoomFor(size_t bytes, const char* what);
  // /dev/shm's size, and what is free of it, in bytes (where they cannot be read: 0, and no limit).
  static size_t devShmBytes();
  static size_t devShmFreeBytes();

 private:
  std::string name_;
  bool owner_ = false, unlinked_ = false;
};

}  // namespace mncl
