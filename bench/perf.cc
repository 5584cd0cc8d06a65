// minincl-perf: nccl-tests' measurement on minincl's C API.
//
//   minincl-perf allreduce -t 2 -b 8 -e 256M -f 4 -c 1
//   minincl-perf broadcast -p 4 -b 1K -e 64M -P ll128
//
// Each rank allocates its buffers once at the largest size, then for every size: fills its
// input, runs -w warm-up calls, lines the ranks up, times -n calls, and (with -c 1) runs once
// more and checks the output against a host reference. Times and wrong counts are combined
// across ranks with minincl's own sends and receives, so threads and processes take the same
// path.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <stdexcept>
#include <vector>

#include "check.h"
#include "collective.h"
#include "device.h"
#include "dtype.h"
#include "launcher.h"
#include "options.h"
#include "table.h"

namespace perf {
namespace {

// The sizes -b, -e and -f (or -i) name, each once as its row reports it (rounded down to whole
// elements per rank: -f 1.01 from 8 named 8 four times), less those too small to hold one
// element per rank (they would repeat the 0-byte row); -b 0 itself is a row: the cost of a
// call that moves nothing.
std::vector<size_t> rowSizes(const Options& opt, int nranks) {
  size_t typeSize = typeInfo(opt.dtype).size;
  std::vector<size_t> out;
  for (size_t s = opt.minBytes; s <= opt.maxBytes;) {
    Shape shape = shapeFor(opt.coll, s, typeSize, nranks);
    bool again = !out.empty() && shapeFor(opt.coll, out.back(), typeSize, nranks).bytes == shape.bytes;
    if ((s == 0 || shape.paramCount > 0) && !again) out.push_back(s);
    // (In double: a step past -e, even past 2^64, ends the list rather than wrap around.)
    double next = opt.stepBytes ? static_cast<double>(s) + static_cast<double>(opt.stepBytes)
                                : static_cast<double>(s) * opt.factor;
    if (next > static_cast<double>(opt.maxBytes)) break;
    s = std::max(static_cast<size_t>(next), s + 1);
  }
  return out;
}

// Small cross-rank reductions: rank 0 gathers the values and sends the result back, through
// sends and receives staged in device memory. Those take no algorithm or protocol, so the
// run's own bookkeeping works whatever MININCL_ALGO / MININCL_PROTO leave the measured
// collective (direct allows no allreduce on 10 ranks, yet alltoall runs there).
class Scalars {
 public:
  Scalars(Device& dev, mnclComm_t comm, int rank, int nranks)
      : dev_(dev), comm_(comm), rank_(rank), nranks_(nranks), buf_(dev, 16) {}

  double reduce(double value, mnclRedOp_t op) {
    if (rank_ != 0) return sendToRoot(value);
    for (int p = 1; p < nranks_; ++p) {
      double v = recvFrom<double>(p);
      value = op == mnclMin ? std::min(value, v) : op == mnclMax ? std::max(value, v) : value + v;
    }
    return broadcast(value);
  }
  double broadcast(double value) { return broadcastFromRoot(value); }
  unsigned long long sum(unsigned long long value) {
    if (rank_ != 0) return sendToRoot(value);
    for (int p = 1; p < nranks_; ++p) value += recvFrom<unsigned long long>(p);
    return broadcastFromRoot(value);
  }
  void barrier() { reduce(0.0, mnclSum); }

