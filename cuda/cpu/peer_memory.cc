// Reading another process's memory for pointer steps: cross-memory attach
// (process_vm_readv), a single kernel copy from the sender's pages into ours. The receiver
// checks at init that this works for each peer before it lets the peer post pointer steps.
#include <errno.h>
#include <sys/uio.h>

#include <cstring>

#include "../arch.h"

namespace mncl::dev {

int readPeerMemory(int pid, void* dst, const void* remote, size_t bytes) {
  if (pid == 0) {
    std::memcpy(dst, remote, bytes);
    return 0;
  }
  char* to = static_cast<char*>(dst);
  const char* from = static_cast<const char*>(remote);
  while (bytes > 0) {
    iovec local{to, bytes}, peer{const_cast<char*>(from), bytes};
    ssize_t got = process_vm_readv(pid, &local, 1, &peer, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return got < 0 ? errno : EFAULT;
    to += got;
    from += got;
    bytes -= (size_t)got;
  }
  return 0;
}

}  // namespace mncl::dev
