#include "comm.h"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>

#include "../enqueue/enqueue.h"
#include "../enqueue/executor.h"
#include "../enqueue/work_plan.h"
#include "../gpu/gpu_comm.h"
#include "../transport/net.h"
#include "../transport/peer_memory.h"
#include "affinity.h"
#include "busy_cores.h"
#include "comm_settings.h"
#include "env.h"
#include "error.h"
#include "log.h"
#include "monitor.h"
#include "vector_isa.h"

namespace mncl {

uint64_t hostHash() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  // MININCL_HOSTID stands for the host's name (NCCL_HOSTID's role): processes that share
  // a name but not memory, or, for tests, processes of one host posing as several hosts.
  std::string key = env::str("MININCL_HOSTID", host);
  // Processes in other pid or ipc namespaces can neither see our pids nor our /dev/shm.
  for (const char* ns : {"/proc/self/ns/pid", "/proc/self/ns/ipc"}) {
    struct stat st {};
    if (stat(ns, &st) == 0) key += ":" + std::to_string((unsigned long long)st.st_ino);
  }
  return std::hash<std::string>{}(key);
}

namespace {

// tmpfs gives a segment's pages as they are first touched, and a page /dev/shm cannot give
// then raises SIGBUS in the process that touches it (caught: see ShmFaultWatch; the call
// fails). Claiming every rank's connection buffers at init would refuse jobs whose traffic
// never reaches most of them (a ring uses 2 of a rank's ranks x channels connections: 8 ranks
// in a container's default 64 MiB run), so where they could outgrow /dev/shm the host's first
// rank says so, once.
void warnIfDevShmTooSmall(size_t regionBytes, int localRanks) {
  size_t room = ShmMapping::devShmBytes(), need = regionBytes * (size_t)localRanks;
  if (room == 0 || need <= room) return;
  MNCL_WARN(kInit,
            "the connection buffers of this host's %d ranks can take %zu MiB of /dev/shm, which holds %zu MiB: a call "
            "whose traffic reaches past what it can give fails (SystemError), and its communicator with it. Give "
            "/dev/shm more (a container's: docker run --shm-size=1g), or make the buffers smaller (MININCL_NCHANNELS, "
            "MININCL_SIMPLE_SLOT_BYTES)",
            localRanks, need >> 20, room >> 20);
}

int cpuCount() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// FIFO sizes. A GPU step is worth more bytes: its flag round trip costs microseconds.
dev::ProtoSizes protoSizesFromEnv(bool onGpu) {
  dev::ProtoSizes s{};
  // (Each checked before it is narrowed: a negative one wrapped into a region of terabytes.)
  int64_t simpleSlot = env::bytes("MININCL_SIMPLE_SLOT_BYTES", onGpu ? 512 << 10 : 128 << 10);
  MNCL_CHECK(simpleSlot >= 4096 && simpleSlot <= (1 << 30) && simpleSlot % 4096 == 0, mnclInvalidArgument,
             "MININCL_SIMPLE_SLOT_BYTES must be a multiple of 4096, at most 1G");
  s.simpleSlotBytes = (uint32_t)simpleSlot;
  // GPU: a step of LL is one pass of a whole block (512 threads x 4 lines in flight each);
  // LL128 four passes (64 lines x 4 per pass). Steps of a few KiB made LL step-bound there.
  // (Counts, read as sizes are: "4M" is 4 x 2^20 lines.)
  int64_t llLines = env::bytes("MININCL_LL_SLOT_LINES", onGpu ? 2048 : 512);
  MNCL_CHECK(llLines >= 16 && llLines <= (1 << 22), mnclInvalidArgument, "MININCL_LL_SLOT_LINES must be from 16 to 4M");
  int64_t ll128Lines = env::bytes("MININCL_LL128_SLOT_LINES", onGpu ? 1024 : 256);
  MNCL_CHECK(ll128Lines >= 4 && ll128Lines <= (1 << 20), mnclInvalidArgument,
             "MININCL_LL128_SLOT_LINES must be from 4 to 1M");
  s.llSlotLines = (uint32_t)llLines;
  s.ll128SlotLines = (uint32_t)ll128Lines;
  // CPU: a piece of 1/8 slot (16 KiB) keeps a 4-rank tree allreduce busy at 64 KiB (19-21 us
  // against 29-30 uncut). GPU: uncut until measured there (a step costs several us).
  int64_t chunk = env::bytes("MININCL_PIPELINE_CHUNK_BYTES", onGpu ? s.simpleSlotBytes : s.simpleSlotBytes / 8);
  MNCL_CHECK(chunk >= 64 && chunk <= (1 << 30), mnclInvalidArgument,
             "MININCL_PIPELINE_CHUNK_BYTES must be from 64 to 1G");
  s.pipelineChunkBytes = (uint32_t)chunk;
  return s;
}

}  // namespace

