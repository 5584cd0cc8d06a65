// A block's channel in fast memory for the length of a launch (on a GPU: shared memory): the
// DevChannel and the arrays it points to (connections, step counters, ring), copied by every
// thread at once, both together (the launch says where the arrays are): one memory round
// trip, where the algorithm touching each word as it needs it (a pointer, then what it points
// to, ...) made a chain of a dozen, which set the time of a small operation. What an
// operation changes goes back at its end (writeBack), for the next launch: every field the
// device code writes must be in it, or the next launch starts from a stale value. The tests'
// SIMT emulation runs its blocks through this too, so a field left out shows there.
#pragma once

#include "channel.h"

namespace mncl::dev {

static_assert(sizeof(DevChannel) % 8 == 0, "copyWords moves whole words");

// Every thread of the block copies a share of `bytes` (whole words), the loads all in flight
// together.
MNCL_DEV void copyWords(void* dst, const void* src, size_t bytes) {
  const uint64_t* from = static_cast<const uint64_t*>(src);
  uint64_t* to = static_cast<uint64_t*>(dst);
  for (size_t i = tid(); i < bytes / 8; i += nthreads()) to[i] = from[i];
}

struct CachedChannel {
  DevChannel* global;
  DevChannel* shared;  // = global where there is no cache
  char* globalArrays;  // where the arrays live in device memory

  // `storage` and `arrays`: the block's fast memory for the channel and for its arrays,
  // ChannelArrays(nranks).bytes = `arraysBytes` (0: no cache, the block works on `g`).
  MNCL_DEV CachedChannel(DevChannel* g, DevChannel* storage, char* arraysInGlobal, uint64_t* arrays,
                         uint32_t arraysBytes)
      : global(g), shared(arraysBytes ? storage : g), globalArrays(arraysInGlobal) {
    if (!arraysBytes) return;
    copyWords(shared, global, sizeof(DevChannel));
    copyWords(arrays, globalArrays, arraysBytes);  // (the host sized it for this channel's ranks)
    barrier();
    if (tid() == 0) ChannelArrays(shared->nranks).point(*shared, reinterpret_cast<char*>(arrays));
    barrier();
  }

  // The counters the operation changed, back to device memory for the next launch. (Not
  // opFirstSendStep / opFirstRecvStep: every operation sets them at its start.)
  MNCL_DEV void writeBack() {
    if (shared == global) return;
    barrier();
    copyWords(globalArrays, shared->sendStep, ChannelArrays(shared->nranks).changedBytes);
    if (tid() == 0) {
      global->pointerStepsPosted = shared->pointerStepsPosted;
      global->pointerStepsSent = shared->pointerStepsSent;
      global->directWritesSent = shared->directWritesSent;
#if defined(MNCL_GPU_TRACE)
      MNCL_TRACE(*shared, kTraceWrittenBack);
      for (int i = 0; i < kTracePoints; ++i) global->traceCycles[i] = shared->traceCycles[i];
      global->traceLaunches = shared->traceLaunches + 1;
#endif
    }
  }
};

}  // namespace mncl::dev
