// Reading another process's memory for pointer steps, and writing it for direct writes:
// cross-memory attach (process_vm_readv / process_vm_writev), a single kernel copy between
// the two processes' pages. Each rank checks at init that it can read each peer before it
// lets the peer post pointer steps, or writes to the peer itself (the kernel checks reads
// and writes alike: PTRACE_MODE_ATTACH).
#include <errno.h>
#include <sys/uio.h>

#include <cstring>

#include "../arch.h"

namespace mncl::dev {

namespace {
// One of the two system calls, repeated until every byte moved (they may stop short).
template <typename SysCall>
int kernelCopy(SysCall call, int pid, char* local, char* remote, size_t bytes) {
  while (bytes > 0) {
    iovec here{local, bytes}, there{remote, bytes};
    ssize_t moved = call(pid, &here, 1, &there, 1, 0);
    if (moved < 0 && errno == EINTR) continue;
    if (moved <= 0) return moved < 0 ? errno : EFAULT;
    local += moved;
    remote += moved;
    bytes -= (size_t)moved;
  }
  return 0;
}
}  // namespace

int readPeerMemory(int pid, void* dst, const void* remote, size_t bytes) {
  if (pid == 0) {
    std::memcpy(dst, remote, bytes);
    return 0;
  }
  return kernelCopy(process_vm_readv, pid, static_cast<char*>(dst), const_cast<char*>(static_cast<const char*>(remote)), bytes);
}

int writePeerMemory(int pid, void* remote, const void* src, size_t bytes) {
  if (pid == 0) {
    std::memcpy(remote, src, bytes);
    return 0;
  }
  return kernelCopy(process_vm_writev, pid, const_cast<char*>(static_cast<const char*>(src)), static_cast<char*>(remote), bytes);
}

}  // namespace mncl::dev
