// A communicator: one rank's view of a group of ranks, with its channels, its connections
// to every peer, the threads that run its channels, and its error state.
#pragma once

#include <sched.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../../cuda/channel.h"
#include "../bootstrap/bootstrap.h"
#include "../topo/comm_plan.h"
#include "../transport/region.h"
#include "../transport/shm_fault.h"
#include "../transport/window.h"
#include "../tune/tuner.h"
#include "busy_cores.h"
#include "call_log.h"
#include "error.h"
#include "log.h"
#include "minincl.h"

namespace mncl {

class Executor;
class Monitor;
class NetProxy;
namespace gpu {
class GpuComm;
class HostMapped;
}  // namespace gpu

// What a channel owns on the host: the device-visible struct plus the arrays it points into.
struct Channel {
  dev::DevChannel dev;
  std::vector<dev::ConnFifo> sendTo, recvFrom;
  std::vector<uint64_t> sendStep, recvStep;
  std::vector<uint64_t> opFirstSendStep, opFirstRecvStep;
  std::vector<uint64_t> peerHeads;
  std::vector<int> ring;
};

struct PeerInfo {
  int32_t rank, pid, nChannels, device;
  int32_t cpu;          // where init ran (sched_getcpu), for placing the rank on the topology
  cpu_set_t affinity;
  uint64_t hostHash;
  uint64_t regionId;    // local registry key (valid in the same process)
  uint64_t regionBytes;
  dev::ProtoSizes sizes;
  uint64_t probeAddr;   // where a known word lies in this rank's process (pointer steps' check)
  char shmName[96];
  uint64_t gpuRegionId;  // GPU: the device FIFO region's registry key (same process)
  char gpuIpcHandle[64];  // GPU: its CUDA IPC handle (other processes)
  int32_t gpuIpcOk;       // GPU: the handle could be made
  char windowName[96];    // CPU: this rank's window (MININCL_WINDOW_BYTES), if it has one
  uint64_t windowBytes, windowAt;  // its size and where it lies in this rank's process
  int32_t netForced;      // MININCL_TRANSPORT=net: every peer over the network (must agree)
  int32_t p2pSpread;      // MININCL_P2P_SPREAD (must agree: see Comm::p2pSpread)
  // MININCL_ALGO / MININCL_PROTO as masks (must agree: every rank's tuner must choose alike).
  uint32_t algoMask, protoMask;
  int32_t oversubscribed;  // this host's channel (and proxy) threads outnumber its cores (tuner)
  double timeoutSeconds;   // MININCL_TIMEOUT: how long its peers may go without its heartbeat
  WireAddr netAddr;       // this rank's network-transport listener (when some peer needs it)
};

// What a communicator's creator may ask for beyond the environment (the C API's mnclConfig_t).
struct CommOptions {
  // Bounds on the channel count: MININCL_NCHANNELS, or the default, is clamped into them
  // (0: no bound). Every rank takes the smallest count of all, as always.
  int minChannels = 0, maxChannels = 0;
  // The window's size (mnclConfig_t's windowBytes), 0 to kMaxWindowBytes; -1: MININCL_WINDOW_BYTES.
  int64_t windowBytes = -1;
};
constexpr int64_t kMaxWindowBytes = int64_t{1} << 40;

class Comm {
 public:
  Comm(const UniqueIdData& id, int rank, int nranks, int device, const CommOptions& options = {});
  ~Comm();

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  int device() const { return device_; }  // CUDA ordinal, or MNCL_DEVICE_CPU
  const CommOptions& options() const { return options_; }
  bool onGpu() const { return device_ >= 0; }
  // MININCL_DEBUG=INFO with the P2P subsystem: each send and receive is logged as it starts.
  bool logsP2p() const { return logsP2p_; }
  // The device side of a GPU communicator (null on the CPU).
  gpu::GpuComm* gpu() const { return gpu_.get(); }
  int nChannels() const { return (int)channels_.size(); }
  Channel& channel(int c) { return *channels_[c]; }
  const Channel& channel(int c) const { return *channels_[c]; }
  const std::vector<PeerInfo>& peers() const { return peers_; }
  Executor& executor() { return *executor_; }
  const Tuner& tuner() const { return tuner_; }
  Bootstrap& bootstrap() { return *bootstrap_; }
  // How the rings were chosen (same on every rank); channel(c).ring holds the order in use.
  const topo::CommPlan& topoPlan() const { return topoPlan_; }
  // Channel c's tree as each rank's parent (-1 at the root), rooted at rank 0, as allreduce
  // runs it; reduce and broadcast re-root it at their root.
  std::vector<int> treeParents(int c) const;

