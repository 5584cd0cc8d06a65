#include "window.h"

#include <sys/mman.h>

#include <cerrno>

#include "../core/error.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // (Linux 5.14; older C library headers lack it)
#endif

namespace mncl {

namespace {
constexpr size_t kPage = 4096;
size_t pages(size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }
}  // namespace

// (Not committed here: a window's pages are claimed as its allocations are made; see claim.)
Window::Window(size_t bytes, const std::string& tag)
    : shm_(ShmMapping::create(pages(bytes), "w" + tag)) {
  free_[0] = shm_->size();
}

void* Window::allocate(size_t bytes) {
  // (A request bigger than the window becomes one byte too big to fit, unrounded: rounding
  // it up to pages could wrap past SIZE_MAX.)
  size_t want = bytes > shm_->size() ? shm_->size() + 1 : pages(bytes ? bytes : 1);
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    size_t off = it->first, left = it->second - want;
    free_.erase(it);
    if (left) free_[off + want] = left;
    used_[off] = want;
    claim(off, want);
    return shm_->base() + off;
  }
  size_t freeBytes = 0;
  for (auto& [off, len] : free_) freeBytes += len;
  throwError(mnclInvalidUsage, "the communicator's window cannot hold " + std::to_string(bytes) + " more bytes (" +
                                   std::to_string(freeBytes) + " of " + std::to_string(shm_->size()) +
                                   " free): make the communicator with a larger window (MININCL_WINDOW_BYTES; Python: window_bytes=, "
                                   "C: config.windowBytes), or free arrays made with empty() (C: memory from "
                                   "mnclCommMemAlloc)");
}

// Claims the pages of a new allocation (with the lock held), so that a /dev/shm too small for
// them is an error here, not SIGBUS at a later touch (see ShmMapping::create). Where the free
// room is short already, nothing is claimed: a claim that fails part-way holds pages for a
// moment, and a peer touching one of its own then would die. (Kernels before 5.14 have no
// MADV_POPULATE_WRITE: there the pages come as they are touched, as before.)
void Window::claim(size_t off, size_t len) {
  char* p = shm_->base() + off;
  if (ShmMapping::devShmFreeBytes() >= len) {
    if (madvise(p, len, MADV_POPULATE_WRITE) == 0 || errno == EINVAL) return;
    madvise(p, len, MADV_REMOVE);  // (gives back the pages it did claim)
  }
  releaseLocked(off);
  throwError(mnclSystemError, ShmMapping::noRoomFor(len, "the communicator's window"));
}

// A freed allocation's pages go back to /dev/shm (the next allocation claims its own: see
// claim, whose check of the free room counts on it).
void Window::release(void* p) {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t off = static_cast<char*>(p) - shm_->base();
  auto it = used_.find(off);
  if (it == used_.end()) return;
  madvise(shm_->base() + off, it->second, MADV_REMOVE);
  releaseLocked(off);
}

void Window::releaseLocked(size_t off) {
  auto it = used_.find(off);
  if (it == used_.end()) return;
  size_t len = it->second;
  used_.erase(it);
  auto next = free_.lower_bound(off);
  if (next != free_.end() && next->first == off + len) {  // merge with the block after
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {  // and with the one before
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += len;
      return;
    }
  }
  free_[off] = len;
}

}  // namespace mncl
