// The tuner: for each call, the (algorithm, protocol, channel count) expected to finish first.
//
// time = latency + bytes / bandwidth, per (algorithm, protocol), with constants measured on
// real runs (see tuner.cc). MININCL_ALGO and MININCL_PROTO restrict the choice as NCCL_ALGO
// and NCCL_PROTO do: a comma list of names, or `^` first to exclude them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "../../cuda/dtypes.h"

namespace mncl {

struct Plan {
  Algo algo;
  Proto proto;
  int nChannels;
  int variant = 0;  // direct allreduce: 0 one-shot, 1 two-shot
};

const char* algoName(Algo a);
const char* protoName(Proto p);
const char* collName(Coll c);
const char* dataTypeName(DataType t);  // "float32", ...; "?" if out of range
// What a send or receive of `bytes` carries, for errors: "5 float32 (20 bytes)".
std::string amountOf(uint64_t bytes, DataType t);
const char* redOpName(RedOp op);       // "sum", ...; "?" if out of range

// Parses "ring,tree" / "^ll" style lists into a bit mask over `count` names.
unsigned parseNameList(const std::string& list, const char* const* names, int count, const char* var);

class Tuner {
 public:
  // bytesPerChannel: the smallest share worth a channel of its own.
  // oversubscribed: this host runs more channel and network proxy threads than it has cores.
  void init(int nranks, int maxChannels, size_t bytesPerChannel, bool oversubscribed);
  // A GPU communicator: the GPU cost table.
  void initGpu(int nranks, int maxChannels);
  // MININCL_ALGO and MININCL_PROTO as masks over Algo and Proto (what init reads).
  static unsigned algoMaskFromEnv();
  static unsigned protoMaskFromEnv();
  // GPU: every rank reads and writes its peers' buffers directly (one process, one GPU), so
  // direct two-shot allreduce moves each byte in and out once instead of through FIFOs.
  void setGpuPointerSteps(bool on) {
    gpuPointerSteps_ = on;
    forget();
  }
  // CPU ranks on hosts of this many ranks each: trees run chains within hosts (cuda/tree.h).
  void setRanksPerHost(int perHost) {
    ranksPerHost_ = perHost;
    forget();
  }
  // Deterministic from its arguments and the communicator-wide settings, so every rank plans
  // the same way. Remembers the last answer per collective: a loop of same-sized calls pays
  // for the estimates once (MININCL_DEBUG=INFO logs a choice when it is made).
  Plan choose(Coll coll, size_t bytes) const;
  // For the runtime's own calls (a barrier runs as an allreduce): what MININCL_ALGO /
  // MININCL_PROTO allow, or where they leave this collective nothing (direct allreduce on 10
  // ranks), the cheapest of all. The user chose no collective there, only settings for theirs.
  Plan chooseForRuntime(Coll coll, size_t bytes) const;
  // The topology search's per-channel bandwidth (GB/s) along the rings. A path slower than
  // what a channel of this machine moves scales every protocol's bandwidth down by the
  // ratio; a faster one changes nothing (the bytes still move at this machine's speed).
  // `mostTold`: the most the search gives a channel; where a channel moves more, a path at
  // that rate is full speed (the ratio is to it).
  void setPathBandwidth(double gbs, double mostTold = 0);
  double bandwidthScale() const { return bwScale_; }
  unsigned algoMask() const { return algoMask_; }
  unsigned protoMask() const { return protoMask_; }

 private:
  Plan chooseUncached(Coll coll, size_t bytes) const;
  // The cheapest plan among the algorithms and protocols in the masks; nChannels 0: none.
  struct Priced {
    Plan plan;
    double us;
  };
  Priced cheapest(Coll coll, size_t bytes, unsigned algoMask, unsigned protoMask) const;
  double estimate(Coll coll, Algo a, Proto p, int variant, size_t bytes, int nch) const;
  void forget();
  bool available(Coll coll, Algo a) const;

  int nranks_ = 1, maxChannels_ = 1;
  size_t bytesPerChannel_ = 1;
  bool oversubscribed_ = false;
  bool gpu_ = false;
  bool gpuPointerSteps_ = false;
  int ranksPerHost_ = 0;
  double bwScale_ = 1.0;  // setPathBandwidth
  unsigned algoMask_ = ~0u, protoMask_ = ~0u;
  // Per collective: the last (bytes + 1) << 12 | plan, packed so one atomic word holds it
  // (a communicator may be driven from several threads). 0: nothing remembered.
  mutable std::atomic<uint64_t> last_[(int)Coll::count] = {};
};

}  // namespace mncl
