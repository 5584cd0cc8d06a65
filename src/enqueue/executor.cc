#include "executor.h"

#include <chrono>

#include "../../cuda/arch.h"
#include "../core/thread_start.h"

namespace mncl {

void Completion::wait() const {
  uint32_t spins = 0;
  while (pending.load(std::memory_order_acquire) != 0) dev::cpuBackoff(spins++);
}

Executor::Executor(int nChannels, int spinMicros) : spinMicros_(spinMicros) {
  try {
    for (int c = 0; c < nChannels; ++c) {
      auto w = std::make_unique<Worker>();
      w->thread = startThread("a channel thread", &Executor::loop, this, w.get());
      workers_.push_back(std::move(w));
    }
  } catch (...) {  // (the threads started must end before they are destroyed: std::terminate else)
    stopWorkers();
    throw;
  }
}

Executor::~Executor() { stopWorkers(); }

void Executor::stopWorkers() {
  for (auto& w : workers_) {
    {
      std::lock_guard<std::mutex> lock(w->mutex);
      w->stop = true;
    }
    w->cv.notify_one();
  }
  for (auto& w : workers_) w->thread.join();
}

void Executor::post(int c, std::function<void()> job, Completion* done) {
  Worker& w = *workers_[c];
  done->pending.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(w.mutex);
    w.jobs.emplace_back(std::move(job), done);
    w.posted.fetch_add(1, std::memory_order_release);
  }
  w.cv.notify_one();
}

// True if a job beyond the first `taken` was posted within spinMicros_.
bool Executor::pollFor(Worker* w, uint64_t taken) const {
  if (spinMicros_ <= 0) return false;
  auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spinMicros_);
  for (uint32_t i = 1;; ++i) {
    if (w->posted.load(std::memory_order_acquire) > taken) return true;
    if (i % 256 == 0 && std::chrono::steady_clock::now() > until) return false;
  }
}

void Executor::loop(Worker* w) {
  uint64_t taken = 0;
  for (;;) {
    std::pair<std::function<void()>, Completion*> item;
    if (taken > 0) pollFor(w, taken);  // after a job, the next one often follows at once
    {
      std::unique_lock<std::mutex> lock(w->mutex);
      w->cv.wait(lock, [&] { return w->stop || !w->jobs.empty(); });
      if (w->jobs.empty()) return;  // stop requested and nothing left
      item = std::move(w->jobs.front());
      w->jobs.pop_front();
      ++taken;
    }
    item.first();
    item.second->pending.fetch_sub(1, std::memory_order_release);
  }
}

}  // namespace mncl
