#include "socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "../../cuda/arch.h"

#include "../core/error.h"
#include "bootstrap.h"

namespace mncl {

SockAddr SockAddr::resolve(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || !res) {
    throwError(mnclInvalidArgument, "cannot resolve bootstrap address \"" + host + "\": " + gai_strerror(rc));
  }
  SockAddr a;
  std::memcpy(&a.storage, res->ai_addr, res->ai_addrlen);
  a.len = res->ai_addrlen;
  freeaddrinfo(res);
  return a;
}

SockAddr SockAddr::loopback(int port) {
  SockAddr a;
  auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
  in->sin_family = AF_INET;
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  in->sin_port = htons((uint16_t)port);
  a.len = sizeof(sockaddr_in);
  return a;
}

int SockAddr::port() const {
  if (storage.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
}

void SockAddr::setPort(int port) {
  if (storage.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons((uint16_t)port);
  else reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons((uint16_t)port);
}

std::string SockAddr::str() const {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (storage.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, buf, sizeof(buf));
    return std::string("[") + buf + "]:" + std::to_string(port());
  }
  inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, buf, sizeof(buf));
  return std::string(buf) + ":" + std::to_string(port());
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {
int newSocket(int family) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throwSystemError("socket()");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

double secondsLeft(Deadline d) {
  return std::chrono::duration<double>(d - Clock::now()).count();
}

thread_local const std::atomic<bool>* tlsCancel = nullptr;  // see WaitCancel
thread_local const std::function<void()>* tlsCheck = nullptr;  // see WaitCheck

// Throws mnclAborted if this thread's waits were cancelled. Runs the thread's long-wait hook
// first (see dev::LongWaitHook: where Ctrl-C cancels a Python init).
void checkCancel(const std::string& what) {
  if (dev::tlsLongWaitHook.fn) dev::tlsLongWaitHook.fn(dev::tlsLongWaitHook.arg);
  if (tlsCheck) (*tlsCheck)();
  if (tlsCancel && tlsCancel->load(std::memory_order_acquire)) {
    throwError(mnclAborted, what + ": stopped, the communicator was aborted or destroyed (or its group refused a call) during its init");
  }
}
}  // namespace

WaitCancel::WaitCancel(const std::atomic<bool>* flag) : previous_(tlsCancel) { tlsCancel = flag; }
WaitCancel::~WaitCancel() { tlsCancel = previous_; }

WaitCheck::WaitCheck(std::function<void()> check) : previous_(tlsCheck) {
  check_ = [outer = previous_, check = std::move(check)] {
    if (outer) (*outer)();
    check();
  };
  tlsCheck = &check_;
}
WaitCheck::~WaitCheck() { tlsCheck = previous_; }

void Socket::waitFor(short events, Deadline deadline, const std::string& what) {
  if (!waitUntil(events, deadline, what)) {
    throwError(mnclTimeout, what + " timed out (raise MININCL_BOOTSTRAP_TIMEOUT if ranks start slowly)");
  }
}

bool Socket::waitUntil(short events, Deadline deadline, const std::string& what) {
  for (;;) {
    checkCancel(what);
    double left = secondsLeft(deadline);
    if (left <= 0) return false;
    pollfd p{fd_, events, 0};
    int rc = ::poll(&p, 1, (int)std::min(left * 1000 + 1, tlsCancel || tlsCheck || dev::tlsLongWaitHook.fn ? 100.0 : 1000.0));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) throwSystemError(what + ": poll()");
  }
}

Socket Socket::listen(const SockAddr& addr) {
  Socket s(newSocket(addr.storage.ss_family));
  int one = 1;
  setsockopt(s.fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(s.fd_, addr.sa(), addr.len) != 0) {
    // Any port: none of the local ports was free. Each closed bootstrap connection holds one
    // for a minute (TIME-WAIT), so thousands of inits within a minute can use them all.
    int err = errno;
    std::string what = "bind(" + addr.str() + ")";
    if (err == EADDRINUSE && addr.port() == 0) {
      what += " (no local port free: /proc/sys/net/ipv4/ip_local_port_range; connections closed within the last "
              "minute, in TIME-WAIT, hold theirs: `ss -tan state time-wait` counts them; many communicators made "
              "and destroyed within a minute?)";
    }
    errno = err;
    throwSystemError(what);
  }
  if (::listen(s.fd_, 1024) != 0) throwSystemError("listen()");
  return s;
}

