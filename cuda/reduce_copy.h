// reduceCopy, the one function every primitive moves its data with: read k sources, combine
// them with the reduction, optionally `finish` with the post-operation (avg's division), write
// m destinations. `pre` (only for reductions with a pre-operation: premulsum) names the sources
// that are some rank's input not yet through it: their values are, as they are loaded.
//
// Behind it, one implementation per target, each picking a path by the step's shape:
//   GPU, and the tests' SIMT emulation: a 16-byte vector loop (reduceCopyVectors) from where
//     every pointer is 16-byte aligned, and an element-wise loop (reduceCopyElements) for
//     what it leaves: the head before that point, the tail, or all when they never align.
//   CPU: copies by memcpy, or by non-temporal stores (streamCopy) for outputs nobody reads
//     during the operation (nStream); loops over restrict pointers for the common shapes
//     (reduce2, reduce2x2; premulsum's preReduce2); 16- and 8-bit floats with the CPU's vector
//     instructions (cpu/narrow_float.h); reductions into streamed outputs a cache line at a
//     time (reduceCopyStreamed); everything else in L1-sized blocks (reduceCopyBlocked).
#pragma once

#include <cstring>
#include <type_traits>

#include "channel.h"
#include "reduce_ops.h"

#if !defined(__CUDACC__)
#include "cpu/narrow_float.h"
#if defined(__x86_64__)
#include <emmintrin.h>
#endif
#endif

namespace mncl::dev {

constexpr int kMaxSrcs = kMaxPeers + 1;  // own input + every peer received from
constexpr int kMaxDsts = kMaxPeers + 1;  // own output + every peer sent to

// The sources of a premulsum that are a rank's input as the caller gave it: this rank's own,
// and a peer's read where it lies (a pointer step), each to be scaled by its rank's scalar.
template <typename T>
struct PreOps {
  uint32_t mask = 0;  // bit s: srcs[s]
  T scalar[kMaxSrcs]{};
  MNCL_HOSTDEV bool has(int s) const { return (mask >> s) & 1u; }
  MNCL_HOSTDEV void add(int s, T rankScalar) {
    mask |= 1u << s;
    scalar[s] = rankScalar;
  }
};

#if defined(__CUDACC__)
// GPU loads that fetch from L2 every time (ld.volatile): a FIFO slot is rewritten by its
// peer on every lap of the FIFO, and this SM's L1 may still hold the previous lap's lines.
template <typename T>
MNCL_DEV T loadFresh(const T* p) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "element size");
  T v;
  if constexpr (sizeof(T) == 1) {
    uint16_t b;
    asm volatile("ld.volatile.global.u8 %0, [%1];" : "=h"(b) : "l"(p) : "memory");
    uint8_t c = (uint8_t)b;
    memcpy(&v, &c, 1);
  } else if constexpr (sizeof(T) == 2) {
    uint16_t b;
    asm volatile("ld.volatile.global.u16 %0, [%1];" : "=h"(b) : "l"(p) : "memory");
    memcpy(&v, &b, 2);
  } else if constexpr (sizeof(T) == 4) {
    uint32_t b;
    asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(b) : "l"(p) : "memory");
    memcpy(&v, &b, 4);
  } else {
    uint64_t b;
    asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(b) : "l"(p) : "memory");
    memcpy(&v, &b, 8);
  }
  return v;
}

using Bits16 = uint4;

#elif MNCL_SIMT
// The tests' emulation of a block on CPU threads: plain loads (the step flags' acquire loads
// order them after the peer's writes).
template <typename T>
MNCL_DEV T loadFresh(const T* p) {
  T v;
  memcpy(&v, p, sizeof(T));
  return v;
}
struct Bits16 {
  uint32_t x, y, z, w;
};
#endif

#if MNCL_SIMT
// 16 bytes as elements: the unit of the vectorised loop.
template <typename T>
union Vec16 {
  static constexpr int kElems = 16 / (int)sizeof(T);
  Bits16 u;
  T e[kElems];
  MNCL_DEV Vec16() {}
};

template <typename T>
MNCL_DEV Vec16<T> loadFresh16(const T* p) {
  Vec16<T> v;
#if defined(__CUDACC__)
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.u.x), "=r"(v.u.y), "=r"(v.u.z), "=r"(v.u.w)
               : "l"(p)
               : "memory");
#else
  memcpy(&v.u, p, 16);
#endif
  return v;
}

template <typename T, typename Fn, int N>
MNCL_DEV void preVectors(const Fn& fn, Vec16<T> (&v)[N], T rankScalar) {
#pragma unroll
  for (int u = 0; u < N; ++u) {
    for (int j = 0; j < Vec16<T>::kElems; ++j) v[u].e[j] = fn.preWith(v[u].e[j], rankScalar);
  }
}

// Vectors of 16 bytes each thread keeps in flight per source: a block's bandwidth is the bytes
// it has in flight over the memory latency, and one load per thread leaves most of it idle.
constexpr int kUnroll = 4;

