// Which CPUs a busy process that is none of our ranks' wants: MININCL_BUSY_CORES=auto's test
// of whether a CPU wait's long yields went to a data loader or another job (sleep instead) or
// to the ranks' own work (keep yielding). See cuda/cpu/spin.cc.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace mncl {

// The processes of one communicator's ranks on this host, counted as the ranks' own for as
// long as it lives (this process always is).
class RankProcessesHere {
 public:
  explicit RankProcessesHere(std::vector<int32_t> pids);
  ~RankProcessesHere();
  RankProcessesHere(const RankProcessesHere&) = delete;
  RankProcessesHere& operator=(const RankProcessesHere&) = delete;

 private:
  std::vector<int32_t> pids_;
};

// Whether a thread of another process (not a kernel thread, not a rank's) was waiting for or
// running on `cpu` when /proc was last read: at most 100 ms ago, else read now.
bool othersWantCpu(int cpu);

// Reads /proc now: (pid, cpu) of each runnable thread of other processes. For tests.
std::vector<std::pair<int32_t, int>> runnableThreadsOfOthers();

// MININCL_BUSY_CORES: 0 (never sleep for a busy core), 1 (always, at 3 long yields within a
// second), auto or unset (only where othersWantCpu). Returns 0, 1 or 2 (auto); throws
// InvalidArgument naming the variable otherwise.
int busyCoresSetting();

}  // namespace mncl
