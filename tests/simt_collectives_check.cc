// Every collective x algorithm x protocol as the GPU kernels run them (runTyped over one
// protocol, cuda/dispatch.h), on blocks of CPU threads that emulate CUDA blocks
// (MNCL_SIMT_EMULATION, tests/simt_block.h): the Simple protocol's block-wide steps (thread 0
// waits and plans, a barrier shares the plan, every thread copies with the 16-byte vector
// loop, thread 0 posts), its pointer steps and direct writes between ranks of one process
// (as on one GPU), channels that each take a slice of the buffer, and the line protocols'
// other collectives; on request also allreduces of 9 ranks (direct's most). Each block runs
// on its channel as cached for the launch (cuda/channel_cache.h), the abort and mismatch
// cases on the channel itself (a launch without the cache). Results are
// checked against sums computed here; a rank missing until an abort, ranks calling with
// different counts, and work the dispatch has no case for must stop every block. Exits 0 when
// every check passes.
//
//   c++ -std=c++20 -O1 -pthread -DMNCL_SIMT_EMULATION -Icuda tests/simt_collectives_check.cc
//   ./a.out [threads-per-block [most-ranks [9-ranks-too]]]
#include <algorithm>
#include <cstring>
#include <span>
#include <string>

#include "algorithms.h"
#include "channel_cache.h"
#include "dispatch.h"
#include "simt_block.h"