Comm::Comm(const UniqueIdData& id, int rank, int nranks, int device, const CommOptions& options)
    : rank_(rank), nranks_(nranks), device_(device), options_(options) {
  PeerInfo mine{};
  try {
    Bootstrap::checkArguments(id, rank, nranks);
    prepareDevice();
    double callTimeout = env::seconds("MININCL_CALL_TIMEOUT", 0);  // (its error names the variable)
    if (std::isinf(callTimeout) && callTimeout > 0) callTimeout = 0;  // ("inf": no limit, as call_timeout = math.inf)
    try {
      setCallTimeout(callTimeout);
    } catch (const Error& e) {
      throw Error(e.code(), std::string("MININCL_CALL_TIMEOUT: ") + e.what());
    }
    cpuBindRequested();  // (checked here for every rank, threads too: only processes bind)
    mine = describeSelf();
    checkLaterSettings();
  } catch (const std::exception& e) {
    Bootstrap::reportInitFailure(id, rank, nranks, e.what());  // (the others need not wait for us)
    throw;
  }
  bootstrap_ = std::make_unique<Bootstrap>(id, rank, nranks);
  // A rank whose init fails from here on closes its bootstrap sockets: its ring neighbours'
  // waits end at once, and theirs in turn, rather than at the bootstrap timeout. (Until the
  // last barrier: past it, a rank done with its init may go.)
  std::optional<WaitCheck> whileNeighboursLive;
  whileNeighboursLive.emplace([this] { bootstrap_->failIfNeighbourGone(); });

  peers_.assign(nranks, PeerInfo{});
  peers_[rank] = mine;
  bootstrap_->allgather(peers_.data(), sizeof(PeerInfo));
  HostShare host = checkPeersAgree(mine);
  rankProcesses_.emplace(pidsOfRanksHere());
  dev::cpuSetSleepOnBusyCores(busyCores_, othersWantCpu);  // (once the ranks' processes are known)
  if (host.anyNet) {  // where the network peers will connect, on the interface bootstrap uses
    netListener_ = Socket::listen(bootstrap_->localAddress());
    peers_[rank].netAddr = WireAddr::from(netListener_.localAddr());
  }
  const int cores = cpuCount();  // the process's, before binding narrows this thread to one
  if (!host.sharedProcess) maybeBindToCore(host.localIndex);  // ranks sharing a process share its threads
  agreeOnPlan();
  int want = onGpu() ? gpuChannelsWanted(host.ranksOnDevice) : channelsWanted(cores / host.localRanks);
  peers_[rank].nChannels = want;
  bootstrap_->allgather(peers_.data(), sizeof(PeerInfo));  // (re-shares the rest unchanged)
  int nch = want;  // (the fewest any rank wants: every rank runs every channel)
  for (const PeerInfo& p : peers_) nch = std::min(nch, (int)p.nChannels);

  // (A network proxy is one more busy thread per rank: it needs a core as a channel does.)
  oversubscribed_ = !onGpu() && host.localRanks * (nch + (host.anyNet ? 1 : 0)) > cores;
  peers_[rank].oversubscribed = oversubscribed_;  // (shared with the regions below)
  windowUseful_ = !onGpu() && host.otherProcess;
  RegionLayout layout(nranks, nch, mine.sizes);
  std::shared_ptr<ShmMapping> shm = createRegions(layout, host.otherProcess);
  if (host.otherProcess && !onGpu() && host.localIndex == 0) warnIfDevShmTooSmall(layout.totalBytes(), host.localRanks);
  bootstrap_->allgather(peers_.data(), sizeof(PeerInfo));
  mapPeerRegions();
  // Other ranks' channels share this rank's cores: a thread that waits must yield soon.
  bool channelsShareCores = !onGpu() && host.localRanks * nch > cores;
  if (host.anyNet) startNetProxy(id, layout, nch, channelsShareCores);
  peerFifos_ = peerRegions_;
  if (onGpu()) openPeerGpuRegions();
  whileNeighboursLive.reset();
  bootstrap_->barrier();  // everyone has mapped everything: the names can go
  if (shm) shm->unlink();
  if (window_) window_->unlink();

  setupChannels(nch, mine.sizes);
  setSpinBudgets(channelsShareCores, host.anyNet);
  connect(layout);
  startTunerAndThreads(nch, mine);
  if (shmFaults_.faulted()) throwStoredError();  // (the control block's first touches)
  const char* transportName = !onGpu() ? (host.anyNet ? (host.otherProcess ? "net + shm" : "net")
                                          : host.otherProcess ? "shm" : "local")
                              : !gpuRegion_ ? "pinned host memory (no CUDA IPC)"
                              : host.otherProcess ? "p2p (CUDA IPC)" : "local (device memory)";
  MNCL_INFO(kInit, "rank %d/%d: %d channel(s), transport %s, FIFO simple %u B x %d, ll %u lines, ll128 %u lines",
            rank, nranks, nch, transportName, mine.sizes.simpleSlotBytes, dev::kSteps,
            mine.sizes.llSlotLines, mine.sizes.ll128SlotLines);
  if (rank == 0) logPlan();
}