// The 16-byte part of reduceCopy: the nvec vectors from element `at` (where every pointer is
// 16-byte aligned), each thread taking kUnroll of them, a block apart, per round; every load
// of a round is issued before any of them is used.
template <typename T, typename Fn>
MNCL_DEV void reduceCopyVectors(const Fn& fn, int nsrc, const T* const* srcs, int ndst, T* const* dsts, size_t at,
                                size_t nvec, bool finish, const PreOps<T>* pre = nullptr) {
  constexpr int kVec = Vec16<T>::kElems;
  const size_t stride = (size_t)nthreads();
  for (size_t first = tid(); first < nvec; first += kUnroll * stride) {
    Vec16<T> acc[kUnroll];
    const T* src = srcs[0] + at;  // (once: each volatile load would read srcs[] again)
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      size_t i = first + u * stride;
      if (i < nvec) acc[u] = loadFresh16(src + i * kVec);
    }
    if constexpr (Fn::kHasPre) {
      if (pre && pre->has(0)) preVectors(fn, acc, pre->scalar[0]);
    }
    for (int s = 1; s < nsrc; ++s) {
      Vec16<T> x[kUnroll];
      src = srcs[s] + at;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        size_t i = first + u * stride;
        if (i < nvec) x[u] = loadFresh16(src + i * kVec);
      }
      if constexpr (Fn::kHasPre) {
        if (pre && pre->has(s)) preVectors(fn, x, pre->scalar[s]);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        for (int j = 0; j < kVec; ++j) acc[u].e[j] = fn(acc[u].e[j], x[u].e[j]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      size_t i = first + u * stride;
      if (i >= nvec) break;
      if (finish) {
        for (int j = 0; j < kVec; ++j) acc[u].e[j] = fn.post(acc[u].e[j]);
      }
      for (int d = 0; d < ndst; ++d) *reinterpret_cast<Bits16*>(dsts[d] + at + i * kVec) = acc[u].u;
    }
  }
}
#endif

#if MNCL_SIMT
// Elements each thread keeps in flight per source in the element-wise loop: 16 bytes' worth,
// at most 4 (more made the Simple kernel, at its 128 registers, spill: 8 float32s, 2 float64s
// with premulsum's scalars; ptxas -v).
template <typename T>
constexpr int kElemUnroll = sizeof(T) >= 4 ? 16 / (int)sizeof(T) : 4;

// One element of the result: the sources combined (each through the pre-operation where
// `pre` names it) and finished, to every destination.
template <typename T, typename Fn>
MNCL_DEV void reduceCopyElement(const Fn& fn, int nsrc, const T* const* srcs, int ndst, T* const* dsts, size_t i,
                                bool finish, const PreOps<T>* pre) {
  T v = loadFresh(srcs[0] + i);
  if constexpr (Fn::kHasPre) {
    if (pre && pre->has(0)) v = fn.preWith(v, pre->scalar[0]);
  }
  for (int s = 1; s < nsrc; ++s) {
    T x = loadFresh(srcs[s] + i);
    if constexpr (Fn::kHasPre) {
      if (pre && pre->has(s)) x = fn.preWith(x, pre->scalar[s]);
    }
    v = fn(v, x);
  }
  if (finish) v = fn.post(v);
  for (int d = 0; d < ndst; ++d) dsts[d][i] = v;
}