  // This rank's window (null without one): shared memory for user buffers that peer
  // processes read directly (see transport/window.h).
  const std::shared_ptr<Window>& window() const { return window_; }
  // Whether a window would serve this rank: a CPU rank with a peer in another process of this
  // host (threads read each other's buffers anyway; network peers map nothing).
  bool windowUseful() const { return windowUseful_; }

  // The word every spin loop watches; non-zero stops all in-flight work.
  // (On a GPU communicator it lives in pinned host memory the kernels read.)
  const uint32_t* abortWord() const { return abort_; }
  bool failed() const { return dev::loadRelaxed(abort_) != 0; }

  // Puts the communicator in the error state (first caller's reason wins), stops in-flight
  // work and tells the peers. Later calls on it raise the same error. (The message gets a
  // note where this process did not run for a while just before: see Monitor::stallNote.)
  void fail(mnclResult_t code, const std::string& message);
  mnclResult_t asyncError() const;
  std::string errorMessage() const;
  // The same text, which stays put once the communicator failed (fail() keeps the first
  // error): a C caller may hold the pointer for as long as the communicator lives.
  const char* failedMessage() const;
  [[noreturn]] void throwStoredError() const;
  // Where a page of this rank's shared memory could not be had (see ShmFaultWatch), stores
  // that as the error, once. The readers above call it first: the SIGBUS handler, which may
  // neither lock nor allocate, only set the abort word.
  void storeShmFault() const;

  // How long one call may stay inside this communicator before its monitor fails it with
  // mnclTimeout, saying where each rank is (seconds, 0: no limit; default
  // MININCL_CALL_TIMEOUT). On a GPU, how long a launch may go unfinished after it was queued
  // (a call returns at once there; see gpu::LaunchWatch). MININCL_TIMEOUT catches a peer that
  // stops; this, a live peer that never makes the call (as torch's process-group timeout does).
  double callTimeout() const { return callTimeout_.load(std::memory_order_relaxed); }
  void setCallTimeout(double seconds);

  // Stops everything; returns once no call is running inside the communicator.
  void abort();
  // For a destroy that waited MININCL_TIMEOUT for calls on other threads: fails the
  // communicator, so that those still waiting for their peers stop (rather than wait for ever).
  void stopCallsForDestroy();
  // Fails the communicator with Aborted (`why`), for abort() and destroy(), from any thread
  // or a signal handler; a split's or shrink's rendezvous under way stops too.
  void stop(const std::string& why);
  // Throws Aborted if the communicator was stopped since stops_ read `before`.
  void failIfStoppedSince(uint32_t before) const;

  // Logs a collective call this rank starts, where its peers' monitors compare it with
  // theirs (see call_log.h).
  void logCall(const LoggedCall& call);
  uint64_t collectiveCallsMade() const;  // logged so far
  uint64_t peerCollectiveCallsMade(int r) const;  // as rank r's log here says (a network peer's: a mirror)
  // CPU, after collective call `seq` of count 0 (which moves no step, so no peer checks it
  // against its own): waits until every peer has logged its call `seq`, and fails the
  // communicator (throwing) if one made another call; the monitor would a tick later, after
  // the next call had paired with the wrong one.
  void checkZeroCountCall(uint64_t seq);
  // Counts a send or receive this rank posts, for the same log. `channelBytes`: of a send,
  // the most that one of its channels carries to the peer, with the group's earlier sends to
  // it (see p2pSplit); `opBytes`: what the op alone puts on its first channel, which every
  // op with that peer starts on (its FIFO steps, see PeerP2p).
  void countP2p(bool isSend, int peer, size_t channelBytes, size_t opBytes);

