#include "validate.h"

#include <cstdint>
#include <string>

#include "../core/comm.h"
#include "../core/error.h"

namespace mncl {

namespace {

// Buffers that overlap are in place only as NCCL lays them out: the same address (allreduce,
// broadcast, reduce), or this rank's block of the bigger buffer (allgather, reduce_scatter).
// Any other overlap would read what the call already wrote.
void checkOverlap(Comm& comm, const CollCall& c) {
  int me = comm.rank();
  bool sendUsed = c.coll != Coll::broadcast || me == c.root, recvUsed = c.coll != Coll::reduce || me == c.root;
  if (c.count == 0 || !c.send || !c.recv || !sendUsed || !recvUsed) return;
  size_t bytes = c.count * dataTypeSize(c.dtype), n = (size_t)comm.nranks();
  auto s = (uintptr_t)c.send, r = (uintptr_t)c.recv;
  size_t sendBytes = bytes * sendBlocks(c.coll, (int)n), recvBytes = bytes * recvBlocks(c.coll, (int)n);
  bool inPlace = c.coll == Coll::allgather       ? s == r + me * bytes
                 : c.coll == Coll::reducescatter ? r == s + me * bytes
                                                 : s == r;
  bool overlap = s < r + recvBytes && r < s + sendBytes;
  MNCL_CHECK(!overlap || inPlace, mnclInvalidArgument,
             std::string(collName(c.coll)) + ": the send and receive buffers overlap (send - recv = " +
                 std::to_string((intptr_t)(s - r)) + " bytes) without being in place; in place, " +
                 (c.coll == Coll::allgather       ? "send is this rank's block of recv (recv + rank * count)"
                  : c.coll == Coll::reducescatter ? "recv is this rank's block of send (send + rank * count)"
                                                  : "send and recv are the same buffer") +
                 "; otherwise use separate buffers");
}

}  // namespace

// Inside a CPU group, the group's end says that the communicator failed instead: it runs the
// calls on the group's other communicators, as the peers do, who may not know of the failure
// yet. (Refused here, the call would refuse the whole group on this rank alone, and the
// peers' calls on a healthy communicator would pair with this rank's next ones.)
void checkUsable(Comm& comm) {
  if (comm.failed() && (groupDepth() == 0 || comm.onGpu())) comm.throwStoredError();
}

void checkTypeOp(DataType t, RedOp op, bool reduces) {
  MNCL_CHECK((unsigned)t < (unsigned)DataType::count, mnclInvalidArgument,
        "unknown data type " + std::to_string((int)t));
  if (!reduces) return;
  MNCL_CHECK((unsigned)op < (unsigned)RedOp::count, mnclInvalidArgument, "unknown reduction op " + std::to_string((int)op));
  MNCL_CHECK(!isBitwise(op) || !isFloat(t), mnclInvalidArgument,
             std::string(redOpName(op)) + " combines integers bit by bit; the data is " + dataTypeName(t));
}

// `count` elements of `t`, `blocks` times (a rank's block for each rank, where a buffer holds
// one), must be a size a buffer can have: a product that wraps around would pass every other
// check and copy a few elements, or none.
void checkBytes(const char* what, size_t count, DataType t, size_t blocks) {
  size_t limit = (size_t)PTRDIFF_MAX / dataTypeSize(t) / blocks;
  MNCL_CHECK(count <= limit, mnclInvalidArgument,
             std::string(what) + ": count " + std::to_string(count) + " of " + dataTypeName(t) +
                 (blocks > 1 ? " (x " + std::to_string(blocks) + " ranks)" : std::string()) +
                 " is more bytes than a buffer can hold (at most " + std::to_string(limit) + " elements)");
}

void validate(Comm& comm, const CollCall& c) {
  checkUsable(comm);
  checkTypeOp(c.dtype, c.op, reduces(c.coll));
  if (c.coll == Coll::broadcast || c.coll == Coll::reduce) {
    MNCL_CHECK(c.root >= 0 && c.root < comm.nranks(), mnclInvalidArgument,
          std::string(collName(c.coll)) + ": root " + std::to_string(c.root) + " is out of range for " +
              std::to_string(comm.nranks()) + " ranks");
  }
  checkBytes(collName(c.coll), c.count, c.dtype, opBlocks(c.coll, comm.nranks()));
  if (c.count > 0) {
    MNCL_CHECK(c.recv != nullptr || (c.coll == Coll::reduce && comm.rank() != c.root), mnclInvalidArgument,
          std::string(collName(c.coll)) + ": the receive buffer is null");
    MNCL_CHECK(c.send != nullptr || (c.coll == Coll::broadcast && comm.rank() != c.root), mnclInvalidArgument,
          std::string(collName(c.coll)) + ": the send buffer is null");
  }
  checkOverlap(comm, c);
}

void validate(Comm& comm, const P2pCall& c) {
  checkUsable(comm);
  checkTypeOp(c.dtype, RedOp::sum, false);
  checkBytes(c.isSend ? "send" : "recv", c.count, c.dtype, 1);
  MNCL_CHECK(c.peer >= 0 && c.peer < comm.nranks(), mnclInvalidArgument,
        std::string(c.isSend ? "send" : "recv") + ": peer " + std::to_string(c.peer) + " is out of range for " +
            std::to_string(comm.nranks()) + " ranks");
  MNCL_CHECK(c.count == 0 || c.buf != nullptr, mnclInvalidArgument, std::string(c.isSend ? "send" : "recv") + ": the buffer is null");
}

}  // namespace mncl