// The element-wise part of reduceCopy, for elements [begin, end): what pointers that are not
// 16-byte aligned together leave (a buffer that starts off 16 bytes, against a FIFO slot that
// does not). Unrolled as the vector loop is, in whole rounds of kElemUnroll elements a thread,
// every load of a round issued before any is used (one load per thread at a time leaves the
// memory system idle); then what is left, an element at a time.
template <typename T, typename Fn>
MNCL_DEV void reduceCopyElements(const Fn& fn, int nsrc, const T* const* srcs, int ndst, T* const* dsts, size_t begin,
                                 size_t end, bool finish, const PreOps<T>* pre = nullptr) {
  constexpr int kU = kElemUnroll<T>;
  const size_t stride = (size_t)nthreads();
  size_t i = begin + tid();
  for (; i + (kU - 1) * stride < end; i += kU * stride) {
    T acc[kU];
    const T* src = srcs[0] + i;  // (once: each volatile load would read srcs[] again)
#pragma unroll
    for (int u = 0; u < kU; ++u) acc[u] = loadFresh(src + u * stride);
    if constexpr (Fn::kHasPre) {
      if (pre && pre->has(0)) {
#pragma unroll
        for (int u = 0; u < kU; ++u) acc[u] = fn.preWith(acc[u], pre->scalar[0]);
      }
    }
    for (int s = 1; s < nsrc; ++s) {
      T x[kU];
      src = srcs[s] + i;
#pragma unroll
      for (int u = 0; u < kU; ++u) x[u] = loadFresh(src + u * stride);
      if constexpr (Fn::kHasPre) {
        if (pre && pre->has(s)) {
#pragma unroll
          for (int u = 0; u < kU; ++u) x[u] = fn.preWith(x[u], pre->scalar[s]);
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) acc[u] = fn(acc[u], x[u]);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      T v = finish ? fn.post(acc[u]) : acc[u];
      for (int d = 0; d < ndst; ++d) dsts[d][i + u * stride] = v;
    }
  }
  for (; i < end; i += stride) reduceCopyElement(fn, nsrc, srcs, ndst, dsts, i, finish, pre);
}

// How many elements come before every pointer is 16-byte aligned, when they all lie the same
// distance past a 16-byte boundary (a misaligned buffer read and written in place, or against
// a peer's buffer at the same offset); `n` when they never align together. (FIFO slots and
// channel slices are 64-byte aligned: a buffer that starts off 16 bytes meets them apart.)
template <typename T>
MNCL_DEV size_t elementsBeforeAligned(int nsrc, const T* const* srcs, int ndst, T* const* dsts, size_t n) {
  uintptr_t off = nsrc > 0 ? (uintptr_t)srcs[0] & 15 : (uintptr_t)dsts[0] & 15;
  for (int s = 0; s < nsrc; ++s) {
    if (((uintptr_t)srcs[s] & 15) != off) return n;
  }
  for (int d = 0; d < ndst; ++d) {
    if (((uintptr_t)dsts[d] & 15) != off) return n;
  }
  if (off == 0) return 0;
  if (off % sizeof(T) != 0) return n;  // (not on an element boundary: never aligned)
  size_t head = (16 - off) / sizeof(T);
  return head < n ? head : n;
}

// Reductions of bytes that act on each byte alone, and so give the same bytes on any wider
// word: copies (copy-only collectives and sends run on bytes, whatever the type) and the
// bitwise ops (which the kernels run on bytes). On<W>: the same reduction on words of W.
template <typename Fn>
struct Bytewise {
  static constexpr bool kIs = false;
};
template <template <typename> class F>
struct BytewiseAs {
  static constexpr bool kIs = true;
  template <typename W>
  using On = F<W>;
};
template <>
struct Bytewise<FuncCopy<uint8_t>> : BytewiseAs<FuncCopy> {};
template <>
struct Bytewise<FuncBitAnd<uint8_t>> : BytewiseAs<FuncBitAnd> {};
template <>
struct Bytewise<FuncBitOr<uint8_t>> : BytewiseAs<FuncBitOr> {};
template <>
struct Bytewise<FuncBitXor<uint8_t>> : BytewiseAs<FuncBitXor> {};

// (hi:lo) >> bits, its low 32 bits, for bits below 32: CUDA's funnel shift.
MNCL_DEV uint32_t funnelShiftRight(uint32_t lo, uint32_t hi, uint32_t bits) {
#if defined(__CUDACC__)
  return __funnelshift_r(lo, hi, bits);
#else
  return (uint32_t)((((uint64_t)hi << 32) | lo) >> bits);
#endif
}

// The 16 bytes at p, which lies `shift` bytes (1 to 15) past a 16-byte boundary: the two
// aligned vectors that hold them, loaded whole and joined. (Each of the four words is picked
// by a branch-free select on shift / 4: a run-time index would put the eight words in local
// memory. Templates, as the loads they use: the tests' emulation specialises those.)
template <typename T, typename Word = uint32_t>
MNCL_DEV Bits16 loadShifted16(const T* p, int shift) {
  static_assert(sizeof(T) == 1 && sizeof(Word) == 4, "bytes, joined as words");
  const Word* at = reinterpret_cast<const Word*>(p - shift);
  Vec16<Word> a = loadFresh16(at), b = loadFresh16(at + 4);
  const uint32_t w[8] = {a.e[0], a.e[1], a.e[2], a.e[3], b.e[0], b.e[1], b.e[2], b.e[3]};
  const int q = shift >> 2;
  const uint32_t bits = (uint32_t)(shift & 3) * 8;
  uint32_t out[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t lo = q == 0 ? w[j] : q == 1 ? w[j + 1] : q == 2 ? w[j + 2] : w[j + 3];
    uint32_t hi = q == 0 ? w[j + 1] : q == 1 ? w[j + 2] : q == 2 ? w[j + 3] : w[j + 4];
    out[j] = funnelShiftRight(lo, hi, bits);
  }
  Bits16 v;
  v.x = out[0], v.y = out[1], v.z = out[2], v.w = out[3];
  return v;
}

// The 16 bytes at p, aligned or `shift` bytes past a boundary.
template <typename T>
MNCL_DEV Bits16 loadAny16(const T* p, int shift) {
  return shift == 0 ? loadFresh16(p).u : loadShifted16(p, shift);
}

// Stores 16 bytes at p, which lies `shift` bytes past a 16-byte boundary: as one vector, or
// in the widest pieces its alignment allows (stores do not hold a thread up as loads do).
MNCL_DEV void storeAny16(uint8_t* p, int shift, const Bits16& v) {
  if (shift == 0) {
    *reinterpret_cast<Bits16*>(p) = v;
    return;
  }
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  if ((shift & 7) == 0) {
    auto* d = reinterpret_cast<uint64_t*>(p);
    d[0] = w[0] | (uint64_t)w[1] << 32;
    d[1] = w[2] | (uint64_t)w[3] << 32;
  } else if ((shift & 3) == 0) {
    auto* d = reinterpret_cast<uint32_t*>(p);
#pragma unroll
    for (int j = 0; j < 4; ++j) d[j] = w[j];
  } else if ((shift & 1) == 0) {
    auto* d = reinterpret_cast<uint16_t*>(p);
#pragma unroll
    for (int j = 0; j < 8; ++j) d[j] = (uint16_t)(w[j / 2] >> (16 * (j % 2)));
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j) p[j] = (uint8_t)(w[j / 4] >> (8 * (j % 4)));
  }
}