  // Counts calls running inside; destroy/abort wait for them to leave. On the CPU, where a
  // call runs on the channels until it ends, it refuses a second call from another thread
  // meanwhile (InvalidUsage, and the communicator fails), and says in the call log what the
  // call is inside (see call_log.h).
  struct CallScope {
    explicit CallScope(Comm& c, Inside inside = Inside::both, uint64_t peers = 0);
    ~CallScope();
    Comm& comm;

   private:
    [[noreturn]] void refuseSecondThread();
  };

  // mnclCommSplit's rendezvous: the ranks passing the same color form a new group, ordered
  // by (key, rank). Collective over this communicator. Returns false for color < 0 (no new
  // group); otherwise the new group's size, this rank's place in it and its unique id (the
  // group's first rank starts its root and sends the id to the others).
  // `members`, if given: this communicator's ranks in the new group, in its rank order.
  // `refused`: this rank's split was refused for its arguments; it still meets the others,
  // so that theirs fail at once, naming it, rather than at the bootstrap timeout (and then
  // returns false: the caller raises its own error).
  bool splitInfo(int color, int key, int* newRanks, int* newRank, UniqueIdData* id,
                 std::vector<int>* members = nullptr, bool refused = false);
  // mnclCommShrink's rendezvous: every rank but `exclude` (which need not be alive, and do
  // not call) forms a new group, in rank order. Works on a failed communicator: it needs
  // only the bootstrap's sockets between the ranks kept. `abortFirst`: abort() once the
  // arguments are checked (MNCL_SHRINK_ABORT).
  void shrinkInfo(const std::vector<int>& exclude, bool abortFirst, int* newRanks, int* newRank, UniqueIdData* id,
                  std::vector<int>* members = nullptr);
  // For the new group's init after a split or shrink (in a WaitCheck): throws RemoteError if
  // the process of one of `members` (this communicator's ranks, on this host) exited, or
  // Timeout if one showed no sign of life for MININCL_TIMEOUT, since it will never join.
  void failIfMemberGone(const std::vector<int>& members) const;
  // The ranks this rank has seen go: they destroyed or aborted their communicator, their
  // process exited (on this host), their network connection broke, or their heartbeat
  // stopped for MININCL_TIMEOUT (given up on for good: a rank alive but stuck in its own code is not lost).
  std::vector<int> lostRanks() const;
  bool lost(int r) const;  // whether lostRanks() lists rank r
  bool givenUpOn(int r) const;  // its heartbeat stopped for MININCL_TIMEOUT (see Monitor::gaveUpOn)
  // Whether rank r's process is gone: on this host, by its pid; over the network, its
  // connection ended without a word (NetProxy::vanished: or the network failed).
  bool exited(int r) const;

  // GPU: whether this communicator's last kernel may still be running.
  bool gpuWorkPending() const;
  // Returns once no other thread is inside a call on this communicator and its last kernel
  // has finished, or once it failed (which stops its calls and kernels).
  void awaitQueuedWork() const;

  // Steps this rank's senders handed over as pointers and wrote straight into receivers'
  // outputs since init, steps from network peers its proxy received straight into this
  // rank's outputs, steps whose data this rank had read ahead from a sender's input, and how
  // many peers read this rank's buffers directly.
  struct Stats {
    uint64_t pointerSteps = 0, directWrites = 0, landedSteps = 0, stepsReadAhead = 0;
    int readablePeers = 0;
  };
  Stats stats();

  // An in-place alltoall sends from a copy of the other ranks' blocks: the communicator
  // keeps that memory for the next one (fresh pages every call made a 16 MiB in-place
  // alltoall 2.8x the time of an out-of-place one). Freed with the communicator.
  std::vector<char>& alltoallScratch() { return alltoallScratch_; }

  // Why peer r stopped, if it has failed (from its control block); empty if it has not.
  std::string peerFailure(int r) const;
  // Where this rank's collective calls and peer r's differ, as their call logs say (see
  // call_log.h): "mismatched calls: rank 0 called barrier() but rank 1 (pid 7) called ...",
  // with the user's names for the calls (an alltoall, a barrier); empty if they agree.
  std::string loggedCallMismatch(int r) const;
  // The collective call this rank is inside ("collective call 3, alltoall(count=4, float32)"),
  // or empty (in sends and receives, or no call).
  std::string collectiveInside() const;

