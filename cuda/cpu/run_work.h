// The CPU build of the device code, as the host runtime calls it.
#pragma once

#include "../channel.h"
#include "../p2p.h"

namespace mncl::dev {

// One channel's share of a collective. False: stopped early (aborted, or *err names a peer
// whose step belongs to a different call).
bool runCollective(DevChannel& ch, const DevWork& w, DevError* err);

// A premulsum on a single rank: w.recv = w.send times this rank's scalar (w.count elements).
void preMulSumAlone(const DevWork& w);

// One channel's share of a group of sends and receives.
bool runP2p(DevChannel& ch, P2pOp* ops, int nops, DevError* err);

}  // namespace mncl::dev
