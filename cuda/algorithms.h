// What the host and the checks know of each algorithm (ring.h, tree.h, direct.h): its name,
// the collectives its struct implements, and its variants. The tuner offers exactly these,
// and tests/simt_*_check.cc run every one, so a new algorithm's entries here are all they
// need (README "Adding an algorithm"). Host code only.
#pragma once

#include "channel.h"
#include "dtypes.h"

namespace mncl {

// Indexed by Algo: MININCL_ALGO's names, and the tuner's and the checks' reports.
inline constexpr const char* kAlgoNames[] = {"ring", "tree", "direct"};
static_assert(sizeof(kAlgoNames) / sizeof(kAlgoNames[0]) == (size_t)Algo::count, "a name for each Algo");

// Whether algorithm `a` implements collective `c` on `nranks` ranks (dispatch.h's
// runAlgorithm has its case).
constexpr bool algoImplements(Algo a, Coll c, int nranks) {
  switch (a) {
    case Algo::ring: return c != Coll::sendrecv;
    case Algo::tree: return c == Coll::allreduce || c == Coll::broadcast || c == Coll::reduce;
    case Algo::direct: return c != Coll::sendrecv && nranks - 1 <= dev::kMaxPeers;  // (every peer at once)
    default: return false;
  }
}

// How many variants of collective `c` algorithm `a` has (DevWork::algoVariant; the tuner
// prices each): direct's allreduce, one-shot (0) or two-shot (1).
constexpr int algoVariants(Algo a, Coll c) { return a == Algo::direct && c == Coll::allreduce ? 2 : 1; }

// Whether algorithm `a`'s schedule of collective `c` (in its variant) overwrites an in-place
// input only with final values, which exist only once every rank's input at their offset has
// been read: an allreduce that reduces each offset at one rank and passes the result on
// (ring, tree, direct's two-shot). Not direct's one-shot, where each rank reduces every input
// itself and may write its output while a peer still reads its input.
// (DevWork::inputReadBeforeOverwritten.)
constexpr bool inputReadBeforeOverwritten(Algo a, Coll c, int variant) {
  bool twoShot = a == Algo::direct && variant == 1;
  return c == Coll::allreduce && (a == Algo::ring || a == Algo::tree || twoShot);
}

// (The tuner keeps a plan's variant in one bit: tuner.cc's packPlan.)
constexpr bool variantsFitOneBit() {
  for (int a = 0; a < (int)Algo::count; ++a) {
    for (int c = 0; c < (int)Coll::count; ++c) {
      if (algoVariants((Algo)a, (Coll)c) > 2) return false;
    }
  }
  return true;
}
static_assert(variantsFitOneBit(), "two variants at most: widen the tuner's packPlan for more");

// " one-shot" / " two-shot", or "" for an algorithm with one variant of `c`.
constexpr const char* algoVariantName(Algo a, Coll c, int variant) {
  return algoVariants(a, c) < 2 ? "" : variant ? " two-shot" : " one-shot";
}

}  // namespace mncl
