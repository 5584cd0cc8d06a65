// The CPU launch: a persistent thread per channel, each running the jobs posted to it in
// order. A caller that runs a single communicator's work does channel 0 itself, so a small
// operation on one channel never pays a thread hand-off.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mncl {

// Counts jobs still running, for whoever waits on them.
struct Completion {
  std::atomic<int> pending{0};
  void wait() const;
};

class Executor {
 public:
  explicit Executor(int nChannels);
  ~Executor();
  // Queues `job` on channel c's thread; `done` is decremented after it runs.
  void post(int c, std::function<void()> job, Completion* done);

 private:
  struct Worker {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<std::pair<std::function<void()>, Completion*>> jobs;
    bool stop = false;
    std::thread thread;
  };
  static void loop(Worker* w);
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace mncl
