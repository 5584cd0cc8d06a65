// A work item: one collective, or a channel's share of it, as the host plans it and the
// device code runs it.
#pragma once

#include "conn.h"

namespace mncl::dev {

// One collective (or a channel's share of it).
struct DevWork {
  Coll coll;
  Algo algo;
  Proto proto;
  DataType dtype;
  RedOp op;
  // A float avg, which runs as a premulsum by 1/nranks (mncl::asRun): its steps still say avg,
  // so that a peer that called a premulsum is a mismatch, as it was before.
  bool floatAvg;
  int root;
  const void* send;
  void* recv;
  uint64_t count;       // elements per rank block (allgather: send count; reduce_scatter: recv count)
  uint64_t chanOffset;  // this channel's slice of the block, in elements
  uint64_t chanCount;
  int treeIndex;        // tree: which of the two trees this channel uses
  int algoVariant;      // direct allreduce: 0 one-shot, 1 two-shot
  // In place, the operation overwrites this rank's input only with final values, which exist
  // only once every rank's input at their offset has been read (algorithms.h): a step of the
  // input may go as a pointer step although the output overlaps it.
  bool inputReadBeforeOverwritten;
  bool streamOutput;    // CPU: large output, write it with non-temporal stores
  bool readInputThemselves;  // CPU: allgather receivers read our input, not take direct writes
  // CPU, between processes (cross-memory attach; where each wins, see work_plan.cc):
  bool readByKernel;    // receivers may read a sender's untouched input by a kernel copy
  bool writeByKernel;   // senders may write final values into a receiver's output by one
  // premulsum: this rank's scalar, the bits of one element (in the low bytes); or, where
  // scalarAt is set, the element there, read when the operation runs (NCCL's ncclScalarDevice).
  uint64_t scalarBits;
  const void* scalarAt;

  MNCL_HOSTDEV StepInfo info() const {
    StepInfo s{};
    s.count = count;
    s.coll = (uint8_t)coll;
    s.dtype = (uint8_t)dtype;
    s.op = (uint8_t)(floatAvg ? RedOp::avg : op);
    s.algo = (uint8_t)algo;
    s.root = root;
    return s;
  }
};

}  // namespace mncl::dev
