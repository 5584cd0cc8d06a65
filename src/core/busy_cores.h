// Which CPUs a busy process that is none of our ranks' wants: MININCL_BUSY_CORES=auto's test
// of whether a CPU wait's long yields went to a data loader or another job (sleep instead) or
// to the ranks' own work (keep yielding). See cuda/cpu/spin.cc.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "../../cuda/arch.h"

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

// Whether threads of another process (not kernel threads, not a rank's) were runnable on `cpu`
// at the last two looks at /proc. Asks for a new look where the last is over 100 ms old (a
// thread of this process's own takes it, and the answer counts from the next ask).
bool othersWantCpu(int cpu) noexcept;

// For tests: this process's looks at /proc so far, and the times one of its threads began a
// second of sleeping instead of yielding, and its threads' sleeps on doorbells
// (cuda/cpu/spin.cc).
uint64_t busyCoreLooks();
uint64_t busyCoreSleepSpells();
dev::CpuDoorbellSleeps doorbellSleeps();

// Reads /proc now: (pid, cpu) of each runnable thread of other processes. For tests.
std::vector<std::pair<int32_t, int>> runnableThreadsOfOthers();

// MININCL_BUSY_CORES: 0 (never sleep for a busy core), 1 (always, at 3 long yields within a
// second), auto or unset (only where othersWantCpu); throws InvalidArgument naming the
// variable otherwise.
dev::SleepOnBusyCores busyCoresSetting();

}  // namespace mncl