namespace mncl::dev {

constexpr const char* kCollNames[] = {"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter"};
constexpr const char* kProtoNames[] = {"simple", "ll", "ll128"};
constexpr int kChannels = 2;

// A buffer's elements cut into `parts` slices of a 64-byte multiple, as the host does
// (src/enqueue/work_plan.h).
size_t sliceOf(size_t count, int parts, size_t elemSize) {
  size_t align = elemSize >= 64 ? 1 : 64 / elemSize;
  size_t per = (count + parts - 1) / parts;
  return (per + align - 1) / align * align;
}

// One kernel's block: what runTyped does for a protocol's kernel, or for direct LL's own
// kernel, which kernels.cu launches where every block runs direct LL (copy-only collectives
// on bytes, as launch.cu sends them; avg knows the rank count, as kernels.cu's setRanks sees to).
template <typename T, typename Fn>
bool runKernelBlock(DevChannel& ch, const DevWork& w, DevError* err) {
  Fn fn{};
  if constexpr (requires { fn.nranks; }) fn.nranks = (uint32_t)ch.nranks;
  if (DirectLLOnly::runs(w)) return runTyped<T, Fn, DirectLLOnly>(ch, w, fn, err);
  switch (w.proto) {
    case Proto::simple: return runTyped<T, Fn, OneProtocol<Proto::simple>>(ch, w, fn, err);
    case Proto::ll: return runTyped<T, Fn, OneProtocol<Proto::ll>>(ch, w, fn, err);
    default: return runTyped<T, Fn, OneProtocol<Proto::ll128>>(ch, w, fn, err);
  }
}

template <typename T>
bool runKernelBlockFor(DevChannel& ch, const DevWork& w, DevError* err) {
  if (isCopyOnly(w.coll)) return runKernelBlock<uint8_t, FuncCopy<uint8_t>>(ch, asBytes(w), err);
  if constexpr (std::is_integral_v<T>) {  // (a float avg runs as a premulsum: see mncl::asRun)
    if (w.op == RedOp::avg) return runKernelBlock<T, FuncAvg<T>>(ch, w, err);
  }
  if (w.op == RedOp::premulsum) return runKernelBlock<T, FuncPreMulSum<T>>(ch, w, err);
  return runKernelBlock<T, FuncSum<T>>(ch, w, err);
}

// Runs a block on its channel as a GPU launch does (cuda/channel_cache.h): on a copy in the
// block's shared memory, whose changes go back at the end. The ranks' channels live on from
// case to case, so a counter the copy changed and did not write back fails the next case.
template <typename Run>
bool onCachedChannel(DevChannel& global, Run run) {
  auto bytes = (uint32_t)ChannelArrays(global.nranks).bytes;
  auto* storage = static_cast<DevChannel*>(simt::blockStorage(&global, sizeof(DevChannel)));
  auto* arrays = static_cast<uint64_t*>(simt::blockStorage(global.sendStep, bytes));
  // (The arrays start with sendStep: ChannelArrays.)
  CachedChannel cache(&global, storage, reinterpret_cast<char*>(global.sendStep), arrays, bytes);
  bool ran = run(*cache.shared);
  cache.writeBack();
  return ran;
}

// premulsum: rank r's scalar.
template <typename T>
T scalarOf(int r) {
  return (T)(r + 2);
}

int failures = 0, checks = 0;

struct Case {
  Coll coll;
  Algo algo;
  Proto proto;
  int variant;
  size_t count;  // elements per rank block (allgather: sent; reduce_scatter: received)
  RedOp op = RedOp::sum;
  // Elements into the allocations where the buffers start: off 16 bytes, a buffer meets the
  // 64-byte aligned FIFO slots and channel slices apart (the element-wise loop), and a peer's
  // buffer at the same offset together (the vector loop after a head).
  size_t sendOffset = 0, recvOffset = 0;
  // The output over the input, as the API allows: the same buffer (allreduce, broadcast,
  // reduce), or the input as this rank's block of the output (allgather) or the output as
  // this rank's block of the input (reduce_scatter).
  bool inPlace = false;
};

std::string describe(const Case& c, int n, int threads, size_t elemSize) {
  char s[200];
  const char* op = c.op == RedOp::avg ? " avg" : c.op == RedOp::premulsum ? " premulsum" : "";
  std::snprintf(s, sizeof s, "%s%s %s%s/%s, %d ranks, %d threads, %zu x %zu-byte elements, buffers %zu and %zu in%s",
                kCollNames[(int)c.coll], op, kAlgoNames[(int)c.algo], algoVariantName(c.algo, c.coll, c.variant),
                kProtoNames[(int)c.proto], n, threads, c.count, elemSize, c.sendOffset, c.recvOffset,
                c.inPlace ? ", in place" : "");
  return s;
}

// Runs the case on every rank (each rank's channels are blocks at once) and checks every
// rank's output against values computed here.
template <typename T>
void check(std::vector<Ranks*> channels, int threads, const Case& c, DataType dt) {
  int n = channels[0]->n, root = (int)(c.count % n);
  watchCase(describe(c, n, threads, sizeof(T)));
  bool gathers = c.coll == Coll::allgather, scatters = c.coll == Coll::reducescatter;
  size_t sendCount = c.count * (scatters ? n : 1), recvCount = c.count * (gathers ? n : 1);
  std::vector<std::vector<T>> sendStore(n), recvStore(n), input(n);
  std::vector<std::span<T>> send(n), recv(n);  // (c.sendOffset and c.recvOffset into their stores)
  for (int r = 0; r < n; ++r) {
    sendStore[r].resize(c.sendOffset + sendCount);
    recvStore[r].resize(c.recvOffset + recvCount);
    send[r] = std::span<T>(sendStore[r]).subspan(c.sendOffset);
    recv[r] = std::span<T>(recvStore[r]).subspan(c.recvOffset);
    std::fill(recv[r].begin(), recv[r].end(), (T)99);
    if (c.inPlace && gathers) send[r] = recv[r].subspan(r * c.count, c.count);
    else if (c.inPlace && scatters) recv[r] = send[r].subspan(r * c.count, c.count);
    else if (c.inPlace) recv[r] = send[r];
    for (size_t i = 0; i < sendCount; ++i) send[r][i] = (T)((i * (r + 3) + r) % 7);
    input[r].assign(send[r].begin(), send[r].end());  // (in place, the output overwrites send)
  }
  // Channel ch of every rank takes the same slice of each rank block.
  size_t share = sliceOf(c.count, (int)channels.size(), sizeof(T));
  std::vector<DevWork> works(n * channels.size());
  for (size_t ch = 0; ch < channels.size(); ++ch) {
    for (int r = 0; r < n; ++r) {
      DevWork& w = works[ch * n + r];
      w = DevWork{};
      w.coll = c.coll;
      w.algo = c.algo;
      w.proto = c.proto;
      w.dtype = dt;
      w.op = c.op;
      w.root = root;
      T scalar = scalarOf<T>(r);
      std::memcpy(&w.scalarBits, &scalar, sizeof(T));
      w.send = send[r].data();
      w.recv = recv[r].data();
      w.count = c.count;
      w.chanOffset = std::min(c.count, ch * share);
      w.chanCount = std::min(share, c.count - w.chanOffset);
      w.treeIndex = (int)ch % 2;
      w.algoVariant = c.variant;
      w.inputReadBeforeOverwritten = inputReadBeforeOverwritten(c.algo, c.coll, c.variant);
    }
  }
  std::vector<DevError> errors;
  bool ran = runBlocks(channels, threads, [&](int r, int ch) {
    const DevWork& w = works[ch * n + r];
    // (A channel without a share runs nothing, as the host launches no block for it.)
    if (w.chanCount == 0) return true;
    return onCachedChannel(channels[ch]->channels[r],
                           [&](DevChannel& cached) { return runKernelBlockFor<T>(cached, w, &errors[ch * n + r]); });
  }, errors);
  size_t wrong = 0;
  for (int r = 0; r < n; ++r) {
    if (c.coll == Coll::reduce && r != root) continue;  // (only the root's output is defined)
    for (size_t i = 0; i < recvCount; ++i) {
      T want = 0;
      if (c.coll == Coll::broadcast) want = input[root][i];
      else if (gathers) want = input[i / c.count][i % c.count];
      else {
        for (int q = 0; q < n; ++q) {
          T x = input[q][scatters ? r * c.count + i : i];
          want = (T)(want + (c.op == RedOp::premulsum ? (T)(x * scalarOf<T>(q)) : x));
        }
        if (c.op == RedOp::avg) want = (T)(want / (T)n);  // (small integer sums: exact until divided)
      }
      wrong += recv[r][i] != want;
    }
  }
  ++checks;
  if (!ran || wrong) {
    ++failures;
    std::printf("FAIL %s: %s, %zu wrong\n", describe(c, n, threads, sizeof(T)).c_str(), ran ? "ran" : "stopped early",
                wrong);
  }
}

// Every algorithm (algorithms.h) x variant that implements the collective on these ranks.
std::vector<std::pair<Algo, int>> algorithmsFor(Coll coll, int nranks) {
  std::vector<std::pair<Algo, int>> all;
  for (int a = 0; a < (int)Algo::count; ++a) {
    if (!algoImplements((Algo)a, coll, nranks)) continue;
    for (int v = 0; v < algoVariants((Algo)a, coll); ++v) all.push_back({(Algo)a, v});
  }
  return all;
}

void checkAll(std::vector<Ranks*> channels, int threads, std::vector<Proto> protos, std::vector<size_t> counts) {
  for (int coll = 0; coll < 5; ++coll) {
    for (Proto proto : protos) {
      for (auto [algo, v] : algorithmsFor((Coll)coll, channels[0]->n)) {
        for (size_t count : counts) check<float>(channels, threads, {(Coll)coll, algo, proto, v, count}, DataType::f32);
        // In place: pointer steps of an input the output overwrites (only once its receivers
        // have read it: DevWork::inputReadBeforeOverwritten), premulsum's too.
        for (size_t count : counts) {
          Case c{(Coll)coll, algo, proto, v, count};
          c.inPlace = true;
          check<float>(channels, threads, c, DataType::f32);
        }
        if (coll != (int)Coll::broadcast && coll != (int)Coll::allgather) {
          Case c{(Coll)coll, algo, proto, v, 4099, RedOp::premulsum};
          c.inPlace = true;
          check<float>(channels, threads, c, DataType::f32);
        }
        // Buffers off 16 bytes: both by one element (with pointer steps, peers' buffers
        // together), and apart; copies (on bytes) as 4- and 8-byte words.
        for (auto [sendOffset, recvOffset] : {std::pair<size_t, size_t>{1, 1}, {1, 2}, {2, 2}}) {
          check<float>(channels, threads, {(Coll)coll, algo, proto, v, 4099, RedOp::sum, sendOffset, recvOffset}, DataType::f32);
          // (and bytes off by one or two: copies a byte at a time, or as 2-byte words)
          if (sendOffset == 1 && recvOffset == 1) continue;
          check<uint8_t>(channels, threads, {(Coll)coll, algo, proto, v, 4099, RedOp::sum, sendOffset, recvOffset}, DataType::u8);
        }
        // Other element sizes change the vector loop's elements and the slices' alignment
        // (copies move bytes whatever the type); an integer avg divides after the sum; premulsum
        // scales each rank's input (its own, and its peers' where pointer steps read them).
        if (coll != (int)Coll::broadcast && coll != (int)Coll::allgather) {
          check<uint8_t>(channels, threads, {(Coll)coll, algo, proto, v, 4099}, DataType::u8);
          check<double>(channels, threads, {(Coll)coll, algo, proto, v, 1009}, DataType::f64);
          check<int32_t>(channels, threads, {(Coll)coll, algo, proto, v, 4099, RedOp::avg}, DataType::i32);
          check<float>(channels, threads, {(Coll)coll, algo, proto, v, 4099, RedOp::premulsum}, DataType::f32);
        }
      }
    }
  }
}

// A float32 sum of `send` into `recv` (the same count) on one channel, under Simple.
DevWork simpleAllreduce(Algo algo, std::vector<float>& send, std::vector<float>& recv) {
  DevWork w{};
  w.coll = Coll::allreduce;
  w.algo = algo;
  w.proto = Proto::simple;
  w.dtype = DataType::f32;
  w.op = RedOp::sum;
  w.send = send.data();
  w.recv = recv.data();
  w.count = w.chanCount = send.size();
  return w;
}

// A rank that never joins: the others wait until the abort word is set, then every block
// must leave its waits and the operation stop early.
void checkAbortWithMissingPeer(ProtoSizes sizes, int threads, Algo algo) {
  watchCase(std::string("abort with a rank missing: simple ") + kAlgoNames[(int)algo]);
  Ranks ranks(3, sizes, true);
  size_t count = 40099;
  std::vector<std::vector<float>> send(3, std::vector<float>(count, 1.0f)), recv(3, std::vector<float>(count));
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    storeRelease(&ranks.abortFlag, 1u);
  });
  std::vector<DevError> errors;
  bool ran = runBlocks({&ranks}, threads, [&](int r, int) {
    return runKernelBlockFor<float>(ranks.channels[r], simpleAllreduce(algo, send[r], recv[r]), &errors[r]);
  }, errors, 2);
  aborter.join();
  ++checks;
  if (ran) {
    ++failures;
    std::printf("FAIL abort: simple %s with a rank missing completed instead of stopping\n", kAlgoNames[(int)algo]);
  }
}