 private:
  template <typename T>
  T sendToRoot(T value) {
    sendTo(0, value);
    return recvFrom<T>(0);
  }
  template <typename T>
  T broadcastFromRoot(T value) {
    if (rank_ != 0) return recvFrom<T>(0);
    for (int p = 1; p < nranks_; ++p) sendTo(p, value);
    return value;
  }
  template <typename T>
  void sendTo(int peer, T value) {
    dev_.copyFromHost(buf_.data(), &value, sizeof value);
    call(mnclSend(buf_.data(), sizeof value, mnclUint8, peer, comm_, dev_.stream()), "timing send");
  }
  template <typename T>
  T recvFrom(int peer) {
    T value;
    call(mnclRecv(buf_.data(), sizeof value, mnclUint8, peer, comm_, dev_.stream()), "timing receive");
    dev_.copyToHost(&value, buf_.data(), sizeof value);
    return value;
  }
  void call(mnclResult_t rc, const char* what) {
    if (rc != mnclSuccess) {
      throw std::runtime_error(std::string(what) + ": " + mnclGetErrorString(rc) + " (" + mnclGetLastError(comm_) + ")");
    }
    dev_.synchronize();
  }
  Device& dev_;
  mnclComm_t comm_;
  int rank_, nranks_;
  Buffer buf_;
};

// The time -a asks for: rank 0's, the mean, the minimum or the maximum over ranks.
double combineTime(Scalars& scalars, double seconds, int average, int nranks) {
  switch (average) {
    case 0: return scalars.broadcast(seconds);
    case 2: return scalars.reduce(seconds, mnclMin);
    case 3: return scalars.reduce(seconds, mnclMax);
    default: return scalars.reduce(seconds, mnclSum) / nranks;
  }
}

// Where a rank's input and output lie for one size: its two buffers, or in place (-I 1) one
// over the other, in the buffer of the larger: the output's block `rank` holds the input
// (allgather), the input's block `rank` is the output (reduce_scatter), or they are one.
struct CallBuffers {
  void* send;
  void* recv;
};
CallBuffers callBuffers(const Options& opt, const Shape& shape, Buffer& send, Buffer& recv, int rank, size_t typeSize) {
  if (!opt.inPlace) return {send.data(), recv.data()};
  char* whole = static_cast<char*>(opt.coll == Coll::ReduceScatter ? send.data() : recv.data());
  size_t sendAt = opt.coll == Coll::AllGather ? rank * shape.sendCount * typeSize : 0;
  size_t recvAt = opt.coll == Coll::ReduceScatter ? rank * shape.recvCount * typeSize : 0;
  return {whole + sendAt, whole + recvAt};
}

// Before a checked call: the output poisoned (a value that was not written shows), then the
// input in place (in place, over the poison and the timed calls' results).
void prepareCheck(Device& dev, const CallBuffers& b, const Shape& shape, size_t typeSize, const std::vector<char>& input) {
  std::vector<char> poison(shape.recvCount * typeSize, static_cast<char>(0x5a));
  dev.copyFromHost(b.recv, poison.data(), poison.size());
  dev.copyFromHost(b.send, input.data(), shape.sendCount * typeSize);
}

int runRank(const Options& opt, mnclComm_t& comm, int rank, int nranks) {
  try {
    std::unique_ptr<Device> dev = makeDevice(opt.device, rank);
    size_t typeSize = typeInfo(opt.dtype).size;
    Shape largest = shapeFor(opt.coll, opt.maxBytes, typeSize, nranks);
    // Shapes only grow with size, so the largest fixes both buffers.
    mnclComm_t windowOf = opt.windowBuffers ? comm : nullptr;
    Buffer send(*dev, largest.sendCount * typeSize, windowOf), recv(*dev, largest.recvCount * typeSize, windowOf);
    std::vector<char> hostSend(send.bytes()), hostRecv(opt.check ? recv.bytes() : 0);
    Scalars scalars(*dev, comm, rank, nranks);
    if (rank == 0) printHeader(opt, nranks);

    double busbwTotal = 0;
    int rows = 0;
    long long wrongTotal = 0;
    for (size_t bytes : rowSizes(opt, nranks)) {
      Shape shape = shapeFor(opt.coll, bytes, typeSize, nranks);
      CallBuffers args = callBuffers(opt, shape, send, recv, rank, typeSize);
      fillInput(opt, shape, rank, hostSend.data());
      dev->copyFromHost(args.send, hostSend.data(), shape.sendCount * typeSize);
      auto once = [&] {
        mnclResult_t rc = runCollective(opt, shape, args.send, args.recv, comm, dev->stream(), rank, nranks);
        if (rc != mnclSuccess) {
          throw std::runtime_error(std::string(collName(opt.coll)) + " of " + std::to_string(shape.bytes) +
                                   " B: " + mnclGetErrorString(rc) + " (" + mnclGetLastError(comm) + ")");
        }
      };
      for (int i = 0; i < opt.warmup; ++i) once();
      dev->synchronize();
      scalars.barrier();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < opt.iters; ++i) once();
      dev->synchronize();
      double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / opt.iters;
      seconds = combineTime(scalars, seconds, opt.average, nranks);

      long long wrong = -1;
      if (opt.check) {
        prepareCheck(*dev, args, shape, typeSize, hostSend);
        once();
        dev->synchronize();
        dev->copyToHost(hostRecv.data(), args.recv, shape.recvCount * typeSize);
        wrong = static_cast<long long>(scalars.sum(countWrong(opt, shape, rank, nranks, hostRecv.data())));
        wrongTotal += wrong;
      }
      double algbw = static_cast<double>(shape.bytes) / seconds / 1e9;
      double busbw = algbw * busFactor(opt.coll, nranks);
      busbwTotal += busbw;
      ++rows;
      if (rank == 0) printRow(opt, shape, seconds * 1e6, algbw, busbw, wrong);
    }
    if (rank == 0) printFooter(opt, rows ? busbwTotal / rows : 0.0, wrongTotal);
    return wrongTotal ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "minincl-perf: rank %d: %s\n", rank, e.what());
    mnclCommAbort(comm);  // the peers stop instead of waiting for this rank; frees comm
    comm = nullptr;
    return 2;
  }
}

