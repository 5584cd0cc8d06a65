#include "window_memory.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>

#include "../core/comm.h"
#include "../core/error.h"
#include "window.h"

namespace mncl {

namespace {

constexpr size_t kPage = 4096;

// Every live allocation, and the window it lies in (null: plain memory, from aligned_alloc).
struct Allocations {
  std::mutex mutex;
  std::unordered_map<void*, std::shared_ptr<Window>> windowOf;
};
Allocations& allocations() {
  static Allocations* a = new Allocations;  // (never destroyed: a free may come at exit)
  return *a;
}

void* plainMemory(size_t bytes) {
  size_t rounded = (bytes + kPage - 1) / kPage * kPage;  // (bytes is below SIZE_MAX / 2: no wrap)
  void* p = std::aligned_alloc(kPage, rounded ? rounded : kPage);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, rounded ? rounded : kPage);
  return p;
}

}  // namespace

// This machine's memory, in bytes (SIZE_MAX / 2 where it cannot be read).
static size_t physicalMemoryBytes() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : SIZE_MAX / 2;
}

void* allocateWindowMemory(Comm& comm, size_t bytes) {
  MNCL_CHECK(bytes <= SIZE_MAX / 2, mnclInvalidArgument,
             "mnclCommMemAlloc: " + std::to_string(bytes) + " bytes is more than any memory holds");
  // (Refused before the allocator sees it: a sanitizer's aborts where it is asked for 2^63 bytes.)
  size_t machine = physicalMemoryBytes();
  MNCL_CHECK(bytes <= machine, mnclInvalidArgument,
             "mnclCommMemAlloc: " + std::to_string(bytes) + " bytes is more than this machine's memory (" +
                 std::to_string(machine >> 20) + " MiB)");
  MNCL_CHECK(!comm.onGpu(), mnclInvalidUsage,
             "mnclCommMemAlloc: windows are for CPU communicators; allocate GPU buffers with cudaMalloc");
  std::shared_ptr<Window> window = comm.window();
  MNCL_CHECK(window || !comm.windowUseful(), mnclInvalidUsage,
             "mnclCommMemAlloc: this communicator has no window: set config.windowBytes, or MININCL_WINDOW_BYTES "
             "(e.g. 1G), before it is made");
  void* p = nullptr;
  if (window) {
    p = window->allocate(bytes);
    std::memset(p, 0, bytes);  // (a page freed before may hold old data)
  } else {
    p = plainMemory(bytes);
  }
  Allocations& a = allocations();
  std::lock_guard<std::mutex> lock(a.mutex);
  a.windowOf[p] = std::move(window);
  return p;
}

void freeWindowMemory(void* p) {
  if (!p) return;
  std::shared_ptr<Window> window;
  {
    Allocations& a = allocations();
    std::lock_guard<std::mutex> lock(a.mutex);
    auto it = a.windowOf.find(p);
    if (it == a.windowOf.end()) {
      std::ostringstream why;
      why << "mnclMemFree: " << p << " is not memory from mnclCommMemAlloc (or it was freed already)";
      throwError(mnclInvalidArgument, why.str());
    }
    window = std::move(it->second);
    a.windowOf.erase(it);
  }
  if (window) window->release(p);  // (the window goes with its last allocation, if its comm is gone)
  else std::free(p);
}

}  // namespace mncl
