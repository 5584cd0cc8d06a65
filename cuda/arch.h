// The architecture layer: what a channel is on each target. Code above it branches on the
// target only where the targets differ in what pays (reduce_copy.h's and prims_lines.h's
// loops) or in what they can do (kernel copies between processes, trees across hosts: CPU).
//
// A channel is one CUDA block or one CPU thread (or, in a test, a block of CPU threads that
// emulates a CUDA block: MNCL_SIMT_EMULATION). Everything above this file is written in terms
// of: the thread's index and count within its channel, a channel-wide barrier, warp-wide syncs
// and votes, acquire/release loads and stores on memory another channel (maybe in another
// process or on another device) reads, and a spin-wait that gives up when the communicator is
// aborted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

// Device functions, and those host code shares: both already say inline (`MNCL_HOSTDEV
// inline` is a duplicate that only the CPU build rejects).
#if defined(__CUDACC__)
#define MNCL_DEV __device__ __forceinline__
#define MNCL_HOSTDEV __host__ __device__ __forceinline__
// A protocol's one data-moving function, called from every step of every algorithm: compiled
// once per instance instead of inlined at each call site (a step moves kilobytes, so the
// call costs nothing measurable; inlining it everywhere multiplied the kernels' build time).
#define MNCL_DEV_STEP __device__ __noinline__
#else
#include <atomic>
#define MNCL_DEV inline
#define MNCL_HOSTDEV inline
#define MNCL_DEV_STEP inline
#endif

// 1 where a channel is a block of threads in warps of 32 (the GPU's lane layouts apply): CUDA,
// and the tests' emulation of it on CPU threads (MNCL_SIMT_EMULATION, see
// tests/simt_lines_check.cc). 0 on the CPU: one thread per channel.
#if defined(__CUDACC__) || defined(MNCL_SIMT_EMULATION)
#define MNCL_SIMT 1
#else
#define MNCL_SIMT 0
#endif
// 1 where a waiting channel may sleep on its connection's doorbell (doorbell.h): the CPU.
#define MNCL_CPU_DOORBELLS (!MNCL_SIMT)