// The vectors of a bytewise reduction whose pointers lie at different distances past 16-byte
// boundaries: nvec 16-byte vectors from byte `at`, a grid where some of them are aligned
// (bytesBeforeMostAligned); each source's loaded whole and joined where it lies off the
// grid, each output's stored in pieces where it does. Such bytes went one load each: a
// thread kept one byte in flight where it now keeps 16. The caller keeps every load inside
// the sources. (Fn names the reduction, which runs on words here. One vector a thread per
// round: two made the Simple and p2p kernels spill more, inlined or not: ptxas -v, at the
// build's -O1, where Simple's copy kernel spills some all the same, up to 476 bytes a thread.)
template <typename Fn>
MNCL_DEV void reduceBytesShifted(const Fn&, int nsrc, const uint8_t* const* srcs, int ndst, uint8_t* const* dsts,
                                 size_t at, size_t nvec) {
  using OnWords = typename Bytewise<Fn>::template On<uint32_t>;
  const OnWords words{};
  for (size_t i = tid(); i < nvec; i += (size_t)nthreads()) {
    const size_t byte = at + i * 16;
    Bits16 acc = loadAny16(srcs[0] + byte, (int)((uintptr_t)(srcs[0] + byte) & 15));
    for (int s = 1; s < nsrc; ++s) {
      Bits16 x = loadAny16(srcs[s] + byte, (int)((uintptr_t)(srcs[s] + byte) & 15));
      acc.x = words(acc.x, x.x), acc.y = words(acc.y, x.y), acc.z = words(acc.z, x.z), acc.w = words(acc.w, x.w);
    }
    for (int d = 0; d < ndst; ++d) storeAny16(dsts[d] + byte, (int)((uintptr_t)(dsts[d] + byte) & 15), acc);
  }
}

// Where the vectors of a bytewise reduction whose pointers never align together start: the
// first byte where as many of them as can be are 16-byte aligned (fewer shifted loads and
// stores in pieces: a copy from a FIFO slot into an odd-offset output and the next slot
// aligns on the slots).
MNCL_DEV size_t bytesBeforeMostAligned(int nsrc, const uint8_t* const* srcs, int ndst, uint8_t* const* dsts) {
  auto offsetOf = [&](int k) { return (uintptr_t)(k < nsrc ? srcs[k] : dsts[k - nsrc]) & 15; };
  uintptr_t best = offsetOf(nsrc), bestCount = 0;  // (ties: dsts[0]'s)
  for (int k = 0; k < nsrc + ndst; ++k) {
    uintptr_t count = 0;
    for (int j = 0; j < nsrc + ndst; ++j) count += offsetOf(j) == offsetOf(k);
    if (count > bestCount || (count == bestCount && offsetOf(k) == offsetOf(nsrc))) {
      best = offsetOf(k);
      bestCount = count;
    }
  }
  return (16 - best) & 15;
}

// A bytewise reduction whose pointers never align to 16 bytes together: the bytes before the
// grid (bytesBeforeMostAligned; 16 more where a source would be loaded from before its
// start) one by one, then reduceBytesShifted's vectors, as many as keep every load inside
// the sources, then the bytes after them. (A copy reads its first source only.)
template <typename Fn>
MNCL_DEV void reduceBytesApart(const Fn& fn, int nsrc, const uint8_t* const* srcs, int ndst, uint8_t* const* dsts,
                               size_t n) {
  if constexpr (std::is_same_v<Fn, FuncCopy<uint8_t>>) nsrc = 1;
  size_t at = bytesBeforeMostAligned(nsrc, srcs, ndst, dsts);
  for (int s = 0; s < nsrc; ++s) {
    if (((uintptr_t)(srcs[s] + at) & 15) > at) at += 16;  // (its first vector would start before it)
  }
  size_t nvec = n > at ? (n - at) / 16 : 0;
  for (int s = 0; s < nsrc && nvec > 0; ++s) {
    size_t shift = (uintptr_t)(srcs[s] + at) & 15;  // (a shifted vector reads 16 - shift bytes past its own)
    size_t inside = (n - at + shift) / 16 - 1;      // (n - at >= 16 here)
    if (shift != 0 && inside < nvec) nvec = inside;
  }
  size_t head = at < n ? at : n;
  reduceCopyElements(fn, nsrc, srcs, ndst, dsts, 0, head, false);
  reduceBytesShifted(fn, nsrc, srcs, ndst, dsts, at, nvec);
  reduceCopyElements(fn, nsrc, srcs, ndst, dsts, nvec ? at + nvec * 16 : head, n, false);
}

// reduceCopy on the GPU: the elements before the pointers align (if they ever do) one by
// one, then 16-byte vectors, then the elements after the last whole vector. (Bytes that
// never align are copied or combined bitwise in vectors all the same: reduceBytesApart.)
template <typename T, typename Fn>
MNCL_DEV void reduceCopySimt(const Fn& fn, int nsrc, const T* const* srcs, int ndst, T* const* dsts, size_t n,
                             bool finish, const PreOps<T>* pre) {
  constexpr int kVec = Vec16<T>::kElems;
  size_t head = elementsBeforeAligned(nsrc, srcs, ndst, dsts, n);
  if constexpr (Bytewise<Fn>::kIs) {
    if (head == n && nsrc > 0) return reduceBytesApart(fn, nsrc, srcs, ndst, dsts, n);
  }
  reduceCopyElements(fn, nsrc, srcs, ndst, dsts, 0, head, finish, pre);
  size_t nvec = (n - head) / kVec;
  reduceCopyVectors(fn, nsrc, srcs, ndst, dsts, head, nvec, finish, pre);
  reduceCopyElements(fn, nsrc, srcs, ndst, dsts, head + nvec * kVec, n, finish, pre);
}
#endif

