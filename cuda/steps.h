// Cutting a channel's slice of the buffer into steps: helpers every algorithm shares
// (ring.h, tree.h, direct.h).
#pragma once

#include "channel.h"

namespace mncl::dev {

MNCL_HOSTDEV size_t minSize(size_t a, size_t b) { return a < b ? a : b; }
MNCL_HOSTDEV size_t divUp(size_t a, size_t b) { return (a + b - 1) / b; }

// Calls f(offset, length) for each step-sized piece of [0, count), in order.
template <typename F>
MNCL_DEV void forEachStep(size_t step, size_t count, F f) {
  for (size_t off = 0; off < count; off += step) f(off, minSize(step, count - off));
}

// The step for a message of `count` elements that crosses a pipeline `hops` connections deep.
// Steps of a whole slot would cross the hops one after another; cut into `hops` pieces, every
// hop works on a piece at once. Pieces stay at least the channel's pipelineChunkBytes (a
// step's handshake must stay cheap next to its bytes), rounded to 64 bytes so copies stay
// aligned, and at most a step (a Simple step is whole 64-byte lines; an LL or LL128 step need
// not be, and needs no more than 8-byte alignment). One hop has nothing to overlap: its steps
// stay whole.
template <typename T>
MNCL_HOSTDEV size_t pipelineStep(const ProtoSizes& sizes, size_t stepElems, size_t count, int hops) {
  size_t align = 64 / sizeof(T);
  size_t piece = divUp(divUp(count, (size_t)(hops > 1 ? hops : 1)), align) * align;
  size_t smallest = sizes.pipelineChunkBytes / sizeof(T);
  return minSize(stepElems, piece > smallest ? piece : smallest);
}

// The n chunks, one per rank, of one loop over a slice (a ring's loop; direct's two-shot
// allreduce): chunk c covers [off(c), off(c) + len(c)).
struct RingLoop {
  size_t base, chunk, end;
  MNCL_HOSTDEV size_t off(int c) const { return minSize(base + (size_t)c * chunk, end); }
  MNCL_HOSTDEV size_t len(int c) const { return minSize(chunk, end - off(c)); }
};

// The chunk of such a loop: the `remaining` elements shared among n ranks, rounded up to 64
// bytes' worth of elements so copies stay aligned, and at most a step (see pipelineStep).
template <typename T>
MNCL_HOSTDEV size_t ringChunk(size_t remaining, int n, size_t stepElems) {
  size_t align = 64 / sizeof(T);
  size_t c = divUp(remaining, (size_t)n);
  c = divUp(c, align) * align;
  return minSize(c, stepElems);
}

}  // namespace mncl::dev
