// The collectives made of sends and receives (alltoall, gather, scatter): each checks its
// arguments, then posts its parts as one group (enqueueExchange) that the call logs carry as
// the collective the caller made.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../core/call_log.h"
#include "../core/comm.h"
#include "../core/error.h"
#include "enqueue.h"
#include "validate.h"

namespace mncl {

namespace {
// The parts of this thread's exchange, kept from call to call: a call allocates nothing.
std::vector<P2pCall>& partsOfExchange() {
  thread_local std::vector<P2pCall> parts;
  parts.clear();
  return parts;
}
}  // namespace

void enqueueAlltoAll(Comm& comm, const void* send, void* recv, size_t count, DataType dtype, void* stream) {
  checkUsable(comm);
  checkTypeOp(dtype, RedOp::sum, false);
  checkBytes("alltoall", count, dtype, (size_t)comm.nranks());
  size_t bytes = count * dataTypeSize(dtype);
  MNCL_CHECK(!(comm.onGpu() && send == recv && bytes), mnclInvalidUsage,
             "in-place alltoall on a CUDA communicator: pass a separate recv buffer");
  MNCL_CHECK(count == 0 || (send && recv), mnclInvalidArgument, "alltoall: a buffer is null");
  size_t total = bytes * (size_t)comm.nranks();
  auto s = (uintptr_t)send, r = (uintptr_t)recv;
  MNCL_CHECK(s == r || !(s < r + total && r < s + total), mnclInvalidArgument,
             "alltoall: the send and receive buffers overlap without being the same buffer (in place); use separate buffers");
  // In place, a block could be overwritten before it is sent: the other ranks' blocks go
  // from a copy (ours stays where it is), in memory the communicator keeps.
  bool inPlace = send == recv && bytes;
  MNCL_CHECK(!inPlace || groupDepth() == 0, mnclInvalidUsage,
             "in-place alltoall inside a group is not supported: use a separate receive buffer");
  int me = comm.rank();
  std::vector<P2pCall>& calls = partsOfExchange();
  for (int p = 0; p < comm.nranks(); ++p) {
    calls.push_back({true, (char*)send + (size_t)p * bytes, count, dtype, p, stream});
    calls.push_back({false, (char*)recv + (size_t)p * bytes, count, dtype, p, stream});
  }
  for (const P2pCall& c : calls) validate(comm, c);
  if (inPlace) {
    std::vector<char>& copy = comm.alltoallScratch();
    copy.resize(bytes * (comm.nranks() - 1));
    for (int p = 0; p < comm.nranks(); ++p) {
      if (p == me) continue;
      char* copied = copy.data() + (size_t)(p - (p > me)) * bytes;
      std::memcpy(copied, calls[2 * p].buf, bytes);
      calls[2 * p].buf = copied;
    }
  }
  enqueueExchange(comm, calls, {kAlltoallCall, (uint8_t)dtype, 0, 0, count});
}

namespace {

// Gather's and scatter's checks (see enqueueRootedExchange); whether the root's call is in place.
bool checkRootedExchange(Comm& comm, bool gather, const void* blocks, const void* own, size_t count, DataType dtype,
                         int root) {
  std::string what = gather ? "gather" : "scatter";
  checkUsable(comm);
  checkTypeOp(dtype, RedOp::sum, false);
  int n = comm.nranks();
  checkBytes(what.c_str(), count, dtype, (size_t)n);
  MNCL_CHECK(root >= 0 && root < n, mnclInvalidArgument,
             what + ": root " + std::to_string(root) + " is out of range for " + std::to_string(n) + " ranks");
  size_t bytes = count * dataTypeSize(dtype);
  bool atRoot = comm.rank() == root;
  const char *ownName = gather ? "send" : "receive", *blocksName = gather ? "receive" : "send";
  MNCL_CHECK(!bytes || own, mnclInvalidArgument, what + ": the " + ownName + " buffer is null");
  MNCL_CHECK(!bytes || !atRoot || blocks, mnclInvalidArgument,
             what + ": the " + blocksName + " buffer is null on the root (rank " + std::to_string(root) + ")");
  auto b = (uintptr_t)blocks, o = (uintptr_t)own;
  bool inPlace = atRoot && bytes && o == b + root * bytes;
  bool overlap = atRoot && bytes && o < b + bytes * n && b < o + bytes;
  MNCL_CHECK(!overlap || inPlace, mnclInvalidArgument,
             what + ": the send and receive buffers overlap without being in place; in place, " +
                 (gather ? "send is the root's block of recv (recv + root * count)"
                         : "recv is the root's block of send (send + root * count)") +
                 "; otherwise use separate buffers");
  return inPlace;
}

// Gather and scatter: the root exchanges a block with every rank (itself included: a copy on
// its channels), every other rank one block with the root. `blocks` is the root's buffer of
// nranks blocks (a gather's recv, a scatter's send), `own` a rank's one block (a gather's
// send, a scatter's recv). In place, `own` is the root's block of `blocks`: it stays there.
void enqueueRootedExchange(Comm& comm, bool gather, const void* blocks, const void* own, size_t count, DataType dtype,
                           int root, void* stream) {
  bool inPlace = checkRootedExchange(comm, gather, blocks, own, count, dtype, root);
  bool atRoot = comm.rank() == root;
  size_t bytes = count * dataTypeSize(dtype);
  // (Every send and receive checked before the call is logged and any of them recorded.)
  std::vector<P2pCall>& calls = partsOfExchange();
  auto post = [&](bool isSend, const void* buf, int peer) {
    calls.push_back({isSend, const_cast<void*>(buf), count, dtype, peer, stream});
    validate(comm, calls.back());
  };
  if (!atRoot) post(gather, own, root);
  for (int p = 0; p < comm.nranks() && atRoot; ++p) {
    const char* block = (const char*)blocks + (size_t)p * bytes;
    if (p != root) {
      post(!gather, block, p);
    } else if (!inPlace) {
      post(true, gather ? own : block, root);
      post(false, gather ? block : own, root);
    }
  }
  enqueueExchange(comm, calls, {gather ? kGatherCall : kScatterCall, (uint8_t)dtype, 0, root, count});
}

}  // namespace

void enqueueGather(Comm& comm, const void* send, void* recv, size_t count, DataType dtype, int root, void* stream) {
  enqueueRootedExchange(comm, true, recv, send, count, dtype, root, stream);
}

void enqueueScatter(Comm& comm, const void* send, void* recv, size_t count, DataType dtype, int root, void* stream) {
  enqueueRootedExchange(comm, false, send, recv, count, dtype, root, stream);
}

}  // namespace mncl