namespace mncl::dev {

#if defined(__CUDACC__)

MNCL_DEV int tid() { return threadIdx.x; }
MNCL_DEV int nthreads() { return blockDim.x; }
MNCL_DEV void barrier() { __syncthreads(); }
// A barrier that also tells every thread whether any thread passed `p` true: how a decision
// one thread made (it saw the abort word, or a mismatched peer) becomes the whole channel's.
MNCL_DEV bool barrierAny(bool p) { return __syncthreads_or(p) != 0; }
MNCL_DEV void pause() { __nanosleep(32); }
// Warp-wide: a sync that also orders the lanes' memory accesses (bar.warp.sync), and votes.
// Called by every lane of the warp at once (blocks are whole warps).
MNCL_DEV void syncLanes() { __syncwarp(); }
MNCL_DEV bool allLanes(bool p) { return __all_sync(0xffffffffu, p); }
MNCL_DEV bool anyLanes(bool p) { return __any_sync(0xffffffffu, p); }

// Acquire / release / relaxed accesses at system scope (a peer may be another GPU or the
// host), written as the PTX instructions themselves: libcu++'s cuda::atomic_ref compiles to
// these same ones, but its header alone added ~2.3 s to the build of each of the ~65 kernel
// translation units. On words of 4 or 8 bytes: counters and pointers.
template <typename T>
using WordOf = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;
template <typename To, typename From>
MNCL_DEV To sameBits(From v) {
  static_assert(sizeof(To) == sizeof(From) && (sizeof(To) == 4 || sizeof(To) == 8), "flags are 4- or 8-byte words");
  To to;
  memcpy(&to, &v, sizeof(To));
  return to;
}

template <typename T>
MNCL_DEV T loadAcquire(const T* p) {
  WordOf<T> v;
  if constexpr (sizeof(T) == 8) asm volatile("ld.acquire.sys.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  else asm volatile("ld.acquire.sys.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return sameBits<T>(v);
}
template <typename T>
MNCL_DEV T loadRelaxed(const T* p) {
  WordOf<T> v;
  if constexpr (sizeof(T) == 8) asm volatile("ld.relaxed.sys.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  else asm volatile("ld.relaxed.sys.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return sameBits<T>(v);
}
template <typename T>
MNCL_DEV void storeRelease(T* p, T v) {
  WordOf<T> w = sameBits<WordOf<T>>(v);
  if constexpr (sizeof(T) == 8) asm volatile("st.release.sys.b64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
  else asm volatile("st.release.sys.b32 [%0], %1;" ::"l"(p), "r"(w) : "memory");
}
template <typename T>
MNCL_DEV void storeRelaxed(T* p, T v) {
  WordOf<T> w = sameBits<WordOf<T>>(v);
  if constexpr (sizeof(T) == 8) asm volatile("st.relaxed.sys.b64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
  else asm volatile("st.relaxed.sys.b32 [%0], %1;" ::"l"(p), "r"(w) : "memory");
}
// Replaces *p with `desired` if it holds `expected`; true if it did (acquire and release).
template <typename T>
MNCL_DEV bool compareExchange(T* p, T expected, T desired) {
  static_assert(sizeof(T) == 8, "exchanged words are 8 bytes");
  uint64_t want = sameBits<uint64_t>(expected), old;
  asm volatile("atom.cas.acq_rel.sys.b64 %0, [%1], %2, %3;"
               : "=l"(old)
               : "l"(p), "l"(want), "l"(sameBits<uint64_t>(desired))
               : "memory");
  return old == want;
}

#elif defined(MNCL_SIMT_EMULATION)  // Tests only: a channel as a block of CPU threads.

// Provided by the test that defines MNCL_SIMT_EMULATION: the calling thread's index in its
// block, the block's size (a multiple of 32), and the block- and warp-wide syncs and votes.
namespace simt {
int threadIndex();
int blockThreads();
void blockSync();
bool blockAny(bool p);
void warpSync();
bool warpAll(bool p);
bool warpAny(bool p);
// The calling thread's block's storage of `bytes` for `key` (zeroed at first use, then the
// same memory for every thread of the block): what a block's __shared__ variable is.
void* blockStorage(const void* key, size_t bytes);
template <typename T>
inline char kSharedKey = 0;
template <typename T>
inline T& blockShared() {
  return *static_cast<T*>(blockStorage(&kSharedKey<T>, sizeof(T)));
}
}  // namespace simt
inline int tid() { return simt::threadIndex(); }
inline int nthreads() { return simt::blockThreads(); }
inline void barrier() { simt::blockSync(); }
inline bool barrierAny(bool p) { return simt::blockAny(p); }
inline void syncLanes() { simt::warpSync(); }
inline bool allLanes(bool p) { return simt::warpAll(p); }
inline bool anyLanes(bool p) { return simt::warpAny(p); }

#else  // CPU: one thread per channel.

inline int tid() { return 0; }
inline int nthreads() { return 1; }
inline void barrier() {}
inline bool barrierAny(bool p) { return p; }
inline void syncLanes() {}
inline bool allLanes(bool p) { return p; }
inline bool anyLanes(bool p) { return p; }

#endif

#if !defined(__CUDACC__)  // CPU atomics, for the CPU and its SIMT emulation alike

template <typename T>
inline T loadAcquire(const T* p) {
  return std::atomic_ref<T>(*const_cast<T*>(p)).load(std::memory_order_acquire);
}
template <typename T>
inline void storeRelease(T* p, T v) {
  std::atomic_ref<T>(*p).store(v, std::memory_order_release);
}
template <typename T>
inline T loadRelaxed(const T* p) {
  return std::atomic_ref<T>(*const_cast<T*>(p)).load(std::memory_order_relaxed);
}
template <typename T>
inline void storeRelaxed(T* p, T v) {
  std::atomic_ref<T>(*p).store(v, std::memory_order_relaxed);
}
template <typename T>
inline bool compareExchange(T* p, T expected, T desired) {
  return std::atomic_ref<T>(*p).compare_exchange_strong(expected, desired, std::memory_order_acq_rel);
}

#endif

// Waits for a condition, checking the communicator's abort word while it does. Once aborted,
// every later wait in the same operation returns at once, so the algorithm runs to its end
// quickly (moving garbage) instead of hanging; the host then reports why.
#if defined(__CUDACC__)
constexpr uint32_t kSpinsPerAbortCheck = 256;
#else
constexpr uint32_t kSpinsPerAbortCheck = 1;
#endif

struct Doorbell;  // (doorbell.h)

struct Waiter {
  const uint32_t* abortFlag;
  uint32_t spinBudget = 200;  // CPU: spins before yielding; GPU: hot spins before sleeping
  bool aborted = false;
  // CPU, a communicator with network peers: moves their steps while this thread waits (it is
  // usually what the wait is for), instead of waiting for the proxy thread to get a core.
  void (*progress)(void*) = nullptr;
  void* progressArg = nullptr;

  // `bell`: the doorbell of the connection the wait is for, where one is (CPU: the thread may
  // sleep on it; see doorbell.h).
  template <typename Ready>
  MNCL_DEV bool until(Ready ready, Doorbell* bell = nullptr) {
    if (aborted) return false;
    uint32_t spins = 0;
    while (!ready()) {
      // On a GPU the word is in host memory, across PCIe: look at it only now and then (and
      // not on a wait's first miss, which most waits end soon after).
      if ((spins % kSpinsPerAbortCheck) == kSpinsPerAbortCheck - 1 && loadRelaxed(abortFlag) != 0) {
        aborted = true;
        return false;
      }
#if MNCL_CPU_DOORBELLS
      if (bell && !progress) {  // (a thread moving network steps must keep polling them)
        backoffOn(*bell, spins++, ready);
        continue;
      }
#else
      (void)bell;
#endif
      backoff(spins++);
    }
    return true;
  }

  // The same for a condition several lanes of a warp evaluate together (each its own part):
  // returns once it holds on every lane, and every lane returns the same, so the warp stays
  // converged for the votes and syncs that follow.
  template <typename Ready>
  MNCL_DEV bool untilAllLanes(Ready ready) {
    if (aborted) return false;
    uint32_t spins = 0;
    while (!allLanes(ready())) {
      if ((spins % kSpinsPerAbortCheck) == kSpinsPerAbortCheck - 1 && anyLanes(loadRelaxed(abortFlag) != 0)) {
        aborted = true;
        return false;
      }
      backoff(spins++);
    }
    return true;
  }

  // Before a Simple step is posted: whether the operation stopped. On a CPU this also looks at
  // the abort word once, which a SIGBUS handler sets when a page of /dev/shm this step went
  // through could not be had (the step's data may be zeros there: it must not reach a peer;
  // see ShmFaultWatch). A GPU's FIFOs are device memory, and the word is a PCIe read away.
  MNCL_DEV bool abortedBeforePost() {
#if !defined(__CUDACC__)
    if (!aborted && loadRelaxed(abortFlag) != 0) aborted = true;
#endif
    return aborted;
  }

  MNCL_DEV void backoff(uint32_t spins);
#if MNCL_CPU_DOORBELLS
  template <typename Ready>
  void backoffOn(Doorbell& bell, uint32_t spins, Ready& ready);
#endif
};

#if defined(__CUDACC__)
// Spins hot first: a sleeping thread wakes up late (the sleep is coarse), and most waits end
// within microseconds. Only a long wait (a peer still busy, a late launch) starts sleeping.
MNCL_DEV void Waiter::backoff(uint32_t spins) {
  if (spins >= spinBudget) pause();
}
#else
void cpuBackoff(uint32_t spins, uint32_t spinBudget = 200);
// MININCL_BUSY_CORES: waits that find the core taken by a busy thread sleep instead of
// yielding (cpu/spin.cc): never, always, or only where othersWantCpu(the wait's CPU) says a
// thread that is none of the ranks' wants that core. For the whole process.
enum class SleepOnBusyCores { never, always, whereOthersRun };
void cpuSetSleepOnBusyCores(SleepOnBusyCores when, bool (*othersWantCpu)(int cpu));
uint64_t cpuSleepSpells();  // times a thread of this process began a second of sleeps (tests)
// Sleeps of this process's threads on a doorbell, and those a ring ended before their time
// (tests).
struct CpuDoorbellSleeps {
  uint64_t sleeps, wakes;
};
CpuDoorbellSleeps cpuDoorbellSleeps();
// What a thread's long waits also do, about every 50 ms once they sleep (cpuBackoff): a caller
// that can be interrupted sets it for the length of its call (the Python binding runs the
// pending signal handlers there, so that Ctrl-C stops a call blocked on its peers).
struct LongWaitHook {
  void (*fn)(void* arg) = nullptr;
  void* arg = nullptr;
};
// Exported from libminincl (the device code is otherwise built with hidden visibility): the
// Python module sets it.
extern thread_local LongWaitHook tlsLongWaitHook __attribute__((visibility("default")));
inline void Waiter::backoff(uint32_t spins) {
  if (progress) progress(progressArg);
  cpuBackoff(spins, spinBudget);
}
#if MNCL_CPU_DOORBELLS
// cpuBackoff's steps, but where it would sleep on a timer, sleeps on `bell` (for as long at
// most): a ring ends the sleep at once.
int64_t cpuBackoffStep(uint32_t spins, uint32_t spinBudget);  // spins or yields (0), or says how long to sleep (ns)
void cpuSleepOn(Doorbell& bell, int64_t ns, bool (*ready)(void*), void* readyArg);
void cpuSlept();  // after each sleep: the long-wait hook, now and then
void cpuSleep(int64_t ns);  // a timer's sleep, as cpuBackoff's
template <typename Ready>
void Waiter::backoffOn(Doorbell& bell, uint32_t spins, Ready& ready) {
  int64_t ns = cpuBackoffStep(spins, spinBudget);
  if (ns == 0) return;
  cpuSleepOn(bell, ns, [](void* r) { return (bool)(*static_cast<Ready*>(r))(); }, &ready);
  cpuSlept();
}
#endif
#endif

// Pointer steps and direct writes (see ConnCtrl::dataAt, ConnCtrl::outputAt): a receiver reads
// a sender's memory, or a sender writes a receiver's, where the host found that it can: ranks
// of one process (one GPU, or CPU threads), or on the CPU through the kernel (cross-memory
// attach) and shared windows.
#if defined(__CUDACC__)
MNCL_DEV int readPeerMemory(int, void*, const void*, size_t) { return -1; }  // never asked on a GPU
MNCL_DEV int writePeerMemory(int, void*, const void*, size_t) { return -1; }
#else
// Copies `bytes` at `remote` in process `pid` to `dst`. Returns 0 or an errno.
int readPeerMemory(int pid, void* dst, const void* remote, size_t bytes);  // cpu/peer_memory.cc
// Copies `bytes` at `src` to `remote` in process `pid`. Returns 0 or an errno.
int writePeerMemory(int pid, void* remote, const void* src, size_t bytes);
#endif

// A variable every thread of a channel sees: the block's shared memory on a GPU (its type must
// have no constructor there), the emulated block's on CPU threads, an ordinary local on the
// CPU's one thread. MNCL_CHANNEL_SHARED(Type, name) declares it.
#if defined(__CUDACC__)
#define MNCL_CHANNEL_SHARED(Type, name) __shared__ Type name
#elif defined(MNCL_SIMT_EMULATION)
#define MNCL_CHANNEL_SHARED(Type, name) Type& name = simt::blockShared<Type>()
#else
#define MNCL_CHANNEL_SHARED(Type, name) Type name
#endif

}  // namespace mncl::dev

namespace mncl::dev {
// Makes this channel's earlier writes (by all its threads, after a barrier) visible to its
// peers before a flag store; or, after a flag load, makes the peer's writes before that flag
// visible to the loads that follow. `system`: some peer reads them from outside this GPU's
// memory (pinned host memory, another GPU); otherwise a device-wide fence is enough, and much
// cheaper. An acquire-release fence (fence.acq_rel), not __threadfence's sequentially
// consistent one (membar.gl): these are plain release / acquire patterns, and no wait here
// depends on a total order of fences. On the CPU the flag's own release / acquire is enough.
#if defined(__CUDACC__)
MNCL_DEV void fenceFor(bool system) {
  if (system) asm volatile("fence.acq_rel.sys;" ::: "memory");
  else asm volatile("fence.acq_rel.gpu;" ::: "memory");
}
#else
inline void fenceFor(bool) {}
#endif

// Stores a flag (a step counter) that a peer polls. On the GPU it follows an explicit
// fenceFor() where it publishes data, and needs no ordering where it only says that we
// finished reading a slot (those reads completed before the barrier that precedes it).
template <typename T>
MNCL_DEV void storeFlag(T* p, T v) {
#if defined(__CUDACC__)
  storeRelaxed(p, v);
#else
  storeRelease(p, v);
#endif
}
}  // namespace mncl::dev
