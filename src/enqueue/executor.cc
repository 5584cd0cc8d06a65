#include "executor.h"

#include "../../cuda/arch.h"

namespace mncl {

void Completion::wait() const {
  uint32_t spins = 0;
  while (pending.load(std::memory_order_acquire) != 0) dev::cpuBackoff(spins++);
}

Executor::Executor(int nChannels) {
  for (int c = 0; c < nChannels; ++c) {
    auto w = std::make_unique<Worker>();
    w->thread = std::thread(loop, w.get());
    workers_.push_back(std::move(w));
  }
}

Executor::~Executor() {
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
  }
  w.cv.notify_one();
}

void Executor::loop(Worker* w) {
  for (;;) {
    std::pair<std::function<void()>, Completion*> item;
    {
      std::unique_lock<std::mutex> lock(w->mutex);
      w->cv.wait(lock, [&] { return w->stop || !w->jobs.empty(); });
      if (w->jobs.empty()) return;  // stop requested and nothing left
      item = std::move(w->jobs.front());
      w->jobs.pop_front();
    }
    item.first();
    item.second->pending.fetch_sub(1, std::memory_order_release);
  }
}

}  // namespace mncl
