#include "net.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstddef>
#include <cstring>
#include <string>

#include "../core/error.h"
#include "../core/log.h"
#include "../core/thread_start.h"
#include "shm_fault.h"
#include "../../cuda/arch.h"

namespace mncl {

namespace {
constexpr uint64_t kNetMagic = 0x4d4e434c4e455431ull;  // "MNCLNET1"
constexpr int kCtrlLink = -1;                           // Hello::link of a peer's control socket
// Idle turns before the proxy yields while a call runs (none where other ranks share the core).
constexpr uint32_t kSpinsBeforeYield = 20;

struct Hello {
  uint64_t magic, nonce;
  int32_t rank, link;  // link: a channel, or kCtrlLink
};

// Moves what it can without blocking: bytes moved, 0 if none would go, -1 if the peer closed
// the connection or it failed (errno set; 0 for an orderly close).
ssize_t sendSome(int fd, iovec* iov, int n) {
  msghdr m{};
  m.msg_iov = iov;
  m.msg_iovlen = (size_t)n;
  ssize_t r = ::sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (r >= 0) return r;
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
}

ssize_t recvSome(int fd, void* to, size_t bytes) {
  ssize_t r = ::recv(fd, to, bytes, MSG_DONTWAIT);
  if (r > 0) return r;
  if (r == 0) {
    errno = 0;
    return -1;
  }
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
}

std::string closedReason(int err) {
  return err == 0 ? "closed its network connection" : std::string("lost its network connection (") + std::strerror(err) + ")";
}
}  // namespace

// What goes before each step's data on the wire.
struct NetProxy::StepHeader {
  uint64_t step;
  dev::StepInfo info;
  uint32_t proto;   // a Proto
  uint32_t length;  // Simple: bytes; LL, LL128: data lines
  // Simple, premulsum: the data is the sender's input, which the receiver scales by the
  // sender's scalar (see ConnCtrl::dataIsInput).
  uint32_t dataIsInput, unused;
  uint64_t inputScalar;
  // Simple: where the data belongs in the receiver's output (dev::kNotOutput: nowhere), and
  // the operation it belongs to, by its first step (see ConnCtrl::outputOffset).
  uint64_t outputOffset, opFirstStep;
};

// A control message: a beat (the sender's heartbeat and state), then the rest (its failure and
// its call log, some 3.5 KiB) only when that changed since the last message it sent. An idle
// rank sends 16 bytes a tick, so a peer that stops reading (a stopped process) takes minutes
// to fill our socket, and the failure we report in the meantime still reaches it.
struct NetProxy::CtrlMessage {
  struct Beat {
    uint64_t heartbeat;
    uint32_t state;
    uint32_t full;  // the rest follows
  } beat;
  uint32_t failCode, gaveUpOn;
  char failMessage[sizeof(RankCtrl::failMessage)];
  CallLog calls;  // (the peer's monitor compares it with its own)
};

// Our state of a control socket: the message we send, the one we receive into, and the copy
// of the peer's RankCtrl it feeds.
struct NetProxy::CtrlLink {
  int peer;
  Socket sock;
  bool closed = false;  // the peer closed it (after saying it left, or see lost)
  bool lost = false;    // the peer failed or vanished: its data links stop too
  CtrlMessage out{}, in{};
  size_t outBytes = 0, outDone = 0, inDone = 0;
  bool outPending = false;
  uint64_t lastBeat = ~uint64_t{0};
  uint32_t lastState = ~0u;
  uint64_t lastNudge = 0;  // callLogNudges_ when the last message went out
  std::shared_ptr<Mapping> mirror;
};

// A step on its way out: its header, then its data where our channel wrote it.
struct NetProxy::OutStep {
  StepHeader header;
  const char* data;
  size_t bytes;
};

// One (peer, channel) connection, both directions.
struct NetProxy::DataLink {
  int peer, channel;
  Socket sock;
  CtrlLink* ctrl;     // the peer's control link
  bool closed = false;  // the peer closed it at a step boundary (whether it left or died, ctrl tells)
  dev::ConnFifo out;  // the sending end, in our memory: our channel writes it, we send from it
  dev::ConnFifo in;   // the receiving end, in our region: we write it, our channel reads it
  // Sending: steps sent whole, and the batch under way (see startBatch).
  uint64_t sent = 0;
  OutStep batch[dev::kSteps];
  int batchSteps = 0, batchStepsDone = 0;
  size_t batchDone = 0;  // bytes of the batch written, headers included
  bool sending() const { return batchSteps > 0; }
  // Receiving: steps received whole, and the one under way.
  uint64_t received = 0;
  StepHeader inHeader{};
  size_t inDone = 0;  // of the header, then of the data
  bool haveHeader = false;
  char* inData = nullptr;
  size_t inBytes = 0;
  bool landing = false;  // inData is in the receiver's output (see aimSimpleStep)
  const char* touchedAt = nullptr;  // where a recv last failed with EFAULT (see progressRecv)
  std::vector<uint64_t> bounce;  // LL / LL128 lines, before they are stored in the slot
};

NetProxy::NetProxy(Setup setup) : setup_(std::move(setup)) {
  lost_ = std::make_unique<std::atomic<bool>[]>(setup_.listeners.size());  // (value-initialized: false)
  vanished_ = std::make_unique<std::atomic<bool>[]>(setup_.listeners.size());
  const RegionLayout& layout = *setup_.layout;
  setup_.layout = nullptr;  // (the caller's, for this constructor only)
  sizes_ = layout.sizes();
  connBytes_ = layout.connBytes();
  size_t npeers = setup_.peers.size();
  sendEnds_ = createLocalRegion(std::max<size_t>(1, npeers * setup_.nChannels * connBytes_));
  for (size_t i = 0; i < npeers; ++i) {
    int peer = setup_.peers[i];
    auto c = std::make_unique<CtrlLink>();
    c->peer = peer;
    c->mirror = createLocalRegion(sizeof(RankCtrl));
    ctrl_.push_back(std::move(c));
    for (int ch = 0; ch < setup_.nChannels; ++ch) {
      auto l = std::make_unique<DataLink>();
      l->peer = peer;
      l->channel = ch;
      l->ctrl = ctrl_.back().get();
      l->out = layout.connAt(sendEnds_->base() + (i * setup_.nChannels + ch) * connBytes_);
      l->out.proxied = true;
      l->out.peerPid = 0;  // pointer steps (where allowed) are read by the proxy, in this process
      l->in = layout.conn(setup_.regionBase, peer, ch);
      data_.push_back(std::move(l));
    }
  }
  {  // The settings on a socket of our own first: refused, every rank of this process fails
     // here together, instead of one failing mid-connection while the others wait for it.
    Socket probe(::socket(setup_.listener->localAddr().storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (probe.valid()) tuneDataSocket(probe);
    mostHeldPerChannel_ = probe.valid() ? heldPerChannel(probe) : 0;
  }
  connectAll();
  if (!data_.empty()) {
    char cc[16] = {};
    socklen_t len = sizeof(cc) - 1;
    getsockopt(data_[0]->sock.fd(), IPPROTO_TCP, TCP_CONGESTION, cc, &len);
    MNCL_INFO(kNet, "rank %d: %zu network data sockets, TCP congestion control %s", setup_.rank, data_.size(), cc);
  }
  wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wakeFd_ < 0) throwSystemError("eventfd() for the network proxy");
  thread_ = startThread("the network proxy thread", [this] { loop(); });
}

NetProxy::~NetProxy() {
  stop_.store(true);
  wake();
  if (thread_.joinable()) thread_.join();
  if (wakeFd_ >= 0) ::close(wakeFd_);
}

dev::ConnFifo NetProxy::sendEnd(int peer, int channel) const {
  for (const auto& l : data_) {
    if (l->peer == peer && l->channel == channel) return l->out;
  }
  throwError(mnclInternalError, "no network connection to rank " + std::to_string(peer));
}

std::shared_ptr<Mapping> NetProxy::mirror(int peer) const {
  for (const auto& c : ctrl_) {
    if (c->peer == peer) return c->mirror;
  }
  return nullptr;
}

NetProxy::CtrlLink& NetProxy::ctrlOf(int peer) {
  for (auto& c : ctrl_) {
    if (c->peer == peer) return *c;
  }
  throwError(mnclInternalError, "no control connection to rank " + std::to_string(peer));
}

void NetProxy::wake() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sleeping_.load()) {
    uint64_t one = 1;
    (void)!::write(wakeFd_, &one, sizeof(one));
  }
}

