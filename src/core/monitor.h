// Watches the peers of a communicator so that a vanished peer becomes an error, not a hang.
//
// Every 10 ms it bumps this rank's heartbeat and looks at each peer's control block:
//  - the peer failed (aborted, or hit an error)     -> RemoteError naming it, at once;
//  - the peer's process is gone (same host)         -> RemoteError, at once;
//  - the peer's heartbeat stopped for MININCL_TIMEOUT -> Timeout;
//  - the peer destroyed its communicator while this rank is still inside a call for
//    MININCL_TIMEOUT                                 -> RemoteError;
//  - the peer made another collective call than ours under the same number (see
//    call_log.h)                                     -> InvalidUsage naming both, at once.
// fail() sets the abort word, so every spin loop of this rank stops within microseconds.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mncl {

class Comm;

class Monitor {
 public:
  explicit Monitor(Comm& comm);
  ~Monitor();
  static double timeoutSeconds();  // MININCL_TIMEOUT, default 5 s

 private:
  void loop();
  void checkPeer(int r, double now);
  bool checkCalls(int r, const std::string& who);

  Comm& comm_;
  double timeout_;
  struct PeerWatch {
    uint64_t lastBeat = 0;
    double lastChange = 0, leftSince = -1;
  };
  std::vector<PeerWatch> watch_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace mncl