template <typename T>
MNCL_DEV void copyElems(T* dst, const T* src, size_t n) {
  if (dst == src || n == 0) return;
#if MNCL_SIMT
  // As bytes, whatever T (a copy is one): bytes that never align go as vectors all the same
  // (reduceBytesApart). Loads fresh from L2: src may be a FIFO slot.
  const auto* from = reinterpret_cast<const uint8_t*>(src);
  auto* to = reinterpret_cast<uint8_t*>(dst);
  reduceCopySimt<uint8_t>(FuncCopy<uint8_t>{}, 1, &from, 1, &to, n * sizeof(T), false, nullptr);
#else
  std::memcpy(dst, src, n * sizeof(T));
#endif
}

#if MNCL_SIMT

template <typename T, typename Fn>
MNCL_DEV void reduceCopy(const Fn& fn, int nsrc, const T* const* srcs, int ndst, T* const* dsts,
                         size_t n, bool finish, int /*nStream*/ = 0, const PreOps<T>* pre = nullptr) {
  if (n == 0 || ndst == 0) return;  // (data already in place: loading it would only cost time)
  reduceCopySimt(fn, nsrc, srcs, ndst, dsts, n, finish && Fn::kHasPost, pre);
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
  for (size_t i = 0; i < n; ++i) {
    T v = fn(a[i], b[i]);  // (not d0[i] = d1[i] = ...: reading d1[i] back stops GCC vectorising 16-bit floats)
    d0[i] = v;
    d1[i] = v;
  }
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

// Streaming loops may read several 4 KiB stretches at once, a line from each in turn, so
// that the core's prefetchers follow several streams. Whether that pays depends on the CPU
// (one core, 256 MiB in 128 KiB steps, a copy with non-temporal stores, GB/s of traffic):
// - Intel (a 2-core Xeon VM): four stretches 22 against 16.5 in order; a reduction of two
//   inputs into two outputs 20 against 13.6. With ordinary stores no gain (12.7 -> 13.5).
// - AMD (a 2-core EPYC VM): in order 38-40, two stretches 23-24, four 26-28; a reduction
//   of two inputs into one output 28-30 in order, 20-26 with four.
// So the default is four on Intel, one (in order) elsewhere; MININCL_STREAM_STRETCHES sets it
// (the host calls useStreamStretches at communicator init). In cpu/stream_copy.cc:
constexpr size_t kStreamStretch = 4096;
size_t streamStretches();          // how many the streaming loops read at once
size_t defaultStreamStretches();   // this CPU's default
void useStreamStretches(size_t stretches);
bool cpuIsIntel();  // (the streaming defaults differ by vendor, see also streamOutputBytes)

// Stores the 64 bytes at `line` (64-byte aligned) to dst (a whole cache line, see
// reduceCopyStreamed), bypassing the caches. The caller fences (streamFence) before anything
// that publishes the data.
inline void streamLine(void* dst, const void* line) {
#if defined(__x86_64__)
  const __m128i* s = static_cast<const __m128i*>(line);
  __m128i* d = static_cast<__m128i*>(dst);
  __m128i a = _mm_load_si128(s), b = _mm_load_si128(s + 1), c = _mm_load_si128(s + 2), e = _mm_load_si128(s + 3);
  _mm_stream_si128(d, a);
  _mm_stream_si128(d + 1, b);
  _mm_stream_si128(d + 2, c);
  _mm_stream_si128(d + 3, e);
#else
  std::memcpy(dst, line, 64);
#endif
}

inline void streamFence() {
#if defined(__x86_64__)
  _mm_sfence();  // streamed lines are weakly ordered: before the step's release store
#endif
}

// Line `off` (elements) of the result: the sources combined, finished, then streamed to
// dsts[0, nStream) and copied to the others.
template <typename T, typename Fn>
inline void reduceStreamLine(const Fn& fn, int nsrc, const T* const* srcs, int ndst, T* const* dsts, size_t off,
                             bool finish, int nStream, const PreOps<T>* pre = nullptr) {
  constexpr int kElems = 64 / (int)sizeof(T);
  alignas(64) T acc[kElems];
  alignas(64) T x[kElems];
  std::memcpy(acc, srcs[0] + off, 64);
  if constexpr (Fn::kHasPre) {
    if (pre && pre->has(0)) {
      for (int j = 0; j < kElems; ++j) acc[j] = fn.preWith(acc[j], pre->scalar[0]);
    }
  }
  for (int s = 1; s < nsrc; ++s) {
    std::memcpy(x, srcs[s] + off, 64);
    if constexpr (Fn::kHasPre) {
      if (pre && pre->has(s)) {
        for (int j = 0; j < kElems; ++j) x[j] = fn.preWith(x[j], pre->scalar[s]);
      }
    }
    for (int j = 0; j < kElems; ++j) acc[j] = fn(acc[j], x[j]);
  }
  if (finish) {
    for (int j = 0; j < kElems; ++j) acc[j] = fn.post(acc[j]);
  }
  for (int d = 0; d < ndst; ++d) {
    if (d < nStream) streamLine(dsts[d] + off, acc);
    else std::memcpy(dsts[d] + off, acc, 64);
  }
}

// Elements [off, off + len) of the sources, combined and finished, into acc.
template <typename T, typename Fn>
inline void combineBlock(const Fn& fn, int nsrc, const T* const* srcs, size_t off, size_t len, bool finish, T* acc) {
  if (nsrc >= 2) {
    reduce2(fn, acc, srcs[0] + off, srcs[1] + off, len);
  } else {
    std::memcpy(acc, srcs[0] + off, len * sizeof(T));
  }
  for (int s = 2; s < nsrc; ++s) reduceInto(fn, acc, srcs[s] + off, len);
  if (finish) postInPlace(fn, acc, len);
}

// Sums, products and premulsums of 16- and 8-bit floats: a block at a time in
// cpu/narrow_float.cc, with the CPU's vector instructions, rather than an element at a time in
// ArithNarrow (the same bits: each operation on two values rounds to the narrow type). Max
// and min stay in ArithNarrow, which compares the bits without converting them.
template <typename H>
constexpr NarrowOp narrowOp(const FuncSum<H>&) { return NarrowOp::add; }
template <typename H>
constexpr NarrowOp narrowOp(const FuncProd<H>&) { return NarrowOp::mul; }
template <typename H>
constexpr NarrowOp narrowOp(const FuncPreMulSum<H>&) { return NarrowOp::add; }
template <typename T, typename Fn>
constexpr bool kCombinesInBlocks =
    (std::is_same_v<T, half_t> || std::is_same_v<T, bfloat16_t> || std::is_same_v<T, fp8e4m3_t> ||
     std::is_same_v<T, fp8e5m2_t>) &&
    requires(const Fn& fn) { narrowOp(fn); };

template <typename T, typename Fn>
  requires kCombinesInBlocks<T, Fn>
inline void combineBlock(const Fn& fn, int nsrc, const T* const* srcs, size_t off, size_t len, bool finish, T* acc) {
  NarrowOp op = narrowOp(fn);
  if (nsrc >= 2) {
    combineNarrow(op, srcs[0] + off, srcs[1] + off, acc, len);
  } else {
    std::memcpy(acc, srcs[0] + off, len * sizeof(T));
  }
  for (int s = 2; s < nsrc; ++s) combineNarrow(op, acc, srcs[s] + off, acc, len);
}

// combineBlock for a reduction with a pre-operation, applied to the sources `pre` names.
template <typename T, typename Fn>
inline void combineBlockPre(const Fn& fn, int nsrc, const T* const* srcs, size_t off, size_t len, bool finish,
                            const PreOps<T>& pre, T* acc) {
  for (int s = 0; s < nsrc; ++s) {
    const T* __restrict__ x = srcs[s] + off;
    const T k = pre.scalar[s];
    if (s == 0 && pre.has(s)) {
      for (size_t i = 0; i < len; ++i) acc[i] = fn.preWith(x[i], k);
    } else if (s == 0) {
      std::memcpy(acc, x, len * sizeof(T));
    } else if (pre.has(s)) {
      for (size_t i = 0; i < len; ++i) acc[i] = fn(acc[i], fn.preWith(x[i], k));
    } else {
      reduceInto(fn, acc, x, len);
    }
  }
  if (finish) postInPlace(fn, acc, len);
}

// ... and for narrow floats: each source scaled as it is added, in one pass (addScaledNarrow:
// the bits of a scaled copy, then a sum; a scaling pass of its own, then the sum's, made a
// bfloat16 avg take 1.6-2x a sum's time).
template <typename T, typename Fn>
  requires kCombinesInBlocks<T, Fn>
inline void combineBlockPre(const Fn&, int nsrc, const T* const* srcs, size_t off, size_t len, bool,
                            const PreOps<T>& pre, T* acc) {
  if (nsrc == 1) {
    if (pre.has(0)) scaleNarrow(srcs[0] + off, pre.scalar[0], acc, len);
    else std::memcpy(acc, srcs[0] + off, len * sizeof(T));
    return;
  }
  addScaledNarrow(srcs[0] + off, pre.has(0), pre.scalar[0], srcs[1] + off, pre.has(1), pre.scalar[1], acc, len);
  for (int s = 2; s < nsrc; ++s) addScaledNarrow(acc, false, T{}, srcs[s] + off, pre.has(s), pre.scalar[s], acc, len);
}

template <typename T, typename Fn>
inline void reduceCopyBlocked(const Fn& fn, int nsrc, const T* const* srcs, int ndst, T* const* dsts,
                              size_t n, bool finish, int nStream, const PreOps<T>* pre = nullptr) {
  // In L1-sized blocks: accumulate, finish, then fan out.
  constexpr size_t kBlock = 4096 / sizeof(T) > 0 ? 4096 / sizeof(T) : 1;
  alignas(64) T acc[kBlock];
  for (size_t off = 0; off < n; off += kBlock) {
    size_t len = n - off < kBlock ? n - off : kBlock;
    if constexpr (Fn::kHasPre) {
      if (pre && pre->mask) combineBlockPre(fn, nsrc, srcs, off, len, finish, *pre, acc);
      else combineBlock(fn, nsrc, srcs, off, len, finish, acc);
    } else {
      combineBlock(fn, nsrc, srcs, off, len, finish, acc);
    }
    for (int d = 0; d < ndst; ++d) {
      if (d < nStream) streamCopy(dsts[d] + off, acc, len * sizeof(T));
      else std::memcpy(dsts[d] + off, acc, len * sizeof(T));
    }
  }
}

// Elements [from, to) through reduceCopyBlocked.
template <typename T, typename Fn>
inline void reduceCopyBlockedRange(const Fn& fn, int nsrc, const T* const* srcs, int ndst, T* const* dsts,
                                   size_t from, size_t to, bool finish, int nStream, const PreOps<T>* pre = nullptr) {
  if (from >= to) return;
  const T* s[kMaxSrcs];
  T* d[kMaxDsts];
  for (int k = 0; k < nsrc; ++k) s[k] = srcs[k] + from;
  for (int k = 0; k < ndst; ++k) d[k] = dsts[k] + from;
  reduceCopyBlocked(fn, nsrc, s, ndst, d, to - from, finish, nStream, pre);
}

// Streamed outputs, in order or stretches interleaved (streamStretches()). Non-temporal stores must fill
// whole cache lines, or the partly filled lines of every stretch and output compete for the
// core's few write-combining buffers (a 2-rank allreduce into NumPy arrays, which start 16
// bytes into a line, fell from 6 to 1.6 GB/s): so the streamed outputs must share their
// offset within a line, and the elements up to the first line boundary go the blocked way.
// False (nothing done) when they do not share it, or when the elements lie across line
// boundaries (an array that starts off its type's alignment, say a float32 view of bytes
// 1..): no whole element ends where a line does.
template <typename T, typename Fn>
inline bool reduceCopyStreamed(const Fn& fn, int nsrc, const T* const* srcs, int ndst, T* const* dsts, size_t n,
                               bool finish, int nStream, const PreOps<T>* pre = nullptr) {
  uintptr_t lineOffset = (uintptr_t)dsts[0] & 63;
  if (lineOffset % sizeof(T)) return false;
  for (int d = 1; d < nStream; ++d) {
    if (((uintptr_t)dsts[d] & 63) != lineOffset) return false;
  }
  constexpr size_t kLine = 64 / sizeof(T), kStretch = kStreamStretch / sizeof(T);
  size_t head = lineOffset ? (64 - lineOffset) / sizeof(T) : 0;
  if (head > n) head = n;
  reduceCopyBlockedRange(fn, nsrc, srcs, ndst, dsts, 0, head, finish, nStream, pre);
  size_t i = head, stretches = streamStretches();
  for (; stretches > 1 && i + stretches * kStretch <= n; i += stretches * kStretch) {
    for (size_t l = 0; l < kStretch; l += kLine) {
      for (size_t p = 0; p < stretches; ++p) {
        reduceStreamLine(fn, nsrc, srcs, ndst, dsts, i + p * kStretch + l, finish, nStream, pre);
      }
    }
  }
  for (; i + kLine <= n; i += kLine) reduceStreamLine(fn, nsrc, srcs, ndst, dsts, i, finish, nStream, pre);
  streamFence();
  reduceCopyBlockedRange(fn, nsrc, srcs, ndst, dsts, i, n, finish, nStream, pre);
  return true;
}

// premulsum's two-source steps, one or two outputs that alias no source: kPreA / kPreB say
// which source is a rank's input to scale.
template <bool kPreA, bool kPreB, int kOuts, typename T, typename Fn>
inline void preReduce2(const Fn& fn, T* __restrict__ d0, T* __restrict__ d1, const T* __restrict__ a,
                       const T* __restrict__ b, T ka, T kb, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    T v = fn(kPreA ? fn.preWith(a[i], ka) : a[i], kPreB ? fn.preWith(b[i], kb) : b[i]);
    d0[i] = v;
    if constexpr (kOuts == 2) d1[i] = v;
  }
}

