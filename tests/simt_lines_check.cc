// The GPU's lane layouts of LL and LL128 (cuda/prims_lines.h: eight lanes per LL128 line,
// four lines in flight per thread, warp votes and syncs) run here on CPU threads: each rank's
// channel is a block of threads in warps of 32, with the block- and warp-wide operations the
// device code asks for (MNCL_SIMT_EMULATION in cuda/arch.h). Every algorithm's allreduce and
// broadcast, checked against sums computed here; an abort while a rank is missing, and ranks
// calling with different counts, must stop every block. Exits 0 when every check passes.
//
//   c++ -std=c++20 -O1 -pthread -DMNCL_SIMT_EMULATION -Icuda tests/simt_lines_check.cc
//   ./a.out [threads-per-block]
#include "algorithms.h"
#include "direct.h"
#include "prims_lines.h"
#include "ring.h"
#include "simt_block.h"
#include "tree.h"

namespace mncl::dev {

// (Each algorithm's case: the checks below run every Algo.)
static_assert((int)Algo::count == 3, "runOne: add the new algorithm's case");

template <template <class, class> class Prims, typename T, typename Fn>
void runOne(PrimsContext<Fn> cx) {
  bool bcast = cx.work.coll == Coll::broadcast;
  switch (cx.work.algo) {
    case Algo::ring: bcast ? Ring<Prims, T, Fn>::broadcast(cx) : Ring<Prims, T, Fn>::allReduce(cx); break;
    case Algo::tree: bcast ? Tree<Prims, T, Fn>::broadcast(cx) : Tree<Prims, T, Fn>::allReduce(cx); break;
    default: bcast ? Direct<Prims, T, Fn>::broadcast(cx) : Direct<Prims, T, Fn>::allReduce(cx); break;
  }
}

// Runs one operation on ranks [0, present) (default: all), a block of `threads` threads
// each; false if any channel stopped early.
template <typename T, typename Fn>
bool runOp(Ranks& ranks, std::vector<DevWork>& works, int threads, int present = -1, int* mismatches = nullptr) {
  std::vector<DevError> errors;
  bool ok = runBlocks({&ranks}, threads, [&](int r, int) {
    DevChannel& ch = ranks.channels[r];
    Waiter waiter{ch.abortFlag, ch.spinBudget};
    PrimsContext<Fn> cx{ch, works[r], Fn{}, waiter, &errors[r]};
    if (tid() == 0) {
      for (int p = 0; p < ch.nranks; ++p) {
        ch.opFirstSendStep[p] = ch.sendStep[p];
        ch.opFirstRecvStep[p] = ch.recvStep[p];
      }
    }
    barrier();
    if (works[r].proto == Proto::ll) runOne<PrimsLL, T, Fn>(cx);
    else runOne<PrimsLL128, T, Fn>(cx);
    return !waiter.aborted;
  }, errors, present);
  if (mismatches) {
    *mismatches = 0;
    for (DevError& e : errors) *mismatches += e.peer >= 0;
  }
  return ok;
}

// One rank's whole operation on one channel: a sum (or, for broadcast, a copy) from root 0.
DevWork workFor(Coll coll, Algo algo, Proto proto, DataType dt, const void* send, void* recv, size_t count) {
  DevWork w{};
  w.coll = coll;
  w.algo = algo;
  w.proto = proto;
  w.dtype = dt;
  w.op = RedOp::sum;
  w.send = send;
  w.recv = recv;
  w.count = count;
  w.chanCount = count;
  return w;
}

int failures = 0, checks = 0;

template <typename T>
void check(Ranks& ranks, int threads, Coll coll, Algo algo, Proto proto, int variant, size_t count, DataType dt) {
  int n = ranks.n, root = (int)(count % n);
  watchCase(std::string(coll == Coll::broadcast ? "broadcast " : "allreduce ") + kAlgoNames[(int)algo] +
            algoVariantName(algo, coll, variant) + (proto == Proto::ll ? "/ll, " : "/ll128, ") + std::to_string(n) +
            " ranks, " + std::to_string(count) + " x " + std::to_string(sizeof(T)) + "-byte elements");
  std::vector<std::vector<T>> send(n), recv(n);
  std::vector<DevWork> works(n);
  for (int r = 0; r < n; ++r) {
    send[r].resize(count);
    for (size_t i = 0; i < count; ++i) send[r][i] = (T)((i * (r + 3) + r) % 7);
    recv[r].assign(count, (T)99);
    works[r] = workFor(coll, algo, proto, dt, send[r].data(), recv[r].data(), count);
    works[r].root = root;
    works[r].treeIndex = (int)(count % 2);
    works[r].algoVariant = variant;
  }
  bool ran = coll == Coll::broadcast ? runOp<T, FuncCopy<T>>(ranks, works, threads)
                                     : runOp<T, FuncSum<T>>(ranks, works, threads);
  size_t wrong = 0;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) {
      T want = send[root][i];
      if (coll != Coll::broadcast) {
        want = (T)0;
        for (int q = 0; q < n; ++q) want = (T)(want + send[q][i]);
      }
      wrong += recv[r][i] != want;
    }
  }
  ++checks;
  if (!ran || wrong) {
    ++failures;
    std::printf("FAIL %s %s/%s%s %d ranks, %d threads, %zu x %zu-byte elements: %s, %zu wrong\n",
                coll == Coll::broadcast ? "broadcast" : "allreduce",
                kAlgoNames[(int)algo], proto == Proto::ll ? "ll" : "ll128", algoVariantName(algo, coll, variant), n,
                threads, count, sizeof(T), ran ? "ran" : "stopped early", wrong);
  }
}