  // CPU, once a call that ran on this communicator and failed has left it (CallScope),
  // before its error reaches the caller, who may then free the call's buffers: a peer on
  // this host whose steps matched ours may still read the pointer steps we posted (our
  // buffers) or write into outputs we published. Each peer fails too once its monitor sees
  // our failure, within a tick; this waits until every peer on this host has failed (or
  // left, or its process is gone, or its monitor stopped) and is outside any call (at most
  // MININCL_TIMEOUT). Returns at once if the communicator has not failed.
  void awaitPeersOutOfCalls() const;

  // Whether a send or receive with a peer starts on channel (rank + peer) % nChannels rather
  // than on channel 0, so that a group's exchanges with several peers (an alltoall) run on
  // several channels even when each is small. On for GPUs, where every channel is a block
  // of the same kernel; off for CPUs, where channel 0 runs on the caller's thread and the
  // others cost a hand-off (MININCL_P2P_SPREAD=0|1 sets it; every rank must agree).
  bool p2pSpread() const { return p2pSpread_; }

  // A rank that has posted more sends to this rank than this rank has posted receives from
  // it (its send waits for a receive), the lowest if several; -1 if none (or this rank or
  // theirs is past the call logs' kP2pPeers). What a receive from any source waits for.
  int pendingSender() const;

  // Whether peer r is reached over the network (another host, or MININCL_TRANSPORT=net).
  bool overNetwork(int r) const { return netPeer_[r] != 0; }
  // Whether ranks a and b reach each other through FIFOs in shared memory, without the network.
  bool shareFifos(int a, int b) const {
    return !peers_[a].netForced && peers_[a].hostHash == peers_[b].hostHash;
  }

 private:
  // Split and shrink from one thread at a time (see comm_split.cc).
  struct RendezvousScope {
    RendezvousScope(Comm& c, const char* call);
    ~RendezvousScope();
    Comm& comm;
  };
  std::atomic<int> rendezvousInside_{0};
  void awaitRendezvousLeft() const;  // after an abort(): until another thread's split or shrink left
  mnclResult_t asyncErrorStored() const;  // asyncError() without storeShmFault() first
  // shrinkInfo's part on the lowest rank kept: compares the others' excluded ranks with its
  // own and sends each the reply (the new group's id, or why there is none); returns the
  // ranks that disagree ("" if none).
  struct ShrinkReply;
  std::string shrinkAsLeader(const std::vector<int>& kept, const std::vector<uint8_t>& excluded, ShrinkReply* reply);
  // Throws InvalidUsage if rank r, kept by a shrink, is lost (it can never answer).
  void failIfGone(int r) const;
  // Rethrows a split's error `e`, prefixed with `call`, naming the ranks gone (Aborted if
  // the communicator was stopped since stops_ read `stops`).
  [[noreturn]] void throwRendezvousError(const char* call, uint32_t stops, const Error& e) const;
  void failIfLeftBeforeSplit(int split) const;  // in a split's waits: throws if a rank left before the ranks met
  // Before the bootstrap: the device is one, and usable (GPU: current, with the abort word in
  // pinned memory). A failure here is told to the other ranks (Bootstrap::reportInitFailure).
  void prepareDevice();
  // Init's phases, in order (see the constructor).
  struct HostShare {  // who shares this rank's host
    int localRanks = 0, localIndex = 0, ranksOnDevice = 0;
    bool otherProcess = false, sharedProcess = false, anyNet = false;
  };
  PeerInfo describeSelf();
  void checkLaterSettings();
  HostShare checkPeersAgree(const PeerInfo& mine);
  std::vector<int32_t> pidsOfRanksHere() const;  // other processes holding ranks of this host
  std::shared_ptr<ShmMapping> createRegions(const RegionLayout& layout, bool otherProcess);
  void mapPeerRegions();
  void setSpinBudgets(bool channelsShareCores, bool anyNet);
  bool anyHostOversubscribed() const;
  void startTunerAndThreads(int nch, const PeerInfo& mine);
  bool peerOutOfCalls(int r) const;
  void agreeOnPlan();
  int channelsWanted(int coresPerRank) const;
  int gpuChannelsWanted(int ranksOnDevice) const;
  int withinChannelBounds(int want, int most) const;  // options_' bounds, checked against `most`
  void logPlan() const;
  void setupChannels(int nch, const dev::ProtoSizes& sizes);
  void connect(const RegionLayout& layout);
  void createGpuRegion(size_t bytes);
  void openPeerGpuRegions();
  bool openPeerIpcRegions();  // false if any peer process's device memory cannot be opened
  void checkGpuErrors();  // the monitor's poll: a kernel's error record becomes the comm's error
  void enablePointerSteps();
  void enableGpuPointerSteps();
  void startNetProxy(const UniqueIdData& id, const RegionLayout& layout, int nch, bool sharesCores);
  void warnOfUnreportedMismatch() const;
  void leave();

