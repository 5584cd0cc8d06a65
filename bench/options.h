// Command-line options of minincl-perf, named as nccl-tests names them.
#pragma once

#include <cstddef>
#include <string>

#include "minincl.h"

namespace perf {

enum class Coll { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AlltoAll, SendRecv, Gather, Scatter };

struct Options {
  Coll coll = Coll::AllReduce;
  int nThreads = 0;             // -t N: ranks as threads of this process
  bool grouped = false;         // -g: with -t N, one thread drives every rank, a group per call
  int nProcs = 0;               // -p N: ranks as processes (fork/exec)
  size_t minBytes = 32 << 20;   // -b
  size_t maxBytes = 32 << 20;   // -e
  double factor = 2.0;          // -f
  size_t stepBytes = 0;         // -i (when set, sizes grow by this increment instead of -f)
  int iters = 20;               // -n
  int warmup = 5;               // -w
  bool check = false;           // -c
  bool inPlace = false;         // -I: the output over the input (nccl-tests' in-place column)
  mnclDataType_t dtype = mnclFloat32;  // -d
  mnclRedOp_t op = mnclSum;     // -o (kPreMulSum: each call creates, uses and destroys one)
  int root = 0;                 // -r
  int average = 1;              // -a: 0 rank 0, 1 mean, 2 min, 3 max over ranks
  std::string algo;             // -A -> MININCL_ALGO
  std::string proto;            // -P -> MININCL_PROTO
  int nChannels = 0;            // -C -> MININCL_NCHANNELS
  std::string device = "cpu";   // -D cpu|cuda
  bool windowBuffers = false;   // -R 1: buffers from mnclCommMemAlloc (nccl-tests' registered buffers)
};

// The collectives with an in-place form: the same buffer (allreduce, broadcast, reduce), or
// the input as this rank's block of the output (allgather) or the output as this rank's
// block of the input (reduce_scatter).
bool hasInPlaceForm(Coll c);

// Parses argv; prints usage and exits on -h or on a bad option.
Options parseOptions(int argc, char** argv);

// "8", "64K", "1M", "1G" (powers of two; a trailing B is ignored) -> bytes.
size_t parseSize(const std::string& text);

const char* collName(Coll c);
// -o premulsum, as Options::op: a pre-multiplied sum, rank r's scalar premulScalar(r)
// (mnclRedOpCreatePreMulSum per call, as nccl-tests does).
constexpr mnclRedOp_t kPreMulSum = mnclNumOps;
inline int premulScalar(int rank) { return rank % 2 + 1; }
const char* opName(mnclRedOp_t op);

}  // namespace perf