// -t N -g: every call is a group of all N ranks' calls, made by this one thread. Ranks on
// one device share the first one's stream (one caller stream: minincl runs them as one
// kernel); the time is this thread's, from the first call queued to the last one finished.
int runGrouped(const Options& opt, std::vector<mnclComm_t>& comms) {
  int n = (int)comms.size();
  try {
    std::vector<std::unique_ptr<Device>> devs;
    std::vector<void*> streams;
    for (int r = 0; r < n; ++r) {
      devs.push_back(makeDevice(opt.device, r));
      int same = 0;
      while (devs[same]->mnclDevice() != devs[r]->mnclDevice()) ++same;
      streams.push_back(devs[same]->stream());
    }
    auto syncAll = [&] {
      for (auto& d : devs) d->synchronize();
    };
    size_t typeSize = typeInfo(opt.dtype).size;
    Shape largest = shapeFor(opt.coll, opt.maxBytes, typeSize, n);
    std::vector<std::unique_ptr<Buffer>> sends, recvs;
    for (int r = 0; r < n; ++r) {
      mnclComm_t windowOf = opt.windowBuffers ? comms[r] : nullptr;
      sends.push_back(std::make_unique<Buffer>(*devs[r], largest.sendCount * typeSize, windowOf));
      recvs.push_back(std::make_unique<Buffer>(*devs[r], largest.recvCount * typeSize, windowOf));
    }
    std::vector<char> host(std::max(sends[0]->bytes(), recvs[0]->bytes()));
    printHeader(opt, n);
    double busbwTotal = 0;
    int rows = 0;
    long long wrongTotal = 0;
    for (size_t bytes : rowSizes(opt, n)) {
      Shape shape = shapeFor(opt.coll, bytes, typeSize, n);
      std::vector<CallBuffers> args;
      std::vector<std::vector<char>> inputs(n, std::vector<char>(shape.sendCount * typeSize));
      for (int r = 0; r < n; ++r) {
        args.push_back(callBuffers(opt, shape, *sends[r], *recvs[r], r, typeSize));
        fillInput(opt, shape, r, inputs[r].data());
        devs[r]->copyFromHost(args[r].send, inputs[r].data(), inputs[r].size());
      }
      auto once = [&] {
        mnclResult_t rc = mnclGroupStart();
        for (int r = 0; r < n && rc == mnclSuccess; ++r) {
          rc = runCollective(opt, shape, args[r].send, args[r].recv, comms[r], streams[r], r, n);
        }
        mnclResult_t end = mnclGroupEnd();
        if (rc == mnclSuccess) rc = end;
        if (rc != mnclSuccess) {
          throw std::runtime_error(std::string(collName(opt.coll)) + " of " + std::to_string(shape.bytes) +
                                   " B: " + mnclGetErrorString(rc) + " (" + mnclGetLastError(nullptr) + ")");
        }
      };
      for (int i = 0; i < opt.warmup; ++i) once();
      syncAll();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < opt.iters; ++i) once();
      syncAll();
      double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / opt.iters;
      long long wrong = -1;
      if (opt.check) {
        for (int r = 0; r < n; ++r) prepareCheck(*devs[r], args[r], shape, typeSize, inputs[r]);
        once();
        syncAll();
        wrong = 0;
        for (int r = 0; r < n; ++r) {
          devs[r]->copyToHost(host.data(), args[r].recv, shape.recvCount * typeSize);
          wrong += static_cast<long long>(countWrong(opt, shape, r, n, host.data()));
        }
        wrongTotal += wrong;
      }
      double algbw = static_cast<double>(shape.bytes) / seconds / 1e9;
      double busbw = algbw * busFactor(opt.coll, n);
      busbwTotal += busbw;
      ++rows;
      printRow(opt, shape, seconds * 1e6, algbw, busbw, wrong);
    }
    printFooter(opt, rows ? busbwTotal / rows : 0.0, wrongTotal);
    return wrongTotal ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "minincl-perf: %s\n", e.what());
    for (mnclComm_t& c : comms) mnclCommAbort(c);
    comms.clear();
    return 2;
  }
}

