// Packs: a fixed number of payload bytes (one LL word; one LL128 line on a CPU, a lane's 16
// bytes of one on a GPU) viewed as elements. Element sizes (1, 2, 4, 8) divide every pack
// size, so no element straddles two packs; the last pack of a step may be partly filled.
#pragma once

#include <cstring>

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

// Moves the first m elements of a pack (m <= kElems) between it and user memory at `at`.
// Elements past m read as zero. On a GPU as 8-byte words where m fills whole words and `at`
// is 8-byte aligned (whole packs and LL128 lanes' parts, in practice), else element by
// element; on a CPU through memcpy.
template <typename T, int Bytes>
MNCL_DEV void loadPackPrefix(Pack<T, Bytes>& p, const T* at, int m) {
#if defined(__CUDACC__)
  if ((m * sizeof(T)) % 8 == 0 && (reinterpret_cast<uintptr_t>(at) & 7) == 0) {
    const uint64_t* w = reinterpret_cast<const uint64_t*>(at);
    int words = m * (int)sizeof(T) / 8;
    for (int j = 0; j < Bytes / 8; ++j) p.w[j] = j < words ? w[j] : 0;
  } else {
    for (int j = 0; j < Bytes / 8; ++j) p.w[j] = 0;
    for (int j = 0; j < m; ++j) p.e[j] = at[j];
  }
#else
  if (m == Pack<T, Bytes>::kElems) {
    memcpy(p.w, at, Bytes);  // a constant size: inlined
    return;
  }
  for (int j = 0; j < Bytes / 8; ++j) p.w[j] = 0;
  if constexpr (Pack<T, Bytes>::kElems > 1) memcpy(p.w, at, (size_t)m * sizeof(T));  // (else m is 0)
#endif
}

template <typename T, int Bytes>
MNCL_DEV void storePackPrefix(const Pack<T, Bytes>& p, T* at, int m) {
#if defined(__CUDACC__)
  if ((m * sizeof(T)) % 8 == 0 && (reinterpret_cast<uintptr_t>(at) & 7) == 0) {
    uint64_t* w = reinterpret_cast<uint64_t*>(at);
    int words = m * (int)sizeof(T) / 8;
    for (int j = 0; j < Bytes / 8; ++j) {
      if (j < words) w[j] = p.w[j];
    }
  } else {
    for (int j = 0; j < m; ++j) at[j] = p.e[j];
  }
#else
  if (m == Pack<T, Bytes>::kElems) {
    memcpy(at, p.w, Bytes);
    return;
  }
  if constexpr (Pack<T, Bytes>::kElems > 1) memcpy(at, p.w, (size_t)m * sizeof(T));  // (else m is 0)
#endif
}

template <typename T, int Bytes, typename Fn>
MNCL_DEV void reducePack(const Fn& fn, Pack<T, Bytes>& acc, const Pack<T, Bytes>& b) {
  for (int j = 0; j < Pack<T, Bytes>::kElems; ++j) acc.e[j] = fn(acc.e[j], b.e[j]);
}

// This rank's input as it contributes to a reduction (premulsum's scaling); elements past
// the loaded prefix are never stored.
template <typename T, int Bytes, typename Fn>
MNCL_DEV void prePack(const Fn& fn, Pack<T, Bytes>& p) {
  if constexpr (Fn::kHasPre) {
    for (int j = 0; j < Pack<T, Bytes>::kElems; ++j) p.e[j] = fn.pre(p.e[j]);
  }
}

template <typename T, int Bytes, typename Fn>
MNCL_DEV void postPack(const Fn& fn, Pack<T, Bytes>& acc) {
  for (int j = 0; j < Pack<T, Bytes>::kElems; ++j) acc.e[j] = fn.post(acc.e[j]);
}

}  // namespace mncl::dev
