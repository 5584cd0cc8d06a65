// The network transport: connections to ranks on other hosts (or to every peer, with
// MININCL_TRANSPORT=net) go over TCP, moved by one proxy thread per communicator, as NCCL's
// net transport moves them. CPU ranks only.
//
// The device code never sees a socket. A sending channel writes each step into a copy of the
// receiver's end of the connection that lies in its own memory (ConnFifo::proxied: no direct
// writes; a big Simple step may be a pointer step into the caller's buffers, which the proxy
// sends from), records the step's length and protocol (Simple: and where it belongs in the
// receiver's output) and bumps that copy's tail. The proxy sends the step (a header, then
// the data) and bumps the copy's head, freeing the slot. On the receiving host the proxy
// reads the header, waits until the receiver's slot is free, reads the data into it and
// bumps its tail; a Simple step of final output values goes straight into the receiver's
// output instead, where the receiver has published it for the step's operation (see
// aimSimpleStep). LL and LL128 lines go through a bounce buffer and are stored as their
// protocols publish them (LL word by word, LL128 flag last): a socket read keeps no order
// within a line. The receiving channel cannot tell a proxied step from one a sender wrote
// itself.
//
// One socket per (peer, channel), so that a channel whose receiver is behind never holds up
// another channel's steps; and one per peer for control messages: this rank's heartbeat and
// state (running, failed with its reason, left), which the peer keeps in a copy of our
// RankCtrl for its Monitor, as it would read our region on one host. A connection that
// closes before its peer has said that it left makes that peer failed.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../bootstrap/socket.h"
#include "region.h"

namespace mncl {

class NetProxy {
 public:
  struct Setup {
    int rank = 0;
    uint64_t nonce = 0;               // the communicator's: a stray connection fails the handshake
    std::vector<int> peers;           // the ranks reached over the network
    std::vector<SockAddr> listeners;  // [nranks]: each rank's listener (the peers' are used)
    Socket* listener = nullptr;       // ours, listening already
    int nChannels = 1;
    const RegionLayout* layout = nullptr;  // read by the constructor only
    char* regionBase = nullptr;       // our region, where the receiving ends are
    const RankCtrl* own = nullptr;    // our control block, which the peers mirror
    const uint32_t* abortWord = nullptr;
    std::function<bool()> busy;       // calls are running: keep polling, do not sleep
    bool sharesCores = false;         // other ranks' channels run on our cores: yield at once
    int socketBufferBytes = 4 << 20;  // data sockets' SO_SNDBUF / SO_RCVBUF (0: the kernel's autotuning)
    // Data sockets' TCP congestion control ("": the system's). Where the kernel refuses it,
    // an error if `congestionRequired` (the user asked for it), else the system's is kept.
    std::string congestion = "cubic";
    bool congestionRequired = false;
    double timeout = 5;               // for connecting, and for the last sends at teardown
    // Teardown: how long the last sends may go with nothing moving on any link (the peers'
    // control messages included) before the peers are taken for hung: MININCL_TIMEOUT, as the
    // monitor gives up on a peer.
    double lastSendsTimeout = 5;
  };

  // Connects to every peer (the lower rank of each pair connects, the higher accepts), then
  // starts the proxy thread. Throws on a peer that cannot be reached in time.
  explicit NetProxy(Setup setup);
  // Sends what the channels published and this rank's last state, then closes.
  ~NetProxy();

  // The sending end of our connection to `peer` on `channel`, in our memory.
  dev::ConnFifo sendEnd(int peer, int channel) const;
  // `peer`'s control block as its messages (and its connections) describe it.
  std::shared_ptr<Mapping> mirror(int peer) const;
  // A call started: poll without sleeping while it runs.
  void wake();
  // Sends this rank's control block (its call log among it) to every peer now, not with the
  // next heartbeat (up to 10 ms on): a call of count 0, which moves nothing, waits for its
  // peers' logs of it (Comm::checkZeroCountCall).
  void sendCallLogNow() {
    callLogNudges_.fetch_add(1, std::memory_order_acq_rel);
    wake();
  }
  // Waiter::progress for our channels: a waiting channel thread moves the data links' steps
  // itself, unless another thread is at it (no hand-off to the proxy thread on a busy core).
  static void progressFromChannel(void* proxy);
  // DevChannel::netSettle: returns once no thread is moving the links' steps, so that the
  // next read into a channel's output sees whether the channel still publishes it.
  static void settle(void* proxy);
  // The most bytes of one channel's steps to a peer that the way there holds before the
  // peer's receiver takes any, as near as it can be told (heldPerChannel; 0: unknown). A
  // longer send cannot end before its receive.
  size_t mostHeldPerChannel() const { return mostHeldPerChannel_; }
  // Simple steps received straight into their receiver's output (a counter, for tests).
  uint64_t landedSteps() const { return landedSteps_.load(std::memory_order_relaxed); }
  // Whether `peer`'s control connection closed or broke (or it sent garbage): it destroyed
  // or aborted its communicator, or vanished.
  bool lost(int peer) const { return lost_[peer].load(std::memory_order_acquire); }
  // Whether it was lost without a word: its connection ended, or broke, while it still said it
  // ran (it neither left nor failed first): its process exited or was killed, or the network
  // failed. (A rank that destroys this communicator says it left before it closes.)
  bool vanished(int peer) const { return vanished_[peer].load(std::memory_order_acquire); }

 private:
  struct StepHeader;
  struct OutStep;
  struct DataLink;
  struct CtrlLink;
  struct CtrlMessage;

  void connectAll();
  size_t heldPerChannel(const Socket& tuned) const;
  void tuneDataSocket(Socket& s);
  void loop();
  bool progressAll(bool withCtrl);
  bool startBatch(DataLink& l);
  const char* pointerStepData(DataLink& l, int slot);
  bool progressSend(DataLink& l);
  bool progressRecv(DataLink& l);
  void aimSimpleStep(DataLink& l);
  char* landing(const DataLink& l) const;
  bool progressCtrl(CtrlLink& c);
  ssize_t receiveCtrl(CtrlLink& c);
  void readLastWords(CtrlLink& c);
  void publish(DataLink& l);
  void sleep();
  void flush();
  void peerLost(int peer, const std::string& why);
  CtrlLink& ctrlOf(int peer);
  std::string unconnectedLowerPeers();

  Setup setup_;
  dev::ProtoSizes sizes_{};
  size_t connBytes_ = 0;
  size_t mostHeldPerChannel_ = 0;  // (read at start, from a socket tuned as the data sockets are)
  std::shared_ptr<Mapping> sendEnds_;  // our copies of the receivers' ends, [peer index][channel]
  std::vector<std::unique_ptr<DataLink>> data_;
  std::vector<std::unique_ptr<CtrlLink>> ctrl_;
  std::mutex progressMutex_;  // one thread moves the links at a time
  int wakeFd_ = -1;
  std::atomic<bool> sleeping_{false}, stop_{false};
  std::atomic<uint64_t> landedSteps_{0};
  std::atomic<uint64_t> callLogNudges_{0};  // see sendCallLogNow
  std::unique_ptr<std::atomic<bool>[]> lost_;      // [rank]: see lost()
  std::unique_ptr<std::atomic<bool>[]> vanished_;  // [rank]: see vanished()
  std::thread thread_;
};

}  // namespace mncl