// ---- connecting ----

// Each pair connects once per channel and once for control: the lower rank connects, the
// higher accepts and learns from the first message which link it is.
void NetProxy::connectAll() {
  Socket& listener = *setup_.listener;
  Deadline deadline = deadlineIn(setup_.timeout);
  auto place = [&](int peer, int link, Socket s) {
    if (link == kCtrlLink) {
      ctrlOf(peer).sock = std::move(s);
      return;
    }
    tuneDataSocket(s);
    for (auto& l : data_) {
      if (l->peer == peer && l->channel == link) l->sock = std::move(s);
    }
  };
  int expected = 0;
  for (int peer : setup_.peers) {
    if (peer < setup_.rank) {
      expected += setup_.nChannels + 1;
      continue;
    }
    for (int link = kCtrlLink; link < setup_.nChannels; ++link) {
      std::string what = "rank " + std::to_string(setup_.rank) + " connecting to rank " + std::to_string(peer) + " (network transport)";
      Socket s = Socket::connect(setup_.listeners[peer], deadline, what, true);  // (it listened before it said where)
      Hello h{kNetMagic, setup_.nonce, setup_.rank, link};
      s.sendAll(&h, sizeof(h), deadline, what);
      place(peer, link, std::move(s));
    }
  }
  while (expected > 0) {
    std::string what = "rank " + std::to_string(setup_.rank) + " waiting for its network connections";
    Socket s;
    try {
      s = listener.accept(deadline, what);
    } catch (const Error& e) {
      if (e.code() != mnclTimeout) throw;
      throwError(mnclTimeout, std::string(e.what()) + "; still missing some from rank(s) " + unconnectedLowerPeers());
    }
    Hello h{};
    bool whole = s.recvOpening(&h, sizeof(h), deadline, what);
    bool known = std::find(setup_.peers.begin(), setup_.peers.end(), h.rank) != setup_.peers.end();
    if (!whole || h.magic != kNetMagic || h.nonce != setup_.nonce || !known || h.rank >= setup_.rank || h.link < kCtrlLink ||
        h.link >= setup_.nChannels) {
      MNCL_WARN(kNet, "rank %d: a connection to its network listener was not from a peer of this communicator; closed",
                setup_.rank);
      continue;
    }
    place(h.rank, h.link, std::move(s));
    --expected;
  }
  // A link connected twice (a confused peer) would leave another without a socket.
  for (auto& c : ctrl_) MNCL_CHECK(c->sock.valid(), mnclSystemError, "no control connection to rank " + std::to_string(c->peer));
  for (auto& l : data_) MNCL_CHECK(l->sock.valid(), mnclSystemError, "no data connection to rank " + std::to_string(l->peer));
}

