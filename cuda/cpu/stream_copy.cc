// Copies with non-temporal stores (x86: movntdq), for outputs too large to stay in cache.
// Elsewhere a plain memcpy.
#include <atomic>
#include <cstdint>
#include <cstring>

#include "../reduce_copy.h"

namespace mncl::dev {

namespace {
std::atomic<size_t> stretchesInUse{defaultStreamStretches()};
}  // namespace

bool cpuIsIntel() {  // asked once per process: plans ask on every call
#if defined(__x86_64__)
  static const bool intel = [] {
    __builtin_cpu_init();  // (this may run among static initializers, before libgcc's own)
    return __builtin_cpu_is("intel") != 0;
  }();
  return intel;
#else
  return false;
#endif
}

size_t defaultStreamStretches() { return cpuIsIntel() ? 4 : 1; }  // see kStreamStretch

void useStreamStretches(size_t stretches) { stretchesInUse.store(stretches, std::memory_order_relaxed); }

size_t streamStretches() { return stretchesInUse.load(std::memory_order_relaxed); }

namespace {
// Line by line, from possibly unaligned src to 64-byte aligned dst.
void streamLines(char* d, const char* s, size_t lines) {
  for (size_t l = 0; l < lines; ++l) {
    alignas(64) char line[64];
    std::memcpy(line, s + l * 64, 64);
    streamLine(d + l * 64, line);
  }
}
}  // namespace

void streamCopy(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  // Whole cache lines only (see reduceCopyStreamed): up to the first line boundary, a memcpy.
  size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
  if (head > bytes) head = bytes;
  std::memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  // Stretches read at once (see streamStretches), a line of each in turn.
  size_t stretches = streamStretches(), block = stretches * kStreamStretch, i = 0;
  for (; stretches > 1 && i + block <= bytes; i += block) {
    for (size_t l = 0; l < kStreamStretch; l += 64) {
      for (size_t p = 0; p < stretches; ++p) streamLines(d + i + p * kStreamStretch + l, s + i + p * kStreamStretch + l, 1);
    }
  }
  size_t lines = (bytes - i) / 64;
  streamLines(d + i, s + i, lines);
  i += lines * 64;
  std::memcpy(d + i, s + i, bytes - i);
  streamFence();
#else
  std::memcpy(dst, src, bytes);
#endif
}

}  // namespace mncl::dev