template <int kOuts, typename T, typename Fn>
inline void preReduce2(const Fn& fn, T* const* dsts, const T* const* srcs, const PreOps<T>& pre, size_t n) {
  T* d1 = kOuts == 2 ? dsts[1] : nullptr;
  T ka = pre.scalar[0], kb = pre.scalar[1];
  if (pre.has(0) && pre.has(1)) preReduce2<true, true, kOuts>(fn, dsts[0], d1, srcs[0], srcs[1], ka, kb, n);
  else if (pre.has(0)) preReduce2<true, false, kOuts>(fn, dsts[0], d1, srcs[0], srcs[1], ka, kb, n);
  else preReduce2<false, true, kOuts>(fn, dsts[0], d1, srcs[0], srcs[1], ka, kb, n);
}

// reduceCopy with sources to scale first (premulsum): the usual shapes of a step in loops of
// their own (a scaled copy; two sources into one or two outputs; streamed outputs), the rest
// in blocks. (Narrow floats with the CPU's vector instructions: a scaled copy, or two sources
// into one output, in one pass; the rest in blocks.)
template <typename T, typename Fn>
inline void reduceCopyPre(const Fn& fn, int nsrc, const T* const* srcs, int ndst, T* const* dsts, size_t n, bool finish,
                          int nStream, const PreOps<T>& pre) {
  if constexpr (kCombinesInBlocks<T, Fn>) {
    if (nStream == 0 && !finish && nsrc == 2 && ndst == 1) {
      return addScaledNarrow(srcs[0], pre.has(0), pre.scalar[0], srcs[1], pre.has(1), pre.scalar[1], dsts[0], n);
    }
    if (nStream == 0 && !finish && nsrc == 1 && ndst == 1 && pre.has(0)) return scaleNarrow(srcs[0], pre.scalar[0], dsts[0], n);
  } else {
    if (nStream > 0 && reduceCopyStreamed(fn, nsrc, srcs, ndst, dsts, n, finish, nStream, &pre)) return;
    bool distinct = true;  // (restrict loops need outputs that alias no source)
    for (int d = 0; d < ndst; ++d) distinct &= dsts[d] != srcs[0] && (nsrc < 2 || dsts[d] != srcs[1]);
    if (nStream == 0 && !finish && distinct && nsrc == 1) {
      for (int d = 0; d < ndst; ++d) {
        for (size_t i = 0; i < n; ++i) dsts[d][i] = fn.preWith(srcs[0][i], pre.scalar[0]);
      }
      return;
    }
    if (nStream == 0 && !finish && distinct && nsrc == 2 && ndst == 1) return preReduce2<1>(fn, dsts, srcs, pre, n);
    if (nStream == 0 && !finish && distinct && nsrc == 2 && ndst == 2) return preReduce2<2>(fn, dsts, srcs, pre, n);
  }
  reduceCopyBlocked(fn, nsrc, srcs, ndst, dsts, n, finish, nStream, &pre);
}

