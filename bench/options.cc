#include "options.h"

#include <getopt.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <stdexcept>

#include "dtype.h"

namespace perf {
namespace {

constexpr const char* kCollNames[] = {"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter",
                                      "alltoall",  "sendrecv",  "gather", "scatter"};  // (Coll's order)
// -o's names and the ops they stand for.
struct OpName {
  const char* name;
  mnclRedOp_t op;
};
constexpr OpName kOps[] = {{"sum", mnclSum},         {"prod", mnclProd}, {"max", mnclMax},
                           {"min", mnclMin},         {"avg", mnclAvg},   {"premulsum", kPreMulSum},
                           {"band", mnclBand},       {"bor", mnclBor},   {"bxor", mnclBxor}};

[[noreturn]] void usage(const char* prog, int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: %s [collective] (-t N | -p N) [options]\n"
               "  collective   allreduce (default) | broadcast | reduce | allgather |\n"
               "               reduce_scatter | alltoall | gather | scatter | sendrecv (or -k NAME)\n"
               "  -t N         N ranks as threads of this process (mnclCommInitAll)\n"
               "  -g           with -t N: one thread drives all N ranks, each call a group of\n"
               "               every rank's call (as nccl-tests with -g); ranks on one GPU share\n"
               "               a stream (and then run as one kernel)\n"
               "  -p N         N ranks as processes (fork/exec, unique id through the environment)\n"
               "  -b SIZE      smallest message, e.g. 8, 64K, 1M (default 32M)\n"
               "  -e SIZE      largest message (default 32M)\n"
               "  -f FACTOR    size multiplication factor (default 2)\n"
               "  -i BYTES     size increment instead of a factor\n"
               "  -n N         timed iterations per size (default 20)\n"
               "  -w N         warm-up iterations per size (default 5)\n"
               "  -c 0|1       check results against a host reference (default 0)\n"
               "  -I 0|1       in place: the output over the input (allreduce, broadcast,\n"
               "               reduce: one buffer; allgather, reduce_scatter: a rank's block)\n"
               "  -o OP        sum | prod | max | min | avg | premulsum | band | bor | bxor\n"
               "               (default sum; the bitwise ones on integer types)\n"
               "  -d TYPE      int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2\n"
               "  -r ROOT      root for broadcast, reduce, gather and scatter (default 0)\n"
               "  -a 0|1|2|3   time reported: rank 0 | mean | min | max over ranks (default 1)\n"
               "  -A ALGO      sets MININCL_ALGO (ring, tree, direct)\n"
               "  -P PROTO     sets MININCL_PROTO (simple, ll, ll128)\n"
               "  -C N         sets MININCL_NCHANNELS\n"
               "  -D DEVICE    cpu (default) | cuda\n"
               "  -R 0|1       1: buffers from mnclCommMemAlloc, in each rank's window, which its\n"
               "               peers map (nccl-tests' registered buffers; CPU ranks; sets\n"
               "               MININCL_WINDOW_BYTES to hold them where it is unset)\n",
               prog);
  std::exit(code);
}

// A wrong argument: one line naming it (the usage text would bury it), exit status 2.
[[noreturn]] void fail(const char* prog, const std::string& why) {
  const char* slash = std::strrchr(prog, '/');
  const char* name = slash ? slash + 1 : prog;
  std::fprintf(stderr, "%s: %s (%s --help lists the options)\n", name, why.c_str(), name);
  std::exit(2);
}

Coll parseColl(const char* name, const char* prog) {
  for (int i = 0; i < (int)std::size(kCollNames); ++i) {
    if (std::strcmp(name, kCollNames[i]) == 0) return static_cast<Coll>(i);
  }
  fail(prog, std::string("unknown collective '") + name + "'");
}

}  // namespace

const char* collName(Coll c) { return kCollNames[static_cast<int>(c)]; }
const char* opName(mnclRedOp_t op) {
  for (const OpName& o : kOps) {
    if (o.op == op) return o.name;
  }
  return "?";
}

size_t parseSize(const std::string& text) {
  std::string t = text;
  if (!t.empty() && (t.back() == 'B' || t.back() == 'b')) t.pop_back();
  if (t.empty()) throw std::invalid_argument("empty size");
  size_t unit = 1;
  switch (t.back()) {
    case 'K': case 'k': unit = size_t{1} << 10; break;
    case 'M': case 'm': unit = size_t{1} << 20; break;
    case 'G': case 'g': unit = size_t{1} << 30; break;
    default: break;
  }
  if (unit != 1) t.pop_back();
  size_t used = 0;
  double value = -1;
  try {
    value = std::stod(t, &used);
  } catch (const std::exception&) {  // (its what() says only "stod")
  }
  if (used != t.size() || !(value >= 0 && value < 1e18)) {  // (also NaN and inf, which stod reads)
    throw std::invalid_argument("'" + text + "' is not a size such as 8, 64K or 1M");
  }
  double bytes = value * static_cast<double>(unit);  // (checked with its unit: 1e17G wrapped to 0)
  if (!(bytes < 1e18)) throw std::invalid_argument("'" + text + "' is more bytes than a size can be");
  return static_cast<size_t>(bytes);
}

namespace {
// A number ("1.5abc" is not 1.5).
double parseNumber(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(value)) throw std::invalid_argument("'" + text + "' is not a number");
  return value;
}