// The peers that connect to this rank (those below it) whose links have not all come yet.
std::string NetProxy::unconnectedLowerPeers() {
  std::string missing;
  for (int peer : setup_.peers) {
    if (peer >= setup_.rank) continue;
    bool whole = ctrlOf(peer).sock.valid();
    for (auto& l : data_) whole &= l->peer != peer || l->sock.valid();
    if (!whole) missing += (missing.empty() ? "" : ", ") + std::to_string(peer);
  }
  return missing;
}

// Fixed socket buffers: under the kernel's autotuning, one launch in three or four of a
// 2-rank allreduce over loopback settled at 1.6x the time for its whole run (4 MiB: ~2450 us
// against ~1500); with fixed buffers of 1-16 MiB none of 36 did (bench/RESULTS.md).
//
// Congestion control: under BBR (the system's choice on some hosts), once a connection had
// carried a few MiB one way it paced and capped what it had in flight by its model of the
// path, and a 2-rank allgather of 4 MiB over loopback took ~1000 us instead of ~600 from then
// on; under cubic or reno it never did (bench/RESULTS.md, seventeenth session).
void NetProxy::tuneDataSocket(Socket& s) {
  if (int bytes = setup_.socketBufferBytes; bytes > 0) {
    setsockopt(s.fd(), SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
    setsockopt(s.fd(), SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
  }
  const std::string& cc = setup_.congestion;
  if (cc.empty() || setsockopt(s.fd(), IPPROTO_TCP, TCP_CONGESTION, cc.data(), (socklen_t)cc.size()) == 0) return;
  std::string why = std::strerror(errno);
  MNCL_CHECK(!setup_.congestionRequired, mnclInvalidArgument,
             "MININCL_NET_CONGESTION=" + cc + ": the kernel refused it (" + why +
                 "; /proc/sys/net/ipv4/tcp_available_congestion_control lists what it has, tcp_allowed_congestion_control "
                 "what an unprivileged process may choose; 'system' keeps the system's)");
  MNCL_INFO(kNet, "rank %d: TCP congestion control %s refused (%s): data sockets keep the system's", setup_.rank, cc.c_str(),
            why.c_str());
  setup_.congestion.clear();  // (not again for every socket)
}

// ---- the proxy thread ----

void NetProxy::loop() {
  uint32_t idle = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    bool moved;
    {
      std::lock_guard<std::mutex> lock(progressMutex_);
      moved = progressAll(true);
    }
    if (moved) {
      idle = 0;
      continue;
    }
    // While a call runs, steps come at any moment: poll, yielding soon (our channels may
    // share our core, and their work is what we wait for). Otherwise sleep until a socket
    // has something, or a call wakes us.
    if (setup_.busy() || idle < 2000) {
      dev::cpuBackoff(idle++, setup_.sharesCores ? 0 : kSpinsBeforeYield);
      continue;
    }
    sleep();
    idle = 0;
  }
  flush();
}

void NetProxy::progressFromChannel(void* proxy) {
  auto* self = static_cast<NetProxy*>(proxy);
  std::unique_lock<std::mutex> lock(self->progressMutex_, std::try_to_lock);
  if (lock.owns_lock()) self->progressAll(false);
}

bool NetProxy::progressAll(bool withCtrl) {
  bool moved = false;
  for (auto& c : ctrl_) moved |= withCtrl && progressCtrl(*c);
  for (auto& l : data_) {
    if (l->closed || l->ctrl->lost) continue;
    moved |= progressSend(*l);
    moved |= progressRecv(*l);
  }
  return moved;
}

// The steps our channel has published and we have not sent, up to a FIFO's worth: sent
// together, in one write (one 128 KiB step per write moved a 16 MiB broadcast at ~60% of the
// rate 512 KiB steps did, over loopback).
bool NetProxy::startBatch(DataLink& l) {
  uint64_t tail = dev::loadAcquire(&l.out.ctrl->tail);
  const dev::ConnCtrl* c = l.out.ctrl;
  const dev::ProtoSizes& sz = sizes_;
  l.batchSteps = 0;
  for (uint64_t step = l.sent; step < tail && l.batchSteps < dev::kSteps; ++step) {
    int s = (int)(step % dev::kSteps);
    OutStep& o = l.batch[l.batchSteps++];
    o.header = StepHeader{step, c->info[s], c->stepProto[s], c->stepLength[s], 0, 0, 0, dev::kNotOutput, 0};
    switch ((Proto)o.header.proto) {
      case Proto::simple:
        o.data = pointerStepData(l, s);
        o.bytes = std::min<size_t>(o.header.length, sz.simpleSlotBytes);
        o.header.dataIsInput = c->dataIsInput[s];
        o.header.inputScalar = c->inputScalar[s];
        o.header.outputOffset = c->outputOffset[s];
        o.header.opFirstStep = c->opFirstStep[s];
        break;
      case Proto::ll:
        o.data = reinterpret_cast<const char*>(l.out.ll + (size_t)s * sz.llSlotLines);
        o.bytes = std::min<size_t>(dev::kLLHeaderLines + (size_t)o.header.length, sz.llSlotLines) * sizeof(dev::LLLine);
        break;
      default:
        o.data = reinterpret_cast<const char*>(l.out.ll128 + (size_t)s * sz.ll128SlotLines);
        o.bytes = std::min<size_t>(o.header.length, sz.ll128SlotLines) * sizeof(dev::LL128Line);
        break;
    }
  }
  l.batchDone = 0;
  l.batchStepsDone = 0;
  return l.batchSteps > 0;
}

// Where a Simple step's data is: in its slot, or, for a pointer step, in our channel's
// buffers (it posts stable data there rather than copying it into the slot: one copy less),
// which we take as a receiver would, so that a send / recv group ending meanwhile waits for
// us rather than take it back (see P2pEngine::settlePointerSteps).
const char* NetProxy::pointerStepData(DataLink& l, int s) {
  const char* slot = l.out.simpleSlot(s, sizes_);
  uint64_t* word = &l.out.ctrl->dataAt[s];
  uint64_t at = dev::loadAcquire(word);
  if (at == 0 || at == dev::kPointerTaken || !dev::compareExchange(word, at, dev::kPointerTaken)) return slot;
  return reinterpret_cast<const char*>(at);
}

bool NetProxy::progressSend(DataLink& l) {
  if (l.batchSteps == 0 && !startBatch(l)) return false;
  iovec iov[2 * dev::kSteps];
  int n = 0;
  size_t skip = l.batchDone;  // what earlier writes took
  auto add = [&](const void* p, size_t len) {
    if (skip >= len) {
      skip -= len;
      return;
    }
    iov[n++] = {const_cast<char*>(static_cast<const char*>(p)) + skip, len - skip};
    skip = 0;
  };
  for (int i = 0; i < l.batchSteps; ++i) {
    add(&l.batch[i].header, sizeof(StepHeader));
    add(l.batch[i].data, l.batch[i].bytes);
  }
  ssize_t r = sendSome(l.sock.fd(), iov, n);
  if (r < 0) {
    peerLost(l.peer, closedReason(errno));
    l.closed = true;
    return true;
  }
  l.batchDone += (size_t)r;
  // Each step now wholly in the socket's buffer frees its slot for the channel again.
  size_t end = 0;
  for (int i = 0; i < l.batchSteps; ++i) {
    end += sizeof(StepHeader) + l.batch[i].bytes;
    if (i < l.batchStepsDone) continue;
    if (end > l.batchDone) break;
    ++l.batchStepsDone;
    dev::storeRelease(&l.out.ctrl->head, ++l.sent);
    dev::ring(l.out.ctrl->bell);
  }
  if (l.batchStepsDone == l.batchSteps) l.batchSteps = 0;
  return r > 0;
}

bool NetProxy::progressRecv(DataLink& l) {
  bool moved = false;
  if (!l.haveHeader) {
    ssize_t r = recvSome(l.sock.fd(), reinterpret_cast<char*>(&l.inHeader) + l.inDone, sizeof(StepHeader) - l.inDone);
    if (r < 0) {
      // Closed between steps: the peer left, or died, which its control link tells (sockets
      // close in no particular order). Anything else is a failure.
      if (errno != 0 || l.inDone > 0) peerLost(l.peer, closedReason(errno));
      l.closed = true;
      return true;
    }
    l.inDone += (size_t)r;
    if (l.inDone < sizeof(StepHeader)) return r > 0;
    const StepHeader& h = l.inHeader;
    const dev::ProtoSizes& sz = sizes_;
    int s = (int)(h.step % dev::kSteps);
    bool ok = h.step == l.received;
    switch ((Proto)h.proto) {
      case Proto::simple:
        ok = ok && h.length <= sz.simpleSlotBytes;
        l.inData = l.in.simpleSlot(s, sz);  // straight into the slot
        l.inBytes = h.length;
        break;
      case Proto::ll:
        ok = ok && dev::kLLHeaderLines + (uint64_t)h.length <= sz.llSlotLines;
        l.inBytes = (dev::kLLHeaderLines + (size_t)h.length) * sizeof(dev::LLLine);
        break;
      case Proto::ll128:
        ok = ok && h.length <= sz.ll128SlotLines;
        l.inBytes = (size_t)h.length * sizeof(dev::LL128Line);
        break;
      default:
        ok = false;
    }
    if (!ok) {
      peerLost(l.peer, "sent a malformed step on its network connection (step " + std::to_string(h.step) + ", expected " +
                           std::to_string(l.received) + "; protocol " + std::to_string(h.proto) + ", length " +
                           std::to_string(h.length) + ")");
      l.closed = true;
      return true;
    }
    if (h.proto != (uint32_t)Proto::simple) {
      l.bounce.resize((l.inBytes + 7) / 8);
      l.inData = reinterpret_cast<char*>(l.bounce.data());
    }
    l.haveHeader = true;
    l.inDone = 0;
    moved = true;
  }
  // The data goes into the slot (Simple) or is published there (lines): wait until our
  // channel has consumed the step that last used it (whose control words we replace, even
  // where the data goes elsewhere).
  if (dev::loadAcquire(&l.in.ctrl->head) + dev::kSteps <= l.inHeader.step) return moved;
  if (l.inHeader.proto == (uint32_t)Proto::simple) aimSimpleStep(l);
  if (l.inDone < l.inBytes) {
    ssize_t r = recvSome(l.sock.fd(), l.inData + l.inDone, l.inBytes - l.inDone);
    // (EFAULT into a FIFO page /dev/shm cannot give: read again, once, after the pages were
    // touched: they are there now, or private. Twice at one place is some other fault.)
    if (r < 0 && errno == EFAULT && l.touchedAt != l.inData + l.inDone &&
        ShmFaultWatch::touchIfWatched(l.inData + l.inDone, l.inBytes - l.inDone)) {
      l.touchedAt = l.inData + l.inDone;
      return true;
    }
    if (r < 0) {
      peerLost(l.peer, closedReason(errno));  // mid-step: never an orderly goodbye
      l.closed = true;
      return true;
    }
    l.inDone += (size_t)r;
    moved |= r > 0;
    if (l.inDone < l.inBytes) return moved;
  }
  publish(l);
  l.haveHeader = false;
  l.inDone = 0;
  l.landing = false;
  ++l.received;
  return true;
}

// Where the rest of a Simple step's data goes: straight into our channel's output, if it is
// final output values and the channel has published that output for the step's very
// operation (it then finds the step in place, as if a sender on this host had written it
// there: one copy less); else into the slot. Asked again before every read: a channel that
// stopped early takes its output back (dev::retractOutput), and from then on nothing more
// goes there (a step begun there ends in the slot; the operation failed anyway).
void NetProxy::aimSimpleStep(DataLink& l) {
  char* out = landing(l);
  if (l.inDone > 0 && !(l.landing && !out)) return;  // begun: it ends where it began, unless taken back
  char* slot = l.in.simpleSlot(l.inHeader.step, sizes_);
  l.landing = out != nullptr;
  l.inData = out ? out : slot;
}

// The place in our channel's output where a Simple step's data belongs, as published for
// its operation; null if none (not final output, or not published for that operation).
char* NetProxy::landing(const DataLink& l) const {
  const StepHeader& h = l.inHeader;
  const dev::ConnCtrl* c = l.in.ctrl;
  if (h.outputOffset == dev::kNotOutput || h.length == 0) return nullptr;
  if (!c->outputPublishedFor(h.opFirstStep, h.info)) return nullptr;
  uint64_t bytes = dev::loadRelaxed(&c->outputBytes);
  if (h.outputOffset > bytes || h.length > bytes - h.outputOffset) return nullptr;
  return reinterpret_cast<char*>(dev::loadRelaxed(&c->outputAt) + h.outputOffset);
}

void NetProxy::settle(void* proxy) {
  auto* self = static_cast<NetProxy*>(proxy);
  std::lock_guard<std::mutex> lock(self->progressMutex_);
}

// Stores a received step in the receiving end as its sender would have: the control words,
// the lines with their flags (LL: every word carries one; LL128: the flag word last), then
// the tail.
void NetProxy::publish(DataLink& l) {
  const StepHeader& h = l.inHeader;
  const dev::ProtoSizes& sz = sizes_;
  int s = (int)(h.step % dev::kSteps);
  dev::ConnCtrl* c = l.in.ctrl;
  c->info[s] = h.info;
  c->stepLength[s] = h.length;
  c->stepProto[s] = h.proto;
  c->dataAt[s] = l.landing ? (uint64_t)(uintptr_t)l.inData : 0;
  c->wroteToReceiver[s] = l.landing ? 1u : 0u;
  landedSteps_.fetch_add(l.landing ? 1 : 0, std::memory_order_relaxed);
  c->dataIsInput[s] = h.dataIsInput;
  c->inputScalar[s] = h.inputScalar;
  const uint64_t* words = l.bounce.data();
  if (h.proto == (uint32_t)Proto::ll) {
    uint64_t* to = l.in.ll[(size_t)s * sz.llSlotLines].w;
    for (size_t i = 0; i < l.inBytes / 8; ++i) dev::storeRelease(to + i, words[i]);
  } else if (h.proto == (uint32_t)Proto::ll128) {
    dev::LL128Line* to = l.in.ll128 + (size_t)s * sz.ll128SlotLines;
    for (size_t i = 0; i < h.length; ++i) {
      const uint64_t* line = words + i * dev::kLL128Words;
      std::memcpy(to[i].w, line, dev::kLL128DataWords * 8);
      dev::storeRelease(&to[i].w[dev::kLL128DataWords], line[dev::kLL128DataWords]);
    }
  }
  dev::storeRelease(&c->tail, h.step + 1);
  dev::ring(c->bell);
}

namespace {
// The third number of a /proc/sys/net/ipv4/tcp_[rw]mem file: the most its autotuning gives a
// socket's buffer (0 if unreadable).
size_t autotunedMost(const char* path) {
  FILE* f = std::fopen(path, "r");
  if (!f) return 0;
  unsigned long least = 0, first = 0, most = 0;
  int n = std::fscanf(f, "%lu %lu %lu", &least, &first, &most);
  std::fclose(f);
  return n == 3 ? most : 0;
}
}  // namespace

size_t NetProxy::heldPerChannel(const Socket& tuned) const {
  // The receiver's FIFO (pointer steps of 128 KiB and more skip our copy of it: the proxy
  // reads the caller's buffer) and each socket buffer as the kernel reports it: what it
  // granted (wmem_max / rmem_max may cap what was asked for), doubled for its bookkeeping.
  // Two ranks sending each other 34 MiB over loopback on 2 channels got through, 40 MiB did
  // not: 17-20 MiB a channel, against 17 counted here at 4 MiB buffers. Neither way is safe:
  // a send that does not fit but is not counted long hangs, and one counted long that fits
  // but takes over a second to leave (a slow link) is reported as a deadlock. (Twice this,
  // as counted before, let head-to-head sends of 36-72 MiB hang.)
  size_t fifo = (size_t)dev::kSteps * sizes_.simpleSlotBytes;
  auto granted = [&](int option, const char* autotunedLimits) -> size_t {
    if (setup_.socketBufferBytes <= 0) return autotunedMost(autotunedLimits);
    int bytes = 0;
    socklen_t len = sizeof(bytes);
    return getsockopt(tuned.fd(), SOL_SOCKET, option, &bytes, &len) == 0 && bytes > 0 ? (size_t)bytes : 0;
  };
  size_t sendBuffer = granted(SO_SNDBUF, "/proc/sys/net/ipv4/tcp_wmem");
  size_t recvBuffer = granted(SO_RCVBUF, "/proc/sys/net/ipv4/tcp_rmem");
  if (sendBuffer == 0 || recvBuffer == 0) return 0;
  return fifo + sendBuffer + recvBuffer;
}

// Our heartbeat and state out, whenever they change or a call asks (sendCallLogNow); the
// peer's in, into its mirror.
bool NetProxy::progressCtrl(CtrlLink& c) {
  if (c.closed) return false;
  bool moved = false;
  const RankCtrl* own = setup_.own;
  uint64_t beat = dev::loadAcquire(&own->heartbeat);
  uint32_t state = dev::loadAcquire(&own->state);
  uint64_t nudges = callLogNudges_.load(std::memory_order_acquire);
  if (!c.outPending && (beat != c.lastBeat || state != c.lastState || nudges != c.lastNudge)) {
    constexpr size_t kCtrlRest = offsetof(CtrlMessage, failCode);  // where the rest starts
    CtrlMessage now{};
    now.failCode = own->failCode;
    now.gaveUpOn = dev::loadAcquire(&own->gaveUpOn);
    std::memcpy(now.failMessage, own->failMessage, sizeof(now.failMessage));
    now.failMessage[sizeof(now.failMessage) - 1] = '\0';
    copyCallLog(own->calls, now.calls);
    bool changed = std::memcmp(reinterpret_cast<char*>(&now) + kCtrlRest, reinterpret_cast<char*>(&c.out) + kCtrlRest,
                               sizeof(CtrlMessage) - kCtrlRest) != 0;
    if (changed) std::memcpy(reinterpret_cast<char*>(&c.out) + kCtrlRest, reinterpret_cast<char*>(&now) + kCtrlRest,
                             sizeof(CtrlMessage) - kCtrlRest);
    c.out.beat = {beat, state, changed || state != c.lastState};
    c.outBytes = c.out.beat.full ? sizeof(CtrlMessage) : sizeof(CtrlMessage::Beat);
    c.lastBeat = beat;
    c.lastState = state;
    c.lastNudge = nudges;
    c.outDone = 0;
    c.outPending = true;
  }
  if (c.outPending) {
    iovec iov{reinterpret_cast<char*>(&c.out) + c.outDone, c.outBytes - c.outDone};
    ssize_t r = sendSome(c.sock.fd(), &iov, 1);
    if (r < 0) {
      peerLost(c.peer, closedReason(errno));
      return true;
    }
    c.outDone += (size_t)r;
    c.outPending = c.outDone < c.outBytes;
    moved |= r > 0;
  }
  ssize_t r = receiveCtrl(c);
  if (r < 0) {  // (a goodbye after the peer said it left or failed; otherwise it vanished)
    int err = errno;
    c.closed = true;
    lost_[c.peer].store(true, std::memory_order_release);  // (gone either way: see lost())
    if (dev::loadAcquire(&c.mirror->ctrl()->state) == RankCtrl::kRunning) peerLost(c.peer, closedReason(err));
    return true;
  }
  return moved || r > 0;
}

// Reads what the peer's control link holds, into its mirror: bytes read, 0 if none were
// there, -1 if it closed or failed (errno set, as recvSome).
ssize_t NetProxy::receiveCtrl(CtrlLink& c) {
  constexpr size_t kBeat = sizeof(CtrlMessage::Beat);
  size_t bytes = c.inDone < kBeat || !c.in.beat.full ? kBeat : sizeof(CtrlMessage);
  ssize_t r = recvSome(c.sock.fd(), reinterpret_cast<char*>(&c.in) + c.inDone, bytes - c.inDone);
  if (r <= 0) return r;
  c.inDone += (size_t)r;
  if (c.inDone < bytes || (bytes == kBeat && c.in.beat.full)) return r;
  RankCtrl* m = c.mirror->ctrl();
  if (c.in.beat.full) {
    m->failCode = c.in.failCode;
    dev::storeRelease(&m->gaveUpOn, c.in.gaveUpOn);
    std::memcpy(m->failMessage, c.in.failMessage, sizeof(m->failMessage));
    m->failMessage[sizeof(m->failMessage) - 1] = '\0';
    copyCallLog(c.in.calls, m->calls);
  }
  if (dev::loadAcquire(&m->state) != RankCtrl::kFailed) dev::storeRelease(&m->state, c.in.beat.state);
  dev::storeRelease(&m->heartbeat, c.in.beat.heartbeat);
  c.inDone = 0;
  return r;
}

// Before a lost connection makes the peer failed, what it said last: its control link may
// still hold the failure it reported before it closed (queued behind heartbeats while this
// process was stopped, or arriving after its data links closed: sockets close in no order).
// Reads until the peer's state is no longer "running", the link closes, or a moment passes.
void NetProxy::readLastWords(CtrlLink& c) {
  Deadline deadline = deadlineIn(0.2);
  while (!c.closed && dev::loadAcquire(&c.mirror->ctrl()->state) == RankCtrl::kRunning) {
    ssize_t r = receiveCtrl(c);
    if (r < 0) c.closed = true;
    if (r != 0) continue;
    int ms = (int)std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd fd{c.sock.fd(), POLLIN, 0};
    if (ms <= 0 || ::poll(&fd, 1, ms) <= 0) return;
  }
}

// The peer is gone (or broke the wire format): its mirror says it failed, unless it said it
// left or failed (before, or in its last words), and the Monitor turns that into this rank's
// error.
void NetProxy::peerLost(int peer, const std::string& why) {
  CtrlLink& c = ctrlOf(peer);
  readLastWords(c);
  c.lost = c.closed = true;
  lost_[peer].store(true, std::memory_order_release);
  RankCtrl* m = c.mirror->ctrl();
  if (dev::loadAcquire(&m->state) != RankCtrl::kRunning) return;
  vanished_[peer].store(true, std::memory_order_release);
  m->failCode = mnclRemoteError;
  std::string message = why + " (did its process exit, or the network fail?)";
  std::strncpy(m->failMessage, message.c_str(), sizeof(m->failMessage) - 1);
  dev::storeRelease(&m->state, (uint32_t)RankCtrl::kFailed);
}

// Nothing to do: wait for a socket or a wake-up (10 ms at most: our heartbeat must go out).
void NetProxy::sleep() {
  std::vector<pollfd> fds;
  std::unique_lock<std::mutex> lock(progressMutex_);
  fds.push_back({wakeFd_, POLLIN, 0});
  for (auto& c : ctrl_) {
    if (!c->closed) fds.push_back({c->sock.fd(), (short)(POLLIN | (c->outPending ? POLLOUT : 0)), 0});
  }
  for (auto& l : data_) {
    if (l->closed || l->ctrl->lost) continue;
    bool waitsForSlot = l->haveHeader && dev::loadAcquire(&l->in.ctrl->head) + dev::kSteps <= l->inHeader.step;
    short events = (short)((waitsForSlot ? 0 : POLLIN) | (l->sending() ? POLLOUT : 0));
    if (events) fds.push_back({l->sock.fd(), events, 0});
  }
  lock.unlock();
  sleeping_.store(true);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!setup_.busy() && !stop_.load()) ::poll(fds.data(), fds.size(), 10);
  sleeping_.store(false);
  uint64_t drained;
  (void)!::read(wakeFd_, &drained, sizeof(drained));
}