Socket Socket::connect(const SockAddr& addr, Deadline deadline, const std::string& what, bool listening) {
  std::optional<Clock::time_point> refusedSince;  // (since the first of the refusals in a row)
  for (int attempt = 0;; ++attempt) {
    Socket s(newSocket(addr.storage.ss_family));
    int rc = ::connect(s.fd_, addr.sa(), addr.len);
    if (rc != 0 && errno == EINPROGRESS) {
      s.waitFor(POLLOUT, deadline, what + ": connecting to " + addr.str());
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(s.fd_, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc == 0) return s;
    if (errno != ECONNREFUSED && errno != ECONNRESET && errno != ETIMEDOUT && errno != EHOSTUNREACH) {
      throwSystemError(what + ": connect(" + addr.str() + ")");
    }
    if (errno != ECONNREFUSED) refusedSince.reset();
    else if (!refusedSince) refusedSince = Clock::now();
    if (listening && refusedSince && Clock::now() - *refusedSince >= std::chrono::seconds(1)) {
      throwError(mnclRemoteError, what + ": " + addr.str() +
                                      " refuses connections, where that rank was listening: its init failed or its "
                                      "process exited (see its error), or a firewall or route refuses it");
    }
    checkCancel(what);
    if (Clock::now() >= deadline) {
      throwError(mnclTimeout, what + ": nobody accepted a connection at " + addr.str() +
                                  " before the timeout (is the root running, and is the address reachable? "
                                  "MININCL_BOOTSTRAP_TIMEOUT sets the limit)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, 5 * (attempt + 1))));
  }
}

bool Socket::closedByPeer() const {
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (fd_ < 0 || ::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP)) return true;
  char byte;
  return ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

Socket Socket::accept(Deadline deadline, const std::string& what) {
  for (;;) {
    waitFor(POLLIN, deadline, what);
    if (Socket s = acceptPending(what); s.valid()) return s;
  }
}

Socket Socket::acceptPending(const std::string& what, int* failed) {
  for (;;) {
    int fd = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return Socket(fd);
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Socket();
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (!failed) throwSystemError(what + ": accept()");
    *failed = errno;
    return Socket();
  }
}

void Socket::sendAll(const void* data, size_t size, Deadline deadline, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd_, p, size, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      size -= (size_t)n;
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      waitFor(POLLOUT, deadline, what);
    } else {
      throwError(mnclRemoteError, what + ": the peer closed the connection (" + std::strerror(errno) + ")");
    }
  }
}

// Reads `size` bytes by `deadline`: 0 once they came, else why not (ECONNRESET-like errno
// values for a failed recv(), kClosed when the peer closed, kLate at the deadline).
int Socket::recvUntil(void* data, size_t size, Deadline deadline, const std::string& what) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::recv(fd_, p, size, 0);
    if (n > 0) {
      p += n;
      size -= (size_t)n;
    } else if (n == 0) {
      return kClosed;
    } else if (errno != EAGAIN && errno != EINTR) {
      return errno;
    } else if (!waitUntil(POLLIN, deadline, what)) {
      return kLate;
    }
  }
  return 0;
}

ssize_t Socket::recvAvailable(void* data, size_t size) {
  for (;;) {
    ssize_t n = ::recv(fd_, data, size, MSG_DONTWAIT);
    if (n > 0) return n;
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
  }
}

void Socket::recvAll(void* data, size_t size, Deadline deadline, const std::string& what) {
  int why = recvUntil(data, size, deadline, what);
  if (why == kClosed) throwError(mnclRemoteError, what + ": the peer closed the connection (did it exit or fail?)");
  if (why == kLate) throwError(mnclTimeout, what + " timed out (raise MININCL_BOOTSTRAP_TIMEOUT if ranks start slowly)");
  if (why != 0) throwError(mnclSystemError, what + ": recv(): " + std::strerror(why));
}

bool Socket::recvOpening(void* data, size_t size, Deadline deadline, const std::string& what) {
  return recvUntil(data, size, std::min(deadline, deadlineIn(kOpeningSeconds)), what) == 0;
}

SockAddr Socket::localAddr() const {
  SockAddr a;
  a.len = sizeof(a.storage);
  getsockname(fd_, reinterpret_cast<sockaddr*>(&a.storage), &a.len);
  return a;
}

}  // namespace mncl

namespace mncl {

WireAddr WireAddr::from(const SockAddr& a) {
  WireAddr w{};
  w.family = a.storage.ss_family;
  w.port = (uint16_t)a.port();
  if (w.family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a.storage);
    std::memcpy(w.addr, &in6->sin6_addr, 16);
    w.scope = in6->sin6_scope_id;
  } else {
    std::memcpy(w.addr, &reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr, 4);
  }
  return w;
}

SockAddr WireAddr::toSockAddr() const {
  SockAddr a;
  if (family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
    in6->sin6_family = AF_INET6;
    std::memcpy(&in6->sin6_addr, addr, 16);
    in6->sin6_scope_id = scope;
    a.len = sizeof(sockaddr_in6);
  } else {
    auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
    in->sin_family = AF_INET;
    std::memcpy(&in->sin_addr, addr, 4);
    a.len = sizeof(sockaddr_in);
  }
  a.setPort(port);
  return a;
}

}  // namespace mncl
