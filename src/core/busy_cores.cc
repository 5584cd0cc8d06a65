// A CPU wait whose yields keep taking milliseconds lost its core to some thread that wanted it
// for a while. If that thread does the ranks' own work (the caller's computation, a peer rank
// sharing the core), yielding to it is right: the work has to be done anyway, and a thread
// that sleeps instead waits for the computing one's time slice when woken (a DDP step took
// 1.2x as long). If it is another process's (a data loader, another job), each yield hands it
// a whole time slice while the peer's step takes microseconds: sleeping on the doorbell is
// 10-20x faster there. The two are told apart by who is runnable on the core: /proc lists
// every thread's state and CPU, and the ranks' processes on this host are known.
#include "busy_cores.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "env.h"
#include "error.h"

namespace mncl {
namespace {

// How old a look at /proc may be: 100 ms, or 20 times what the last look took, so that looks
// take at most 5% of a waiting thread's time. One reads a small file per thread on the
// machine (a few us each), and comes only after a long yield.
constexpr int64_t kLookEveryNs = 100'000'000, kLookCostShare = 20;
constexpr int kMaxCpus = 1024;
constexpr unsigned kKernelThread = 0x00200000;  // PF_KTHREAD in a task's flags (field 9)

std::mutex registryMutex;
std::map<int32_t, int> rankPids;  // pid -> communicators that count it as a rank's

std::mutex lookMutex;  // one look at a time; the others use the last one meanwhile
std::atomic<int64_t> nextLookNs{0};
std::array<std::atomic<uint64_t>, kMaxCpus / 64> othersWant{};  // a bit per CPU

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool isNumber(const char* s) { return *s >= '0' && *s <= '9'; }

// A task's stat line: "pid (comm) state ppid ... flags(9th) ... processor(39th) ...". The
// name may hold spaces and parentheses, so fields count from the last ')'. Returns the CPU of
// a runnable user thread, else -1.
int runnableCpu(const char* path) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;  // (the thread ended meanwhile)
  char buf[1024];
  ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return -1;
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');
  if (!p || p[1] != ' ' || p[2] != 'R') return -1;
  int field = 2;  // the ')' ends field 2
  unsigned long flags = 0;
  for (p += 1; *p; ++p) {
    if (*p != ' ') continue;
    ++field;
    if (field == 9) flags = std::strtoul(p + 1, nullptr, 10);
    if (field == 39) return (flags & kKernelThread) ? -1 : std::atoi(p + 1);
  }
  return -1;
}

std::vector<int32_t> ranksPids() {
  std::lock_guard<std::mutex> lock(registryMutex);
  std::vector<int32_t> pids{(int32_t)getpid()};
  for (const auto& [pid, count] : rankPids) pids.push_back(pid);
  std::sort(pids.begin(), pids.end());
  return pids;
}

template <typename Found>
void forEachRunnableThreadOfOthers(Found&& found) {
  std::vector<int32_t> ours = ranksPids();
  DIR* proc = ::opendir("/proc");
  if (!proc) return;
  while (dirent* e = ::readdir(proc)) {
    if (!isNumber(e->d_name)) continue;
    int32_t pid = std::atoi(e->d_name);
    if (std::binary_search(ours.begin(), ours.end(), pid)) continue;
    std::string tasks = std::string("/proc/") + e->d_name + "/task/";
    DIR* dir = ::opendir(tasks.c_str());
    if (!dir) continue;
    while (dirent* t = ::readdir(dir)) {
      if (!isNumber(t->d_name)) continue;
      int cpu = runnableCpu((tasks + t->d_name + "/stat").c_str());
      if (cpu >= 0) found(pid, cpu);
    }
    ::closedir(dir);
  }
  ::closedir(proc);
}

void look() {
  std::array<uint64_t, kMaxCpus / 64> want{};
  forEachRunnableThreadOfOthers([&](int32_t, int cpu) {
    if (cpu < kMaxCpus) want[cpu / 64] |= uint64_t{1} << (cpu % 64);
  });
  for (size_t i = 0; i < want.size(); ++i) othersWant[i].store(want[i], std::memory_order_relaxed);
}

}  // namespace

RankProcessesHere::RankProcessesHere(std::vector<int32_t> pids) : pids_(std::move(pids)) {
  std::lock_guard<std::mutex> lock(registryMutex);
  for (int32_t pid : pids_) ++rankPids[pid];
}

RankProcessesHere::~RankProcessesHere() {
  std::lock_guard<std::mutex> lock(registryMutex);
  for (int32_t pid : pids_)
    if (--rankPids[pid] == 0) rankPids.erase(pid);
}

bool othersWantCpu(int cpu) {
  if (cpu < 0 || cpu >= kMaxCpus) return false;
  int64_t start = nowNs();
  if (start >= nextLookNs.load(std::memory_order_relaxed)) {
    std::unique_lock<std::mutex> lock(lookMutex, std::try_to_lock);
    if (lock.owns_lock()) {
      look();
      int64_t end = nowNs();
      nextLookNs.store(end + std::max(kLookEveryNs, kLookCostShare * (end - start)), std::memory_order_relaxed);
    }
  }
  return (othersWant[cpu / 64].load(std::memory_order_relaxed) >> (cpu % 64)) & 1;
}

std::vector<std::pair<int32_t, int>> runnableThreadsOfOthers() {
  std::vector<std::pair<int32_t, int>> found;
  forEachRunnableThreadOfOthers([&](int32_t pid, int cpu) { found.emplace_back(pid, cpu); });
  return found;
}

int busyCoresSetting() {
  std::string v = env::str("MININCL_BUSY_CORES");
  if (v.empty() || v == "auto") return 2;
  MNCL_CHECK(v == "0" || v == "1", mnclInvalidArgument,
             "MININCL_BUSY_CORES=" + v + " is not 0 (off), 1 (on) or auto (the default)");
  return v == "1";
}

}  // namespace mncl
