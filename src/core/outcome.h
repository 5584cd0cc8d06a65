// How work that another thread runs ended: set once by that thread, waited for by any number of
// others. Shared (std::shared_ptr) by whoever waits, so a waiter needs nothing else of the
// work's owner, which may be gone by then.
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>

#include "minincl.h"

namespace mncl {

// How long a waiter yields before it sleeps: an operation that ends within it is seen at once.
// Sleeping costs a wake-up, and waking a thread whose core sits idle took ~30 us on a 2-core
// VM (an 8-byte async_op call and its wait on a single-rank communicator: 68 us, where the
// call itself takes 0.5). Yields, not spins, so that the thread it waits for runs, on the
// same core if need be (ranks may outnumber cores).
inline constexpr std::chrono::microseconds kYieldBeforeSleep{100};

// Yields until `ready()` or `limit` has passed; whether it came.
template <typename Ready>
bool yieldUntil(Ready ready, std::chrono::steady_clock::duration limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    if (ready()) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    sched_yield();
  }
}

class Outcome {
 public:
  void set(mnclResult_t code, std::string message) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      code_ = code;
      message_ = std::move(message);
      done_.store(true, std::memory_order_release);
    }
    ended_.notify_all();
  }
  void wait() {
    if (yieldUntil([&] { return done(); }, kYieldBeforeSleep)) return;
    std::unique_lock<std::mutex> lock(mutex_);
    ended_.wait(lock, [&] { return done(); });
  }
  // wait(), giving up after `d`; whether it ended.
  template <typename Duration>
  bool waitFor(Duration d) {
    auto yieldFor = std::min<std::chrono::steady_clock::duration>(d, kYieldBeforeSleep);
    if (yieldUntil([&] { return done(); }, yieldFor)) return true;
    std::unique_lock<std::mutex> lock(mutex_);
    return ended_.wait_for(lock, d - yieldFor, [&] { return done(); });
  }
  // (An acquire load: the code and message written before are visible after it.)
  bool done() const { return done_.load(std::memory_order_acquire); }
  // After wait() (or done() said true): how it ended.
  mnclResult_t code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  std::mutex mutex_;
  std::condition_variable ended_;
  std::atomic<bool> done_{false};
  mnclResult_t code_ = mnclSuccess;
  std::string message_;
};

}  // namespace mncl