// Whether every pointer is aligned for T. A caller's array may start off its type's alignment
// (a NumPy view at an odd byte offset): a typed load there is undefined behaviour, which x86
// forgives but a vectoriser's aligned moves or another CPU need not.
template <typename T>
inline bool allAligned(int nsrc, const T* const* srcs, int ndst, T* const* dsts) {
  uintptr_t bits = 0;
  for (int s = 0; s < nsrc; ++s) bits |= reinterpret_cast<uintptr_t>(srcs[s]);
  for (int d = 0; d < ndst; ++d) bits |= reinterpret_cast<uintptr_t>(dsts[d]);
  return bits % alignof(T) == 0;
}

template <typename T, typename Fn>
inline void reduceCopy(const Fn& fn, int nsrc, const T* const* srcs, int ndst, T* const* dsts, size_t n,
                       bool finish, int nStream = 0, const PreOps<T>* pre = nullptr);

// reduceCopy on pointers off T's alignment: a block at a time, the sources copied as bytes
// into aligned blocks, reduced there, and the result copied out as bytes.
template <typename T, typename Fn>
inline void reduceCopyUnaligned(const Fn& fn, int nsrc, const T* const* srcs, int ndst, T* const* dsts, size_t n,
                                bool finish, const PreOps<T>* pre) {
  constexpr size_t kBlock = 1024 / sizeof(T);
  alignas(64) T in[kMaxSrcs][kBlock];
  alignas(64) T out[kBlock];
  const T* from[kMaxSrcs];
  T* to = out;
  for (int s = 0; s < nsrc; ++s) from[s] = in[s];
  for (size_t off = 0; off < n; off += kBlock) {
    size_t len = n - off < kBlock ? n - off : kBlock;
    for (int s = 0; s < nsrc; ++s) std::memcpy(in[s], srcs[s] + off, len * sizeof(T));
    reduceCopy(fn, nsrc, from, 1, &to, len, finish, 0, pre);
    for (int d = 0; d < ndst; ++d) std::memcpy(dsts[d] + off, out, len * sizeof(T));
  }
}

