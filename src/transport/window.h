// A window: shared memory that a rank's user buffers can live in (`comm.empty`), mapped by
// every peer process at init. A Simple step whose data lies in the sender's window goes as a
// pointer step even between processes: the receiver reads the sender's buffer through its
// own mapping, one copy instead of the FIFO's two (NCCL's registered user buffers play the
// same part). Off unless asked for (MININCL_WINDOW_BYTES, window_bytes=, config.windowBytes).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "region.h"

namespace mncl {

class Window {
 public:
  // A segment of `bytes` (rounded up to pages) named for peers to open.
  Window(size_t bytes, const std::string& tag);
  const std::string& name() const { return shm_->name(); }
  char* base() const { return shm_->base(); }
  size_t size() const { return shm_->size(); }
  void unlink() { shm_->unlink(); }

  // Page-aligned space for a buffer, or an InvalidUsage error saying the window is full (a
  // SystemError where /dev/shm cannot hold its pages).
  void* allocate(size_t bytes);
  void release(void* p);  // (a pointer it did not hand out: nothing)

 private:
  void claim(size_t off, size_t len);
  void releaseLocked(size_t off);

  std::shared_ptr<ShmMapping> shm_;
  std::mutex mutex_;
  std::map<size_t, size_t> free_;  // offset -> bytes, coalesced
  std::map<size_t, size_t> used_;  // offset -> bytes
};

}  // namespace mncl