// Two ranks calling allreduce with different counts: the first step's check must catch it,
// record the peer, and stop both ranks (with the monitor's abort) instead of hanging.
void checkMismatch(ProtoSizes sizes, int threads, Algo algo, bool directAccess) {
  watchCase(std::string("mismatched counts: simple ") + kAlgoNames[(int)algo] + (directAccess ? " (direct access)" : ""));
  Ranks ranks(2, sizes, directAccess);
  size_t counts[2] = {10009, 30001};
  std::vector<std::vector<float>> send(2), recv(2);
  for (int r = 0; r < 2; ++r) {
    send[r].assign(counts[r], 1.0f);
    recv[r].assign(counts[r], 0.0f);
  }
  std::vector<DevError> errors;
  bool ran = runBlocks({&ranks}, threads, [&](int r, int) {
    return runKernelBlockFor<float>(ranks.channels[r], simpleAllreduce(algo, send[r], recv[r]), &errors[r]);
  }, errors);
  int mismatches = 0;
  for (DevError& e : errors) mismatches += e.peer >= 0;
  ++checks;
  if (ran || mismatches == 0) {
    ++failures;
    std::printf("FAIL mismatch: simple %s%s with counts 10009 and 30001: %s, %d rank(s) reported it\n",
                kAlgoNames[(int)algo], directAccess ? " (direct access)" : "", ran ? "completed" : "stopped", mismatches);
  }
}