// A whole integer from `lo` to `hi` ("3abc" is not 3).
int parseInt(const std::string& text, int lo, int hi) {
  size_t used = 0;
  long value = 0;
  try {
    value = std::stol(text, &used);
  } catch (const std::exception&) {  // (its what() says only "stol")
    used = 0;
  }
  if (used == 0 || used != text.size()) throw std::invalid_argument("'" + text + "' is not an integer");
  if (value < lo || value > hi) {
    throw std::invalid_argument(text + " is not from " + std::to_string(lo) + " to " + std::to_string(hi));
  }
  return static_cast<int>(value);
}
}  // namespace

bool hasInPlaceForm(Coll c) {
  return c == Coll::AllReduce || c == Coll::Broadcast || c == Coll::Reduce || c == Coll::AllGather ||
         c == Coll::ReduceScatter;
}

Options parseOptions(int argc, char** argv) {
  Options o;
  const char* prog = argv[0];
  int first = 1;
  if (argc > 1 && argv[1][0] != '-') {
    o.coll = parseColl(argv[1], prog);
    first = 2;
  }
  // getopt starts at optind; skip the positional collective.
  optind = first;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0) usage(prog, 0);  // (getopt takes short options only)
  }
  int c;
  try {
    while ((c = getopt(argc, argv, "hgk:t:p:b:e:f:i:n:w:c:I:o:d:r:a:A:P:C:D:R:")) != -1) {
      std::string arg = optarg ? optarg : "";
      switch (c) {
        case 'k': o.coll = parseColl(optarg, prog); break;
        case 't': o.nThreads = parseInt(arg, 1, 1 << 16); break;
        case 'g': o.grouped = true; break;
        case 'p': o.nProcs = parseInt(arg, 1, 1 << 16); break;
        case 'b': o.minBytes = parseSize(arg); break;
        case 'e': o.maxBytes = parseSize(arg); break;
        case 'f': o.factor = parseNumber(arg); break;
        case 'i': o.stepBytes = parseSize(arg); break;
        case 'n': o.iters = parseInt(arg, 1, 1 << 30); break;
        case 'w': o.warmup = parseInt(arg, 0, 1 << 30); break;
        case 'c': o.check = parseInt(arg, 0, 1) != 0; break;
        case 'I': o.inPlace = parseInt(arg, 0, 1) != 0; break;
        case 'r': o.root = parseInt(arg, 0, 1 << 16); break;
        case 'a': o.average = parseInt(arg, 0, 3); break;
        case 'A': o.algo = arg; break;
        case 'P': o.proto = arg; break;
        case 'C': o.nChannels = parseInt(arg, 1, 64); break;
        case 'D': o.device = arg; break;
        case 'R': o.windowBuffers = parseInt(arg, 0, 1) != 0; break;
        case 'o': {
          bool found = false;
          for (const OpName& op : kOps) {
            if (arg == op.name) { o.op = op.op; found = true; }
          }
          if (!found) fail(prog, "-o: unknown op '" + arg + "'");
          break;
        }
        case 'd': {
          const TypeInfo* t = findType(arg);
          if (!t) fail(prog, "-d: unknown type '" + arg + "'");
          o.dtype = t->type;
          break;
        }
        case 'h': usage(prog, 0);
        default: fail(prog, "unknown option or missing value");  // (getopt has named it)
      }
    }
  } catch (const std::exception& e) {
    fail(prog, std::string("bad value for -") + static_cast<char>(c) + ": " + e.what());
  }
  if (optind < argc) fail(prog, std::string("unexpected argument '") + argv[optind] + "'");
  if ((o.nThreads > 0) == (o.nProcs > 0)) fail(prog, "give exactly one of -t N (threads) or -p N (processes)");
  if (o.grouped && o.nThreads == 0) fail(prog, "-g goes with -t N (ranks of this process)");
  if (o.inPlace && !hasInPlaceForm(o.coll)) {
    fail(prog, std::string("-I 1: ") + collName(o.coll) +
                   " has no in-place form here (allreduce, broadcast, reduce, allgather and reduce_scatter do)");
  }
  bool ofSends = o.coll == Coll::AlltoAll || o.coll == Coll::Gather || o.coll == Coll::Scatter || o.coll == Coll::SendRecv;
  if (ofSends && (!o.algo.empty() || !o.proto.empty())) {
    // (as `minincl bench` refuses them; and the run's own timing allreduce would take them)
    fail(prog, std::string(o.algo.empty() ? "-P " + o.proto : "-A " + o.algo) + ": " + collName(o.coll) +
                   " runs as sends and receives, which have no algorithm or protocol to choose");
  }
  if (o.maxBytes < o.minBytes) {
    fail(prog, "-b " + std::to_string(o.minBytes) + " is larger than -e " + std::to_string(o.maxBytes));
  }
  if (o.stepBytes == 0 && o.factor <= 1.0) fail(prog, "-f must be above 1 (or give -i BYTES)");
  bool bitwise = o.op == mnclBand || o.op == mnclBor || o.op == mnclBxor;
  if (bitwise && typeInfo(o.dtype).isFloat) {
    fail(prog, std::string("-o band / bor / bxor combine integers bit by bit; -d ") + typeInfo(o.dtype).name +
                   " is a float type");
  }
  if (o.windowBuffers && o.device != "cpu") fail(prog, "-R 1: windows are for CPU ranks (-D cpu)");
  int n = o.nThreads > 0 ? o.nThreads : o.nProcs;
  if (o.root >= n) fail(prog, "-r " + std::to_string(o.root) + " is not a rank of " + std::to_string(n));
  return o;
}

}  // namespace perf