void Comm::prepareDevice() {
  MNCL_CHECK(device_ >= 0 || device_ == MNCL_DEVICE_CPU, mnclInvalidArgument,
             "device " + std::to_string(device_) + " is neither a CUDA device (0, 1, ...) nor the CPU (MNCL_DEVICE_CPU, -1)");
#if defined(MININCL_HAVE_CUDA)
  // Init leaves the communicator's GPU current. (Giving the caller's back is no kindness where
  // the caller never chose one: CUDA reports device 0 then, and since CUDA 12 making it current
  // makes a context there, hundreds of MB on a GPU this process may never use.)
  if (onGpu()) {
    gpu::useDevice(device_);
    abortPinned_ = std::make_unique<gpu::HostMapped>(sizeof(uint32_t));
    abort_ = static_cast<uint32_t*>(abortPinned_->host());
  }
#else
  MNCL_CHECK(device_ < 0, mnclInvalidUsage,
             "device cuda:" + std::to_string(device_) +
                 ": this build of minincl has no CUDA backend (built without CUDA: nvcc was not found, or MININCL_CUDA=OFF); use the CPU (device=\"cpu\", "
                 "MNCL_DEVICE_CPU in C)");
#endif
}

// What this rank tells the others at init; also checks the settings read here.
PeerInfo Comm::describeSelf() {
  PeerInfo mine{};
  mine.rank = rank_;
  mine.pid = (int32_t)getpid();
  mine.device = device_;
  mine.hostHash = hostHash();
  mine.sizes = protoSizesFromEnv(onGpu());
  streamOutputBytes(Coll::allreduce);  // a malformed MININCL_STREAM_OUTPUT_BYTES fails here, not mid-collective
  applyStreamStretchesSetting();
  applyVectorIsaSetting();
  mine.probeAddr = peerMemoryProbeAddress();
  std::string given = env::str("MININCL_TRANSPORT"), transport = given;
  for (char& c : transport) c = (char)std::tolower((unsigned char)c);  // (any case, as ALGO and PROTO)
  MNCL_CHECK(transport.empty() || transport == "auto" || transport == "net", mnclInvalidArgument,
             "MININCL_TRANSPORT=\"" + given + "\" is not net or auto (or unset: auto, the network only between hosts)");
  mine.netForced = transport == "net";
  int64_t spread = env::integer("MININCL_P2P_SPREAD", onGpu() ? 1 : 0);
  MNCL_CHECK(spread == 0 || spread == 1, mnclInvalidArgument, "MININCL_P2P_SPREAD must be 0 or 1");
  mine.p2pSpread = (int32_t)spread;
  p2pSpread_ = spread != 0;
  mine.timeoutSeconds = Monitor::timeoutSeconds();
  mine.algoMask = Tuner::algoMaskFromEnv();
  mine.protoMask = Tuner::protoMaskFromEnv();
  mine.cpu = sched_getcpu();
  if (sched_getaffinity(0, sizeof(mine.affinity), &mine.affinity) != 0) CPU_ZERO(&mine.affinity);
  return mine;
}

