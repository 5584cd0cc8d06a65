// What kernel copies between two processes cost on this machine, without minincl: the
// measurements behind the cross-memory attach choices in src/enqueue/work_plan.cc.
//
//   minincl-cross-memory [BYTES [CHUNK]]   (plain numbers; default 8388608 and 131072)
//
// Two processes (a fork), each with an input of BYTES and an output of 2 x BYTES, exchange
// their inputs in CHUNK pieces, as a 2-rank allgather does, four ways; and the first sends
// its input to the second, as a 2-rank broadcast does, two ways. Prints the median of 30
// rounds for each (the slower process counts).
#include <sched.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

struct Shared {  // in memory both processes map
  std::atomic<long> arrived[2];  // barrier generations
  std::atomic<long> copied[2];   // chunks of its own block each has copied (this round)
  char* input[2];
  char* output[2];
  pid_t pid[2];
  double seconds[2];
};

struct Rank {
  int r;
  Shared* sh;
  char *input, *output, *fifo;  // fifo: 1 MiB per rank, shared
  size_t bytes, chunk;
  long gen = 0;

  int peer() const { return 1 - r; }
  void barrier() {
    sh->arrived[r].store(++gen);
    while (sh->arrived[peer()].load() < gen) {
    }
  }
  void kernelCopy(bool write, char* local, char* remote, size_t n) const {
    iovec here{local, n}, there{remote, n};
    ssize_t moved = write ? process_vm_writev(sh->pid[peer()], &here, 1, &there, 1, 0)
                          : process_vm_readv(sh->pid[peer()], &here, 1, &there, 1, 0);
    if (moved != (ssize_t)n) {
      perror("cross-memory attach");
      exit(1);
    }
  }
  char* fifoSlot(int owner, size_t off) const { return fifo + owner * (1 << 20) + off % (1 << 20); }
};

// The ways to move data. Each runs one round on one rank.
enum Way { kFifo, kReadInput, kReadOutput, kBroadcastFifo, kBroadcastSplit, kWays };
const char* kNames[kWays] = {
    "allgather: local copy + through a FIFO (2 copies)",
    "allgather: local copy + kernel read of the peer's input",
    "allgather: local copy + kernel read of the peer's just-written output",
    "broadcast: root into a FIFO, receiver out of it",
    "broadcast: root writes odd chunks, receiver reads even ones (kernel)",
};

void round(Rank& k, Way way, long base) {
  char* own = k.output + k.r * k.bytes;
  char* theirs = k.output + k.peer() * k.bytes;
  for (size_t off = 0, i = 1; off < k.bytes; off += k.chunk, ++i) {
    size_t n = std::min(k.chunk, k.bytes - off);
    switch (way) {
      case kFifo:
        memcpy(own + off, k.input + off, n);
        memcpy(k.fifoSlot(k.r, off), k.input + off, n);
        memcpy(theirs + off, k.fifoSlot(k.peer(), off), n);  // (timing only: no flags)
        break;
      case kReadInput:
      case kReadOutput: {
        memcpy(own + off, k.input + off, n);
        k.sh->copied[k.r].store(base + (long)i, std::memory_order_release);
        while (k.sh->copied[k.peer()].load(std::memory_order_acquire) < base + (long)i) {
        }
        char* from = way == kReadInput ? k.sh->input[k.peer()] + off : k.sh->output[k.peer()] + k.peer() * k.bytes + off;
        k.kernelCopy(false, theirs + off, from, n);
        break;
      }
      case kBroadcastFifo:
        if (k.r == 0) memcpy(k.fifoSlot(0, off), k.input + off, n);
        else memcpy(k.output + off, k.fifoSlot(0, off), n);
        break;
      case kBroadcastSplit:
        if (k.r == 0 && i % 2 == 0) k.kernelCopy(true, k.input + off, k.sh->output[1] + off, n);
        if (k.r == 1 && i % 2 == 1) k.kernelCopy(false, k.output + off, k.sh->input[0] + off, n);
        break;
      default:
        break;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = argc > 1 ? strtoull(argv[1], nullptr, 0) : 8 << 20;
  size_t chunk = argc > 2 ? strtoull(argv[2], nullptr, 0) : 128 << 10;
  auto* sh = static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  auto* fifo = static_cast<char*>(mmap(nullptr, 2 << 20, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  pid_t child = fork();
  Rank k{child == 0 ? 1 : 0, sh, nullptr, nullptr, fifo, bytes, chunk};
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(k.r, &set);
  sched_setaffinity(0, sizeof set, &set);
  // Huge pages where the kernel gives them (NumPy asks for them from 4 MiB on).
  k.input = static_cast<char*>(aligned_alloc(2 << 20, (bytes + (2 << 20) - 1) / (2 << 20) * (2 << 20)));
  k.output = static_cast<char*>(aligned_alloc(2 << 20, (2 * bytes + (2 << 20) - 1) / (2 << 20) * (2 << 20)));
  madvise(k.input, bytes, MADV_HUGEPAGE);
  madvise(k.output, 2 * bytes, MADV_HUGEPAGE);
  memset(k.input, k.r + 1, bytes);
  memset(k.output, 0, 2 * bytes);
  sh->input[k.r] = k.input;
  sh->output[k.r] = k.output;
  sh->pid[k.r] = getpid();
  k.barrier();
  if (k.r == 0) printf("%zu bytes a rank, %zu-byte chunks; median of 30 rounds\n", bytes, chunk);
  for (int way = 0; way < kWays; ++way) {
    std::vector<double> times;
    for (int it = 0; it < 30; ++it) {
      sh->copied[k.r].store(0);
      k.barrier();
      auto t0 = std::chrono::steady_clock::now();
      round(k, (Way)way, 0);
      sh->seconds[k.r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      k.barrier();
      times.push_back(std::max(sh->seconds[0], sh->seconds[1]));
      k.barrier();  // both read the times before the next round overwrites them
    }
    std::sort(times.begin(), times.end());
    if (k.r == 0) printf("%8.1f us  %s\n", times[times.size() / 2] * 1e6, kNames[way]);
  }
  if (child != 0) waitpid(child, nullptr, 0);
  return 0;
}
