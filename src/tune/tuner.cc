#include "tuner.h"

#include <iterator>
#include <limits>

#include "../core/env.h"
#include "../core/error.h"
#include "../core/log.h"
#include "../../cuda/algorithms.h"
#include "../../cuda/channel.h"
#include "../../cuda/tree.h"

namespace mncl {

namespace {
struct ProtoCost {
  double stepLatencyUs, bandwidthGBs;
};

const char* const kProtoNames[] = {"simple", "ll", "ll128"};
const char* const kCollNames[] = {"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "sendrecv"};
static_assert(std::size(kProtoNames) == (size_t)Proto::count);
static_assert(std::size(kCollNames) == (size_t)Coll::count);

// Cost of one step between two CPU ranks of this machine class (2-core x86 VM), per
// protocol: a latency (us) and a per-channel bandwidth (GB/s), plus how much faster bytes
// move while a message fits in the cores' caches. Fitted to `bench/sweep_algos.py` sweeps
// (every algorithm x protocol forced, bench/RESULTS.md) with bench/sweep_report.py's copy of
// this model. The shape matters more than the digits: LL is cheapest per step, Simple moves
// the most bytes per second.
struct CostTable {
  ProtoCost proto[3];       // simple, ll, ll128
  double cacheBoost;        // bandwidth multiplier for messages of up to kCacheBytes
  double treeStepCost;      // a tree step against a ring step (an inner node serves 3 peers)
  double treeLineStepCost;  // the same for an allreduce under LL and LL128
  double treeFactor;        // bytes a tree allreduce moves per byte of the buffer
};
// Every channel thread has a core (2 rank processes on 2 cores, bound to them).
constexpr CostTable kCpuCost = {{
    {0.3, 6.0},   // simple
    {0.1, 0.3},   // ll
    {0.2, 1.5},   // ll128
}, 3.0, 1.0, 1.0, 1.6};
// Channel threads outnumber cores (4 rank processes on 2 cores): a step costs several times
// more, since the peer it waits for may first need this core. Refitted to small-size sweeps
// of 8 and 4 thread-ranks and 4 and 3 rank processes on 2 cores (bench/RESULTS.md,
// fifty-fifth session): one-shot LL128 allreduce was the fastest from 8 B to 1 KiB where the
// tuner took an LL tree (1.6-2.8x its time with 8 thread-ranks): each inner node of an LL
// tree allreduce waits for its children, each perhaps descheduled, where one-shot's posts do
// not wait on one another. (A broadcast's or reduce's tree kept its LL step cost: one-way,
// it measured no slower.)
constexpr CostTable kCpuCostOversubscribed = {{
    {1.0, 4.0},   // simple
    {0.8, 0.2},   // ll
    {0.6, 1.2},   // ll128
}, 3.0, 1.0, 2.0, 1.6};
// One GPU block per channel, ranks on one GPU. Fitted to forced sweeps on one H200 (2 and 8
// ranks, every algorithm x protocol, 8 B to 16 MiB; bench/RESULTS.md, fifth and eighth
// sessions): a Simple step costs ~6 us (ring at 8 ranks: 95 us for 14 steps) and a channel
// moves ~20 GB/s at the sizes where the choice is close; LL ~3 us a step and ~2.9 GB/s a
// channel (2 ranks direct: +9.7 us from 4 to 32 KiB), which puts the LL / Simple crossover
// between 4 and 32 KiB at 2 ranks and one-shot Simple ahead of the LL ring at 32 KiB on 8
// ranks (51 against 78 us), as measured. LL128 was never the fastest (at 16 MiB, 3x Simple's
// time; at small sizes no faster than LL): priced so that it is not chosen.
constexpr CostTable kGpuCost = {{
    {6.0, 20.0},  // simple
    {3.0, 2.9},   // ll
    {6.0, 1.0},   // ll128
}, 1.0, 1.5, 1.5, 2.0};
constexpr size_t kCacheBytes = 256 << 10;
constexpr double kBaseLatencyUs = 1.0;

}  // namespace

const char* algoName(Algo a) { return kAlgoNames[(int)a]; }
const char* protoName(Proto p) { return kProtoNames[(int)p]; }
const char* collName(Coll c) { return kCollNames[(int)c]; }
const char* redOpName(RedOp op) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg", "premulsum", "band", "bor", "bxor"};
  static_assert(std::size(names) == (size_t)RedOp::count);
  return (unsigned)op < (unsigned)RedOp::count ? names[(int)op] : "?";
}
const char* dataTypeName(DataType t) {
  static const char* names[] = {"int8",    "uint8",   "int32",    "uint32",        "int64",      "uint64",
                                "float16", "float32", "float64", "bfloat16", "float8_e4m3fn", "float8_e5m2"};
  static_assert(std::size(names) == (size_t)DataType::count);
  return (unsigned)t < (unsigned)DataType::count ? names[(int)t] : "?";
}

std::string amountOf(uint64_t bytes, DataType t) {
  size_t size = (unsigned)t < (unsigned)DataType::count ? dataTypeSize(t) : 0;
  std::string inBytes = std::to_string(bytes) + " bytes";
  if (size == 0 || bytes % size) return inBytes + " (" + dataTypeName(t) + ")";
  return std::to_string(bytes / size) + " " + dataTypeName(t) + " (" + inBytes + ")";
}

unsigned parseNameList(const std::string& list, const char* const* names, int count, const char* var) {
  if (list.empty()) return (1u << count) - 1;
  bool exclude = list[0] == '^';
  unsigned mask = 0;
  size_t pos = exclude ? 1 : 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    std::string name = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    for (auto& ch : name) ch = (char)std::tolower((unsigned char)ch);
    int found = -1;
    for (int i = 0; i < count; ++i) {
      if (name == names[i]) found = i;
    }
    if (found < 0) {
      std::string valid;
      for (int i = 0; i < count; ++i) valid += std::string(i ? ", " : "") + names[i];
      std::string what = name.empty() ? "=\"" + list + "\" has an empty name" : ": unknown name \"" + name + "\"";
      throwError(mnclInvalidArgument,
                 std::string(var) + what + " (valid: " + valid + "; a comma list, or ^ first to exclude)");
    }
    mask |= 1u << found;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (exclude) mask = ((1u << count) - 1) & ~mask;
  if (mask == 0) throwError(mnclInvalidArgument, std::string(var) + "=\"" + list + "\" leaves nothing to choose from");
  return mask;
}

void Tuner::init(int nranks, int maxChannels, size_t bytesPerChannel, bool oversubscribed) {
  nranks_ = nranks;
  oversubscribed_ = oversubscribed;
  maxChannels_ = maxChannels;
  bytesPerChannel_ = std::max<size_t>(1, bytesPerChannel);
  algoMask_ = algoMaskFromEnv();
  protoMask_ = protoMaskFromEnv();
  forget();
}

unsigned Tuner::algoMaskFromEnv() {
  return parseNameList(env::str("MININCL_ALGO"), kAlgoNames, (int)Algo::count, "MININCL_ALGO");
}
unsigned Tuner::protoMaskFromEnv() {
  return parseNameList(env::str("MININCL_PROTO"), kProtoNames, (int)Proto::count, "MININCL_PROTO");
}

void Tuner::initGpu(int nranks, int maxChannels) {
  init(nranks, maxChannels, 64 << 10, false);
  gpu_ = true;
}

bool Tuner::available(Coll coll, Algo a) const { return algoImplements(a, coll, nranks_); }

// Steps on the critical path, and bytes each rank moves per byte of the buffer, for each
// algorithm (n ranks, the tree's depth d):
//   ring     allreduce 2(n-1) steps, 2(n-1)/n; allgather, reduce_scatter n-1, (n-1)/n;
//            broadcast, reduce n-1 (pipelined), 1
//   tree     allreduce 2d, 2 (CPUs: fitted 1.6); broadcast, reduce d, 1 (all cut into pieces
//            that pipeline, cuda/steps.h's pipelineStep)
//   direct   one-shot allreduce 1 step but n-1 sends, and every rank reduces all n inputs
//            over the whole buffer: n (CPU: (2n+1)/4, see below); two-shot 2 steps, 2(n-1)/n;
//            the others 1 step, (n-1)/n (broadcast and reduce: the root moves (n-1))
// A CPU channel is one thread, so a rank's sends and receives to several peers in one
// "step" still cost it one step each: direct pays (n-1) step latencies per phase.
double Tuner::estimate(Coll coll, Algo a, Proto p, int variant, size_t bytes, int nch) const {
  double n = nranks_;
  const CostTable& table = gpu_ ? kGpuCost : oversubscribed_ ? kCpuCostOversubscribed : kCpuCost;
  double steps = 0, factor = 0;
  bool reduceAll = coll == Coll::allreduce;
  bool rootColl = coll == Coll::broadcast || coll == Coll::reduce;
  switch (a) {
    case Algo::ring:
      steps = reduceAll ? 2 * (n - 1) : n - 1;
      factor = reduceAll ? 2 * (n - 1) / n : rootColl ? 1.0 : (n - 1) / n;
      break;
    case Algo::tree:
      steps = (reduceAll ? 2 : 1) * dev::treeDepth(nranks_, ranksPerHost_) *
              (reduceAll && p != Proto::simple ? table.treeLineStepCost : table.treeStepCost);
      factor = reduceAll ? table.treeFactor : 1.0;
      // On a GPU an LL tree pipelines its small slots through nodes that serve three
      // connections from one block: per byte it measured 3-4x the direct or ring LL
      // (8 ranks, 4 -> 32 KiB: +91 us against +34 and +5).
      if (gpu_ && p != Proto::simple) factor *= 4;
      break;
    case Algo::direct:
      if (reduceAll && variant == 0) {
        steps = n - 1;
        // Simple on CPUs moves bytes at copy speed, so its cost is memory traffic: a rank
        // copies its input into n-1 FIFOs in one pass (reads b, writes (n-1)b) and reduces n
        // inputs (reads nb, writes b), (2n+1)b in all, against 4b for a 2-rank ring (factor
        // 1). Measured at 2 ranks: one-shot 2.9 us at 16 KiB, ring 4.9, two-shot 5.0
        // (bench/RESULTS.md, fourth session). LL and LL128 pay per line sent and polled; their
        // constants were fitted with factor n.
        // When channel threads outnumber cores, a core serves several ranks and all ranks'
        // copies add up: n(n-1) against the ring's 2(n-1), so n/2 times the ring's factor.
        factor = gpu_ || p != Proto::simple ? n : oversubscribed_ ? n - 1 : (2 * n + 1) / 4;
      } else {
        steps = (reduceAll ? 2 : 1) * (n - 1);
        factor = reduceAll ? 2 * (n - 1) / n : rootColl ? n - 1 : (n - 1) / n;
        // Measured on an H200, 8 ranks x 256 MiB: two-shot with pointer steps and direct
        // writes 2794 us, the ring 3128 (16 channels; 4140 / 4718 on 8).
        if (gpuPointerSteps_ && reduceAll && p == Proto::simple) factor *= 0.88;
      }
      break;
    default:
      // An algorithm without a cost here would cost ~kBaseLatencyUs and win at every size:
      // never choose it (where nothing else is allowed, chooseUncached fails the call).
      return std::numeric_limits<double>::infinity();
  }
  const ProtoCost& c = table.proto[(int)p];
  double bw = c.bandwidthGBs * nch * 1e3;  // bytes per us
  if (bytes <= kCacheBytes) bw *= table.cacheBoost;
  bw *= bwScale_;
  return kBaseLatencyUs + steps * c.stepLatencyUs + factor * (double)bytes / bw;
}

void Tuner::setPathBandwidth(double gbs, double mostTold) {
  double simple = (gpu_ ? kGpuCost : oversubscribed_ ? kCpuCostOversubscribed : kCpuCost).proto[(int)Proto::simple].bandwidthGBs;
  // (Against the most the search tells apart where a channel moves more: a GPU channel's
  // 20 GB/s against the search's 12 scaled every GPU plan by 0.6, however fast its links.)
  double full = mostTold > 0 ? std::min(simple, mostTold) : simple;
  bwScale_ = gbs > 0 ? std::min(1.0, gbs / full) : 1.0;
  forget();
}

// A plan in 12 bits: algorithm (2), protocol (2), variant (1), channels - 1 (7).
namespace {
constexpr int kPlanBits = 12;
static_assert((int)Algo::count <= 4 && (int)Proto::count <= 4, "algorithm and protocol have 2 bits each in a plan");
uint64_t packPlan(const Plan& p) {
  return (uint64_t)p.algo | (uint64_t)p.proto << 2 | (uint64_t)p.variant << 4 | (uint64_t)(p.nChannels - 1) << 5;
}
Plan unpackPlan(uint64_t w) {
  return {(Algo)(w & 3), (Proto)(w >> 2 & 3), (int)(w >> 5 & 127) + 1, (int)(w >> 4 & 1)};
}
}  // namespace

void Tuner::forget() {
  for (auto& w : last_) w.store(0, std::memory_order_relaxed);
}

Plan Tuner::choose(Coll coll, size_t bytes) const {
  std::atomic<uint64_t>& last = last_[(int)coll];
  uint64_t key = ((uint64_t)bytes + 1) << kPlanBits;
  bool fits = bytes < (1ull << (64 - kPlanBits)) - 1;
  uint64_t seen = last.load(std::memory_order_relaxed);
  if (fits && (seen >> kPlanBits << kPlanBits) == key) return unpackPlan(seen & ((1u << kPlanBits) - 1));
  Plan p = chooseUncached(coll, bytes);
  if (fits && p.nChannels >= 1 && p.nChannels <= 128) last.store(key | packPlan(p), std::memory_order_relaxed);
  return p;
}

Plan Tuner::chooseForRuntime(Coll coll, size_t bytes) const {
  Priced allowed = cheapest(coll, bytes, algoMask_, protoMask_);
  return allowed.plan.nChannels > 0 ? allowed.plan : cheapest(coll, bytes, ~0u, ~0u).plan;
}

Tuner::Priced Tuner::cheapest(Coll coll, size_t bytes, unsigned algoMask, unsigned protoMask) const {
  int nch = (int)std::min<size_t>((size_t)maxChannels_, std::max<size_t>(1, bytes / bytesPerChannel_));
  Plan best{Algo::ring, Proto::simple, 0, 0};
  double bestTime = std::numeric_limits<double>::infinity();
  for (int a = 0; a < (int)Algo::count; ++a) {
    if (!(algoMask & (1u << a)) || !available(coll, (Algo)a)) continue;
    int variants = algoVariants((Algo)a, coll);
    for (int p = 0; p < (int)Proto::count; ++p) {
      if (!(protoMask & (1u << p))) continue;
      for (int v = 0; v < variants; ++v) {
        double t = estimate(coll, (Algo)a, (Proto)p, v, bytes, nch);
        if (t < bestTime) {
          bestTime = t;
          best = {(Algo)a, (Proto)p, nch, v};
        }
      }
    }
  }
  return {best, bestTime};
}

Plan Tuner::chooseUncached(Coll coll, size_t bytes) const {
  auto [best, bestTime] = cheapest(coll, bytes, algoMask_, protoMask_);
  if (best.nChannels == 0) {
    int nch = (int)std::min<size_t>((size_t)maxChannels_, std::max<size_t>(1, bytes / bytesPerChannel_));
    std::string allowed, uncosted;  // (an algorithm being added may have no cost yet)
    for (int a = 0; a < (int)Algo::count; ++a) {
      if (!available(coll, (Algo)a)) continue;
      bool costed = estimate(coll, (Algo)a, Proto::simple, 0, bytes, nch) < std::numeric_limits<double>::infinity();
      std::string& list = costed ? allowed : uncosted;
      list += std::string(list.empty() ? "" : ", ") + kAlgoNames[a];
    }
    throwError(mnclInvalidUsage, std::string("MININCL_ALGO / MININCL_PROTO allow no algorithm that implements ") +
                                     collName(coll) + " on " + std::to_string(nranks_) + " ranks (algorithms that do: " +
                                     allowed + ")" +
                                     (uncosted.empty() ? "" : "; " + uncosted + " implement it but have no cost in "
                                                              "Tuner::estimate, so are never chosen"));
  }
  MNCL_INFO(kTune, "%s %zu bytes on %d ranks: %s%s/%s on %d channel(s), estimated %.1f us", collName(coll), bytes,
            nranks_, algoName(best.algo), algoVariantName(best.algo, coll, best.variant), protoName(best.proto),
            best.nChannels, bestTime);
  return best;
}

}  // namespace mncl