namespace {
// "ring,tree" for the set bits of `mask` over `count` names.
template <typename E>
std::string namesIn(unsigned mask, int count, const char* (*name)(E)) {
  std::string out;
  for (int i = 0; i < count; ++i) {
    if (mask & (1u << i)) out += (out.empty() ? "" : ",") + std::string(name((E)i));
  }
  return out;
}
}  // namespace

// Refuses peers whose settings or device kind differ from this rank's; marks the peers
// reached over the network (netPeer_); counts who shares this host.
Comm::HostShare Comm::checkPeersAgree(const PeerInfo& mine) {
  HostShare host;
  netPeer_.assign(nranks_, 0);
  std::string me = std::to_string(rank_);
  for (const PeerInfo& p : peers_) {
    std::string them = "rank " + std::to_string(p.rank);
    MNCL_CHECK(p.p2pSpread == mine.p2pSpread, mnclInvalidUsage,
          them + " sets MININCL_P2P_SPREAD differently from rank " + me + "; set it the same on every rank");
    MNCL_CHECK(p.netForced == mine.netForced, mnclInvalidUsage,
          them + " sets MININCL_TRANSPORT differently from rank " + me + "; set it the same on every rank");
    // (Ranks whose tuners choose differently wait on each other for ever, or worse.)
    MNCL_CHECK(p.algoMask == mine.algoMask && p.protoMask == mine.protoMask, mnclInvalidUsage,
          them + " allows algorithms " + namesIn(p.algoMask, (int)Algo::count, algoName) + " and protocols " +
              namesIn(p.protoMask, (int)Proto::count, protoName) + " but rank " + me + " " +
              namesIn(mine.algoMask, (int)Algo::count, algoName) + " and " +
              namesIn(mine.protoMask, (int)Proto::count, protoName) +
              ": set MININCL_ALGO and MININCL_PROTO the same on every rank");
    bool sameHost = p.hostHash == mine.hostHash;
    netPeer_[p.rank] = p.rank != rank_ && (!sameHost || mine.netForced);
    host.anyNet |= netPeer_[p.rank] != 0;
    MNCL_CHECK((p.device >= 0) == onGpu(), mnclInvalidUsage,
          them + " is on " + (p.device >= 0 ? "a GPU" : "the CPU") + " but rank " + me + " is on " +
              (onGpu() ? "a GPU" : "the CPU") + "; all ranks of a communicator must be on the same kind of device");
    host.ranksOnDevice += p.device == device_ && sameHost;
    MNCL_CHECK(!netPeer_[p.rank] || !onGpu(), mnclInvalidUsage,
          them + (sameHost ? "" : " runs on another host and") +
              " would be reached over the network, which carries CPU ranks only; GPU ranks must share a host");
    MNCL_CHECK(std::memcmp(&p.sizes, &mine.sizes, sizeof(mine.sizes)) == 0, mnclInvalidUsage,
          them + " uses different FIFO sizes: set MININCL_SIMPLE_SLOT_BYTES / MININCL_LL*_SLOT_LINES / "
                 "MININCL_PIPELINE_CHUNK_BYTES the same on every rank");
    if (!sameHost) continue;  // (cores and memory are shared with this host's ranks only)
    host.localIndex += p.rank < rank_;
    host.localRanks += 1;
    host.otherProcess |= p.pid != mine.pid && !netPeer_[p.rank];
    host.sharedProcess |= p.pid == mine.pid && p.rank != rank_;
  }
  return host;
}

