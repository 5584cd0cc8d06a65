// Enqueue: check a call's arguments, plan it, and run it — now, or at the end of a group.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "../../cuda/channel.h"
#include "minincl.h"

#include "../../cuda/dtypes.h"

namespace mncl {

class Comm;
struct LoggedCall;

struct CollCall {
  Coll coll;
  const void* send;
  void* recv;
  size_t count;  // allgather: per-rank send count; reduce_scatter: per-rank recv count
  DataType dtype;
  RedOp op;
  int root;
  void* stream = nullptr;  // GPU: the caller's cudaStream_t (null: the legacy default stream)
  // premulsum: this rank's scalar (see DevWork::scalarBits)
  uint64_t scalarBits = 0;
  const void* scalarAt = nullptr;
  bool floatAvg = false;  // a float avg that runs as this premulsum (see asRun and DevWork::floatAvg)
  bool runtimesOwn = false;  // a barrier: planned by Tuner::chooseForRuntime
};

struct P2pCall {
  bool isSend;
  void* buf;
  size_t count;
  DataType dtype;
  int peer;
  void* stream = nullptr;  // GPU: as CollCall::stream
  int32_t tag = 0;         // must equal the other end's: a send and its receive pair in order
};

// Validate (throwing InvalidArgument / InvalidUsage before anything is written), then run
// the call, or record it if a group is open on this thread.
void enqueueColl(Comm& comm, const CollCall& call);
void enqueueP2p(Comm& comm, const P2pCall& call);
// A send and a recv as one group (MPI_Sendrecv): both checked before either is recorded.
void enqueueSendRecv(Comm& comm, const P2pCall& send, const P2pCall& recv);
// A CPU barrier: an allreduce of one int32 (`word`, in place), logged as a barrier (so that
// a mismatch names it as the caller made it).
void enqueueBarrier(Comm& comm, int32_t* word);
void enqueueAlltoAll(Comm& comm, const void* send, void* recv, size_t count, DataType dtype, void* stream = nullptr);
// `count` elements from every rank into root's recv, rank-major (recv is used at the root
// only); in place when send is the root's block of recv. Scatter: block r of root's send
// (used at the root only) into rank r's recv; in place when recv is the root's block of send.
void enqueueGather(Comm& comm, const void* send, void* recv, size_t count, DataType dtype, int root,
                   void* stream = nullptr);
void enqueueScatter(Comm& comm, const void* send, void* recv, size_t count, DataType dtype, int root,
                    void* stream = nullptr);
// A collective made of sends and receives (exchanges.cc): `calls`, each validated, posted as
// one group (inside the caller's, if one is open) whose first part carries `logged`, the call
// as the caller made it, into the call log.
void enqueueExchange(Comm& comm, const std::vector<P2pCall>& calls, const LoggedCall& logged);

void groupStart();
// Runs everything recorded since the outermost groupStart; after a refused call (see
// groupRefuse), runs none of it and throws that call's error.
void groupEnd();
// A call refused inside this thread's open group (its arguments, or a communicator it cannot
// use) fails the whole group, as NCCL's: one thread driving several ranks would otherwise
// run the other ranks' calls at the group's end and wait for ever for this one.
void groupRefuse(mnclResult_t code, const std::string& why);
bool groupRefused();  // whether this thread's open group refused a call
// Leaves a group without running it (an exception left the block): the outermost one drops
// every recorded call; an inner one makes the outer group's end refuse to run.
void groupDiscard();
// Drops this thread's recorded calls of `comm` (destroyed before its group ended; the
// address only identifies them).
void groupForget(const Comm* comm);
int groupDepth();
// Throws InvalidUsage inside an open group: `what` (split, shrink) blocks until every rank
// joins, so one thread driving several ranks in a group would wait for itself.
void checkNoOpenGroup(const std::string& what);

}  // namespace mncl
