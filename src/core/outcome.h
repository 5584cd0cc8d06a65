// How work that another thread runs ended: set once by that thread, waited for by any number of
// others. Shared (std::shared_ptr) by whoever waits, so a waiter needs nothing else of the
// work's owner, which may be gone by then.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>

#include "minincl.h"

namespace mncl {

class Outcome {
 public:
  void set(mnclResult_t code, std::string message) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      code_ = code;
      message_ = std::move(message);
      done_ = true;
    }
    ended_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    ended_.wait(lock, [&] { return done_; });
  }
  // wait(), giving up after `d`; whether it ended.
  template <typename Duration>
  bool waitFor(Duration d) {
    std::unique_lock<std::mutex> lock(mutex_);
    return ended_.wait_for(lock, d, [&] { return done_; });
  }
  bool done() {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }
  // After wait() (or done() said true): how it ended.
  mnclResult_t code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  std::mutex mutex_;
  std::condition_variable ended_;
  bool done_ = false;
  mnclResult_t code_ = mnclSuccess;
  std::string message_;
};

}  // namespace mncl
