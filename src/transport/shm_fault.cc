#include "shm_fault.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <mutex>
#include <thread>

namespace mncl {

namespace {

// The process's watched ranges. The handler reads them without a lock (it may not take one):
// a slot is filled before its owner is published, and its owner cleared before it is reused.
struct WatchedRange {
  std::atomic<uintptr_t> begin{0}, end{0};
  std::atomic<ShmFaultWatch*> owner{nullptr};
};
// (A rank watches its own region and each local peer's, per communicator: n^2 for n thread-ranks
// of one process beside another process. Untouched slots cost no memory.)
constexpr int kMaxRanges = 1 << 14;
WatchedRange ranges[kMaxRanges];
std::atomic<int> rangesUsed{0};   // slots below this may be in use
std::mutex rangesMutex;           // (writers)
std::atomic<int> handlersRunning{0};  // a watch ends only once no handler may still hold it

struct sigaction previousAction;  // what SIGBUS did before the handler (set once, before it is installed)
uintptr_t pageBytes = 4096;

// Calls f(watch) for each watch of a range that holds `address` (a region may be watched by
// several communicators of this process: its own, and those of ranks in this process that
// write to it). Returns how many.
template <typename F>
int forEachWatchOf(uintptr_t address, F f) {
  int used = rangesUsed.load(std::memory_order_acquire), found = 0;
  for (int i = 0; i < used; ++i) {
    ShmFaultWatch* owner = ranges[i].owner.load(std::memory_order_acquire);
    bool inside = owner && address >= ranges[i].begin.load(std::memory_order_acquire) &&
                  address < ranges[i].end.load(std::memory_order_acquire);
    if (inside && ranges[i].owner.load(std::memory_order_acquire) == owner) {  // (not reused meanwhile)
      f(owner);
      ++found;
    }
  }
  return found;
}

// Hands the signal on as if this handler had never been there.
void chain(int signal, siginfo_t* info, void* context) {
  const struct sigaction& p = previousAction;
  if ((p.sa_flags & SA_SIGINFO) && p.sa_sigaction) return p.sa_sigaction(signal, info, context);
  if (!(p.sa_flags & SA_SIGINFO) && p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN) return p.sa_handler(signal);
  bool sent = info->si_code <= 0;  // (by kill or raise, not by a fault)
  if (sent && p.sa_handler == SIG_IGN) return;
  // The default action: a fault happens again as the access is retried; a sent signal is sent
  // again (it is blocked here, and arrives once the handler returns).
  struct sigaction byDefault {};
  byDefault.sa_handler = SIG_DFL;
  sigemptyset(&byDefault.sa_mask);
  sigaction(signal, &byDefault, nullptr);
  if (sent) raise(signal);
}

// Whether the fault at `address` is on a watched page: then that page is now a private one,
// and its watches are told.
bool takeFault(uintptr_t address) {
  if (forEachWatchOf(address, [](ShmFaultWatch*) {}) == 0) return false;
  // (mmap is a plain system call, safe here in practice though POSIX does not list it.)
  void* page = (void*)(address & ~(pageBytes - 1));
  void* got = mmap(page, pageBytes, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (got != page) return false;
  forEachWatchOf(address, [](ShmFaultWatch* watch) { watch->noteFault(); });
  return true;
}

void onSigbus(int signal, siginfo_t* info, void* context) {
  handlersRunning.fetch_add(1, std::memory_order_seq_cst);  // (before any owner is read)
  bool taken = info->si_code == BUS_ADRERR && takeFault((uintptr_t)info->si_addr);
  handlersRunning.fetch_sub(1, std::memory_order_seq_cst);
  if (!taken) chain(signal, info, context);  // (else the access is retried, on the private page)
}

// Once per process. (Not again where another handler replaced this one later: that one, as
// Python's faulthandler does, may hand faults back to this one, and the two would loop.)
void installHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    pageBytes = (uintptr_t)sysconf(_SC_PAGESIZE);
    struct sigaction mine {};
    mine.sa_sigaction = onSigbus;
    mine.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&mine.sa_mask);
    sigaction(SIGBUS, nullptr, &previousAction);
    sigaction(SIGBUS, &mine, nullptr);
  });
}

}  // namespace

void ShmFaultWatch::watch(const void* base, size_t bytes, uint32_t* abortWord) {
  installHandler();
  abortWord_.store(abortWord, std::memory_order_release);
  std::lock_guard<std::mutex> lock(rangesMutex);
  for (int i = 0; i < kMaxRanges; ++i) {
    if (ranges[i].owner.load(std::memory_order_relaxed) != nullptr) continue;
    ranges[i].begin.store((uintptr_t)base, std::memory_order_relaxed);
    ranges[i].end.store((uintptr_t)base + bytes, std::memory_order_relaxed);
    ranges[i].owner.store(this, std::memory_order_release);
    if (i >= rangesUsed.load(std::memory_order_relaxed)) rangesUsed.store(i + 1, std::memory_order_release);
    slots_.push_back(i);
    return;
  }
  // (Past kMaxRanges a fault there kills the process with SIGBUS, as it did before this watch.)
}

bool ShmFaultWatch::touchIfWatched(const void* at, size_t bytes) {
  bool any = false;
  uintptr_t from = (uintptr_t)at, to = from + bytes;
  for (uintptr_t p = from; p < to; p = (p & ~(pageBytes - 1)) + pageBytes) {
    if (forEachWatchOf(p, [](ShmFaultWatch*) {}) == 0) continue;
    (void)*reinterpret_cast<const volatile char*>(p);
    any = true;
  }
  return any;
}

ShmFaultWatch::~ShmFaultWatch() {
  {
    std::lock_guard<std::mutex> lock(rangesMutex);
    for (int i : slots_) ranges[i].owner.store(nullptr, std::memory_order_seq_cst);
  }
  // A handler that read an owner before it was cleared may still use it: wait it out (a
  // handler runs a few microseconds; this happens as a communicator is destroyed).
  while (handlersRunning.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
}

void ShmFaultWatch::noteFault() {
  faulted_.store(1, std::memory_order_release);
  if (uint32_t* abortWord = abortWord_.load(std::memory_order_acquire)) {
    __atomic_store_n(abortWord, 1u, __ATOMIC_RELEASE);
  }
}

}  // namespace mncl