// Work the dispatch has no case for (an algorithm without that collective, an algorithm or
// a protocol past its enum's end) must stop every block, not return having done nothing.
// (The dispatch says why on stderr.)
void checkUndispatched(ProtoSizes sizes, int threads) {
  struct Gap {
    Coll coll;
    Algo algo;
    Proto proto;
  };
  for (Gap u : {Gap{Coll::allgather, Algo::tree, Proto::simple}, Gap{Coll::reducescatter, Algo::tree, Proto::ll},
                Gap{Coll::allreduce, Algo::count, Proto::simple}, Gap{Coll::broadcast, Algo::count, Proto::ll128}}) {
    watchCase("undispatched: collective " + std::to_string((int)u.coll) + ", algorithm " + std::to_string((int)u.algo));
    Ranks ranks(2, sizes, true);
    size_t count = 1009;
    std::vector<std::vector<float>> send(2, std::vector<float>(2 * count, 1.0f)), recv(2, std::vector<float>(2 * count));
    std::vector<DevError> errors;
    bool ran = runBlocks({&ranks}, threads, [&](int r, int) {
      DevWork w = simpleAllreduce(Algo::ring, send[r], recv[r]);
      w.coll = u.coll;
      w.algo = u.algo;
      w.proto = u.proto;
      w.count = w.chanCount = count;
      return runKernelBlockFor<float>(ranks.channels[r], w, &errors[r]);
    }, errors);
    // Each rank's record says so, by its own rank (the host, a GPU's too, reads it from there).
    bool recorded = true;
    for (int r = 0; r < 2; ++r) recorded &= errors[r].peer == r && errors[r].undispatched != Undispatched::none;
    ++checks;
    if (ran || !recorded) {
      ++failures;
      std::printf("FAIL undispatched: collective %d, algorithm %d, protocol %d %s\n", (int)u.coll, (int)u.algo,
                  (int)u.proto, ran ? "completed instead of stopping" : "left no record");
    }
  }
}

}  // namespace mncl::dev