// A rank that never joins: the others wait until the abort word is set, then every warp of
// every block must leave its waits (the warp-wide ones included) and the operation stop early.
void checkAbortWithMissingPeer(ProtoSizes sizes, int threads, Algo algo, Proto proto) {
  Ranks ranks(3, sizes);
  size_t count = 4099;
  std::vector<std::vector<float>> send(3, std::vector<float>(count, 1.0f)), recv(3, std::vector<float>(count));
  std::vector<DevWork> works(3);
  for (int r = 0; r < 3; ++r) {
    works[r] = workFor(Coll::allreduce, algo, proto, DataType::f32, send[r].data(), recv[r].data(), count);
  }
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    storeRelease(&ranks.abortFlag, 1u);
  });
  bool ran = runOp<float, FuncSum<float>>(ranks, works, threads, 2);
  aborter.join();
  ++checks;
  if (ran) {
    ++failures;
    std::printf("FAIL abort: %s/%s with a rank missing completed instead of stopping\n",
                algo == Algo::ring ? "ring" : algo == Algo::tree ? "tree" : "direct", proto == Proto::ll ? "ll" : "ll128");
  }
}

// Two ranks calling allreduce with different counts: the first step's check must catch it,
// record the peer, and stop both ranks (with the monitor's abort) instead of hanging, before
// any thread writes into either rank's output.
void checkMismatch(ProtoSizes sizes, int threads, Algo algo, Proto proto) {
  Ranks ranks(2, sizes);
  size_t counts[2] = {1009, 3001};
  std::vector<std::vector<float>> send(2), recv(2);
  std::vector<DevWork> works(2);
  for (int r = 0; r < 2; ++r) {
    send[r].assign(counts[r], 1.0f);
    recv[r].assign(counts[r], 0.0f);
    works[r] = workFor(Coll::allreduce, algo, proto, DataType::f32, send[r].data(), recv[r].data(), counts[r]);
  }
  int mismatches = 0;
  bool ran = runOp<float, FuncSum<float>>(ranks, works, threads, -1, &mismatches);
  ++checks;
  size_t written = 0;
  for (int r = 0; r < 2; ++r) {
    for (float x : recv[r]) written += x != 0.0f;
  }
  if (ran || mismatches == 0 || written) {
    ++failures;
    std::printf("FAIL mismatch: %s/%s with counts 1009 and 3001: %s, %d rank(s) reported it, %zu output "
                "element(s) written\n",
                algo == Algo::ring ? "ring" : algo == Algo::tree ? "tree" : "direct", proto == Proto::ll ? "ll" : "ll128",
                ran ? "completed" : "stopped", mismatches, written);
  }
}

}  // namespace mncl::dev

int main(int argc, char** argv) {
  using namespace mncl;
  using namespace mncl::dev;
  int threads = argc > 1 ? std::atoi(argv[1]) : 64;
  failAfter(600);  // (a backstop: a hang ends after runBlocks' kStallSeconds)
  // Steps of a pass and a quarter (LL: 64 threads x 4 lines = 256 per pass) and one and a half
  // (LL128: 8 lines per 64 threads x 4 = 32 per pass), so steps end inside a pass; pieces of
  // 64 bytes, so the pipelines cut.
  ProtoSizes sizes{4096, 320, 48, 64};
  for (int n : {2, 3}) {
    Ranks ranks(n, sizes);
    for (Proto proto : {Proto::ll, Proto::ll128}) {
      for (int a = 0; a < (int)Algo::count; ++a) {
        Algo algo = (Algo)a;
        for (int variant = 0; variant < algoVariants(algo, Coll::allreduce); ++variant) {
          for (size_t count : {1, 7, 1009, 4099}) {
            check<uint8_t>(ranks, threads, Coll::allreduce, algo, proto, variant, count, DataType::u8);
            check<float>(ranks, threads, Coll::allreduce, algo, proto, variant, count, DataType::f32);
            check<double>(ranks, threads, Coll::allreduce, algo, proto, variant, count, DataType::f64);
          }
        }
        check<uint8_t>(ranks, threads, Coll::broadcast, algo, proto, 0, 5003, DataType::u8);
      }
    }
  }
  for (Proto proto : {Proto::ll, Proto::ll128}) {
    for (int a = 0; a < (int)Algo::count; ++a) {
      Algo algo = (Algo)a;
      checkAbortWithMissingPeer(sizes, threads, algo, proto);
      checkMismatch(sizes, threads, algo, proto);
    }
  }
  std::printf("%d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
