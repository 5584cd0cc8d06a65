// Whether this rank can read a peer process's memory directly (cross-memory attach), which
// pointer steps need. It can fail: another user, a ptrace policy (Yama), a seccomp filter.
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace mncl {

// The address, in this process, of a word with a known value, for peers to probe.
uint64_t peerMemoryProbeAddress();
// Reads the probe word at `addr` in process `pid` and checks its value.
bool canReadPeerMemory(pid_t pid, uint64_t addr);

}  // namespace mncl
