#include "table.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "dtype.h"

namespace perf {

void printHeader(const Options& opt, int nranks) {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return v && *v ? v : "auto";
  };
  char step[48];  // (nccl-tests' "+N" for -i N, "xF" for -f F)
  if (opt.stepBytes) std::snprintf(step, sizeof(step), "+%zu", opt.stepBytes);
  else std::snprintf(step, sizeof(step), "x%g", opt.factor);
  std::printf("# minincl-perf %s: %d ranks as %s on %s, minBytes %zu maxBytes %zu step: %s, "
              "warmup iters: %d iters: %d, validation: %d, in place: %d, window buffers: %d\n",
              collName(opt.coll), nranks, opt.grouped ? "one thread's groups" : opt.nThreads > 0 ? "threads" : "processes", opt.device.c_str(),
              opt.minBytes, opt.maxBytes, step, opt.warmup, opt.iters, opt.check ? 1 : 0, opt.inPlace ? 1 : 0,
              opt.windowBuffers ? 1 : 0);
  std::printf("# MININCL_ALGO %s, MININCL_PROTO %s, MININCL_NCHANNELS %s; pid %d\n#\n", env("MININCL_ALGO"),
              env("MININCL_PROTO"), env("MININCL_NCHANNELS"), static_cast<int>(getpid()));
  std::printf("#%11s %13s %9s %9s %6s %9s %8s %8s %7s\n", "size", "count", "type", "redop", "root",
              "time", "algbw", "busbw", "#wrong");
  std::printf("#%11s %13s %9s %9s %6s %9s %8s %8s %7s\n", "(B)", "(elements)", "", "", "", "(us)",
              "(GB/s)", "(GB/s)", "");
  std::fflush(stdout);
}

void printRow(const Options& opt, const Shape& shape, double usec, double algbw, double busbw, long long wrong) {
  char wrongText[32];
  if (wrong < 0) std::snprintf(wrongText, sizeof wrongText, "N/A");
  else std::snprintf(wrongText, sizeof wrongText, "%lld", wrong);
  std::printf(" %11zu %13zu %9s %9s %6d %9.2f %8.2f %8.2f %7s\n", shape.bytes, shape.paramCount,
              typeInfo(opt.dtype).name, reduces(opt.coll) ? opName(opt.op) : "none",
              hasRoot(opt.coll) ? opt.root : -1, usec, algbw, busbw, wrongText);
  std::fflush(stdout);
}

void printFooter(const Options& opt, double avgBusbw, long long totalWrong) {
  if (opt.check) std::printf("# Out of bounds values : %lld %s\n", totalWrong, totalWrong ? "FAILED" : "OK");
  std::printf("# Avg bus bandwidth    : %g\n#\n", avgBusbw);
  std::fflush(stdout);
}

}  // namespace perf