std::vector<int32_t> Comm::pidsOfRanksHere() const {
  std::vector<int32_t> pids;
  for (const PeerInfo& p : peers_)
    if (p.hostHash == peers_[rank_].hostHash && p.pid != peers_[rank_].pid) pids.push_back(p.pid);
  return pids;
}

// This rank's region (shared memory when a peer is another process), window and GPU FIFOs,
// with their names and sizes in peers_[rank_]. Returns the shared-memory mapping, whose name
// goes once every peer opened it.
std::shared_ptr<ShmMapping> Comm::createRegions(const RegionLayout& layout, bool otherProcess) {
  PeerInfo& mine = peers_[rank_];
  // On a GPU the FIFOs go to device memory and the host region keeps the control block; across
  // processes it also has room for the FIFOs (untouched pages cost nothing), where they go
  // instead, pinned, when CUDA IPC is unavailable.
  bool hostFifos = !onGpu() || otherProcess;
  size_t hostBytes = hostFifos ? layout.totalBytes() : RegionLayout(nranks_, 0, mine.sizes).totalBytes();
  std::shared_ptr<ShmMapping> shm;
  if (otherProcess) {
    shm = ShmMapping::create(hostBytes, "r" + std::to_string(rank_));
    shmFaults_.watch(shm->base(), shm->size(), abort_);
    region_ = shm;
    std::strncpy(mine.shmName, shm->name().c_str(), sizeof(mine.shmName) - 1);
  } else {
    region_ = createLocalRegion(hostBytes);
  }
  mine.regionId = registerRegion(region_);
  mine.regionBytes = hostBytes;
  int64_t chosen = options_.windowBytes;
  int64_t windowBytes = chosen >= 0 ? chosen : env::bytes("MININCL_WINDOW_BYTES", 0);
  MNCL_CHECK(windowBytes <= kMaxWindowBytes, mnclInvalidArgument,
             "MININCL_WINDOW_BYTES = " + std::to_string(windowBytes) + ": from 0 (no window) to 2^40 (1T)");
  if (windowUseful_ && windowBytes > 0) {
    window_ = std::make_shared<Window>((size_t)windowBytes, std::to_string(rank_));
    std::strncpy(mine.windowName, window_->name().c_str(), sizeof(mine.windowName) - 1);
    mine.windowBytes = window_->size();
    mine.windowAt = (uint64_t)(uintptr_t)window_->base();
  }
  if (onGpu()) createGpuRegion(layout.totalBytes());
  return shm;
}

