// The C API: thin wrappers that turn exceptions into mnclResult_t and keep the message.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <shared_mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/socket.h"
#include "core/comm.h"
#include "core/env.h"
#include "core/error.h"
#include "core/monitor.h"
#include "core/outcome.h"
#include "core/thread_start.h"
#include "enqueue/enqueue.h"
#include "gpu/cuda_api.h"
#include "minincl.h"
#include "transport/window_memory.h"

using namespace mncl;

// An op from mnclRedOpCreatePreMulSum: what a collective called with it runs.
struct PreMulSumOp {
  bool live = false;
  DataType dtype = DataType::f32;
  uint64_t scalarBits = 0;         // mnclScalarHostImmediate: the value
  const void* scalarAt = nullptr;  // mnclScalarDevice: where to read it when an operation runs
};

// Where a communicator's init stands: done in the call (blocking), or on a thread of its own
// (nonblocking init, or a mnclCommInitRank* inside a group: started at once, and awaited at
// the group's end).
enum class Init { ready, running, failed };

struct mnclComm {
  std::unique_ptr<Comm> impl;
  std::atomic<Init> init{Init::ready};
  std::thread initThread;  // (joined by destroy / abort, before the communicator is freed)
  // How an init on initThread ended, shared with the group end that waits for it: that wait
  // must not touch the handle, which another thread may destroy or abort meanwhile (only
  // destroy / abort joins the init's thread).
  std::shared_ptr<Outcome> outcome;
  // Set by destroy / abort: stops the socket waits of init and of a split (mnclCommSplit)
  // waiting for its peers.
  std::atomic<bool> cancelWaits{false};
  // Stops the init on initThread: set by destroy / abort too, and by a group that refused a
  // call (its own flag: a refused group must not stop this communicator's later splits).
  std::atomic<bool> cancelInit{false};
  mnclResult_t initError = mnclSuccess;  // Init::failed: why (written before `init`)
  std::string initMessage;
  std::mutex opsMutex;
  std::vector<PreMulSumOp> preMulSums;  // op mnclNumOps + i
  // Held shared by each call while it runs, and by a thread whose open group recorded calls
  // on this communicator until the group ends; mnclCommDestroy / mnclCommAbort take it
  // exclusively before freeing anything (abort stops the calls first).
  std::shared_timed_mutex inUse;
  std::atomic<bool> finalized{false};  // mnclCommFinalize: no more operations
};

