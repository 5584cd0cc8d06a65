// reduceCopy and copyElems, the GPU's data movers (cuda/reduce_copy.h), on emulated blocks
// with pointers at every offset from a 16-byte boundary: the vector loop after a head where
// they lie together, the element-wise loop where they never do, byte copies and bitwise
// reductions as words. A block's threads run one after another on one OS thread (reduceCopy
// has no barriers), in reverse order, so an element covered twice or never shows up every
// time; each loaded byte is counted (it must be loaded once), and bytes around each output
// must stay untouched.
// Exits 0 when every check passes.
//
//   c++ -std=c++20 -O1 -pthread -DMNCL_SIMT_EMULATION -Icuda -Itests tests/simt_reduce_copy_check.cc
#include <cstdint>
#include <cstdio>
#include <vector>

#include "reduce_copy.h"
#include "simt_block.h"

namespace mncl::dev {

// The source bytes being watched, and how often each was loaded.
const unsigned char* watchedFrom = nullptr;
const unsigned char* watchedTo = nullptr;
std::vector<int> loadsOf;

void countLoad(const void* p, size_t bytes) {
  auto* b = static_cast<const unsigned char*>(p);
  if (b < watchedFrom && b + bytes > watchedFrom) {
    std::printf("FAIL: a load of %zu bytes starts before the source\n", bytes);
    std::exit(1);
  }
  if (b < watchedFrom || b >= watchedTo) return;
  if (b + bytes > watchedTo) {
    std::printf("FAIL: a load of %zu bytes runs past the source's end\n", bytes);
    std::exit(1);
  }
  for (size_t k = 0; k < bytes; ++k) loadsOf[b - watchedFrom + k]++;
}

void watch(const void* from, size_t bytes) {
  watchedFrom = static_cast<const unsigned char*>(from);
  watchedTo = watchedFrom + bytes;
  loadsOf.assign(bytes, 0);
}

// Bytes loaded other than once; `shifted`: the source lies off the outputs' 16-byte grid,
// where each vector loads the two aligned ones that hold it (loadShifted16), so a byte may
// be loaded twice.
size_t bytesNotLoadedOnce(bool shifted = false) {
  size_t off = 0;
  for (int n : loadsOf) off += shifted ? n < 1 || n > 2 : n != 1;
  return off;
}

// The emulation's loads, counted (the checks below use only these types).
#define COUNTED_LOAD(T)                      \
  template <>                                \
  inline T loadFresh<T>(const T* p) {        \
    countLoad(p, sizeof(T));                 \
    T v;                                     \
    std::memcpy(&v, p, sizeof(T));           \
    return v;                                \
  }                                          \
  template <>                                \
  inline Vec16<T> loadFresh16<T>(const T* p) { \
    if ((uintptr_t)p & 15) {                 \
      std::printf("FAIL: a 16-byte load off 16 bytes\n"); \
      std::exit(1);                          \
    }                                        \
    countLoad(p, 16);                        \
    Vec16<T> v;                              \
    std::memcpy(&v.u, p, 16);                \
    return v;                                \
  }
COUNTED_LOAD(char)
COUNTED_LOAD(uint8_t)
COUNTED_LOAD(uint16_t)
COUNTED_LOAD(uint32_t)
COUNTED_LOAD(uint64_t)
COUNTED_LOAD(float)
COUNTED_LOAD(double)

// Runs f as each thread of a block in turn, the last first.
template <typename F>
void runBlockInTurn(int threads, F f) {
  Block block(threads);
  gBlock = &block;
  for (int t = threads - 1; t >= 0; --t) {
    gThread = t;
    f();
  }
  gBlock = nullptr;
  gThread = 0;
}

int failures = 0, checks = 0;

void report(bool ok, const char* what, int threads, int srcOff, int dstOff, size_t n, size_t wrong, size_t loads) {
  ++checks;
  if (ok || ++failures > 20) return;
  std::printf("FAIL %s, %d threads, source +%d, output +%d, %zu elements: %zu wrong, %zu not loaded once\n", what,
              threads, srcOff, dstOff, n, wrong, loads);
}

// Buffers with 64 bytes of guard before the data, which starts at an offset below 16.
constexpr int kGuard = 64, kMost = 300;
alignas(64) unsigned char source[512], output[512], slot[512];

// A send's copy: copyElems of bytes, every source and output offset, 0 to kMost bytes.
void checkByteCopies(int threads) {
  for (int srcOff = 0; srcOff < 16; ++srcOff) {
    for (int dstOff = 0; dstOff < 16; ++dstOff) {
      for (size_t n = 0; n <= kMost; ++n) {
        for (int i = 0; i < 512; ++i) source[i] = (unsigned char)(i * 7 + 3), output[i] = 0xee;
        char* src = reinterpret_cast<char*>(source) + kGuard + srcOff;
        char* dst = reinterpret_cast<char*>(output) + kGuard + dstOff;
        watch(src, n);
        runBlockInTurn(threads, [&] { copyElems<char>(dst, src, n); });
        size_t wrong = 0;
        for (int i = 0; i < 512; ++i) {
          int k = i - kGuard - dstOff;
          wrong += output[i] != ((k >= 0 && (size_t)k < n) ? source[kGuard + srcOff + k] : 0xee);
        }
        size_t loads = bytesNotLoadedOnce(srcOff != dstOff);
        report(wrong == 0 && loads == 0, "copyElems<char>", threads, srcOff, dstOff, n, wrong, loads);
      }
    }
  }
}

// A copy-only collective's step: reduceCopy of bytes to an output and an aligned FIFO slot.
void checkByteCopiesToTwo(int threads) {
  for (int srcOff = 0; srcOff < 16; ++srcOff) {
    for (int dstOff = 0; dstOff < 16; dstOff += 3) {
      for (size_t n = 0; n <= kMost; n += n < 40 ? 1 : 7) {
        for (int i = 0; i < 512; ++i) source[i] = (unsigned char)(i * 5 + 1), output[i] = 0xee, slot[i] = 0xdd;
        const uint8_t* srcs[1] = {source + kGuard + srcOff};
        uint8_t* dsts[2] = {output + kGuard + dstOff, slot + kGuard};
        watch(srcs[0], n);
        runBlockInTurn(threads, [&] { reduceCopy(FuncCopy<uint8_t>{}, 1, srcs, 2, dsts, n, false); });
        size_t wrong = 0;
        for (int i = 0; i < 512; ++i) {
          int k = i - kGuard - dstOff, inSlot = i - kGuard;
          wrong += output[i] != ((k >= 0 && (size_t)k < n) ? source[kGuard + srcOff + k] : 0xee);
          wrong += slot[i] != ((inSlot >= 0 && (size_t)inSlot < n) ? source[kGuard + srcOff + inSlot] : 0xdd);
        }
        // (Off the slot's grid, the source's vectors are shifted: the grid is the slot's, or
        // the output's too where it lies with the source.)
        size_t loads = bytesNotLoadedOnce(srcOff != 0);
        report(wrong == 0 && loads == 0, "reduceCopy of bytes to two outputs", threads, srcOff, dstOff, n, wrong, loads);
      }
    }
  }
}

// A reduction in place, d = fn(pre(a), d), also written to e (at d's offset or aligned):
// with the threads in turn, an element reduced twice adds a twice.
template <typename T, typename Fn>
void checkReductions(int threads, Fn fn, bool withPre, bool finish, const char* what) {
  constexpr int kGuardElems = 32, kLen = 2 * kGuardElems + kMost + 20;
  for (int aOff = 0; aOff <= 16 / (int)sizeof(T); ++aOff) {
    for (int dOff = 0; dOff <= 16 / (int)sizeof(T); ++dOff) {
      for (bool eWithD : {false, true}) {
        int eOff = eWithD ? dOff : 0;
        for (size_t n = 0; n <= kMost; ++n) {
          alignas(64) T a[kLen], d[kLen], e[kLen], d0[kLen];
          for (int i = 0; i < kLen; ++i) a[i] = (T)(i % 13 + 1), d[i] = d0[i] = (T)(i % 5 + 2), e[i] = (T)99;
          PreOps<T> pre;
          if (withPre) pre.add(0, (T)3);
          const T* srcs[2] = {a + kGuardElems + aOff, d + kGuardElems + dOff};
          T* dsts[2] = {d + kGuardElems + dOff, e + kGuardElems + eOff};
          runBlockInTurn(threads, [&] { reduceCopy(fn, 2, srcs, 2, dsts, n, finish, 0, withPre ? &pre : nullptr); });
          auto want = [&](int k) {
            T v = withPre ? (T)(a[kGuardElems + aOff + k] * (T)3) : a[kGuardElems + aOff + k];
            v = fn(v, d0[kGuardElems + dOff + k]);
            return finish ? fn.post(v) : v;
          };
          size_t wrong = 0;
          for (int i = 0; i < kLen; ++i) {
            int k = i - kGuardElems - dOff, ke = i - kGuardElems - eOff;
            wrong += d[i] != ((k >= 0 && (size_t)k < n) ? want(k) : d0[i]);
            wrong += e[i] != ((ke >= 0 && (size_t)ke < n) ? want(ke) : (T)99);
          }
          report(wrong == 0, what, threads, aOff * (int)sizeof(T), dOff * (int)sizeof(T), n, wrong, 0);
        }
      }
    }
  }
}

}  // namespace mncl::dev

int main() {
  using namespace mncl::dev;
  for (int threads : {32, 64, 7, 1}) {
    checkByteCopies(threads);
    checkByteCopiesToTwo(threads);
    checkReductions<float>(threads, FuncSum<float>{}, false, false, "sum of float32");
    checkReductions<float>(threads, FuncPreMulSum<float>{}, true, false, "premulsum of float32");
    checkReductions<int32_t>(threads, FuncAvg<int32_t>{3}, false, true, "avg of int32");
    checkReductions<double>(threads, FuncSum<double>{}, false, false, "sum of float64");
    checkReductions<uint8_t>(threads, FuncSum<uint8_t>{}, false, false, "sum of uint8");
    checkReductions<uint16_t>(threads, FuncMax<uint16_t>{}, false, false, "max of uint16");
    // (as words where the pointers allow: xor shows an element combined twice, or a word
    // that reached past the end)
    checkReductions<uint8_t>(threads, FuncBitXor<uint8_t>{}, false, false, "bxor of bytes");
    checkReductions<uint8_t>(threads, FuncBitOr<uint8_t>{}, false, false, "bor of bytes");
  }
  std::printf("%d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