// Every peer's region (and window) mapped here: the same mapping for a rank of this process,
// none for a network peer (its control block's mirror comes with the proxy).
void Comm::mapPeerRegions() {
  int32_t myPid = peers_[rank_].pid;
  peerRegions_.resize(nranks_);
  peerWindows_.resize(nranks_);
  for (int r = 0; r < nranks_; ++r) {
    const PeerInfo& p = peers_[r];
    if (r == rank_) peerRegions_[r] = region_;
    else if (netPeer_[r]) continue;
    else if (p.pid == myPid) peerRegions_[r] = findRegion(p.regionId);
    else peerRegions_[r] = ShmMapping::open(p.shmName, p.regionBytes, "rank " + std::to_string(r) + "'s connection buffers");
    MNCL_CHECK(peerRegions_[r] != nullptr, mnclInternalError, "rank " + std::to_string(r) + "'s region vanished during init");
    if (r != rank_ && dynamic_cast<ShmMapping*>(peerRegions_[r].get())) {  // (this rank's threads write there)
      shmFaults_.watch(peerRegions_[r]->base(), peerRegions_[r]->size(), abort_);
    }
    if (r != rank_ && p.windowBytes > 0 && p.pid != myPid) {
      peerWindows_[r] = ShmMapping::open(p.windowName, p.windowBytes, "rank " + std::to_string(r) + "'s window");
    }
  }
}

namespace {
uint32_t gpuSpinsFromEnv() {
  int64_t spins = env::integer("MININCL_GPU_SPINS", 1 << 14);
  MNCL_CHECK(spins >= 0 && spins <= UINT32_MAX, mnclInvalidArgument, "MININCL_GPU_SPINS must be between 0 and 2^32-1");
  return (uint32_t)spins;
}
}  // namespace

void Comm::setSpinBudgets(bool channelsShareCores, bool anyNet) {
  uint32_t gpuSpins = onGpu() ? gpuSpinsFromEnv() : 0;
  // Spins before a waiting CPU channel yields. With network peers each spin also polls their
  // sockets (a system call or more, ~100x a plain spin): where other ranks' channels share
  // the cores, a few of those, or it keeps the core from the rank it waits for (2 ranks on
  // one core over TCP, with the proxy yielding at once too: an 8-byte allreduce 75 -> 16 us).
  uint32_t cpuSpins = !oversubscribed_ ? 5000 : channelsShareCores && anyNet ? 4 : 200;
  for (auto& ch : channels_) ch->dev.spinBudget = onGpu() ? gpuSpins : cpuSpins;
}

// Whether any host's channel and proxy threads outnumber its cores: the tuner's cost table. (Each
// rank's own waits follow its own host; the tuner's choice must be the same on every rank.)
bool Comm::anyHostOversubscribed() const {
  return std::any_of(peers_.begin(), peers_.end(), [](const PeerInfo& p) { return p.oversubscribed != 0; });
}

// The tuner's view of this communicator, then what runs its calls: the GPU's channel table,
// or the CPU channels' threads; and the monitor that watches the peers.
void Comm::startTunerAndThreads(int nch, const PeerInfo& mine) {
  if (onGpu()) {
    tuner_.initGpu(nranks_, nch);
    bool allHere = true;  // every rank in this process, on this GPU: pointer steps everywhere
    for (const PeerInfo& p : peers_) allHere &= p.pid == mine.pid && p.device == device_;
    tuner_.setGpuPointerSteps(allHere && env::integer("MININCL_POINTER_STEPS", 2) >= 1);
#if defined(MININCL_HAVE_CUDA)
    gpu_->upload(channels_, static_cast<const uint32_t*>(abortPinned_->device()));
#endif
  } else {
    tuner_.init(nranks_, nch, 2 * (size_t)mine.sizes.simpleSlotBytes, anyHostOversubscribed());
    tuner_.setRanksPerHost(topo::ranksPerHost(topoPlan_));
    executor_ = std::make_unique<Executor>(nch, oversubscribed_ ? 0 : 50);
  }
  if (topoPlan_.searched) tuner_.setPathBandwidth(topoPlan_.bwGBs, topo::kSearchChannelBw);
  if (nranks_ > 1) monitor_ = std::make_unique<Monitor>(*this);
}