// nStream: dsts[0, nStream) are outputs nobody reads during the operation (see streamCopy).
template <typename T, typename Fn>
inline void reduceCopy(const Fn& fn, int nsrc, const T* const* srcs, int ndst, T* const* dsts,
                       size_t n, bool finish, int nStream, const PreOps<T>* pre) {
  if (n == 0 || ndst == 0) return;
  finish = finish && Fn::kHasPost;
  bool plainCopy = nsrc == 1 && !finish && !(pre && pre->mask);  // (bytes: any alignment)
  if (alignof(T) > 1 && !plainCopy && !allAligned(nsrc, srcs, ndst, dsts)) {
    return reduceCopyUnaligned(fn, nsrc, srcs, ndst, dsts, n, finish, pre);
  }
  if constexpr (Fn::kHasPre) {
    if (pre && pre->mask) return reduceCopyPre(fn, nsrc, srcs, ndst, dsts, n, finish, nStream, *pre);
  }
  // (A plain copy takes streamCopy, below.)
  bool reduces = nsrc >= 2 || finish;
  if constexpr (kCombinesInBlocks<T, Fn>) {
    if (nsrc == 2 && ndst == 1 && !finish && nStream == 0) {
      return combineNarrow(narrowOp(fn), srcs[0], srcs[1], dsts[0], n);
    }
    if (reduces) return reduceCopyBlocked(fn, nsrc, srcs, ndst, dsts, n, finish, nStream);
  }
  if (nStream > 0 && reduces && reduceCopyStreamed(fn, nsrc, srcs, ndst, dsts, n, finish, nStream)) return;
  if (nsrc == 1 && !finish) {
    for (int d = 0; d < ndst; ++d) {
      if (d < nStream && dsts[d] != srcs[0]) streamCopy(dsts[d], srcs[0], n * sizeof(T));
      else copyElems(dsts[d], srcs[0], n);
    }
    return;
  }
  if (nStream == 0) {
    bool distinct = true;  // restrict loops need outputs that alias no input
    for (int d = 0; d < ndst; ++d) distinct &= dsts[d] != srcs[0] && (nsrc < 2 || dsts[d] != srcs[1]);
    if (nsrc == 2 && !finish && distinct && ndst == 1) {
      reduce2(fn, dsts[0], srcs[0], srcs[1], n);
      return;
    }
    if (nsrc == 2 && !finish && distinct && ndst == 2) {
      reduce2x2(fn, dsts[0], dsts[1], srcs[0], srcs[1], n);
      return;
    }
  }
  reduceCopyBlocked(fn, nsrc, srcs, ndst, dsts, n, finish, nStream);
}

#endif

}  // namespace mncl::dev
