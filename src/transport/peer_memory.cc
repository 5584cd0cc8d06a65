#include "peer_memory.h"

#include "../../cuda/arch.h"

namespace mncl {
namespace {
const volatile uint64_t kProbeWord = 0x6d696e696e636c21ull;  // "minincl!" in ASCII
}

uint64_t peerMemoryProbeAddress() { return (uint64_t)(uintptr_t)&kProbeWord; }

bool canReadPeerMemory(pid_t pid, uint64_t addr) {
  uint64_t word = 0;
  return dev::readPeerMemory(pid, &word, reinterpret_cast<const void*>(addr), sizeof(word)) == 0 && word == kProbeWord;
}

}  // namespace mncl
