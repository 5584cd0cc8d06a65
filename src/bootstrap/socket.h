// TCP sockets where every blocking call has a deadline: connect, accept, send and receive
// either finish in time or throw a clear error (Timeout, or RemoteError when the peer went
// away). No rank's wait in bootstrap is without end (a root whose id no rank ever uses
// serves until the process exits: see startRoot).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

namespace mncl {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline deadlineIn(double seconds) {
  return Clock::now() + std::chrono::microseconds((int64_t)(seconds * 1e6));
}

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;

  static SockAddr resolve(const std::string& host, int port);  // numeric or DNS name
  static SockAddr loopback(int port = 0);
  int port() const;
  void setPort(int port);
  std::string str() const;
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

// Lets another thread stop this thread's socket waits (connect, accept, send, recv): while a
// WaitCancel is alive on a thread, its waits look at `flag` every 100 ms and throw mnclAborted
// once it is set. How mnclCommAbort / mnclCommDestroy stop a nonblocking init still waiting
// for its peers.
class WaitCancel {
 public:
  explicit WaitCancel(const std::atomic<bool>* flag);
  ~WaitCancel();
  WaitCancel(const WaitCancel&) = delete;
  WaitCancel& operator=(const WaitCancel&) = delete;

 private:
  const std::atomic<bool>* previous_;
};

// Runs `check` in this thread's socket waits (every 100 ms or so) while alive: it throws to
// end a wait that can no longer succeed (a shrink waiting for a peer that is gone). Checks
// nest: an inner one runs after those around it.
class WaitCheck {
 public:
  explicit WaitCheck(std::function<void()> check);
  ~WaitCheck();
  WaitCheck(const WaitCheck&) = delete;
  WaitCheck& operator=(const WaitCheck&) = delete;

 private:
  std::function<void()> check_;
  const std::function<void()>* previous_;
};

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  ~Socket() { close(); }

  static Socket listen(const SockAddr& addr);  // port 0 picks a free one
  // Retries while the listener is not up yet (connection refused) until the deadline. Where
  // it is known to have been up (`listening`: a peer published the address after it began
  // to listen there), refusals for a second mean it is gone: RemoteError.
  static Socket connect(const SockAddr& addr, Deadline deadline, const std::string& what, bool listening = false);

  Socket accept(Deadline deadline, const std::string& what);
  // A connection waiting to be accepted, or an invalid Socket where none is (never waits).
  // Where `failed` is given, an accept() that fails sets it to errno (returning an invalid
  // Socket) instead of throwing.
  Socket acceptPending(const std::string& what, int* failed = nullptr);
  void sendAll(const void* data, size_t size, Deadline deadline, const std::string& what);
  void recvAll(void* data, size_t size, Deadline deadline, const std::string& what);
  // Reads the header a connection just accepted opens with, giving it until `deadline` but
  // kOpeningSeconds at most; whether it came whole. One that closes or stays silent first (a
  // port scan, a health check, a leftover of an earlier job) is not a peer: the caller drops
  // it and goes on accepting, instead of failing, or waiting until the deadline, for it.
  // (A cancelled wait, or a WaitCheck that fails, still throws.)
  bool recvOpening(void* data, size_t size, Deadline deadline, const std::string& what);
  static constexpr double kOpeningSeconds = 5.0;  // (a peer sends its header as it connects)
  // Reads what has come, up to `size` (> 0) bytes, without waiting: how many (0: nothing
  // yet), or -1 where nothing more will (the peer closed, or the connection failed).
  ssize_t recvAvailable(void* data, size_t size);
  SockAddr localAddr() const;
  // Whether the other end closed the connection with nothing it sent left unread here (a
  // connection carrying data both ways that was quiet until then; never blocks).
  bool closedByPeer() const;
  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void close();

 private:
  void waitFor(short events, Deadline deadline, const std::string& what);  // Timeout at the deadline
  bool waitUntil(short events, Deadline deadline, const std::string& what);  // false at the deadline
  static constexpr int kClosed = -1, kLate = -2;  // (recvUntil's answers other than errno values)
  int recvUntil(void* data, size_t size, Deadline deadline, const std::string& what);
  int fd_ = -1;
};

}  // namespace mncl