namespace {
// MININCL_NET_SOCKET_BUFFER and MININCL_NET_CONGESTION, checked, into the proxy's setup.
void applyNetSettings(NetProxy::Setup& s) {
  int64_t socketBuffer = env::bytes("MININCL_NET_SOCKET_BUFFER", 4 << 20);
  // (Below 64K the proxy's transfers stall on the tiny windows: 8K made a 128 KiB
  // allreduce over loopback take 2 s, 16K a 1 MiB one 40 ms, where 64K took 3 ms.)
  MNCL_CHECK(socketBuffer == 0 || (socketBuffer >= (64 << 10) && socketBuffer <= (1 << 30)), mnclInvalidArgument,
             "MININCL_NET_SOCKET_BUFFER must be 0 (the kernel's autotuning) or a size from 64K to 1G (smaller "
             "buffers stall the transfers)");
  s.socketBufferBytes = (int)socketBuffer;
  std::string congestion = env::str("MININCL_NET_CONGESTION", "");
  for (char& c : congestion) c = (char)std::tolower((unsigned char)c);  // (the kernel's names are lower case)
  MNCL_CHECK(congestion.size() < 16 && congestion.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_-") == std::string::npos,
             mnclInvalidArgument, "MININCL_NET_CONGESTION must name a TCP congestion control (cubic, reno, bbr, ...) or be 'system'");
  s.congestionRequired = !congestion.empty() && congestion != "system";
  s.congestion = congestion.empty() ? "cubic" : congestion == "system" ? "" : congestion;
}
}  // namespace

// Connects to the peers reached over the network and starts the thread that moves their
// steps. Their control blocks are mirrors the proxy keeps from their messages.
void Comm::startNetProxy(const UniqueIdData& id, const RegionLayout& layout, int nch, bool sharesCores) {
  NetProxy::Setup s;
  s.sharesCores = sharesCores;
  s.rank = rank_;
  s.nonce = id.nonce;
  for (int r = 0; r < nranks_; ++r) {
    if (netPeer_[r]) s.peers.push_back(r);
    s.listeners.push_back(peers_[r].netAddr.toSockAddr());
  }
  s.listener = &netListener_;
  s.nChannels = nch;
  s.layout = &layout;
  s.regionBase = region_->base();
  s.own = region_->ctrl();
  s.abortWord = abortWord();
  s.busy = [this] { return callsInside_.load() > 0; };
  s.timeout = std::max(bootstrapTimeout(), Monitor::timeoutSeconds());
  s.lastSendsTimeout = Monitor::timeoutSeconds();
  applyNetSettings(s);
  netProxy_ = std::make_unique<NetProxy>(std::move(s));
  netListener_.close();
  for (int r = 0; r < nranks_; ++r) {
    if (netPeer_[r]) peerRegions_[r] = netProxy_->mirror(r);
  }
}

void Comm::setupChannels(int nch, const dev::ProtoSizes& sizes) {
  int perHost = onGpu() ? 0 : topo::ranksPerHost(topoPlan_);  // (GPU communicators span no hosts)
  for (int c = 0; c < nch; ++c) {
    auto ch = std::make_unique<Channel>();
    ch->sendTo.resize(nranks_);
    ch->recvFrom.resize(nranks_);
    ch->sendStep.assign(nranks_, 0);
    ch->recvStep.assign(nranks_, 0);
    ch->opFirstSendStep.assign(nranks_, 0);
    ch->opFirstRecvStep.assign(nranks_, 0);
    ch->peerHeads.assign(nranks_, 0);
    ch->ring = topoPlan_.rings[c % topoPlan_.rings.size()];  // the search's order (or rank order)
    dev::DevChannel& d = ch->dev;
    d.rank = rank_;
    d.nranks = nranks_;
    d.sendTo = ch->sendTo.data();
    d.recvFrom = ch->recvFrom.data();
    d.sendStep = ch->sendStep.data();
    d.recvStep = ch->recvStep.data();
    d.opFirstSendStep = ch->opFirstSendStep.data();
    d.opFirstRecvStep = ch->opFirstRecvStep.data();
    d.peerHeads = ch->peerHeads.data();
    d.ring = ch->ring.data();
    d.ringPos = (int)(std::find(ch->ring.begin(), ch->ring.end(), rank_) - ch->ring.begin());
    d.ranksPerHost = perHost;
    d.sizes = sizes;
    d.abortFlag = abortWord();
    channels_.push_back(std::move(ch));
  }
}