// Teardown: what our channels published still goes out (unless this communicator failed:
// then nobody waits for it), then our last state; then the sockets close, each after reading
// what is left in it (closing with unread data would reset the connection, and the peer
// could lose what we sent last). Where nothing moves (control messages included) for
// MININCL_TIMEOUT, the peer is hung: the rest is dropped (a destroy waited for the bootstrap
// timeout, 60 s, on a stopped peer); a live one that reads nothing has until then.
void NetProxy::flush() {
  Deadline deadline = deadlineIn(setup_.lastSendsTimeout), cap = deadlineIn(setup_.timeout);
  auto pending = [&] {
    for (auto& l : data_) {
      if (!l->closed && !l->ctrl->lost && (l->sending() || dev::loadAcquire(&l->out.ctrl->tail) > l->sent)) return true;
    }
    for (auto& c : ctrl_) {
      if (!c->closed && (c->outPending || dev::loadAcquire(&setup_.own->state) != c->lastState)) return true;
    }
    return false;
  };
  uint32_t spins = 0;
  while (pending() && Clock::now() < std::min(deadline, cap)) {
    bool failed = dev::loadRelaxed(setup_.abortWord) != 0;
    bool moved = false;
    for (auto& c : ctrl_) moved |= progressCtrl(*c);
    for (auto& l : data_) {
      if (!l->closed && !l->ctrl->lost && !failed) moved |= progressSend(*l);
    }
    if (failed && std::all_of(ctrl_.begin(), ctrl_.end(), [](auto& c) { return c->closed || !c->outPending; })) break;
    if (moved) deadline = deadlineIn(setup_.lastSendsTimeout);
    spins = moved ? 0 : spins + 1;
    dev::cpuBackoff(spins);
  }
  char sink[4096];
  auto drainAndClose = [&](Socket& s) {
    if (!s.valid()) return;
    ::shutdown(s.fd(), SHUT_WR);
    while (::recv(s.fd(), sink, sizeof(sink), MSG_DONTWAIT) > 0) {
    }
    s.close();
  };
  for (auto& l : data_) drainAndClose(l->sock);
  for (auto& c : ctrl_) drainAndClose(c->sock);
}

}  // namespace mncl
