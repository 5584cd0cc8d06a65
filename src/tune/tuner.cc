#include "tuner.h"

#include <limits>

#include "../core/env.h"
#include "../core/error.h"
#include "../core/log.h"

namespace mncl {

namespace {
const char* const kAlgoNames[] = {"ring", "tree", "direct"};
const char* const kProtoNames[] = {"simple", "ll", "ll128"};
const char* const kCollNames[] = {"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "sendrecv"};

// Per-hop latency (us) and per-channel bandwidth (GB/s) of each protocol between two CPU
// ranks of this machine class (2-core x86 VM), measured with `minincl bench --proto`.
// See bench/RESULTS.md; the shape matters more than the digits.
struct ProtoCost {
  double hopLatencyUs, bandwidthGBs;
};
constexpr ProtoCost kCpuCost[] = {
    {3.0, 6.0},   // simple
    {0.6, 1.5},   // ll
    {1.0, 4.5},   // ll128
};
constexpr double kBaseLatencyUs = 1.0;
}  // namespace

const char* algoName(Algo a) { return kAlgoNames[(int)a]; }
const char* protoName(Proto p) { return kProtoNames[(int)p]; }
const char* collName(Coll c) { return kCollNames[(int)c]; }

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
      throwError(mnclInvalidArgument, std::string(var) + ": unknown name \"" + name + "\" (valid: " + valid +
                                          "; a comma list, or ^ first to exclude)");
    }
    mask |= 1u << found;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (exclude) mask = ((1u << count) - 1) & ~mask;
  if (mask == 0) throwError(mnclInvalidArgument, std::string(var) + "=\"" + list + "\" leaves nothing to choose from");
  return mask;
}

void Tuner::init(int nranks, int maxChannels, size_t bytesPerChannel) {
  nranks_ = nranks;
  maxChannels_ = maxChannels;
  bytesPerChannel_ = std::max<size_t>(1, bytesPerChannel);
  algoMask_ = parseNameList(env::str("MININCL_ALGO"), kAlgoNames, (int)Algo::count, "MININCL_ALGO");
  protoMask_ = parseNameList(env::str("MININCL_PROTO"), kProtoNames, (int)Proto::count, "MININCL_PROTO");
}

bool Tuner::available(Coll coll, Algo a, Proto) const {
  if (coll == Coll::sendrecv) return false;
  return a == Algo::ring;
}

double Tuner::estimate(Coll coll, Algo, Proto p, size_t bytes, int nch) const {
  // Ring: allreduce crosses 2(n-1) hops and moves 2(n-1)/n of the data through each link;
  // the others cross n-1 hops and move (n-1)/n (broadcast/reduce: all of it, pipelined).
  int n = nranks_;
  double hops = coll == Coll::allreduce ? 2.0 * (n - 1) : (double)(n - 1);
  double factor = coll == Coll::allreduce ? 2.0 * (n - 1) / n
                  : (coll == Coll::broadcast || coll == Coll::reduce) ? 1.0
                                                                       : (double)(n - 1) / n;
  const ProtoCost& c = kCpuCost[(int)p];
  double bw = c.bandwidthGBs * nch * 1e3;  // bytes per us
  return kBaseLatencyUs + hops * c.hopLatencyUs + factor * (double)bytes / bw;
}

Plan Tuner::choose(Coll coll, size_t bytes) const {
  int nch = (int)std::min<size_t>((size_t)maxChannels_, std::max<size_t>(1, bytes / bytesPerChannel_));
  Plan best{Algo::ring, Proto::simple, nch};
  double bestTime = std::numeric_limits<double>::infinity();
  bool any = false;
  for (int a = 0; a < (int)Algo::count; ++a) {
    if (!(algoMask_ & (1u << a))) continue;
    for (int p = 0; p < (int)Proto::count; ++p) {
      if (!(protoMask_ & (1u << p)) || !available(coll, (Algo)a, (Proto)p)) continue;
      double t = estimate(coll, (Algo)a, (Proto)p, bytes, nch);
      any = true;
      if (t < bestTime) {
        bestTime = t;
        best = {(Algo)a, (Proto)p, nch};
      }
    }
  }
  if (!any) {
    throwError(mnclInvalidUsage, std::string("no algorithm allowed by MININCL_ALGO / MININCL_PROTO implements ") +
                                     collName(coll) + " (available now: ring with simple, ll, ll128)");
  }
  MNCL_INFO(kTune, "%s %zu bytes: %s/%s on %d channel(s), estimated %.1f us", collName(coll), bytes,
            algoName(best.algo), protoName(best.proto), best.nChannels, bestTime);
  return best;
}

}  // namespace mncl
