// The worker thread of one communicator's async_op calls: they run one after the other, in
// the order they were submitted, each reporting its end through an Outcome. A synchronous
// call drains the queue first, so that calls stay in program order.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "../core/error.h"
#include "../core/outcome.h"
#include "../core/thread_start.h"
#include "../../cuda/arch.h"  // dev::tlsLongWaitHook

namespace mncl::py_async {

class AsyncQueue {
 public:
  ~AsyncQueue() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  std::shared_ptr<Outcome> submit(std::function<void()> fn) {
    auto st = std::make_shared<Outcome>();
    std::lock_guard<std::mutex> lock(mutex_);
    if (!thread_.joinable()) thread_ = startThread("the async calls' thread", [this] { loop(); });
    jobs_.emplace_back(std::move(fn), st);
    ++pending_;
    cv_.notify_all();
    return st;
  }
  void drain() {
    if (yieldUntil([&] { return idle(); }, kYieldBeforeSleep)) return;
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return pending_ == 0; });
  }
  // drain() for a call: a cv wait never reaches the spin waits' hook, so this one runs it
  // (Ctrl-C's check, py_interrupt) every 50 ms while a queued call is stuck.
  void drainForCall() {
    while (!drainUntil(std::chrono::steady_clock::now() + std::chrono::milliseconds(50))) {
      if (dev::tlsLongWaitHook.fn) dev::tlsLongWaitHook.fn(dev::tlsLongWaitHook.arg);
    }
  }
  // drain(), giving up at `until`; whether the queue is empty.
  bool drainUntil(std::chrono::steady_clock::time_point until) {
    if (yieldUntil([&] { return idle(); }, std::min<std::chrono::steady_clock::duration>(
                                                kYieldBeforeSleep, until - std::chrono::steady_clock::now()))) {
      return true;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_until(lock, until, [&] { return pending_ == 0; });
  }
  // Without the lock: every synchronous call asks.
  bool idle() const { return pending_.load(std::memory_order_acquire) == 0; }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (jobs_.empty() && !stop_) {
        // The next call of a run of them comes soon after the last one's wait: yield for it
        // before sleeping, as a waiter does (outcome.h). (pending_ > 0 with nothing running:
        // a job is queued.)
        lock.unlock();
        yieldUntil([&] { return pending_.load(std::memory_order_acquire) > 0; }, kYieldBeforeSleep);
        lock.lock();
      }
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      auto [fn, st] = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      mnclResult_t code = mnclSuccess;
      std::string msg;
      try {
        fn();
      } catch (const Error& e) {
        code = e.code();
        msg = e.what();
      } catch (const std::exception& e) {
        code = mnclInternalError;
        msg = e.what();
      }
      st->set(code, std::move(msg));
      lock.lock();
      --pending_;
      cv_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<Outcome>>> jobs_;
  std::atomic<int> pending_{0};  // changed under mutex_
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace mncl::py_async
