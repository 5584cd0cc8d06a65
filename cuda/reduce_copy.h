// The one data-moving loop under every primitive: read k sources, combine them with the
// reduction, optionally finish with the post-operation (avg's division), write m destinations.
#pragma once

#include <cstring>

#include "channel.h"
#include "reduce_ops.h"

namespace mncl::dev {

constexpr int kMaxSrcs = kMaxPeers + 1;  // own input + every peer received from
constexpr int kMaxDsts = kMaxPeers + 1;  // own output + every peer sent to

template <typename T>
MNCL_DEV void copyElems(T* dst, const T* src, size_t n) {
  if (dst == src || n == 0) return;
#if defined(__CUDACC__)
  for (size_t i = tid(); i < n; i += nthreads()) dst[i] = src[i];
#else
  std::memcpy(dst, src, n * sizeof(T));
#endif
}

#if defined(__CUDACC__)

template <typename T, typename Fn>
MNCL_DEV void reduceCopy(const Fn& fn, int nsrc, const T* const* srcs, int ndst, T* const* dsts,
                         size_t n, bool post, bool /*streamDst0*/ = false) {
  for (size_t i = tid(); i < n; i += nthreads()) {
    T v = srcs[0][i];
    for (int s = 1; s < nsrc; ++s) v = fn(v, srcs[s][i]);
    if (post) v = fn.post(v);
    for (int d = 0; d < ndst; ++d) dsts[d][i] = v;
  }
}

#else

// CPU: simple loops over restrict pointers so the compiler vectorises them.
template <typename T, typename Fn>
inline void reduce2(const Fn& fn, T* __restrict__ d, const T* __restrict__ a,
                    const T* __restrict__ b, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = fn(a[i], b[i]);
}
// recvReduceCopySend's shape: one result to the output and to the next peer's FIFO.
template <typename T, typename Fn>
inline void reduce2x2(const Fn& fn, T* __restrict__ d0, T* __restrict__ d1, const T* __restrict__ a,
                      const T* __restrict__ b, size_t n) {
  for (size_t i = 0; i < n; ++i) d0[i] = d1[i] = fn(a[i], b[i]);
}
template <typename T, typename Fn>
inline void reduceInto(const Fn& fn, T* __restrict__ acc, const T* __restrict__ b, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = fn(acc[i], b[i]);
}
template <typename T, typename Fn>
inline void postInPlace(const Fn& fn, T* __restrict__ acc, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = fn.post(acc[i]);
}

// Writes dst with non-temporal stores: they skip the read-for-ownership of each line and
// keep a large output from evicting what the operation still needs (its FIFOs).
void streamCopy(void* dst, const void* src, size_t bytes);  // cpu/stream_copy.cc

template <typename T, typename Fn>
inline void reduceCopyBlocked(const Fn& fn, int nsrc, const T* const* srcs, int ndst, T* const* dsts,
                              size_t n, bool post, bool streamDst0) {
  // In L1-sized blocks: accumulate, finish, then fan out.
  constexpr size_t kBlock = 4096 / sizeof(T) > 0 ? 4096 / sizeof(T) : 1;
  alignas(64) T acc[kBlock];
  for (size_t off = 0; off < n; off += kBlock) {
    size_t len = n - off < kBlock ? n - off : kBlock;
    if (nsrc >= 2) {
      reduce2(fn, acc, srcs[0] + off, srcs[1] + off, len);
    } else {
      std::memcpy(acc, srcs[0] + off, len * sizeof(T));
    }
    for (int s = 2; s < nsrc; ++s) reduceInto(fn, acc, srcs[s] + off, len);
    if (post) postInPlace(fn, acc, len);
    for (int d = 0; d < ndst; ++d) {
      if (d == 0 && streamDst0) streamCopy(dsts[d] + off, acc, len * sizeof(T));
      else std::memcpy(dsts[d] + off, acc, len * sizeof(T));
    }
  }
}

// streamDst0: dsts[0] is an output nobody reads during the operation (see streamCopy).
template <typename T, typename Fn>
inline void reduceCopy(const Fn& fn, int nsrc, const T* const* srcs, int ndst, T* const* dsts,
                       size_t n, bool post, bool streamDst0 = false) {
  if (n == 0 || ndst == 0) return;
  post = post && Fn::kHasPost;
  if (nsrc == 1 && !post) {
    for (int d = 0; d < ndst; ++d) {
      if (d == 0 && streamDst0 && dsts[0] != srcs[0]) streamCopy(dsts[0], srcs[0], n * sizeof(T));
      else copyElems(dsts[d], srcs[0], n);
    }
    return;
  }
  if (!streamDst0) {
    bool distinct = true;  // restrict loops need outputs that alias no input
    for (int d = 0; d < ndst; ++d) distinct &= dsts[d] != srcs[0] && (nsrc < 2 || dsts[d] != srcs[1]);
    if (nsrc == 2 && !post && distinct && ndst == 1) {
      reduce2(fn, dsts[0], srcs[0], srcs[1], n);
      return;
    }
    if (nsrc == 2 && !post && distinct && ndst == 2) {
      reduce2x2(fn, dsts[0], dsts[1], srcs[0], srcs[1], n);
      return;
    }
  }
  reduceCopyBlocked(fn, nsrc, srcs, ndst, dsts, n, post, streamDst0);
}

#endif

}  // namespace mncl::dev