void Comm::connect(const RegionLayout& layout) {
  for (int c = 0; c < nChannels(); ++c) {
    Channel& ch = *channels_[c];
    for (int p = 0; p < nranks_; ++p) {
      if (p == rank_) continue;
      ch.sendTo[p] = netPeer_[p] ? netProxy_->sendEnd(p, c) : layout.conn(peerFifos_[p]->base(), rank_, c);
      if (netPeer_[p]) {
        ch.dev.netProgress = &NetProxy::progressFromChannel;
        ch.dev.netSettle = &NetProxy::settle;
        ch.dev.netProgressArg = netProxy_.get();
      }
      ch.recvFrom[p] = layout.conn(peerFifos_[rank_]->base(), p, c);
    }
  }
  if (onGpu()) enableGpuPointerSteps();
  else enablePointerSteps();
}

// The settings later phases of init read, read now: a malformed one then fails this rank
// before it joins the others, who hear of it at once (Bootstrap::reportInitFailure) instead
// of waiting for this rank until the bootstrap timeout (describeSelf reads the others). Rank
// 0's topology files are read later, but a file it cannot read only makes a plan without it.
void Comm::checkLaterSettings() {
  Monitor::timeoutSeconds();
  busyCores_ = busyCoresSetting();
  pointerStepSettings(0, 0);
  NetProxy::Setup net;
  applyNetSettings(net);
  env::bytes("MININCL_WINDOW_BYTES", 0);
  if (onGpu()) {
    gpuSpinsFromEnv();
    gpuChannelsWanted(1);
    gpuTransportFromEnv();
#if defined(MININCL_HAVE_CUDA)
    gpu::GpuComm::settingsFromEnv();
#endif
  } else {
    channelsWanted(1);
  }
}

Comm::Stats Comm::stats() {
  Stats s;
#if defined(MININCL_HAVE_CUDA)
  if (onGpu()) {  // the counters live in the device's copy of the channels
    gpu_->sumCounters(&s.pointerSteps, &s.directWrites);
    s.readablePeers = gpuReadablePeers_;
    return s;
  }
#endif
  for (auto& ch : channels_) {
    s.pointerSteps += dev::loadRelaxed(&ch->dev.pointerStepsSent);
    s.directWrites += dev::loadRelaxed(&ch->dev.directWritesSent);
    s.stepsReadAhead += dev::loadRelaxed(&ch->dev.stepsReadAhead);
  }
  if (netProxy_) s.landedSteps = netProxy_->landedSteps();
  for (int p = 0; p < nranks_; ++p) {
    if (p != rank_) s.readablePeers += (int)dev::loadRelaxed(&channels_[0]->dev.recvFrom[p].ctrl->readsSenderMemory);
  }
  return s;
}

Comm::~Comm() {
  warnOfUnreportedMismatch();
  leave();
  // A kernel still waiting on peers that will never come would block freeing the device
  // memory below (it synchronises the device): give it MININCL_TIMEOUT, then stop it.
  if (gpuWorkPending()) {
    auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(Monitor::timeoutSeconds());
    uint32_t spins = 0;
    while (gpuWorkPending() && std::chrono::steady_clock::now() < until) dev::cpuBackoff(spins++);
    if (gpuWorkPending()) fail(mnclAborted, "destroyed while a kernel still waited on its peers");
  }
  monitor_.reset();
  executor_.reset();
  netProxy_.reset();  // (after the channels: it sends what they published, then our goodbye)
  peerFifos_.clear();  // before the device state that the regions' memory belongs with
  gpuRegion_.reset();
  gpu_.reset();
}

}  // namespace mncl