int main(int argc, char** argv) {
  using namespace mncl;
  using namespace mncl::dev;
  int threads = argc > 1 ? std::atoi(argv[1]) : 64;
  int mostRanks = argc > 2 ? std::atoi(argv[2]) : 4;  // (every rank's blocks run at once)
  bool manyRanks = argc > 3 && std::atoi(argv[3]) != 0;  // also the 9-rank allreduces
  // (48 s a run on a quiet 2-core VM, 69-400+ s at nice 19 beside builds: 256 spinning threads
  // slow down far more than the machine does. A hang ends sooner: runBlocks' kStallSeconds.)
  failAfter(1200);
  // Simple slots of 4 KiB: a block of 64 threads moves 4 KiB a pass of its vector loop (16
  // bytes x 4 in flight per thread), so steps end inside passes at other block sizes; LL and
  // LL128 as in simt_lines_check.cc; pipeline pieces of 64 bytes, so that pipelines cut.
  ProtoSizes sizes{4096, 320, 48, 64};
  std::vector<size_t> counts = {1, 7, 1009, 4099, 20011};
  for (int n = 2; n <= mostRanks; ++n) {
    for (bool directAccess : {false, true}) {
      std::vector<std::unique_ptr<Ranks>> owned;
      std::vector<Ranks*> channels;
      for (int c = 0; c < kChannels; ++c) {
        owned.push_back(std::make_unique<Ranks>(n, sizes, directAccess));
        channels.push_back(owned.back().get());
      }
      // The line protocols never take pointer steps: once is enough for them.
      std::vector<Proto> protos = {Proto::simple};
      if (!directAccess) protos = {Proto::simple, Proto::ll, Proto::ll128};
      checkAll(channels, threads, protos, counts);
    }
  }
  // Direct's most ranks (kMaxPeers peers each), one channel: every algorithm x protocol's
  // allreduce, Simple with direct access too.
  if (manyRanks) {
    int n = kMaxPeers + 1;
    for (bool directAccess : {false, true}) {
      Ranks ranks(n, sizes, directAccess);
      for (Proto proto : directAccess ? std::vector<Proto>{Proto::simple} : std::vector<Proto>{Proto::simple, Proto::ll, Proto::ll128}) {
        for (auto [algo, v] : algorithmsFor(Coll::allreduce, n)) {
          check<float>({&ranks}, threads, {Coll::allreduce, algo, proto, v, 20011}, DataType::f32);
        }
      }
    }
  }
  for (int a = 0; a < (int)Algo::count; ++a) {
    Algo algo = (Algo)a;
    checkAbortWithMissingPeer(sizes, threads, algo);
    for (bool directAccess : {false, true}) checkMismatch(sizes, threads, algo, directAccess);
  }
  checkUndispatched(sizes, threads);
  std::printf("%d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
