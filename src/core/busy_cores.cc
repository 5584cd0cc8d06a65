// A CPU wait whose yields keep taking milliseconds lost its core to some thread that wanted it
// for a while. If that thread does the ranks' own work (the caller's computation, a peer rank
// sharing the core), yielding to it is right: the work has to be done anyway, and a thread
// that sleeps instead waits for the computing one's time slice when woken (a DDP step took
// 1.2x as long). If it is another process's (a data loader, another job), each yield hands it
// a whole time slice while the peer's step takes microseconds: sleeping on the doorbell is
// 10-20x faster there. The two are told apart by who is runnable on the core: /proc lists
// every thread's state and CPU, and the ranks' processes on this host are known. A thread of
// this process's own reads /proc when a wait asks; the waits read only its verdict.
#include "busy_cores.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <thread>

#include "env.h"
#include "error.h"

namespace mncl {
namespace {

// How old a look at /proc may be when a wait asks: 100 ms once a look saw another process
// runnable anywhere, doubling up to 1 s while none did (a rank beside its own computing
// thread yields long all the time: a DDP step), and at least 20 times what the last look
// took, so that looks take at most 5% of a core. One reads a small file per thread on the
// machine (~3 us each, 0.3-0.4 ms for this VM's ~115 threads).
constexpr int64_t kLookEveryNs = 100'000'000, kLookAtMostEveryNs = 1'000'000'000, kLookCostShare = 20;
// A verdict older than this is none (no wait asked meanwhile): the next needs two fresh looks.
constexpr int64_t kVerdictLastsNs = 1'500'000'000;
constexpr int64_t kRetryWatcherNs = 1'000'000'000;
constexpr int kMaxCpus = 1024;
constexpr unsigned kKernelThread = 0x00200000;  // PF_KTHREAD in a task's flags (field 9)
using CpuBits = std::array<uint64_t, kMaxCpus / 64>;

// Shared with the watcher thread, which outlives main() (it is never joined): never freed, so
// that the process's exit does not pull them from under it.
struct State {
  std::mutex registryMutex;
  std::map<int32_t, int> rankPids;  // pid -> communicators that count it as a rank's
  std::mutex askMutex;
  std::condition_variable asked;
  bool lookWanted = false;
  pid_t watcherPid = 0;  // the process whose watcher thread runs (a forked child has none)
  std::atomic<int64_t> nextLookNs{0};
  std::atomic<int64_t> verdictAtNs{INT64_MIN / 2};                // when the last look ended
  std::array<std::atomic<uint64_t>, kMaxCpus / 64> othersWant{};  // a bit per CPU
  std::atomic<uint64_t> looks{0};
};
State& makeStateWithForkHandlers();
State& state() {
  static State& s = makeStateWithForkHandlers();
  return s;
}

// A process that forks (a DataLoader's workers) must not leave a child one of these mutexes
// held by another thread at the fork: the child's next communicator would wait on it for
// ever. The child has no watcher thread (its first ask starts one) and no verdict yet.
State& makeStateWithForkHandlers() {
  State* s = new State;
  pthread_atfork(
      [] {
        state().registryMutex.lock();
        state().askMutex.lock();
      },
      [] {
        state().askMutex.unlock();
        state().registryMutex.unlock();
      },
      [] {
        state().askMutex.unlock();
        state().registryMutex.unlock();
        // (The parent's watcher may be counted as waiting in the copy: a fresh one.)
        new (&state().asked) std::condition_variable;
        state().nextLookNs.store(0);  // (a look under way at the fork never ends here)
        state().verdictAtNs.store(INT64_MIN / 2);
        for (auto& bits : state().othersWant) bits.store(0);
      });
  return *s;
}

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
  State& s = state();
  std::lock_guard<std::mutex> lock(s.registryMutex);
  std::vector<int32_t> pids{(int32_t)getpid()};
  for (const auto& [pid, count] : s.rankPids) pids.push_back(pid);
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

// A CPU counts once two looks in a row, close in time, saw another process's thread runnable
// there: a process that wants the core for a while (a data loader, another job), not one
// runnable for a moment (a launcher's parent, a system daemon), which a trial saw in ~0.7% of
// looks. Returns whether it saw any other process's thread runnable, on any CPU.
bool look(CpuBits& seenLastTime) {
  State& s = state();
  CpuBits seen{};
  bool any = false;
  forEachRunnableThreadOfOthers([&](int32_t, int cpu) {
    any = true;
    if (cpu < kMaxCpus) seen[cpu / 64] |= uint64_t{1} << (cpu % 64);
  });
  int64_t now = nowNs();
  if (now - s.verdictAtNs.load() > kVerdictLastsNs) seenLastTime = {};  // (no waits asked for a while)
  for (size_t i = 0; i < seen.size(); ++i) s.othersWant[i].store(seen[i] & seenLastTime[i]);
  s.verdictAtNs.store(now);
  s.looks.fetch_add(1, std::memory_order_relaxed);
  seenLastTime = seen;
  return any;
}

// The watcher does not stay on the core of the wait that started it (a rank bound to its core,
// MININCL_CPU_BIND=1): it runs where the process may (the kernel keeps it within its cpuset).
void unbindThisThread() {
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &all);
  sched_setaffinity(0, sizeof(all), &all);  // (a failure leaves it where it is)
}

// The watcher thread: a look each time a wait asks (it runs apart from the waits, so that one
// on a machine of many threads does not hold up a collective).
void watch() {
  State& s = state();
  unbindThisThread();
  CpuBits seenLastTime{};
  int64_t every = kLookEveryNs;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(s.askMutex);
      s.asked.wait(lock, [&] { return s.lookWanted; });
      s.lookWanted = false;
    }
    int64_t start = nowNs();
    try {
      every = look(seenLastTime) ? kLookEveryNs : std::min(2 * every, kLookAtMostEveryNs);
    } catch (const std::exception&) {  // (out of memory: no look this time)
    }
    int64_t end = nowNs();
    s.nextLookNs.store(end + std::max(every, kLookCostShare * (end - start)));
  }
}

