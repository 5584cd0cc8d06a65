// The CPU build's reducing collectives, one translation unit per reduction
// (cuda/cpu/run_reduction.cc, compiled once for each: see CMakeLists.txt), so that a build
// spreads them over the cores, as it does the CUDA kernels.
#pragma once

#include "../channel.h"

namespace mncl::dev {

// One channel's share of a reducing collective whose reduction is `op`, for every type.
template <RedOp op>
bool runReduction(DevChannel& ch, const DevWork& w, DevError* err);

template <> bool runReduction<RedOp::sum>(DevChannel&, const DevWork&, DevError*);
template <> bool runReduction<RedOp::prod>(DevChannel&, const DevWork&, DevError*);
template <> bool runReduction<RedOp::max>(DevChannel&, const DevWork&, DevError*);
template <> bool runReduction<RedOp::min>(DevChannel&, const DevWork&, DevError*);
template <> bool runReduction<RedOp::avg>(DevChannel&, const DevWork&, DevError*);
template <> bool runReduction<RedOp::premulsum>(DevChannel&, const DevWork&, DevError*);

}  // namespace mncl::dev
