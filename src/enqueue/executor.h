// The CPU launch: a persistent thread per channel, each running the jobs posted to it in
// order. The caller does the first communicator's channel 0 itself, so a small operation on
// one channel never pays a thread hand-off. A channel thread that has just run a job polls
// for the next one for a while before it sleeps: waking a sleeping thread costs ~10-40 us
// here, more than a small collective.
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
  // spinMicros: how long an idle channel thread polls before sleeping (0 when channel
  // and proxy threads outnumber cores: a poller would take the core its peer needs).
  Executor(int nChannels, int spinMicros);
  ~Executor();
  // Queues `job` on channel c's thread; `done` is decremented after it runs.
  void post(int c, std::function<void()> job, Completion* done);

 private:
  struct Worker {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<std::pair<std::function<void()>, Completion*>> jobs;
    std::atomic<uint64_t> posted{0};  // jobs ever posted: polled without the lock
    bool stop = false;
    std::thread thread;
  };
  void loop(Worker* w);
  void stopWorkers();  // ends and joins every worker started
  bool pollFor(Worker* w, uint64_t taken) const;
  int spinMicros_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace mncl
