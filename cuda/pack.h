// Packs: a fixed number of payload bytes (one LL word, one LL128 line) viewed as elements.
// Element sizes (1, 2, 4, 8) divide every pack size, so no element straddles two packs; the
// last pack of a step may be partly filled.
#pragma once

#include "reduce_ops.h"

namespace mncl::dev {

template <typename T, int Bytes>
struct Pack {
  static constexpr int kElems = Bytes / (int)sizeof(T);
  union {
    T e[kElems];
    uint64_t w[Bytes / 8];
  };
  MNCL_HOSTDEV Pack() {}
};

// Loads elements [first, first + kElems) of src, as far as n reaches; the rest reads as zero.
template <typename T, int Bytes>
MNCL_DEV void loadPack(Pack<T, Bytes>& p, const T* src, size_t first, size_t n) {
  constexpr int E = Pack<T, Bytes>::kElems;
  if (first + E <= n) {
    for (int j = 0; j < E; ++j) p.e[j] = src[first + j];
  } else {
    for (int j = 0; j < Bytes / 8; ++j) p.w[j] = 0;
    for (int j = 0; first + j < n; ++j) p.e[j] = src[first + j];
  }
}

template <typename T, int Bytes>
MNCL_DEV void storePack(const Pack<T, Bytes>& p, T* dst, size_t first, size_t n) {
  constexpr int E = Pack<T, Bytes>::kElems;
  int m = first + E <= n ? E : (int)(n - first);
  for (int j = 0; j < m; ++j) dst[first + j] = p.e[j];
}

template <typename T, int Bytes, typename Fn>
MNCL_DEV void reducePack(const Fn& fn, Pack<T, Bytes>& acc, const Pack<T, Bytes>& b) {
  for (int j = 0; j < Pack<T, Bytes>::kElems; ++j) acc.e[j] = fn(acc.e[j], b.e[j]);
}

template <typename T, int Bytes, typename Fn>
MNCL_DEV void postPack(const Fn& fn, Pack<T, Bytes>& acc) {
  for (int j = 0; j < Pack<T, Bytes>::kElems; ++j) acc.e[j] = fn.post(acc.e[j]);
}

}  // namespace mncl::dev
