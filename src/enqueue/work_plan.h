// How a collective call is cut into per-channel work items: the tuner picks the algorithm,
// protocol and channel count, and each channel takes an aligned slice of the buffer. The
// same cut serves the CPU launch and the GPU one.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "../../cuda/channel.h"
#include "../../cuda/p2p.h"
#include "enqueue.h"

namespace mncl {

class Comm;

// count elements cut into `parts` slices of a 64-byte multiple (the last may be shorter).
inline size_t alignedShare(size_t count, int parts, size_t elemSize) {
  size_t align = elemSize >= 64 ? 1 : 64 / elemSize;
  size_t per = (count + parts - 1) / parts;
  return (per + align - 1) / align * align;
}

// The call as the device code runs it. A float avg becomes a premulsum whose every rank's
// scalar is 1/nranks rounded to the type, as NCCL runs it: the sum of the scaled inputs
// overflows only where the average itself would (float16 avg(65504, 65504) is 65504, where
// summing first gave inf). An integer avg stays a sum then a truncating division (FuncAvg).
// A single rank's avg stays a copy.
CollCall asRun(const Comm& comm, const CollCall& c);

// Appends one work item per channel used to `out` (nothing when count is 0 or there is a
// single rank: see copyWithoutPeers). Returns how many it appended.
int planCollWorks(Comm& comm, const CollCall& c, std::vector<dev::DevWork>& out);

// How a send or recv of `bytes` with `peer` spreads over channels: `channels` of them from
// channel `first` on (wrapping around) carry `share` bytes each, the last what remains.
// Part ch lies on channel (first + ch) % nChannels; sender and receiver agree on all three.
struct P2pSplit {
  int channels;
  size_t share;
  int first = 0;
  size_t bytesOn(int ch, size_t bytes) const { return std::min(share, bytes - std::min(bytes, (size_t)ch * share)); }
};
P2pSplit p2pSplit(const Comm& comm, size_t bytes, int peer);

// Appends a send or recv to another rank to the channels' op lists (perChannel[c], sized
// to the communicator's channels): big transfers spread over channels, and the first channel
// (p2pSplit) always carries a step, so a receiver compares sizes with its sender even when
// they would disagree on the channel count.
void planP2pOps(Comm& comm, const P2pCall& c, std::vector<std::vector<dev::P2pOp>>& perChannel);
// Puts a channel's ops in connection order (dev::P2pEngine::connectionOrder), each
// connection's in the order they were posted, so that an op waits on the one just before it.
void groupP2pOps(const Comm& comm, std::vector<dev::P2pOp>& ops);

// Sends to self pair with recvs from self in order; throws InvalidUsage unless they match.
void checkSelfPairs(int rank, const std::vector<const P2pCall*>& sends, const std::vector<const P2pCall*>& recvs);

// The size from which collective c's outputs are streamed on the CPU: MININCL_STREAM_OUTPUT_BYTES,
// read once per process (communicator init reads it first, so a malformed value fails there
// rather than in a collective); unset, 32 MiB, but kNeverStreamed for reductions on CPUs other
// than Intel's. (Twice it must not overflow: see readByKernel.)
constexpr size_t kNeverStreamed = size_t{1} << 60;
size_t streamOutputBytes(Coll c);
// MININCL_STREAM_STRETCHES: how many 4 KiB stretches the streaming loops read at once (see
// dev::kStreamStretch); the CPU's default unless set. Throws InvalidArgument outside 1-16.
void applyStreamStretchesSetting();

// A single rank has nothing to exchange: the result is its own input. True if the call is
// of that kind (its copy is then the caller's to make, on the host or the GPU stream).
bool copyWithoutPeers(const Comm& comm, const CollCall& c);
// Of those, a premulsum: the result is the input times the scalar, not a copy of it (made by
// dev::preMulSumAlone on the CPU, dev::launchPreMulSumAlone on a GPU, from workWithoutPeers).
bool scalesWithoutPeers(const Comm& comm, const CollCall& c);
dev::DevWork workWithoutPeers(const CollCall& c);

}  // namespace mncl