namespace {

// Runs f, returning its error code and keeping its message for mnclGetLastError.
template <typename F>
mnclResult_t guarded(F&& f) {
  auto failed = [](mnclResult_t code, const std::string& why) {
    setThreadLastError(why);
    return code;
  };
  try {
    f();
    return mnclSuccess;
  } catch (const Error& e) {
    return failed(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return failed(mnclSystemError, "out of memory");
  } catch (const std::system_error& e) {  // (a resource the system would not give: not a bug of ours)
    return failed(mnclSystemError, e.what());
  } catch (const std::exception& e) {
    return failed(mnclInternalError, std::string("internal error: ") + e.what());
  }
}

void refuseGroup(mnclResult_t code, const std::string& why);

// guarded() for the calls a group holds (collectives, sends and receives, inits): refused
// inside an open group, one fails the group (refuseGroup).
// A call on a communicator still initializing returns mnclInProgress without running: in
// a group it fails the group too (mnclInvalidUsage), or mnclGroupEnd would succeed with the
// call left out, silently (NCCL refuses such a call with ncclInvalidArgument).
template <typename F>
mnclResult_t groupable(F&& f) {
  mnclResult_t rc = guarded(std::forward<F>(f));
  if (rc == mnclInProgress) refuseGroup(mnclInvalidUsage, std::string("a call in it was refused: ") + threadLastError());
  else if (rc != mnclSuccess) refuseGroup(rc, threadLastError());
  return rc;
}

// Communicators whose init this thread's open group started; its end waits for them.
thread_local std::vector<std::pair<mnclComm_t, std::shared_ptr<Outcome>>> tlsGroupInits;

// A call refused inside this thread's open group fails the group, as NCCL's: mnclGroupEnd runs
// none of its calls (groupRefuse), and the inits it started stop (their ranks would wait for
// one that never comes). Outside a group: nothing.
void refuseGroup(mnclResult_t code, const std::string& why) {
  if (groupDepth() == 0) return;
  groupRefuse(code, why);
  for (auto& [handle, outcome] : tlsGroupInits) handle->cancelInit.store(true, std::memory_order_release);
}

// Whether this thread's open group started `comm`'s init: then the communicator is in
// progress until the group ends, even once its init thread is done (a call on it must not
// depend on how fast the peers' inits were).
bool initInOpenGroup(mnclComm_t comm) {
  return std::any_of(tlsGroupInits.begin(), tlsGroupInits.end(), [comm](const auto& s) { return s.first == comm; });
}

Comm& use(mnclComm_t comm) {
  MNCL_CHECK(comm, mnclInvalidArgument, "the communicator is null");
  Init state = comm->init.load(std::memory_order_acquire);
  if (state != Init::failed && !tlsGroupInits.empty() && initInOpenGroup(comm)) state = Init::running;
  switch (state) {
    case Init::running:
      throwError(mnclInProgress, "the communicator is still initializing (a nonblocking init: call "
                                 "mnclCommGetAsyncError until it returns mnclSuccess; an init inside a group: "
                                 "use the communicator after mnclGroupEnd)");
    case Init::failed: throwError(comm->initError, "the communicator's init failed: " + comm->initMessage);
    case Init::ready: break;
  }
  MNCL_CHECK(comm->impl, mnclInvalidArgument, "the communicator was destroyed");
  return *comm->impl;
}

// The communicators this thread's open group recorded calls on, each held (inUse) until the
// group ends.
thread_local std::vector<std::pair<mnclComm_t, std::shared_lock<std::shared_timed_mutex>>> tlsGroupHeld;

// Holds `comm` for one call: for the call itself, or, inside a group, until the group ends.
class CallHold {
 public:
  explicit CallHold(mnclComm_t comm) : comm_(use(comm)) {
    MNCL_CHECK(!comm->finalized.load(std::memory_order_acquire), mnclInvalidUsage,
               "the communicator was finalized (mnclCommFinalize): it takes no more operations; destroy it");
    if (groupDepth() == 0) {
      lock_ = std::shared_lock<std::shared_timed_mutex>(comm->inUse);
      return;
    }
    for (auto& held : tlsGroupHeld) {
      if (held.first == comm) return;
    }
    tlsGroupHeld.emplace_back(comm, std::shared_lock<std::shared_timed_mutex>(comm->inUse));
  }
  Comm& comm() { return comm_; }

 private:
  Comm& comm_;
  std::shared_lock<std::shared_timed_mutex> lock_;
};

// Frees `comm` once no call runs on it and no open group holds it (on this thread, its
// recorded calls are dropped: mnclGroupEnd would run them on freed memory). A call still
// waiting for its peers after MININCL_TIMEOUT is stopped (mnclAborted): a destroy must not hang.
void release(mnclComm_t comm) {
  if (comm->initThread.joinable()) {
    comm->cancelInit.store(true, std::memory_order_release);  // (an init waiting for peers stops)
    comm->initThread.join();
  }
  std::erase_if(tlsGroupInits, [comm](const auto& started) { return started.first == comm; });
  std::erase_if(tlsGroupHeld, [comm](const auto& held) { return held.first == comm; });
  groupForget(comm->impl.get());
  {
    auto until = Monitor::timeoutFromNow();
    std::unique_lock<std::shared_timed_mutex> exclusive(comm->inUse, std::defer_lock);
    if (!exclusive.try_lock_until(until)) {
      comm->cancelWaits.store(true, std::memory_order_release);  // (a split still waiting stops too)
      if (comm->impl) comm->impl->stopCallsForDestroy();
      exclusive.lock();
    }
  }
  delete comm;
}

void checkStream(const Comm& comm, void* stream) {
  MNCL_CHECK(comm.device() >= 0 || stream == nullptr, mnclInvalidArgument,
        "a CPU communicator takes a null stream");
}

// The options a config asks for (fields left undefined: the defaults).
CommOptions optionsFrom(const mnclConfig_t* config) {
  CommOptions options;
  if (!config) return options;
  MNCL_CHECK(config->magic == MNCL_CONFIG_MAGIC && config->size >= offsetof(mnclConfig_t, maxCTAs) + sizeof(int),
             mnclInvalidArgument, "the config was not set up from MNCL_CONFIG_INITIALIZER (wrong magic or size)");
  MNCL_CHECK(config->blocking == MNCL_CONFIG_UNDEF_INT || config->blocking == 0 || config->blocking == 1,
             mnclInvalidArgument, "config.blocking = " + std::to_string(config->blocking) + ": 1 (blocking) or 0");
  auto take = [](int value, int& into, const char* name) {
    if (value == MNCL_CONFIG_UNDEF_INT) return;
    MNCL_CHECK(value >= 0, mnclInvalidArgument,
               std::string("config.") + name + " = " + std::to_string(value) + ": a channel bound is >= 0");
    into = value;
  };
  take(config->minCTAs, options.minChannels, "minCTAs");
  take(config->maxCTAs, options.maxChannels, "maxCTAs");
  MNCL_CHECK(options.maxChannels == 0 || options.minChannels <= options.maxChannels, mnclInvalidArgument,
             "config.minCTAs = " + std::to_string(options.minChannels) + " is above maxCTAs = " +
                 std::to_string(options.maxChannels));
  if (config->size >= offsetof(mnclConfig_t, windowBytes) + sizeof(long long) &&
      config->windowBytes != MNCL_CONFIG_UNDEF_INT) {
    MNCL_CHECK(config->windowBytes >= 0 && config->windowBytes <= kMaxWindowBytes, mnclInvalidArgument,
               "config.windowBytes = " + std::to_string(config->windowBytes) + ": between 0 (no window) and 2^40");
    options.windowBytes = config->windowBytes;
  }
  return options;
}

// How a background init ended: the handle's state, then its outcome (which a group's end
// waits on; `outcome` is the handle's, held apart from it by the init's thread).
void endInit(mnclComm* handle, Outcome& outcome, mnclResult_t code, const std::string& message) {
  if (code != mnclSuccess) {
    handle->initError = code;
    handle->initMessage = message;
  }
  handle->init.store(code == mnclSuccess ? Init::ready : Init::failed, std::memory_order_release);
  outcome.set(code, handle->initMessage);
}

// Makes the communicator in this call, or (`background`) on a thread of its own: *comm is then
// a handle whose init runs on (see Init). Returns whether init still runs.
bool initRank(mnclComm_t* comm, int nranks, const mnclUniqueId& commId, int rank, int device,
              const CommOptions& options, bool background) {
  MNCL_CHECK(comm != nullptr, mnclInvalidArgument, "comm is null");
  *comm = nullptr;
  UniqueIdData id;
  std::memcpy(&id, commId.internal, sizeof(id));
  try {  // (here too: a group's or nonblocking init says at once)
    Bootstrap::checkArguments(id, rank, nranks);
  } catch (const Error& e) {
    Bootstrap::reportInitFailure(id, rank, nranks, e.what());  // (the other ranks need not wait for it)
    throw;
  }
  if (device == MNCL_DEVICE_AUTO) device = gpu::usableDeviceCount() > 0 ? gpu::currentDevice() : MNCL_DEVICE_CPU;
  auto c = std::make_unique<mnclComm>();
  if (!background) {
    c->impl = std::make_unique<Comm>(id, rank, nranks, device, options);
    *comm = c.release();
    return false;
  }
  mnclComm* handle = c.get();
  handle->init.store(Init::running, std::memory_order_relaxed);
  handle->outcome = std::make_shared<Outcome>();
  if (groupDepth() > 0 && groupRefused()) {  // (its group's end runs nothing: no init to start)
    std::string why = "not made: its group refused a call before this init";
    Bootstrap::reportInitFailure(id, rank, nranks, why);
    endInit(handle, *handle->outcome, mnclInvalidUsage, why);
  } else {
    auto init = [handle, outcome = handle->outcome, id, rank, nranks, device, options] {
      WaitCancel cancel(&handle->cancelInit);
      mnclResult_t code = guarded([&] { handle->impl = std::make_unique<Comm>(id, rank, nranks, device, options); });
      endInit(handle, *outcome, code, code == mnclSuccess ? "" : threadLastError());
    };
    try {
      handle->initThread = startThread("a nonblocking init's thread", init);
    } catch (const Error& e) {
      Bootstrap::reportInitFailure(id, rank, nranks, e.what());  // (the other ranks need not wait for it)
      throw;
    }
  }
  *comm = c.release();
  if (groupDepth() > 0) tlsGroupInits.emplace_back(*comm, (*comm)->outcome);
  return true;
}

// The end of the outermost group: waits for the inits it started; the first that failed (in
// the order they were called) is the group's error.
mnclResult_t awaitGroupInits() {
  std::vector<std::pair<mnclComm_t, std::shared_ptr<Outcome>>> inits;
  inits.swap(tlsGroupInits);
  for (auto& [handle, outcome] : inits) outcome->wait();  // (a refusal stopped those running: refuseGroup)
  if (groupRefused()) {  // (the refusal is the group's error: groupEnd says it)
    // Made before the refusal stopped them: failed now, whatever the timing, so that their
    // peers hear it too instead of waiting in calls these ranks will not make.
    for (auto& [handle, outcome] : inits) {
      if (handle->init.load(std::memory_order_acquire) == Init::ready && handle->impl) {
        handle->impl->fail(mnclInvalidUsage,
                           "its init's group refused a call (mnclGroupEnd said which): destroy this communicator");
      }
    }
    return mnclSuccess;
  }
  for (auto& [handle, outcome] : inits) {
    if (outcome->code() != mnclSuccess) {
      setThreadLastError("a communicator's init in this group failed: " + outcome->message());
      return outcome->code();
    }
  }
  return mnclSuccess;
}

// A query's answer: `out` must not be null.
template <typename T, typename F>
mnclResult_t answer(T* out, const char* name, F&& get) {
  return guarded([&] {
    auto value = get();  // (first: a null or destroyed communicator is the first thing to name)
    MNCL_CHECK(out != nullptr, mnclInvalidArgument, std::string(name) + " is null");
    *out = value;
  });
}

uint64_t randomNonce() {
  std::random_device rd;
  return ((uint64_t)rd() << 32) ^ rd();
}

// Where the root of a new unique id listens: MININCL_BOOTSTRAP_ADDR (host, host:port, an IPv6
// address, or [IPv6]:port), else the loopback interface (all ranks on this host).
SockAddr rootBindAddress() {
  const char* name = "MININCL_BOOTSTRAP_ADDR";
  std::string spec = env::str(name);
  if (spec.empty()) return SockAddr::loopback(0);
  std::string host = spec, port;
  bool hasPort = false;
  if (spec.front() == '[') {  // [v6] or [v6]:port
    size_t close = spec.find(']');
    MNCL_CHECK(close != std::string::npos && (close + 1 == spec.size() || spec[close + 1] == ':'), mnclInvalidArgument,
               std::string(name) + "=" + spec + ": write an IPv6 address as [address] or [address]:port");
    host = spec.substr(1, close - 1);
    hasPort = close + 1 < spec.size();
    if (hasPort) port = spec.substr(close + 2);
  } else if (size_t colon = spec.find(':'); colon != std::string::npos && spec.rfind(':') == colon) {  // host:port
    host = spec.substr(0, colon);
    port = spec.substr(colon + 1);
    hasPort = true;
  }  // (else a host name, or an IPv6 address without a port, :: included)
  int number = 0;
  if (hasPort) {
    bool digits = !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
    number = digits ? std::stoi(port) : -1;
    MNCL_CHECK(number >= 0 && number < 65536, mnclInvalidArgument,
               std::string(name) + "=" + spec + ": the port must be a number from 0 (any) to 65535");
  }
  try {
    return SockAddr::resolve(host, number);
  } catch (const Error& e) {
    throwError(e.code(), std::string(name) + "=" + spec + ": " + e.what());
  }
}

// A root for a new unique id, at `addr`; a failure names MININCL_BOOTSTRAP_ADDR where it chose
// the address (an address of another host cannot be bound).
SockAddr startRootAt(const SockAddr& addr, uint64_t nonce) {
  try {
    return startRoot(addr, nonce);
  } catch (const Error& e) {
    std::string spec = env::str("MININCL_BOOTSTRAP_ADDR");
    if (spec.empty() || e.code() != mnclSystemError) throw;  // (not the socket's: a bad timeout, say)
    throwError(e.code(), "MININCL_BOOTSTRAP_ADDR=" + spec + " (an address of this host, where the root listens): " +
                             e.what());
  }
}

void fillId(mnclUniqueId* out, const SockAddr& addr, uint64_t nonce) {
  UniqueIdData d{};
  d.magic = kIdMagic;
  d.nonce = nonce;
  d.root = WireAddr::from(addr);
  static_assert(sizeof(UniqueIdData) <= sizeof(out->internal), "unique id too small");
  std::memset(out->internal, 0, sizeof(out->internal));
  std::memcpy(out->internal, &d, sizeof(d));
}

// A call of sends and receives: enqueue(comm) on the held communicator, its stream checked.
template <typename Enqueue>
mnclResult_t sendsAndReceives(mnclComm_t c, void* stream, Enqueue enqueue) {
  return groupable([&] {
    CallHold hold(c);
    Comm& cm = hold.comm();
    checkStream(cm, stream);
    enqueue(cm);
  });
}

}  // namespace

extern "C" {

mnclResult_t mnclGetVersion(int* version) {
  return guarded([&] {
    MNCL_CHECK(version != nullptr, mnclInvalidArgument, "version is null");
    *version = MNCL_VERSION_CODE;
  });
}

mnclResult_t mnclGetUniqueId(mnclUniqueId* id) {
  return guarded([&] {
    MNCL_CHECK(id != nullptr, mnclInvalidArgument, "uniqueId is null");
    uint64_t nonce = randomNonce();
    SockAddr root = startRootAt(rootBindAddress(), nonce);
    fillId(id, root, nonce);
  });
}

mnclResult_t mnclGetUniqueIdForAddress(mnclUniqueId* id, const char* host, int port) {
  return guarded([&] {
    MNCL_CHECK(id != nullptr, mnclInvalidArgument, "mnclGetUniqueIdForAddress: uniqueId is null");
    MNCL_CHECK(host != nullptr, mnclInvalidArgument, "mnclGetUniqueIdForAddress: host is null");
    UniqueIdData d = uniqueIdForAddress(host, port, "");
    std::memset(id->internal, 0, sizeof(id->internal));
    std::memcpy(id->internal, &d, sizeof(d));
  });
}

mnclResult_t mnclCommInitRankDevice(mnclComm_t* comm, int nranks, mnclUniqueId commId, int rank, int device) {
  return groupable([&] { initRank(comm, nranks, commId, rank, device, {}, groupDepth() > 0); });
}

mnclResult_t mnclCommInitRank(mnclComm_t* comm, int nranks, mnclUniqueId commId, int rank) {
  return mnclCommInitRankDevice(comm, nranks, commId, rank, MNCL_DEVICE_AUTO);
}

mnclResult_t mnclCommInitRankConfig(mnclComm_t* comm, int nranks, mnclUniqueId commId, int rank, mnclConfig_t* config) {
  bool running = false;
  mnclResult_t rc = groupable([&] {
    if (comm) *comm = nullptr;
    bool nonblocking = config && config->blocking == 0;
    CommOptions options = optionsFrom(config);
    running = initRank(comm, nranks, commId, rank, MNCL_DEVICE_AUTO, options, nonblocking || groupDepth() > 0);
    running &= nonblocking && groupDepth() == 0;  // (a group's end waits for it)
  });
  return rc == mnclSuccess && running ? mnclInProgress : rc;
}

mnclResult_t mnclCommInitAll(mnclComm_t* comms, int ndev, const int* devlist) {
  mnclUniqueId id;
  mnclResult_t rc = guarded([&] {
    MNCL_CHECK(comms != nullptr, mnclInvalidArgument, "mnclCommInitAll: comms is null");
    MNCL_CHECK(ndev >= 1, mnclInvalidArgument, "mnclCommInitAll: ndev=" + std::to_string(ndev) + " is less than 1");
    MNCL_CHECK(ndev <= kMaxRanks, mnclInvalidArgument, "mnclCommInitAll: " + tooManyRanks(ndev));
  });
  if (rc != mnclSuccess) return rc;
  if ((rc = mnclGetUniqueId(&id)) != mnclSuccess) return rc;
  std::vector<mnclResult_t> results(ndev, mnclSuccess);
  std::vector<std::string> errors(ndev);
  std::vector<std::thread> threads;
  if ((rc = guarded([&] { threads.reserve(ndev); })) != mnclSuccess) return rc;  // (no growth while threads run)
  for (int r = 0; r < ndev; ++r) {
    try {
      threads.emplace_back([&, r] {
        results[r] = mnclCommInitRankDevice(&comms[r], ndev, id, r, devlist ? devlist[r] : MNCL_DEVICE_CPU);
        if (results[r] != mnclSuccess) errors[r] = threadLastError();
      });
    } catch (const std::system_error& e) {  // (the process's threads ran out: the ranks started hear of it)
      for (int q = r; q < ndev; ++q) {
        results[q] = mnclSystemError;
        errors[q] = "could not start a thread for rank " + std::to_string(q) + " of " + std::to_string(ndev) + ": " +
                    e.what();
      }
      UniqueIdData d;
      std::memcpy(&d, id.internal, sizeof(d));
      Bootstrap::reportInitFailure(d, r, ndev, errors[r]);  // (one rank's failure fails them all)
      break;
    }
  }
  for (auto& t : threads) t.join();
  // The failure to report: a rank's own (a bad device, say) before those it caused in the
  // others (RemoteError naming it).
  int failed = -1;
  for (int r = 0; r < ndev; ++r) {
    if (results[r] == mnclSuccess) continue;
    if (failed < 0 || (results[failed] == mnclRemoteError && results[r] != mnclRemoteError)) failed = r;
  }
  if (failed >= 0) {
    for (int q = 0; q < ndev; ++q) {
      if (results[q] == mnclSuccess) mnclCommDestroy(comms[q]);
      comms[q] = nullptr;
    }
    setThreadLastError("rank " + std::to_string(failed) + ": " + errors[failed]);
    return results[failed];
  }
  return mnclSuccess;
}

namespace {
// The new communicator of a split or shrink; its init fails at once if the process of one of
// `members` (the parent's ranks) exits before joining. (static: in the extern "C" block it
// would otherwise be exported under its bare name.)
static mnclComm_t newChild(Comm& parent, const UniqueIdData& id, int rank, int nranks, const std::vector<int>& members,
                           const CommOptions& options) {
  auto c = std::make_unique<mnclComm>();
  WaitCheck whileTheyLive([&] { parent.failIfMemberGone(members); });
  try {
    c->impl = std::make_unique<Comm>(id, rank, nranks, parent.device(), options);
  } catch (const Error& e) {
    // A member that exited is the story: another may have left the init for it first, and the
    // root said so before this rank's watch looked; or it hosted the init's root, whose
    // connections closed (or were reset) as its process went, a moment before it was gone:
    // look for half a second.
    if (e.code() != mnclRemoteError && e.code() != mnclSystemError) throw;
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    do {
      parent.failIfMemberGone(members);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } while (std::chrono::steady_clock::now() < until);
    throw;
  }
  return c.release();
}
}  // namespace

mnclResult_t mnclCommSplit(mnclComm_t comm, int color, int key, mnclComm_t* newcomm, void* config) {
  return guarded([&] {
    MNCL_CHECK(newcomm != nullptr, mnclInvalidArgument, "newcomm is null");
    *newcomm = nullptr;
    checkNoOpenGroup("mnclCommSplit");
    CallHold hold(comm);
    Comm& parent = hold.comm();
    WaitCancel cancel(&comm->cancelWaits);  // (abort stops the rendezvous and the new comm's init)
    // A config refused still joins the rendezvous: the others' splits then fail at once,
    // naming this rank, instead of waiting for it until the bootstrap timeout.
    CommOptions options;
    std::optional<Error> refusal;
    try {
      options = config ? optionsFrom(static_cast<const mnclConfig_t*>(config)) : parent.options();
    } catch (const Error& e) {
      refusal = e;
    }
    // But a good config asking for a nonblocking split is refused at once: its caller may be
    // one thread splitting several ranks, which the rendezvous would keep waiting for the others.
    MNCL_CHECK(refusal || !config || static_cast<const mnclConfig_t*>(config)->blocking != 0, mnclInvalidArgument,
               "config.blocking = 0: minincl's split always blocks; set blocking to 1 (or leave it undefined), "
               "and split ranks of one process from threads of their own");
    int n = 0, r = 0;
    UniqueIdData id{};
    std::vector<int> members;
    bool joins = false;
    try {
      joins = parent.splitInfo(color, key, &n, &r, &id, &members, refusal.has_value());
    } catch (const Error&) {
      if (refusal) throw *refusal;  // (its own story first, whatever the rendezvous met)
      throw;
    }
    if (refusal) throw *refusal;
    if (!joins) return;
    *newcomm = newChild(parent, id, r, n, members, options);
  });
}

mnclResult_t mnclCommShrink(mnclComm_t comm, int* excludeRanksList, int excludeRanksCount, mnclComm_t* newcomm,
                            void* config, int shrinkFlags) {
  return guarded([&] {
    MNCL_CHECK(newcomm != nullptr, mnclInvalidArgument, "newcomm is null");
    *newcomm = nullptr;
    checkNoOpenGroup("mnclCommShrink");
    MNCL_CHECK(excludeRanksCount >= 0, mnclInvalidArgument,
               "shrink: excludeRanksCount=" + std::to_string(excludeRanksCount) + " is negative");
    MNCL_CHECK(excludeRanksCount == 0 || excludeRanksList, mnclInvalidArgument,
               "shrink: excludeRanksList is null with excludeRanksCount=" + std::to_string(excludeRanksCount));
    MNCL_CHECK(shrinkFlags == MNCL_SHRINK_DEFAULT || shrinkFlags == MNCL_SHRINK_ABORT, mnclInvalidArgument,
               "shrink: shrinkFlags must be MNCL_SHRINK_DEFAULT or MNCL_SHRINK_ABORT, not " + std::to_string(shrinkFlags));
    CallHold hold(comm);
    Comm& parent = hold.comm();
    WaitCancel cancel(&comm->cancelWaits);
    CommOptions options = config ? optionsFrom(static_cast<const mnclConfig_t*>(config)) : parent.options();
    MNCL_CHECK(!config || static_cast<const mnclConfig_t*>(config)->blocking != 0, mnclInvalidArgument,
               "config.blocking = 0: minincl's shrink always blocks; set blocking to 1 (or leave it undefined)");
    int n = 0, r = 0;
    UniqueIdData id{};
    std::vector<int> exclude(excludeRanksList, excludeRanksList + excludeRanksCount);
    std::vector<int> members;
    parent.shrinkInfo(exclude, shrinkFlags == MNCL_SHRINK_ABORT, &n, &r, &id, &members);
    *newcomm = newChild(parent, id, r, n, members, options);
  });
}

mnclResult_t mnclCommDestroy(mnclComm_t comm) {
  return guarded([&] {
    if (comm) release(comm);
  });
}

mnclResult_t mnclCommAbort(mnclComm_t comm) {
  return guarded([&] {
    if (!comm) return;
    // (Calls in flight raise, and let go; so does a split waiting for its peers. An init still
    // running has none: release stops it and waits for it.)
    comm->cancelWaits.store(true, std::memory_order_release);
    if (comm->init.load(std::memory_order_acquire) == Init::ready && comm->impl) comm->impl->abort();
    release(comm);
  });
}

mnclResult_t mnclCommFinalize(mnclComm_t comm) {
  return guarded([&] {
    Comm& cm = use(comm);
    for (const auto& held : tlsGroupHeld) {
      MNCL_CHECK(held.first != comm, mnclInvalidUsage,
                 "this thread's open group holds calls on the communicator: end the group (mnclGroupEnd) "
                 "before finalizing it");
    }
    std::shared_lock<std::shared_timed_mutex> hold(comm->inUse);
    comm->finalized.store(true, std::memory_order_release);
    cm.awaitQueuedWork();
    if (cm.asyncError() != mnclSuccess) cm.throwStoredError();
  });
}

mnclResult_t mnclCommGetAsyncError(mnclComm_t comm, mnclResult_t* asyncError) {
  return guarded([&] {
    MNCL_CHECK(asyncError != nullptr, mnclInvalidArgument, "asyncError is null");
    MNCL_CHECK(comm != nullptr, mnclInvalidArgument, "the communicator is null");
    Init init = comm->init.load(std::memory_order_acquire);
    // (An init this thread's open group started is in progress until the group ends: see use.)
    if (init == Init::ready && !tlsGroupInits.empty() && initInOpenGroup(comm)) init = Init::running;
    if (init == Init::running) *asyncError = mnclInProgress;
    else if (init == Init::failed) *asyncError = comm->initError;
    else *asyncError = use(comm).asyncError();
  });
}

mnclResult_t mnclCommLostRanks(const mnclComm_t comm, int* ranks, int* count) {
  return guarded([&] {
    MNCL_CHECK(count != nullptr, mnclInvalidArgument, "count is null");
    std::vector<int> lost = use(comm).lostRanks();
    if (ranks) std::copy(lost.begin(), lost.end(), ranks);
    *count = (int)lost.size();
  });
}

mnclResult_t mnclCommCount(const mnclComm_t comm, int* count) {
  return answer(count, "count", [&] { return use(comm).nranks(); });
}
mnclResult_t mnclCommUserRank(const mnclComm_t comm, int* rank) {
  return answer(rank, "rank", [&] { return use(comm).rank(); });
}
mnclResult_t mnclCommDevice(const mnclComm_t comm, int* device) {
  return answer(device, "device", [&] { return use(comm).device(); });
}
mnclResult_t mnclCommCuDevice(const mnclComm_t comm, int* device) { return mnclCommDevice(comm, device); }
mnclResult_t mnclCommSetCallTimeout(mnclComm_t comm, double seconds) {
  return guarded([&] { use(comm).setCallTimeout(seconds); });
}
mnclResult_t mnclCommGetCallTimeout(const mnclComm_t comm, double* seconds) {
  return guarded([&] {
    MNCL_CHECK(seconds != nullptr, mnclInvalidArgument, "seconds is null");
    *seconds = use(comm).callTimeout();
  });
}

mnclResult_t mnclCommMemAlloc(mnclComm_t comm, void** ptr, size_t size) {
  return guarded([&] {
    MNCL_CHECK(ptr != nullptr, mnclInvalidArgument, "mnclCommMemAlloc: ptr is null");
    *ptr = nullptr;
    Comm& cm = use(comm);
    std::shared_lock<std::shared_timed_mutex> held(comm->inUse);  // (not destroyed meanwhile)
    *ptr = allocateWindowMemory(cm, size);
  });
}
mnclResult_t mnclMemFree(void* ptr) {
  return guarded([&] { freeWindowMemory(ptr); });
}

const char* mnclGetErrorString(mnclResult_t r) {
  switch (r) {
    case mnclSuccess: return "no error";
    case mnclUnhandledCudaError: return "unhandled CUDA error";
    case mnclSystemError: return "system error (a call to the operating system failed)";
    case mnclInternalError: return "internal error (a bug in minincl)";
    case mnclInvalidArgument: return "invalid argument";
    case mnclInvalidUsage: return "invalid usage";
    case mnclRemoteError: return "remote error (a peer failed or went away)";
    case mnclInProgress: return "operation in progress";
    case mnclTimeout: return "timeout";
    case mnclAborted: return "aborted";
    default: return "unknown result code";
  }
}

const char* mnclGetLastError(mnclComm_t comm) {
  if (comm && comm->init.load(std::memory_order_acquire) == Init::failed) return comm->initMessage.c_str();
  if (comm && comm->init.load(std::memory_order_acquire) == Init::ready && comm->impl &&
      comm->impl->asyncError() != mnclSuccess) {
    return comm->impl->failedMessage();  // (stable: two calls may share one printf)
  }
  return threadLastError();
}

// An enum argument's value as the C caller stored it. Read as an int: a value outside the
// enumerators' range (99 for a data type) is one C allows and C++ may not load as the enum.
static_assert(sizeof(mnclDataType_t) == sizeof(int) && sizeof(mnclRedOp_t) == sizeof(int) &&
              sizeof(mnclScalarResidence_t) == sizeof(int));
static int valueAt(const void* anEnum) {
  int v;
  std::memcpy(&v, anEnum, sizeof v);
  return v;
}

// A call's data type, checked as the caller passed it (a cast first turned -1 into 255).
static DataType dataTypeOf(const mnclDataType_t& type) {
  int t = valueAt(&type);
  MNCL_CHECK(t >= 0 && t < mnclNumTypes, mnclInvalidArgument, "unknown data type " + std::to_string(t));
  return (DataType)t;
}

// The reduction a call's op names: a built-in one, or one of comm's pre-multiplied sums.
static void resolveOp(mnclComm_t comm, const mnclRedOp_t& given, CollCall& call) {
  int op = valueAt(&given);
  MNCL_CHECK(op >= 0, mnclInvalidArgument, "unknown reduction op " + std::to_string(op));
  if (op < mnclNumOps) {
    call.op = (RedOp)op;
    return;
  }
  if (op >= mnclBand && op <= mnclBxor) {
    call.op = op == mnclBand ? RedOp::band : op == mnclBor ? RedOp::bor : RedOp::bxor;
    return;
  }
  std::lock_guard<std::mutex> lock(comm->opsMutex);
  size_t i = (size_t)op - mnclNumOps;
  MNCL_CHECK(i < comm->preMulSums.size() && comm->preMulSums[i].live, mnclInvalidArgument,
             "reduction op " + std::to_string((int)op) +
                 " is not one of this communicator's: create it with mnclRedOpCreatePreMulSum on this communicator "
                 "(and do not use it after mnclRedOpDestroy)");
  const PreMulSumOp& pre = comm->preMulSums[i];
  MNCL_CHECK(pre.dtype == call.dtype, mnclInvalidArgument,
             "reduction op " + std::to_string((int)op) + " was created for " + dataTypeName(pre.dtype) +
                 " data, but this call's data is " + dataTypeName(call.dtype));
  call.op = RedOp::premulsum;
  call.scalarBits = pre.scalarBits;
  call.scalarAt = pre.scalarAt;
}

static mnclResult_t coll(Coll c, const void* send, void* recv, size_t count, mnclDataType_t dt, mnclRedOp_t op,
                         int root, mnclComm_t comm, void* stream) {
  return groupable([&] {
    CallHold hold(comm);
    Comm& cm = hold.comm();
    checkStream(cm, stream);
    CollCall call{c, send, recv, count, dataTypeOf(dt), RedOp::sum, root, stream};
    if (reduces(c)) resolveOp(comm, op, call);
    enqueueColl(cm, call);
  });
}

mnclResult_t mnclRedOpCreatePreMulSum(mnclRedOp_t* op, void* scalar, mnclDataType_t datatype,
                                      mnclScalarResidence_t residence, mnclComm_t comm) {
  return guarded([&] {
    use(comm);
    MNCL_CHECK(op != nullptr, mnclInvalidArgument, "mnclRedOpCreatePreMulSum: op is null");
    MNCL_CHECK(scalar != nullptr, mnclInvalidArgument, "mnclRedOpCreatePreMulSum: scalar is null");
    int type = valueAt(&datatype), where = valueAt(&residence);
    MNCL_CHECK(type >= 0 && type < mnclNumTypes, mnclInvalidArgument,
               "mnclRedOpCreatePreMulSum: unknown data type " + std::to_string(type));
    MNCL_CHECK(where == mnclScalarDevice || where == mnclScalarHostImmediate, mnclInvalidArgument,
               "mnclRedOpCreatePreMulSum: residence " + std::to_string(where) +
                   " is neither mnclScalarDevice nor mnclScalarHostImmediate");
    PreMulSumOp pre;
    pre.live = true;
    pre.dtype = (DataType)type;
    if (where == mnclScalarHostImmediate) std::memcpy(&pre.scalarBits, scalar, dataTypeSize(pre.dtype));
    else pre.scalarAt = scalar;
    std::lock_guard<std::mutex> lock(comm->opsMutex);
    auto& ops = comm->preMulSums;
    size_t i = 0;
    while (i < ops.size() && ops[i].live) ++i;  // reuse a destroyed op's number
    MNCL_CHECK(i < (size_t)(mnclBand - mnclNumOps), mnclInvalidUsage, "too many reduction ops on this communicator");
    if (i == ops.size()) ops.push_back(pre);
    else ops[i] = pre;
    *op = (mnclRedOp_t)(mnclNumOps + (int)i);
  });
}

mnclResult_t mnclRedOpDestroy(mnclRedOp_t op, mnclComm_t comm) {
  return guarded([&] {
    use(comm);
    std::lock_guard<std::mutex> lock(comm->opsMutex);
    int given = valueAt(&op);  // (an int: a value past the enum's may come from C)
    size_t i = (size_t)given - mnclNumOps;
    MNCL_CHECK(given >= mnclNumOps && i < comm->preMulSums.size() && comm->preMulSums[i].live, mnclInvalidArgument,
               "mnclRedOpDestroy: reduction op " + std::to_string(given) +
                   " is not a live mnclRedOpCreatePreMulSum op of this communicator");
    comm->preMulSums[i].live = false;
  });
}

mnclResult_t mnclAllReduce(const void* s, void* r, size_t n, mnclDataType_t t, mnclRedOp_t op, mnclComm_t c, void* st) {
  return coll(Coll::allreduce, s, r, n, t, op, 0, c, st);
}
mnclResult_t mnclBroadcast(const void* s, void* r, size_t n, mnclDataType_t t, int root, mnclComm_t c, void* st) {
  return coll(Coll::broadcast, s, r, n, t, mnclSum, root, c, st);
}
mnclResult_t mnclBcast(void* b, size_t n, mnclDataType_t t, int root, mnclComm_t c, void* st) {
  return coll(Coll::broadcast, b, b, n, t, mnclSum, root, c, st);
}
mnclResult_t mnclReduce(const void* s, void* r, size_t n, mnclDataType_t t, mnclRedOp_t op, int root, mnclComm_t c, void* st) {
  return coll(Coll::reduce, s, r, n, t, op, root, c, st);
}
mnclResult_t mnclAllGather(const void* s, void* r, size_t n, mnclDataType_t t, mnclComm_t c, void* st) {
  return coll(Coll::allgather, s, r, n, t, mnclSum, 0, c, st);
}
mnclResult_t mnclReduceScatter(const void* s, void* r, size_t n, mnclDataType_t t, mnclRedOp_t op, mnclComm_t c, void* st) {
  return coll(Coll::reducescatter, s, r, n, t, op, 0, c, st);
}

mnclResult_t mnclAlltoAll(const void* s, void* r, size_t n, mnclDataType_t t, mnclComm_t c, void* st) {
  return sendsAndReceives(c, st, [&](Comm& cm) { enqueueAlltoAll(cm, s, r, n, dataTypeOf(t), st); });
}
mnclResult_t mnclGather(const void* s, void* r, size_t n, mnclDataType_t t, int root, mnclComm_t c, void* st) {
  return sendsAndReceives(c, st, [&](Comm& cm) { enqueueGather(cm, s, r, n, dataTypeOf(t), root, st); });
}
mnclResult_t mnclScatter(const void* s, void* r, size_t n, mnclDataType_t t, int root, mnclComm_t c, void* st) {
  return sendsAndReceives(c, st, [&](Comm& cm) { enqueueScatter(cm, s, r, n, dataTypeOf(t), root, st); });
}
mnclResult_t mnclSend(const void* buf, size_t n, mnclDataType_t t, int peer, mnclComm_t c, void* st) {
  return sendsAndReceives(c, st, [&](Comm& cm) {
    enqueueP2p(cm, {true, const_cast<void*>(buf), n, dataTypeOf(t), peer, st});
  });
}
mnclResult_t mnclRecv(void* buf, size_t n, mnclDataType_t t, int peer, mnclComm_t c, void* st) {
  return sendsAndReceives(c, st, [&](Comm& cm) { enqueueP2p(cm, {false, buf, n, dataTypeOf(t), peer, st}); });
}

mnclResult_t mnclGroupStart(void) {
  return guarded([] { groupStart(); });
}
mnclResult_t mnclGroupEnd(void) {
  return guarded([] {
    bool outermost = groupDepth() == 1;
    struct LetGo {  // (also when the group's calls fail)
      bool outermost;
      ~LetGo() {
        if (outermost) tlsGroupHeld.clear();
      }
    } letGo{outermost};
    if (outermost) {
      mnclResult_t inits = awaitGroupInits();
      if (inits != mnclSuccess) {
        std::string why = threadLastError();
        groupEnd();  // (the group's calls still run, on the communicators that exist)
        throwError(inits, why);
      }
    }
    groupEnd();
  });
}

}  // extern "C"
