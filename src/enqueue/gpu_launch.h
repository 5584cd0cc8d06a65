// The GPU launch: one kernel per collective on the caller's stream, one block per channel;
// the call returns once the kernel is queued.
#pragma once

#include <vector>

#include "enqueue.h"

namespace mncl {

struct GpuCall {
  Comm* comm;
  bool isP2p;
  CollCall coll;
  P2pCall p2p;
  uint64_t callNumber = 0;  // a collective's number in the call log, for the call timeout's error
};

// Launches `calls` in order, one kernel per collective; each communicator's sends and
// receives run together in one more kernel, after its collectives. Communicators that share a
// caller stream (several ranks driven by one thread in a group) would wait for each other on
// it: all but the first run on their own side stream, forked from the caller's stream before
// and joined back into it after, which also keeps the whole group inside a CUDA graph capture.
// A group of one collective per rank, all on one GPU and one stream, runs as one kernel instead.
void launchGpuCalls(const std::vector<GpuCall>& calls);

}  // namespace mncl
