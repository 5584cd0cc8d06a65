#include "work_plan.h"

#include <algorithm>

#include "../../cuda/algorithms.h"
#include "../../cuda/reduce_copy.h"
#include "../core/comm.h"
#include "../core/env.h"
#include "../core/error.h"

namespace mncl {

// Outputs at least this big (per rank) are written with non-temporal stores on the CPU: far
// past the per-core caches they would only evict the FIFOs the operation streams through.
// Measured on a 2-core Intel VM: a gain from 32 MiB on, a loss at 8 MiB. On a 2-core AMD
// EPYC VM copies still gain (windows, 128 MiB allgather and 64 MiB broadcast: 0.6x and 0.7x
// the time) but reductions lose: a 64 MiB allreduce took 0.54x the time unstreamed (windows),
// 0.8x with plain buffers, where 2 of 8 streamed runs took 60-82 ms instead of 13.5-15 (the
// whole run, stalled on the non-temporal stores) and no unstreamed one did. So reductions
// stream on Intel only. MININCL_STREAM_OUTPUT_BYTES, where set, is the size for both.
size_t streamOutputBytes(Coll c) {
  static const auto sizes = [] {
    size_t copies = size_t{32} << 20, reductions = dev::cpuIsIntel() ? copies : kNeverStreamed;
    if (!env::str("MININCL_STREAM_OUTPUT_BYTES").empty()) {
      copies = reductions = (size_t)env::bytes("MININCL_STREAM_OUTPUT_BYTES", 0);
    }
    return std::pair{copies, reductions};
  }();
  return reduces(c) ? sizes.second : sizes.first;
}

void applyStreamStretchesSetting() {
  int64_t n = env::integer("MININCL_STREAM_STRETCHES", (int64_t)dev::defaultStreamStretches());
  MNCL_CHECK(n >= 1 && n <= 16, mnclInvalidArgument,
             "MININCL_STREAM_STRETCHES=" + std::to_string(n) + " is not between 1 and 16");
  dev::useStreamStretches((size_t)n);
}

namespace {

// Which copies between processes may go through the kernel (cross-memory attach; see
// PrimsSimple::pointerToPublish and directWrite): where they beat the FIFO, measured with 2
// processes on a 2-core VM (time against the FIFO's, which streams outputs of 32 MiB and more).
// - Reads of a sender's input. Allgather while its output is below twice the streaming size
//   (32 MiB: 0.67x; 64 MiB: 1.10x, where cached stores lose to streaming ones); broadcast at
//   every size. Reducing receivers (allreduce, reduce_scatter) land the read in their slot,
//   so the copies are as many as through the FIFO, but the sender's core makes none of them
//   and the receiver reads lines nobody has just written: below the streaming size (0.89-0.98x
//   at 128 KiB-16 MiB, allreduce; 0.94-1.01x, reduce_scatter; 32 MiB: 1.00).
// - Writes of final values into a receiver's output: an in-place broadcast root's every other
//   step, so that root and receiver split the copies (32 and 64 MiB: 0.55x and 0.64x with the
//   reads); an out-of-place allreduce below the streaming size (0.65x at 512 KiB, 0.80x at 8
//   and 16 MiB; 32 MiB: 1.25x. In place, 16 MiB: 1.13x; NumPy arrays and torch tensors alike).
// On CPUs other than Intel's, where reductions' outputs are never streamed, reducing
// receivers read and allreduce senders write at every size (a 2-core AMD EPYC VM, against the
// streamed FIFO: 0.65-0.78x the time at 32-256 MiB, allreduce; 0.56-1.00x, reduce_scatter),
// and allgather receivers read at every size too: at 128 MiB the FIFO's streamed copies took
// 2-3.5x as long in 2 of 5 runs (0.9x in the others), the kernel's 15-18 ms in every run.
// Timed in the same moments (bench/paired_paths.py), the FIFO is the faster at 256 KiB-16
// MiB while data moves fast between the cores (0.5-0.95x) and the slower in the VM's periods
// when it does not (1.1-2.1x, inputs rewritten before each call): the kernel's worst case is
// the bounded one (bench/RESULTS.md, twenty-second session).
bool readByKernel(const CollCall& c, size_t recvBytes) {
  bool reducedOnEveryRank = c.coll == Coll::allreduce || c.coll == Coll::reducescatter;
  bool allgatherReads = !dev::cpuIsIntel() || recvBytes < 2 * streamOutputBytes(c.coll);
  return c.coll == Coll::broadcast || (c.coll == Coll::allgather && allgatherReads) ||
         (reducedOnEveryRank && recvBytes < streamOutputBytes(c.coll));
}
bool writeByKernel(const CollCall& c, size_t recvBytes, bool inPlace) {
  return c.coll == Coll::broadcast ||
         (c.coll == Coll::allreduce && !inPlace && recvBytes < streamOutputBytes(c.coll));
}

// Whether an allgather's receivers read each step of a sender's input themselves (a pointer
// step), as a broadcast's do, rather than take a direct write from the sender (window buffers
// or ranks in one process): each core then writes only its own output (out of place; in place,
// a sender with one receiver writes every other step of its own block, as a broadcast root
// does: prims_simple.h). 2 processes with
// window buffers, three runs: 0.58-0.74x the time at 128 KiB, 0.73-0.94x at 512 KiB,
// 0.64-1.02x at 2-8 MiB; ranks as threads alike at 128 KiB-2 MiB. No gain at 32 MiB, where
// outputs are streamed.
bool readInputThemselves(const CollCall& c, size_t recvBytes) {
  return c.coll == Coll::allgather && recvBytes < streamOutputBytes(c.coll);
}

bool overlaps(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bBytes && y < x + aBytes;
}

}  // namespace

P2pSplit p2pSplit(const Comm& comm, size_t bytes, int peer) {
  if (comm.nChannels() == 0) return {1, bytes};
  // (a channel each for every 4 slots of the message: fewer, smaller steps cost more than
  // they spread)
  size_t perChannelBytes = 4 * (size_t)comm.channel(0).dev.sizes.simpleSlotBytes;
  int nch = (int)std::clamp<size_t>(bytes / perChannelBytes, 1, (size_t)comm.nChannels());
  if (comm.onGpu()) {
    // A GPU group's channel ops travel in one kernel argument (dev::kMaxGpuP2pOps): a message
    // takes at most as many channels as let a send and a receive with every peer (an
    // alltoall) fit. (Sender and receiver must split a message alike: the cap depends on the
    // rank count alone.)
    int cap = std::max(1, dev::kMaxGpuP2pOps / (2 * std::max(1, comm.nranks() - 1)));
    nch = std::min(nch, cap);
  }
  int first = comm.p2pSpread() ? (comm.rank() + peer) % comm.nChannels() : 0;  // (the same sum on both ends)
  return {nch, alignedShare(bytes, nch, 1), first};
}

void planP2pOps(Comm& comm, const P2pCall& c, std::vector<std::vector<dev::P2pOp>>& perChannel) {
  size_t bytes = c.count * dataTypeSize(c.dtype);
  P2pSplit split = p2pSplit(comm, bytes, c.peer);
  for (int ch = 0; ch < split.channels; ++ch) {
    dev::P2pOp op{};
    op.isSend = c.isSend;
    op.peer = c.peer;
    op.buf = static_cast<char*>(c.buf) + std::min(bytes, (size_t)ch * split.share);
    op.bytes = split.bytesOn(ch, bytes);
    op.totalBytes = bytes;
    op.dtype = c.dtype;
    op.tag = c.tag;
    op.pointerSteps = !comm.onGpu();  // (never measured on a GPU)
    perChannel[(split.first + ch) % comm.nChannels()].push_back(op);
  }
}

void groupP2pOps(const Comm& comm, std::vector<dev::P2pOp>& ops) {
  auto before = [rank = comm.rank(), n = comm.nranks()](const dev::P2pOp& a, const dev::P2pOp& b) {
    return dev::P2pEngine::connectionOrder(a, rank, n) < dev::P2pEngine::connectionOrder(b, rank, n);
  };
  if (std::is_sorted(ops.begin(), ops.end(), before)) return;  // (most groups: nothing to move)
  if (ops.size() <= 32) {  // (an insertion sort, stable, allocates nothing)
    for (size_t i = 1; i < ops.size(); ++i) {
      for (size_t j = i; j > 0 && before(ops[j], ops[j - 1]); --j) std::swap(ops[j], ops[j - 1]);
    }
    return;
  }
  std::stable_sort(ops.begin(), ops.end(), before);
}

void checkSelfPairs(int rank, const std::vector<const P2pCall*>& sends, const std::vector<const P2pCall*>& recvs) {
  MNCL_CHECK(sends.size() == recvs.size(), mnclInvalidUsage,
        "rank " + std::to_string(rank) + " sends to itself " + std::to_string(sends.size()) +
            " time(s) but receives from itself " + std::to_string(recvs.size()) + " time(s) in this group");
  for (size_t i = 0; i < sends.size(); ++i) {
    const P2pCall& s = *sends[i];
    const P2pCall& r = *recvs[i];
    size_t sb = s.count * dataTypeSize(s.dtype), rb = r.count * dataTypeSize(r.dtype);
    MNCL_CHECK(sb == rb && s.dtype == r.dtype, mnclInvalidUsage,
          "send to self of " + amountOf(sb, s.dtype) + " does not match the recv from self of " + amountOf(rb, r.dtype));
    MNCL_CHECK(s.tag == r.tag, mnclInvalidUsage,
               "send to self with tag " + std::to_string(s.tag) + " does not match the recv from self with tag " +
                   std::to_string(r.tag) + ": a send and its receive pair in the order they are posted");
  }
}

bool copyWithoutPeers(const Comm& comm, const CollCall& c) { return c.count > 0 && comm.nranks() == 1; }

bool scalesWithoutPeers(const Comm& comm, const CollCall& c) {
  return copyWithoutPeers(comm, c) && reduces(c.coll) && c.op == RedOp::premulsum;
}

CollCall asRun(const Comm& comm, const CollCall& c) {
  if (c.op != RedOp::avg || !isFloat(c.dtype) || !reduces(c.coll) || comm.nranks() == 1) return c;
  CollCall run = c;
  run.op = RedOp::premulsum;
  run.scalarBits = floatBitsOf(1.0 / comm.nranks(), c.dtype);
  run.floatAvg = true;
  return run;
}

// What every channel's work item for the call holds: the call itself, all of it.
static dev::DevWork workOfCall(const CollCall& c) {
  dev::DevWork w{};
  w.coll = c.coll;
  w.dtype = c.dtype;
  w.op = c.op;
  w.root = c.root;
  w.send = c.send;
  w.recv = c.recv;
  w.count = c.count;
  w.chanCount = c.count;
  w.scalarBits = c.scalarBits;
  w.scalarAt = c.scalarAt;
  w.floatAvg = c.floatAvg;
  return w;
}

dev::DevWork workWithoutPeers(const CollCall& c) { return workOfCall(c); }

int planCollWorks(Comm& comm, const CollCall& c, std::vector<dev::DevWork>& out) {
  if (comm.nranks() == 1) return 0;
  if (c.count == 0) {
    comm.tuner().choose(c.coll, 0);  // (refuses, as at any count, what MININCL_ALGO / _PROTO leave no algorithm)
    return 0;
  }
  size_t sz = dataTypeSize(c.dtype), bytes = c.count * sz * opBlocks(c.coll, comm.nranks());
  Plan p = c.runtimesOwn ? comm.tuner().chooseForRuntime(c.coll, bytes) : comm.tuner().choose(c.coll, bytes);
  size_t share = alignedShare(c.count, p.nChannels, sz);
  size_t sendBytes = c.count * sz * sendBlocks(c.coll, comm.nranks());
  size_t recvBytes = c.count * sz * recvBlocks(c.coll, comm.nranks());
  bool sendApartFromRecv = !overlaps(c.send, sendBytes, c.recv, recvBytes);
  for (int ch = 0; ch < p.nChannels; ++ch) {
    size_t off = std::min(c.count, (size_t)ch * share);
    dev::DevWork w = workOfCall(c);
    w.algo = p.algo;
    w.proto = p.proto;
    w.chanOffset = off;
    w.chanCount = std::min(share, c.count - off);
    w.treeIndex = ch % 2;
    w.algoVariant = p.variant;
    w.inputReadBeforeOverwritten = inputReadBeforeOverwritten(p.algo, c.coll, p.variant);
    w.streamOutput = !comm.onGpu() && recvBytes >= streamOutputBytes(c.coll);
    w.readByKernel = !comm.onGpu() && readByKernel(c, recvBytes);
    w.writeByKernel = !comm.onGpu() && writeByKernel(c, recvBytes, !sendApartFromRecv);
    w.readInputThemselves = !comm.onGpu() && readInputThemselves(c, recvBytes);
    out.push_back(w);
  }
  return p.nChannels;
}

}  // namespace mncl