  int rank_, nranks_, device_;
  CommOptions options_;
  uint32_t abortLocal_ = 0;
  std::unique_ptr<gpu::HostMapped> abortPinned_;  // GPU: the abort word, where kernels see it
  uint32_t* abort_ = &abortLocal_;
  mutable std::mutex errorMutex_;
  mnclResult_t error_ = mnclSuccess;
  std::string errorMessage_;
  // MININCL_DEBUG's COLL and P2P at INFO, read once: every call asks.
  const bool logsCalls_ = log::enabled(log::kInfo, log::kColl);
  const bool logsP2p_ = log::enabled(log::kInfo, log::kP2p);
  std::atomic<int> callsInside_{0};
  // How many times abort() or a destroy stopped this communicator's calls: a split's or
  // shrink's rendezvous, which waits on the bootstrap's sockets rather than on the channels,
  // watches it (failIfStoppedSince) so that those stop it too.
  std::atomic<uint32_t> stops_{0};
  std::string stopReason_;  // the last stop's (errorMutex_)
  std::atomic<double> callTimeout_{0};  // see callTimeout()
  int splits_ = 0;  // tags bootstrap messages of successive splits apart
  // Shrink exchanges completed with each rank (see shrinkInfo): they tag the next one's
  // bootstrap messages.
  static constexpr int kShrinkTags = 1 << 20;
  std::vector<int> shrinksWith_;
  int gpuReadablePeers_ = 0;  // GPU: peers whose kernels read this rank's buffers
  bool oversubscribed_ = false;  // CPU: this host's ranks have more channel and proxy threads than cores
  bool p2pSpread_ = false;       // see p2pSpread()
  bool windowUseful_ = false;    // see windowUseful()

  std::unique_ptr<Bootstrap> bootstrap_;
  std::vector<PeerInfo> peers_;
  std::optional<RankProcessesHere> rankProcesses_;  // the processes of this host's ranks (busy_cores.h)
  dev::SleepOnBusyCores busyCores_ = dev::SleepOnBusyCores::whereOthersRun;  // MININCL_BUSY_CORES
  std::shared_ptr<Mapping> region_;                 // ours
  std::vector<std::shared_ptr<Mapping>> peerRegions_;
  std::shared_ptr<Window> window_;
  std::vector<std::shared_ptr<Mapping>> peerWindows_;  // [rank]: its window mapped here, or null
  ShmFaultWatch shmFaults_;  // the shared regions above (declared after them: unwatched before they go)
  // Where the FIFOs are: the regions above on the CPU; device memory on a GPU (whose host
  // regions then hold only the control block).
  std::shared_ptr<Mapping> gpuRegion_;
  std::vector<std::shared_ptr<Mapping>> peerFifos_;
  std::unique_ptr<gpu::GpuComm> gpu_;
  std::vector<std::unique_ptr<Channel>> channels_;
  topo::CommPlan topoPlan_;
  Tuner tuner_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Monitor> monitor_;
  std::vector<char> netPeer_;            // [rank]: reached over the network
  std::vector<char> alltoallScratch_;    // see alltoallScratch()
  Socket netListener_;                   // where network peers connect (while init connects)
  std::unique_ptr<NetProxy> netProxy_;   // moves those peers' steps (null without any)

  friend class Monitor;
};

uint64_t hostHash();  // same value for processes that can share /dev/shm and see each other's pids

}  // namespace mncl