// Wakes the watcher for a look, starting it first in this process; a watcher that cannot
// start (a limit on threads) is tried again a second later, meanwhile no CPU counts.
void askForALook(State& s, int64_t now) {
  if (now < s.nextLookNs.load(std::memory_order_relaxed)) return;
  std::unique_lock<std::mutex> lock(s.askMutex, std::try_to_lock);
  if (!lock.owns_lock()) return;
  if (s.watcherPid != getpid()) {
    try {
      std::thread(watch).detach();
    } catch (const std::system_error&) {
      s.nextLookNs.store(now + kRetryWatcherNs);
      return;
    }
    s.watcherPid = getpid();
  }
  s.nextLookNs.store(INT64_MAX);  // (until this look ends)
  s.lookWanted = true;
  s.asked.notify_one();
}

}  // namespace

RankProcessesHere::RankProcessesHere(std::vector<int32_t> pids) : pids_(std::move(pids)) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.registryMutex);
  for (int32_t pid : pids_) ++s.rankPids[pid];
}

RankProcessesHere::~RankProcessesHere() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.registryMutex);
  for (int32_t pid : pids_)
    if (--s.rankPids[pid] == 0) s.rankPids.erase(pid);
}

bool othersWantCpu(int cpu) noexcept {
  if (cpu < 0 || cpu >= kMaxCpus) return false;
  try {
    State& s = state();
    int64_t now = nowNs();
    askForALook(s, now);
    if (now - s.verdictAtNs.load(std::memory_order_relaxed) > kVerdictLastsNs) return false;
    return (s.othersWant[cpu / 64].load(std::memory_order_relaxed) >> (cpu % 64)) & 1;
  } catch (const std::exception&) {  // (out of memory for the state: no verdict)
    return false;
  }
}

uint64_t busyCoreLooks() { return state().looks.load(std::memory_order_relaxed); }
uint64_t busyCoreSleepSpells() { return dev::cpuSleepSpells(); }
dev::CpuDoorbellSleeps doorbellSleeps() { return dev::cpuDoorbellSleeps(); }

std::vector<std::pair<int32_t, int>> runnableThreadsOfOthers() {
  std::vector<std::pair<int32_t, int>> found;
  forEachRunnableThreadOfOthers([&](int32_t pid, int cpu) { found.emplace_back(pid, cpu); });
  return found;
}

dev::SleepOnBusyCores busyCoresSetting() {
  std::string v = env::str("MININCL_BUSY_CORES");
  v.erase(0, v.find_first_not_of(" \t"));
  v.erase(v.find_last_not_of(" \t") + 1);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return (char)std::tolower(c); });
  if (v.empty() || v == "auto") return dev::SleepOnBusyCores::whereOthersRun;
  MNCL_CHECK(v == "0" || v == "1", mnclInvalidArgument,
             "MININCL_BUSY_CORES=\"" + env::str("MININCL_BUSY_CORES") + "\" is not 0 (off), 1 (on) or auto (the default)");
  return v == "1" ? dev::SleepOnBusyCores::always : dev::SleepOnBusyCores::never;
}

}  // namespace mncl
