// A channel's error record: why it stopped early, for the host to turn into a message
// (src/enqueue/device_error.cc).
#pragma once

#include "conn.h"

namespace mncl::dev {

// What the device code had no case for (dispatch.h): a tuner choice it does not implement.
enum class Undispatched : uint8_t {
  none,
  allgatherInAlgorithm,
  copyOnlyCollective,
  reduceScatterInAlgorithm,
  reducingCollective,
  algorithm,
  protocol,
};

MNCL_HOSTDEV const char* undispatchedName(Undispatched u) {
  switch (u) {
    case Undispatched::allgatherInAlgorithm: return "allgather in this algorithm";
    case Undispatched::copyOnlyCollective: return "copy-only collective";
    case Undispatched::reduceScatterInAlgorithm: return "reduce_scatter in this algorithm";
    case Undispatched::reducingCollective: return "reducing collective";
    case Undispatched::algorithm: return "algorithm";
    case Undispatched::protocol: return "protocol";
    default: return "case";
  }
}

struct DevError {
  int peer = -1;  // (this rank's own, where the record is not about a peer: undispatched)
  StepInfo expected{}, got{};
  int copyErrno = 0;  // nonzero: a kernel copy from or to `peer`'s memory failed (CPU)
  bool wrote = false;  // with copyErrno: the copy wrote `peer`'s memory (a direct write), else read it
  Undispatched undispatched = Undispatched::none;  // the work had no case in the device code
};

// Fills an empty error record: `fill` writes the details, then `peer` is stored with release,
// since a GPU host (GpuComm::firstError) may read the record while the kernel still runs:
// once it sees `peer` (acquire), the details are there. Each channel has a record of its own
// and one thread that writes it (thread 0; LL: the thread with a step's first line, which is
// thread 0's too), so the check for an empty record needs no atomic claim.
template <typename Fill>
MNCL_DEV void recordError(DevError* error, int peer, Fill fill) {
  if (!error || loadRelaxed(&error->peer) >= 0) return;
  fill(*error);
  storeRelease(&error->peer, peer);
}

}  // namespace mncl::dev