// Refuses sizes whose buffers (each rank's send and receive buffers, and the host copies
// it fills and checks them through) would not fit this machine's memory, before any rank
// allocates them: otherwise -e 64G ends in an allocation failure, or the OOM killer.
// What runRank holds at once: the host input (hostSend); with -c 1 also the host output
// (hostRecv) and, while a check runs, the poison it writes first (a third copy of the
// output); on the CPU the device buffers, send and recv, are host memory too.
bool fitsInMemory(const Options& opt, int nranks) {
  size_t typeSize = typeInfo(opt.dtype).size;
  Shape largest = shapeFor(opt.coll, opt.maxBytes, typeSize, nranks);
  double send = static_cast<double>(largest.sendCount * typeSize);
  double recv = static_cast<double>(largest.recvCount * typeSize);
  double perRank = send + (opt.check ? 2 * recv : 0);
  if (opt.device == "cpu") perRank += send + recv;
  double need = perRank * nranks;
  double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (have <= 0 || need <= have) return true;
  std::fprintf(stderr, "minincl-perf: -e %zu (%.1f GiB) needs about %.1f GiB of buffers for %d ranks; this machine has %.1f GiB\n",
               opt.maxBytes, static_cast<double>(opt.maxBytes) / (1 << 30), need / (1 << 30), nranks, have / (1 << 30));
  return false;
}

// -R 1: each rank's window holds its two buffers, unless MININCL_WINDOW_BYTES says otherwise
// (the rank processes inherit it).
void sizeWindows(const Options& opt, int nranks) {
  const char* set = std::getenv("MININCL_WINDOW_BYTES");
  if (set && *set) return;
  size_t typeSize = typeInfo(opt.dtype).size;
  Shape largest = shapeFor(opt.coll, opt.maxBytes, typeSize, nranks);
  auto pages = [](size_t bytes) { return (bytes + 4095) / 4096 * 4096; };
  size_t bytes = pages(largest.sendCount * typeSize) + pages(largest.recvCount * typeSize) + 4096;
  setenv("MININCL_WINDOW_BYTES", std::to_string(bytes).c_str(), 1);
}

}  // namespace
}  // namespace perf

int main(int argc, char** argv) {
  using namespace perf;
  Options opt = parseOptions(argc, argv);
  applyEnvironment(opt);
  int nranks = opt.nThreads > 0 ? opt.nThreads : opt.nProcs;
  if (rowSizes(opt, nranks).empty()) {
    const TypeInfo& type = typeInfo(opt.dtype);
    size_t least = type.size;  // the smallest size with an element for every rank
    while (shapeFor(opt.coll, least, type.size, nranks).paramCount == 0) least += type.size;
    std::fprintf(stderr, "minincl-perf: no size from -b %zu to -e %zu holds a whole %s element per rank for %s on %d ranks (it takes %zu B)\n",
                 opt.minBytes, opt.maxBytes, type.name, collName(opt.coll), nranks, least);
    return 2;
  }
  if (!fitsInMemory(opt, nranks)) return 2;
  if (opt.windowBuffers) sizeWindows(opt, nranks);
  RankMain rankMain = [&opt](mnclComm_t& comm, int rank, int nranks) { return runRank(opt, comm, rank, nranks); };
  try {
    if (opt.grouped) return runOneThread(opt, [&opt](std::vector<mnclComm_t>& comms) { return runGrouped(opt, comms); });
    return opt.nThreads > 0 ? runThreads(opt, rankMain) : runProcesses(opt, argv, rankMain);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "minincl-perf: %s\n", e.what());
    return 1;
  }
}
