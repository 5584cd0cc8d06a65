// minincl._core: the communicator as Python sees it. The per-call path (array -> pointer,
// count, type -> enqueue) stays in compiled code, and every blocking call releases the GIL so
// that ranks running as Python threads of one process progress together.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "../bootstrap/bootstrap.h"
#include "../bootstrap/socket.h"
#include "../core/comm.h"
#include "../core/error.h"
#include "../core/monitor.h"
#include "../core/outcome.h"
#include "../core/vector_isa.h"
#include "../enqueue/enqueue.h"
#include "../gpu/cuda_api.h"
#include "arrays.h"
#include "async_queue.h"
#include "call_args.h"
#include "interrupt.h"
#include "minincl.h"
#include "reduce_op.h"

#ifdef MININCL_HAVE_TOPO
void bindTopo(pybind11::module_& m);
#endif

namespace py = pybind11;
using namespace mncl;
using py_arrays::ArrayView;

namespace {

// ---- errors: mncl::Error -> minincl.<Class>(message) ----

py::object errorClass(mnclResult_t code) {
  py::module_ errors = py::module_::import("minincl.errors");
  switch (code) {
    case mnclInvalidArgument: return errors.attr("InvalidArgument");
    case mnclInvalidUsage: return errors.attr("InvalidUsage");
    case mnclSystemError: return errors.attr("SystemError");
    case mnclRemoteError: return errors.attr("RemoteError");
    case mnclTimeout: return errors.attr("Timeout");
    case mnclAborted: return errors.attr("Aborted");
    default: return errors.attr("Error");
  }
}

[[noreturn]] void raise(mnclResult_t code, const std::string& msg) {
  py::object cls = errorClass(code);
  PyErr_SetString(cls.ptr(), msg.c_str());
  throw py::error_already_set();
}

// ---- asynchronous calls: a Work per call, run in order by the communicator's AsyncQueue ----

class Work {
 public:
  using Stop = std::function<void(const std::string& why)>;
  // stop: fails the communicator, for a wait() that Ctrl-C interrupts (see py_interrupt).
  Work(std::shared_ptr<Outcome> s, py::object result, py::list keep, Stop stop)
      : state_(std::move(s)), result_(std::move(result)), keep_(std::move(keep)), stop_(std::move(stop)) {}
  py::object wait() {
    py_interrupt::InterruptibleCall interruptible([this](const std::string& why) { stop_(why); });
    for (;;) {
      {
        py_gil::Released nogil;
        if (state_->waitFor(std::chrono::milliseconds(50))) break;
      }
      interruptible.checkNow();
    }
    if (state_->code() != mnclSuccess) raise(state_->code(), state_->message());
    return result_;
  }
  bool isCompleted() { return state_->done(); }
  py::object result() { return result_; }

 private:
  std::shared_ptr<Outcome> state_;
  py::object result_;
  py::list keep_;  // the arrays, alive until the work is gone
  Stop stop_;
};

class PyComm;

// What this thread's open group holds until it ends: its calls' arrays (and the
// communicators' Python objects), alive until the calls ran, and the communicators the calls
// were recorded on, held open while the group runs.
struct PyGroup {
  std::vector<py::object> keep;
  std::vector<PyComm*> comms;
};
thread_local PyGroup* tlsGroup = nullptr;

// ---- the communicator ----

// What PyComm::run calls to enqueue a collective on a communicator and (GPU) stream.
struct EnqueueColl {
  CollCall call;
  void operator()(Comm& cm, void* stream) {
    call.stream = stream;
    enqueueColl(cm, call);
  }
};

class PyComm {
  // f(the communicator), held open meanwhile: a close() on another thread (abort, destroy)
  // waits until f returns, and f never sees one that was closed. (Defined first: the
  // methods below need its return type.)
  template <typename F>
  auto withLive(F f) {
    HeldHere here(this);  // (declared first: it ends after the lock is released)
    std::shared_lock<std::shared_timed_mutex> lock(callMutex_);
    if (destroyed_) throwClosed();
    return f(*comm_);
  }

  // Marks the communicators this thread holds open (inside withLive or a group's end). A
  // signal handler runs on the thread it interrupts, from inside the call's long wait: an
  // abort() or destroy() there cannot wait for that call to end, so it stops the call, and
  // the communicator closes when the call has unwound (see stopFromInside).
  static thread_local std::vector<PyComm*> tlsHeld;
  struct HeldHere {
    PyComm* comm;
    explicit HeldHere(PyComm* c) : comm(c) { tlsHeld.push_back(c); }
    ~HeldHere() {
      tlsHeld.erase(std::find(tlsHeld.rbegin(), tlsHeld.rend(), comm).base() - 1);
      if (comm->closeWhenFree_ && !comm->heldHere()) comm->closeDeferred();
    }
    HeldHere(const HeldHere&) = delete;
    HeldHere& operator=(const HeldHere&) = delete;
  };
  bool heldHere() const { return std::find(tlsHeld.begin(), tlsHeld.end(), this) != tlsHeld.end(); }

  // abort() or destroy() from a signal handler on the thread inside a call: `why` fails that
  // call (it raises Aborted) and its peers' waits; the close follows once it has returned.
  void stopFromInside(const std::string& why) {
    comm_->stop(why);
    closeWhenFree_ = true;
  }
  void closeDeferred() noexcept {
    auto closeNow = [this] {
      std::lock_guard<std::mutex> life(lifeMutex_);
      if (!destroyed_) close();
    };
    if (PyGILState_Check()) {
      {
        py_gil::Released nogil;  // (queued async_op calls may need it to end)
        closeNow();
      }
      asyncHeld_.clear();  // (close() waited for the queued calls; touched with the GIL only)
    } else {
      closeNow();
    }
  }

  [[noreturn]] static void throwClosed() {
    throwError(mnclInvalidUsage, "the communicator was destroyed (or aborted); create a new one");
  }

 public:
  PyComm(int nranks, py::bytes uid, int rank, int device) {
    std::string id = uid;
    if (id.size() != MNCL_UNIQUE_ID_BYTES) {
      throwError(mnclInvalidArgument, "the unique id must be " + std::to_string(MNCL_UNIQUE_ID_BYTES) +
                                          " bytes (from minincl.get_unique_id()), got " + std::to_string(id.size()));
    }
    UniqueIdData data;
    std::memcpy(&data, id.data(), sizeof(data));
    // Ctrl-C while the peers are awaited (up to MININCL_BOOTSTRAP_TIMEOUT) stops the init.
    std::atomic<bool> cancel{false};
    py_interrupt::InterruptibleCall interruptible([&cancel](const std::string&) { cancel = true; });
    interruptible.withoutGil([&] {  // (one that ends though interrupted goes with this object)
      WaitCancel cancelWaits(&cancel);
      comm_ = std::make_unique<Comm>(data, rank, nranks, device);
    });
    rank_ = comm_->rank();
    nranks_ = comm_->nranks();
    device_ = comm_->device();
    commAddress_ = comm_.get();
  }
  ~PyComm() { destroy(); }

  // Who this communicator is stays readable once it is destroyed or aborted (for the error
  // handlers that log it).
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  int device() const { return device_; }
  bool destroyed() const { return destroyed_.load(); }

  py::object allreduce(py::object send, py::object recv, py::handle op, bool asyncOp, py::object stream) {
    py_ops::OpArg rop = py_ops::parse(op);
    auto [s, r] = sendRecv(send, recv);
    checkCounts("allreduce", s, r, s.count);
    CollCall call = callArgs(Coll::allreduce, s, r, s.count, RedOp::sum, 0);
    py::object scalar = applyOp(rop, call);
    return run(asyncOp, stream, recv, {s.keepAlive, r.keepAlive, scalar}, EnqueueColl{call});
  }

  py::object broadcast(py::object send, py::object recv, int root, bool asyncOp, py::object stream) {
    auto [s, r] = sendRecv(send, recv);
    checkCounts("broadcast", s, r, s.count);
    return run(asyncOp, stream, recv, {s.keepAlive, r.keepAlive},
               EnqueueColl{callArgs(Coll::broadcast, s, r, s.count, RedOp::sum, root)});
  }

  py::object reduce(py::object send, py::object recv, py::handle op, int root, bool asyncOp, py::object stream) {
    py_ops::OpArg rop = py_ops::parse(op);
    auto [s, r] = sendRecv(send, recv);
    checkCounts("reduce", s, r, s.count);
    CollCall call = callArgs(Coll::reduce, s, r, s.count, RedOp::sum, root);
    py::object scalar = applyOp(rop, call);
    return run(asyncOp, stream, recv, {s.keepAlive, r.keepAlive, scalar}, EnqueueColl{call});
  }

  py::object allgather(py::object send, py::object recv, bool asyncOp, py::object stream) {
    ArrayView s = py_arrays::view(send, false, "send");
    if (recv.is_none()) recv = py_arrays::emptyLike(send, gatheredShape(s.shape));
    ArrayView r = py_arrays::view(recv, true, "recv");
    checkDevice(s, "send");
    checkDevice(r, "recv");
    checkCounts("allgather", s, r, s.count * (size_t)nranks_);
    return run(asyncOp, stream, recv, {s.keepAlive, r.keepAlive},
               EnqueueColl{callArgs(Coll::allgather, s, r, s.count, RedOp::sum, 0)});
  }

  py::object reduceScatter(py::object send, py::object recv, py::handle op, bool asyncOp, py::object stream) {
    py_ops::OpArg rop = py_ops::parse(op);
    ArrayView s = py_arrays::view(send, false, "send");
    size_t n = (size_t)nranks_;
    if (recv.is_none()) {
      if (s.count % n != 0) {
        throwError(mnclInvalidArgument, "reduce_scatter: send has " + std::to_string(s.count) +
                                            " elements, not a multiple of " + std::to_string(n) + " ranks");
      }
      recv = py_arrays::emptyLike(send, scatteredShape(s.shape, s.count, n));
    }
    ArrayView r = py_arrays::view(recv, true, "recv");
    checkDevice(s, "send");
    checkDevice(r, "recv");
    checkCounts("reduce_scatter", r, s, r.count * n, "send");
    CollCall call = callArgs(Coll::reducescatter, s, r, r.count, RedOp::sum, 0);
    py::object scalar = applyOp(rop, call);
    return run(asyncOp, stream, recv, {s.keepAlive, r.keepAlive, scalar}, EnqueueColl{call});
  }

  py::object alltoall(py::object send, py::object recv, bool asyncOp, py::object stream) {
    ArrayView s = py_arrays::view(send, false, "send");
    if (recv.is_none()) recv = py_arrays::emptyLike(send, s.shape.empty() ? std::vector<int64_t>{(int64_t)s.count} : s.shape);
    ArrayView r = py_arrays::view(recv, true, "recv");
    checkDevice(s, "send");
    checkDevice(r, "recv");
    checkCounts("alltoall", s, r, s.count);
    size_t n = (size_t)nranks_;
    if (s.count % n != 0) {
      throwError(mnclInvalidArgument, "alltoall: send has " + std::to_string(s.count) + " elements, not a multiple of " +
                                          std::to_string(n) + " ranks");
    }
    size_t per = s.count / n;
    const void* sp = s.data;
    void* rp = r.data;
    DataType t = s.dtype;
    return run(asyncOp, stream, recv, {s.keepAlive, r.keepAlive},
               [=](Comm& cm, void* st) { enqueueAlltoAll(cm, sp, rp, per, t, st); });
  }

  // recv is used at the root only (a new array there when None); elsewhere it is returned as given.
  py::object gather(py::object send, py::object recv, int root, bool asyncOp, py::object stream) {
    ArrayView s = py_arrays::view(send, false, "send");
    checkDevice(s, "send");
    void* rp = nullptr;
    py::object recvKeep = py::none();
    if (rank_ == root) {
      if (recv.is_none()) recv = py_arrays::emptyLike(send, gatheredShape(s.shape));
      ArrayView r = py_arrays::view(recv, true, "recv");
      checkDevice(r, "recv");
      checkCounts("gather", s, r, s.count * (size_t)nranks_);
      rp = r.data;
      recvKeep = r.keepAlive;
    }
    const void* sp = s.data;
    size_t count = s.count;
    DataType t = s.dtype;
    return run(
        asyncOp, stream, recv, {s.keepAlive, recvKeep},
        [=](Comm& cm, void* st) { enqueueGather(cm, sp, rp, count, t, root, st); }, send);
  }

  // send is read at the root only; elsewhere it may be None, or give a new recv its shape
  // (recv None: send's shape with nranks times fewer elements, as at the root).
  py::object scatter(py::object send, py::object recv, int root, bool asyncOp, py::object stream) {
    size_t n = (size_t)nranks_;
    bool atRoot = rank_ == root;
    std::optional<ArrayView> s;
    if (atRoot || recv.is_none()) {
      if (send.is_none()) {
        throwError(mnclInvalidArgument, atRoot ? "scatter: send is None on the root (rank " + std::to_string(root) + ")"
                                               : std::string("scatter: send and recv are both None: pass recv"));
      }
      s = py_arrays::view(send, false, "send");
      checkDevice(*s, "send");
      if (recv.is_none()) {
        if (s->count % n != 0) {
          throwError(mnclInvalidArgument, "scatter: send has " + std::to_string(s->count) + " elements, not a multiple of " +
                                              std::to_string(n) + " ranks");
        }
        recv = py_arrays::emptyLike(send, scatteredShape(s->shape, s->count, n));
      }
    }
    ArrayView r = py_arrays::view(recv, true, "recv");
    checkDevice(r, "recv");
    if (atRoot) checkCounts("scatter", r, *s, r.count * n, "send");
    const void* sp = atRoot ? s->data : nullptr;
    void* rp = r.data;
    size_t count = r.count;
    DataType t = r.dtype;
    return run(asyncOp, stream, recv, {atRoot ? s->keepAlive : py::none(), r.keepAlive},
               [=](Comm& cm, void* st) { enqueueScatter(cm, sp, rp, count, t, root, st); });
  }

  py::object send(py::object buf, int peer, bool asyncOp, py::object stream, int tag) {
    ArrayView b = py_arrays::view(buf, false, "buf");
    checkDevice(b, "buf");
    P2pCall c{true, b.data, b.count, b.dtype, peer};
    c.tag = tag;
    return run(
        asyncOp, stream, py::none(), {b.keepAlive},
        [c](Comm& cm, void* st) mutable {
          c.stream = st;
          enqueueP2p(cm, c);
        },
        buf);
  }

  py::object recv(py::object buf, int peer, bool asyncOp, py::object stream, int tag) {
    ArrayView b = py_arrays::view(buf, true, "buf");
    checkDevice(b, "buf");
    P2pCall c{false, b.data, b.count, b.dtype, peer};
    c.tag = tag;
    return run(asyncOp, stream, buf, {b.keepAlive}, [c](Comm& cm, void* st) mutable {
      c.stream = st;
      enqueueP2p(cm, c);
    });
  }

  py::object sendrecv(py::object send, py::object recv, int peer, py::object recvPeer, bool asyncOp, py::object stream) {
    ArrayView s = py_arrays::view(send, false, "send");
    ArrayView r = py_arrays::view(recv, true, "recv");
    checkDevice(s, "send");
    checkDevice(r, "recv");
    int from = recvPeer.is_none() ? peer : recvPeer.cast<int>();
    P2pCall out{true, s.data, s.count, s.dtype, peer}, in{false, r.data, r.count, r.dtype, from};
    return run(asyncOp, stream, recv, {s.keepAlive, r.keepAlive}, [out, in](Comm& cm, void* st) mutable {
      out.stream = in.stream = st;
      enqueueSendRecv(cm, out, in);
    });
  }

  // A NumPy array in this rank's window (see Communicator.empty). The array keeps the window
  // mapped, whatever happens to the communicator, and gives its space back when collected.
  // Where no window would serve (no peer in another process of this host): a plain array.
  py::array windowEmpty(const std::vector<int64_t>& shape, const py::dtype& dtype) {
    auto [window, useful] = withLive([](Comm& cm) { return std::make_pair(cm.window(), cm.windowUseful()); });
    if (!window && device_ >= 0) {
      throwError(mnclInvalidUsage, "empty: windows are for CPU communicators; allocate GPU buffers with CuPy or PyTorch");
    }
    if (!window && !useful) return py::array(dtype, shape);
    if (!window) {
      throwError(mnclInvalidUsage, "this communicator has no window: set MININCL_WINDOW_BYTES (e.g. 1G) before it is "
                                   "created");
    }
    size_t bytes = (size_t)dtype.itemsize();
    for (int64_t d : shape) {
      if (d < 0) throwError(mnclInvalidArgument, "empty: negative dimension " + std::to_string(d));
      bytes *= (size_t)d;
    }
    void* p = window->allocate(bytes);
    using Owner = std::pair<std::shared_ptr<Window>, void*>;
    py::capsule keeper(new Owner(window, p), [](void* o) {
      auto* owner = static_cast<Owner*>(o);
      owner->first->release(owner->second);
      delete owner;
    });
    return py::array(dtype, shape, p, keeper);
  }

  int pendingSender() {
    return withLive([](Comm& cm) {
      if (cm.failed()) cm.throwStoredError();
      return cm.pendingSender();
    });
  }

  double callTimeout() {
    return withLive([](Comm& cm) { return cm.callTimeout(); });
  }
  void setCallTimeout(py::object seconds) {
    bool number = py::isinstance<py::float_>(seconds) || py::isinstance<py::int_>(seconds);
    if (!seconds.is_none() && (!number || py::isinstance<py::bool_>(seconds))) {
      throw py::type_error("call_timeout must be a number of seconds or None, not " +
                           py::str(py::type::handle_of(seconds).attr("__name__")).cast<std::string>());
    }
    double s = seconds.is_none() ? 0.0 : seconds.cast<double>();
    if (std::isinf(s) && s > 0) s = 0;  // (no limit, as None)
    withLive([s](Comm& cm) { cm.setCallTimeout(s); });
  }

  // Counters for tests and tuning.
  py::dict stats() {
    int channels = 0, network = 0;
    Comm::Stats s = withLive([&](Comm& cm) {
      channels = cm.nChannels();
      for (int r = 0; r < cm.nranks(); ++r) network += cm.overNetwork(r);
      return cm.stats();
    });
    py::dict d;
    d["channels"] = channels;
    d["pointer_steps"] = s.pointerSteps;
    d["direct_writes"] = s.directWrites;
    d["network_steps_landed"] = s.landedSteps;
    d["steps_read_ahead"] = s.stepsReadAhead;
    d["readable_peers"] = s.readablePeers;
    d["network_peers"] = network;
    return d;
  }

  // (new nranks, unique id, new rank, members) of the group this rank joins, or None for
  // color < 0; members: this communicator's ranks in it, in its rank order.
  py::object splitInfo(int color, int key) {
    return rendezvous([&](Comm& cm, int* n, int* r, UniqueIdData* id, std::vector<int>* members) {
      return cm.splitInfo(color, key, n, r, id, members);
    });
  }

  std::vector<int> lostRanks() {
    return withLive([](Comm& cm) { return cm.lostRanks(); });
  }

  // (new nranks, unique id, new rank, members) of the group of every rank but `exclude`.
  py::object shrinkInfo(const std::vector<int>& exclude) {
    return rendezvous([&](Comm& cm, int* n, int* r, UniqueIdData* id, std::vector<int>* members) {
      cm.shrinkInfo(exclude, false, n, r, id, members);
      return true;
    });
  }

  // The new group's init after a split or shrink fails at once, with RemoteError, if one of
  // `members` is gone (see Comm::failIfMemberGone); a communicator destroyed meanwhile
  // watches nothing.
  void failIfMemberGone(const std::vector<int>& members) {
    std::shared_lock<std::shared_timed_mutex> lock(callMutex_, std::try_to_lock);
    if (lock.owns_lock() && !destroyed_) comm_->failIfMemberGone(members);
  }

  // How init ordered the rings (see Communicator.topology()).
  py::dict topology() {
    return withLive([&](Comm& cm) {
      const topo::CommPlan& p = cm.topoPlan();
      std::vector<std::vector<int>> rings, trees;
      std::vector<std::vector<std::string>> hops;
      for (int c = 0; c < cm.nChannels(); ++c) {
        rings.push_back(cm.channel(c).ring);
        trees.push_back(cm.treeParents(c));
        if (!p.ringHops.empty()) hops.push_back(p.ringHops[c % p.ringHops.size()]);
      }
      py::dict d;
      d["nchannels"] = cm.nChannels();
      d["rings"] = rings;
      d["ring_hops"] = hops;
      d["searched"] = p.searched;
      d["on_gpus"] = p.onGpus;
      d["search_channels"] = p.searchChannels;
      d["path_bandwidth_gbs"] = p.bwGBs;
      d["bandwidth_scale"] = cm.tuner().bandwidthScale();
      d["devices"] = p.devices;
      d["hosts"] = p.hosts;
      d["trees"] = trees;
      d["source"] = p.source;
      d["reason"] = p.why;
      d["warnings"] = p.warnings;
      return d;
    });
  }

  void barrier() {
    if (device_ >= 0) {  // a host-side barrier: the ranks' threads, not their streams, meet
      py_gil::withoutGil([this] { withLive([](Comm& cm) { cm.bootstrap().barrier(); }); });
      return;
    }
    run(false, py::none(), py::none(), {}, [this](Comm& cm, void*) { enqueueBarrier(cm, &barrierWord_); });
  }

  // Stops in-flight work on every thread (they raise Aborted), then releases everything.
  // Both run without the GIL: the calls they wait for need it to finish raising.
  void abort() {
    if (destroyed_) return;
    if (heldHere()) {
      stopFromInside("the communicator was aborted (comm.abort(), from a signal handler during this call)");
      return;
    }
    {
      py_gil::Released nogil;
      std::lock_guard<std::mutex> life(lifeMutex_);
      if (destroyed_) return;
      comm_->abort();
      close();
    }
    asyncHeld_.clear();  // (close() waited for the queued calls)
  }

  void destroy() {
    if (destroyed_) return;
    if (heldHere()) {
      stopFromInside("the communicator was destroyed (comm.destroy(), from a signal handler during this call)");
      return;
    }
    {
      py_gil::Released nogil;
      std::lock_guard<std::mutex> life(lifeMutex_);
      if (destroyed_) return;
      close();
    }
    asyncHeld_.clear();
  }

  // failInside once a call has returned (InterruptibleCall::checkAfterReturn), unless the
  // communicator is closing (its destroy tells the peers): the handler may have closed it,
  // and a close may wait for work that needs the GIL this thread holds.
  void failAfterReturn(const std::string& why) {
    std::shared_lock<std::shared_timed_mutex> lock(callMutex_, std::try_to_lock);
    if (lock.owns_lock() && !destroyed_) failInside(why);
  }

  // failInside from an async_op call's Work.wait(), outside any call.
  void failForInterrupt(const std::string& why) {
    std::shared_lock<std::shared_timed_mutex> lock(callMutex_);
    if (!destroyed_) failInside(why);
  }

  // Ends this thread's outermost group (called with the GIL, which it releases while the
  // calls run), with every communicator its calls were recorded on held open: an abort() on
  // another thread stops the calls and then waits for them, instead of freeing what they run
  // on. Calls of a communicator closed before the group ended are dropped (nothing is left
  // for them to run on); the rest run.
  static void endGroup(std::vector<PyComm*> comms) {
    std::sort(comms.begin(), comms.end());  // one locking order for every thread
    py_interrupt::InterruptibleCall interruptible([&comms](const std::string& why) {
      for (PyComm* c : comms) {
        if (!c->destroyed_) c->failInside(why);  // (held open below)
      }
    });
    interruptible.withoutGil([&] {
      std::vector<std::unique_ptr<HeldHere>> here;  // (declared first: they end after the locks)
      std::vector<std::shared_lock<std::shared_timed_mutex>> held;
      std::string closed;
      for (PyComm* c : comms) {
        here.push_back(std::make_unique<HeldHere>(c));
        held.emplace_back(c->callMutex_);
        if (!c->destroyed_) continue;
        groupForget(c->commAddress_);
        closed += (closed.empty() ? "" : ", ") + std::to_string(c->rank_);
      }
      groupEnd();
      if (!closed.empty()) {
        throwError(mnclInvalidUsage, "the group's calls on the communicator of rank(s) " + closed +
                                         " did not run: it was destroyed or aborted before the group ended");
      }
    });
    interruptible.checkAfterReturn([&comms](const std::string& why) {
      for (PyComm* c : comms) c->failAfterReturn(why);
    });
  }

 private:
  // A split's or shrink's rendezvous, `f(comm, &nranks, &rank, &id, &members)`: (nranks,
  // unique id, rank, members) of the new group, or None where f returns false. Ctrl-C while the other ranks are
  // awaited cancels the rendezvous's socket waits and fails this communicator (its ranks are
  // somewhere inside the rendezvous).
  template <typename F>
  py::object rendezvous(F f) {
    checkNoOpenGroup("Communicator.split / shrink");
    int n = 0, r = 0;
    UniqueIdData id{};
    std::vector<int> members;
    std::atomic<bool> cancel{false};
    py_interrupt::InterruptibleCall interruptible([&](const std::string& why) {
      cancel = true;
      failInside(why);  // (from inside withLive)
    });
    bool joined = interruptible.withoutGil([&] {
      WaitCancel cancelWaits(&cancel);
      return withLive([&](Comm& cm) { return f(cm, &n, &r, &id, &members); });
    });
    if (!joined) return py::none();
    char bytes[MNCL_UNIQUE_ID_BYTES] = {};
    std::memcpy(bytes, &id, sizeof(id));
    return py::make_tuple(n, py::bytes(bytes, sizeof(bytes)), r, members);
  }

  // Frees the communicator once no call uses it: calls on other threads, and queued
  // async_op ones, end first. One still waiting for its peers after MININCL_TIMEOUT is
  // stopped (it raises Aborted): its peers may never come, and destroy() must not hang.
  void close() {
    auto until = Monitor::timeoutFromNow();
    std::unique_lock<std::shared_timed_mutex> lock(callMutex_, std::defer_lock);
    if (!async_.drainUntil(until) || !lock.try_lock_until(until)) {
      comm_->stopCallsForDestroy();
      async_.drain();
      lock.lock();
    }
    comm_.reset();
    destroyed_ = true;
  }


  void checkDevice(const ArrayView& v, const char* role) {
    bool hostMemory = v.deviceType == 1 || v.deviceType == 3;
    int device = device_;
    if (device < 0 && !hostMemory) {
      throwError(mnclInvalidArgument, std::string(role) + " is on a GPU (DLPack device " + std::to_string(v.deviceType) + ":" +
                                          std::to_string(v.deviceId) + ") but this communicator is on the CPU");
    }
    if (device >= 0 && v.count > 0) {
      bool onCuda = v.deviceType == 2 || v.deviceType == 13;  // kDLCUDA, kDLCUDAManaged
      if (!onCuda) {
        throwError(mnclInvalidArgument, std::string(role) + " is in host memory but this communicator is on cuda:" +
                                            std::to_string(device) + "; pass a CuPy array or a PyTorch CUDA tensor");
      }
      if (v.deviceId != device) {
        throwError(mnclInvalidArgument, std::string(role) + " is on cuda:" + std::to_string(v.deviceId) +
                                            " but this communicator is on cuda:" + std::to_string(device));
      }
    }
  }

  // How to ask the library an array type comes from for its current stream: CuPy's
  // get_current_stream, PyTorch's raw-stream getter (what Triton calls per launch; the public
  // torch.cuda.current_stream where a build lacks it), or nothing (the legacy default stream).
  struct StreamGetter {
    enum Kind { none, cupy, torchRaw, torch } kind = none;
    py::object fn;
  };

  // Found once per array type: a small GPU call from Python is host-bound, and the type's
  // module name, an import and three attribute lookups were on every call.
  static const StreamGetter& streamGetterFor(py::handle like) {
    static auto* known = new std::unordered_map<PyTypeObject*, StreamGetter>;  // GIL held; kept for the process
    PyTypeObject* type = Py_TYPE(like.ptr());
    if (auto it = known->find(type); it != known->end()) return it->second;
    std::string module = py::str(py::type::handle_of(like).attr("__module__"));
    StreamGetter g;
    if (module.rfind("cupy", 0) == 0) {
      g = {StreamGetter::cupy, py::module_::import("cupy").attr("cuda").attr("get_current_stream")};
    } else if (module.rfind("torch", 0) == 0) {
      py::object torchC = py::module_::import("torch").attr("_C");
      if (py::hasattr(torchC, "_cuda_getCurrentRawStream")) {
        g = {StreamGetter::torchRaw, torchC.attr("_cuda_getCurrentRawStream")};
      } else {
        g = {StreamGetter::torch, py::module_::import("torch").attr("cuda").attr("current_stream")};
      }
    }
    return known->emplace(type, std::move(g)).first->second;
  }

  // The stream a GPU call is ordered on: `stream=` (a handle, a CuPy stream or a PyTorch
  // stream), else the current stream of the library the arrays come from.
  static void* callStream(py::handle stream, py::handle like, int device) {
    if (!stream.is_none()) {
      if (py::isinstance<py::int_>(stream)) return reinterpret_cast<void*>(stream.cast<uintptr_t>());
      if (py::hasattr(stream, "cuda_stream")) return reinterpret_cast<void*>(stream.attr("cuda_stream").cast<uintptr_t>());
      if (py::hasattr(stream, "ptr")) return reinterpret_cast<void*>(stream.attr("ptr").cast<uintptr_t>());
      throwError(mnclInvalidArgument, "stream: expected a cudaStream_t handle (int), a CuPy stream or a PyTorch stream, got " +
                                          std::string(py::str(py::type::handle_of(stream).attr("__name__"))));
    }
    if (like.is_none()) return nullptr;  // the legacy default stream
    const StreamGetter& g = streamGetterFor(like);
    auto handle = [](py::handle h) { return reinterpret_cast<void*>(h.cast<uintptr_t>()); };
    switch (g.kind) {
      // (The communicator's device's current stream: CuPy keeps one per device, and the
      // current device may be another.)
      case StreamGetter::cupy: return handle(g.fn(device).attr("ptr"));
      case StreamGetter::torchRaw: return handle(g.fn(device));
      case StreamGetter::torch: return handle(g.fn(device).attr("cuda_stream"));
      default: break;
    }
    return nullptr;  // the legacy default stream
  }

  std::pair<ArrayView, ArrayView> sendRecv(py::object send, py::object& recv) {
    if (recv.is_none()) {  // in place: the one array is read and written
      ArrayView s = py_arrays::view(send, true, "send (in place)");
      checkDevice(s, "send");
      recv = send;
      return {s, std::move(s)};
    }
    ArrayView s = py_arrays::view(send, false, "send");
    ArrayView r = py_arrays::view(recv, true, "recv");
    checkDevice(s, "send");
    checkDevice(r, "recv");
    return {s, r};
  }

  // `a` must have `expect` elements of b's type.
  static void checkCounts(const char* what, const ArrayView& b, const ArrayView& a, size_t expect,
                          const char* aRole = "recv") {
    const char* bRole = std::strcmp(aRole, "recv") == 0 ? "send" : "recv";
    if (a.dtype != b.dtype) {
      throwError(mnclInvalidArgument, std::string(what) + ": " + bRole + " is " + dataTypeName(b.dtype) + " but " +
                                          aRole + " is " + dataTypeName(a.dtype) + "; they must match");
    }
    if (a.count != expect) {
      throwError(mnclInvalidArgument, std::string(what) + ": " + aRole + " has " + std::to_string(a.count) +
                                          " elements, expected " + std::to_string(expect) + " (" + bRole + " has " +
                                          std::to_string(b.count) + ")");
    }
  }

  std::vector<int64_t> gatheredShape(const std::vector<int64_t>& s) {
    int64_t n = nranks_;
    if (s.empty()) return {n};
    std::vector<int64_t> out = s;
    out[0] *= n;
    return out;
  }

  static std::vector<int64_t> scatteredShape(const std::vector<int64_t>& s, size_t count, size_t n) {
    if (!s.empty() && s[0] % (int64_t)n == 0) {
      std::vector<int64_t> out = s;
      out[0] /= (int64_t)n;
      return out;
    }
    return {(int64_t)(count / n)};
  }

  // (`op`: the reduction applyOp then sets, or a placeholder for calls without one.)
  static CollCall callArgs(Coll coll, const ArrayView& s, const ArrayView& r, size_t count, RedOp op, int root) {
    return CollCall{coll, s.data, r.data, count, s.dtype, op, root};
  }
  // The call's reduction from `op`; an array scalar on this communicator's device, kept
  // alive with the call (returned; None for a number).
  py::object applyOp(const py_ops::OpArg& op, CollCall& call) {
    std::optional<ArrayView> v = py_ops::apply(op, call);
    if (!v) return py::none();
    checkDevice(*v, "the PreMulSum scalar");
    return v->keepAlive;
  }

  // `op` enqueues the call on a communicator and stream. A template, so that the synchronous
  // path (the hot one for small CPU collectives) allocates nothing for it.
  template <typename Op>
  py::object run(bool asyncOp, py::object stream, py::object result, std::initializer_list<py::object> keep, Op op,
                 py::handle like = py::none()) {
    if (destroyed_) throwClosed();
    if (!stream.is_none() && device_ < 0) throwError(mnclInvalidArgument, "a CPU communicator takes no stream");
    void* cudaStream = nullptr;
    if (device_ >= 0) {
      if (asyncOp) {
        throwError(mnclInvalidUsage, "async_op=True on a CUDA communicator: its calls are already asynchronous, ordered on "
                                     "the stream; synchronize the stream (or record an event) to wait for them");
      }
      cudaStream = callStream(stream, like.is_none() ? py::handle(result) : like, device_);
    }
    if (groupDepth() > 0) {
      if (asyncOp) throwError(mnclInvalidUsage, "async_op=True inside minincl.group(): the group itself is the unit of completion");
      // Program order: the async_op calls queued before come first (the group's calls are
      // logged and run at its end, after them).
      try {
        if (!async_.idle()) awaitAsyncCalls();
        withLive([&](Comm& cm) { op(cm, cudaStream); });  // records only
      } catch (const Error& e) {
        groupRefuse(e.code(), e.what());  // (the group's end runs none of it, even if the caller goes on)
        throw;
      } catch (...) {
        groupRefuse(mnclInvalidUsage, "a call in it raised");
        throw;
      }
      if (tlsGroup) {
        for (const py::object& k : keep) tlsGroup->keep.push_back(k);
        if (std::find(tlsGroup->comms.begin(), tlsGroup->comms.end(), this) == tlsGroup->comms.end()) {
          tlsGroup->comms.push_back(this);
          tlsGroup->keep.push_back(py::cast(this));  // (the existing Python object)
        }
      }
      return result;
    }
    if (asyncOp) {
      py::list k;
      for (const py::object& o : keep) k.append(o);
      std::shared_ptr<Outcome> outcome = async_.submit([this, op]() mutable {
        std::shared_lock<std::shared_timed_mutex> lock(callMutex_);
        if (destroyed_) throwError(mnclInvalidUsage, "the communicator was destroyed before this operation ran");
        op(*comm_, nullptr);
      });
      releaseFinishedAsync();
      asyncHeld_.emplace_back(outcome, k);
      return py::cast(Work(outcome, result, k, [self = py::cast(this)](const std::string& why) {
        self.cast<PyComm&>().failForInterrupt(why);
      }));
    }
    if (!asyncHeld_.empty()) releaseFinishedAsync();
    if (!async_.idle()) awaitAsyncCalls();  // program order with earlier async calls
    py_interrupt::InterruptibleCall interruptible([this](const std::string& why) { failInside(why); });
    interruptible.withoutGil([&] { withLive([&](Comm& cm) { op(cm, cudaStream); }); });
    interruptible.checkAfterReturn([this](const std::string& why) { failAfterReturn(why); });
    return result;
  }

  // Waits for the async_op calls queued before a call. Ctrl-C (or another signal's handler that
  // raises) fails the communicator, which ends them; the handler may also have closed it (the
  // wait is outside withLive): failForInterrupt checks.
  void awaitAsyncCalls() {
    py_interrupt::InterruptibleCall interruptible([this](const std::string& why) { failForInterrupt(why); });
    interruptible.withoutGil([this] { async_.drainForCall(); });
  }

  // Fails the communicator for a call that Ctrl-C interrupted (see py_interrupt), from inside
  // the call (withLive holds it open).
  void failInside(const std::string& why) {
    comm_->fail(mnclAborted, why + "; the communicator is aborted");
  }

  // The arrays of queued async_op calls, alive until they ran even when their Work is dropped
  // first (the worker thread reads and writes them). Touched with the GIL held only.
  void releaseFinishedAsync() {
    while (!asyncHeld_.empty() && asyncHeld_.front().first->done()) asyncHeld_.pop_front();  // (they end in order)
  }
  std::deque<std::pair<std::shared_ptr<Outcome>, py::list>> asyncHeld_;

  std::unique_ptr<Comm> comm_;
  int rank_ = 0, nranks_ = 0, device_ = 0;
  const Comm* commAddress_ = nullptr;  // comm_'s, kept to find its calls in a group once it is gone
  std::shared_timed_mutex callMutex_;
  std::mutex lifeMutex_;
  std::atomic<bool> destroyed_{false};
  std::atomic<bool> closeWhenFree_{false};  // stopFromInside: close when no call holds it here
  py_async::AsyncQueue async_;
  int32_t barrierWord_ = 0;
};

thread_local std::vector<PyComm*> PyComm::tlsHeld;

// parent._watch_begin(members), then the child's init, then parent._watch_end(): the init,
// waiting in the bootstrap for the members of a split or shrink, fails at once if one of
// them exited (it never joins; the init waited MININCL_BOOTSTRAP_TIMEOUT). Begun and ended
// on one thread, as the init runs there; the parent stays alive meanwhile (the caller holds it).
thread_local std::vector<std::unique_ptr<WaitCheck>> tlsMemberWatches;

py::bytes uniqueIdBytes(const mnclUniqueId& id) { return py::bytes(id.internal, sizeof(id.internal)); }

void checkResult(mnclResult_t rc) {
  if (rc != mnclSuccess) raise(rc, mnclGetLastError(nullptr));
}

// ---- the per-call methods, on CPython's fast calling convention (see call_args.h) ----

using py_args::Args;
using py_args::Signature;

// A method body's exceptions as Python errors: minincl's own as minincl.<Class>.
template <typename Body>
PyObject* callGuarded(Body body) {
  return py_args::guarded(body, [](const std::exception& e) {
    auto* err = dynamic_cast<const Error*>(&e);
    if (err) PyErr_SetString(errorClass(err->code()).ptr(), err->what());
    return err != nullptr;
  });
}

PyComm& self(PyObject* obj) { return py::cast<PyComm&>(py::handle(obj)); }

// A per-call method: `Sig` names its parameters, `Body` calls the communicator with them.
using Body = py::object (*)(PyComm&, const Args&);
template <const Signature& Sig, Body F>
PyObject* method(PyObject* obj, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return callGuarded([&] { return F(self(obj), Args(Sig, args, nargs, kwnames)); });
}

const Signature kAllreduce("allreduce", {"send", "recv=None", "op='sum'", "async_op=False", "stream=None"});
const Signature kBroadcast("broadcast", {"send", "recv=None", "root=0", "async_op=False", "stream=None"});
const Signature kReduce("reduce", {"send", "recv=None", "op='sum'", "root=0", "async_op=False", "stream=None"});
const Signature kAllgather("allgather", {"send", "recv=None", "async_op=False", "stream=None"});
const Signature kReduceScatter("reduce_scatter", {"send", "recv=None", "op='sum'", "async_op=False", "stream=None"});
const Signature kAlltoall("alltoall", {"send", "recv=None", "async_op=False", "stream=None"});
const Signature kGather("gather", {"send", "recv=None", "root=0", "async_op=False", "stream=None"});
const Signature kScatter("scatter", {"send=None", "recv=None", "root=0", "async_op=False", "stream=None"});
const Signature kSend("send", {"buf", "peer", "async_op=False", "stream=None", "tag=0"});
const Signature kRecv("recv", {"buf", "peer", "async_op=False", "stream=None", "tag=0"});
const Signature kSendrecv("sendrecv", {"send", "recv", "peer", "recv_peer=None", "async_op=False", "stream=None"});

// What each method does with its parsed arguments.
py::object allreduceWith(PyComm& c, const Args& a) {
  return c.allreduce(a.object(0), a.object(1), a.object(2), a.flag(3), a.object(4));
}
py::object broadcastWith(PyComm& c, const Args& a) {
  return c.broadcast(a.object(0), a.object(1), a.integer(2), a.flag(3), a.object(4));
}
py::object reduceWith(PyComm& c, const Args& a) {
  return c.reduce(a.object(0), a.object(1), a.object(2), a.integer(3), a.flag(4), a.object(5));
}
py::object allgatherWith(PyComm& c, const Args& a) {
  return c.allgather(a.object(0), a.object(1), a.flag(2), a.object(3));
}
py::object reduceScatterWith(PyComm& c, const Args& a) {
  return c.reduceScatter(a.object(0), a.object(1), a.object(2), a.flag(3), a.object(4));
}
py::object alltoallWith(PyComm& c, const Args& a) {
  return c.alltoall(a.object(0), a.object(1), a.flag(2), a.object(3));
}
py::object gatherWith(PyComm& c, const Args& a) {
  return c.gather(a.object(0), a.object(1), a.integer(2), a.flag(3), a.object(4));
}
py::object scatterWith(PyComm& c, const Args& a) {
  return c.scatter(a.object(0), a.object(1), a.integer(2), a.flag(3), a.object(4));
}
py::object sendWith(PyComm& c, const Args& a) {
  return c.send(a.object(0), a.integer(1), a.flag(2), a.object(3), a.integer(4));
}
py::object recvWith(PyComm& c, const Args& a) {
  return c.recv(a.object(0), a.integer(1), a.flag(2), a.object(3), a.integer(4));
}
py::object sendrecvWith(PyComm& c, const Args& a) {
  return c.sendrecv(a.object(0), a.object(1), a.integer(2), a.object(3), a.flag(4), a.object(5));
}

void bindCalls(py::handle comm) {
  using py_args::addMethod;
  addMethod(comm, kAllreduce, method<kAllreduce, allreduceWith>,
            "Reduces send over the ranks into recv (in place when recv is None); returns recv.");
  addMethod(comm, kBroadcast, method<kBroadcast, broadcastWith>,
            "Root's send into every rank's recv (in place when recv is None); returns recv.");
  addMethod(comm, kReduce, method<kReduce, reduceWith>,
            "Reduces send over the ranks into root's recv (in place when recv is None); returns recv.");
  addMethod(comm, kAllgather, method<kAllgather, allgatherWith>,
            "Every rank's send, rank-major, into recv (a new array when None); returns recv.");
  addMethod(comm, kReduceScatter, method<kReduceScatter, reduceScatterWith>,
            "Reduces send (nranks blocks) over the ranks, block r into rank r's recv (a new array when None).");
  addMethod(comm, kAlltoall, method<kAlltoall, alltoallWith>,
            "Block p of send to rank p, block q of recv from rank q (a new array when None); returns recv.");
  addMethod(comm, kGather, method<kGather, gatherWith>,
            "Every rank's send, rank-major, into root's recv (a new array at the root when None); returns recv.");
  addMethod(comm, kScatter, method<kScatter, scatterWith>,
            "Block r of root's send (nranks blocks) into rank r's recv (a new array when None); returns recv.");
  addMethod(comm, kSend, method<kSend, sendWith>, "Sends buf to rank peer (which calls recv).");
  addMethod(comm, kRecv, method<kRecv, recvWith>,
            "Receives into buf from rank peer (which calls send); returns buf.");
  addMethod(comm, kSendrecv, method<kSendrecv, sendrecvWith>,
            "Sends send to rank peer and receives recv from recv_peer (default: peer), as one group; returns recv.");
}

// Exceptions from the core become the minincl.Error subclass of their code.
void bindErrors() {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object cls = errorClass(e.code());
      // (Replacing bytes that are not UTF-8: a message may quote what a stranger sent.)
      std::string_view what = e.what();
      PyObject* text = PyUnicode_DecodeUTF8(what.data(), (Py_ssize_t)what.size(), "replace");
      PyErr_SetObject(cls.ptr(), text);
      Py_XDECREF(text);
    }
  });
}

// The module's functions: unique ids, what this build and machine have, init failures.
void bindModuleFunctions(py::module_& m) {
  m.def("get_unique_id", [] {
    mnclUniqueId id;
    checkResult(mnclGetUniqueId(&id));
    return uniqueIdBytes(id);
  }, "A new unique id: starts a bootstrap root in this process. Share it with every rank.");
  m.def(
      "unique_id_for_address",
      [](const std::string& host, int port, const std::string& job) {
        UniqueIdData d = uniqueIdForAddress(host, port, job);
        char bytes[MNCL_UNIQUE_ID_BYTES] = {};
        std::memcpy(bytes, &d, sizeof(d));
        return py::bytes(bytes, sizeof(bytes));
      },
      py::arg("host"), py::arg("port"), py::arg("job") = "",
      "The id every rank derives from a root address; rank 0 hosts the root. `job` (a launcher's "
      "job id) goes into it: two jobs given the same address then fail at the root instead of "
      "joining each other's ranks.");
  m.def("_cap_bootstrap_timeout", &capBootstrapTimeout, py::arg("seconds"),
        "Caps the bootstrap timeout of the unique ids and inits this thread starts (0: no cap); "
        "returns the cap before (the torch backend's group timeout).");
  m.def("version", [] { return std::string(std::to_string(MNCL_MAJOR) + "." + std::to_string(MNCL_MINOR) + "." + std::to_string(MNCL_PATCH)); });
  m.def("gpu_count", [] { return gpu::usableDeviceCount(); },
        "How many CUDA GPUs this process can use (0 without a driver, a GPU or a CUDA build).");
  m.def("_cuda_current_device", [] { return gpu::currentDevice(); });
  m.def(
      "_report_init_failure",
      [](int nranks, py::bytes uid, int rank, const std::string& message) {
        std::string id = uid;
        if (id.size() != MNCL_UNIQUE_ID_BYTES) return;  // (that init's own error says so)
        UniqueIdData data;
        std::memcpy(&data, id.data(), sizeof(data));
        py_gil::withoutGil([&] { Bootstrap::reportInitFailure(data, rank, nranks, message); });
      },
      py::arg("nranks"), py::arg("uid"), py::arg("rank"), py::arg("message"),
      "For an init that failed before the core saw it: the other ranks' inits fail at once, naming why.");
  m.def("build_info", [] {
    py::dict d;
#ifdef MININCL_HAVE_CUDA
    d["cuda"] = true;
    d["cuda_archs"] = std::string(MININCL_CUDA_ARCHS);
#else
    d["cuda"] = false;
    d["cuda_archs"] = std::string();
#endif
#if defined(__GNUC__) && !defined(__clang__)
    d["compiler"] = std::string("GCC ") + __VERSION__;  // (GCC's __VERSION__ is the number alone)
#else
    d["compiler"] = std::string(__VERSION__);
#endif
    d["cpu_vector_isa"] = vectorIsaInUse();  // the CPU's 16-bit float arithmetic
    d["library"] = std::string(MININCL_SONAME);  // the C API's library file, named by its SONAME
    return d;
  });
}

// Groups: a thread's open group, ended (run or dropped) by group_end.
void bindGroups(py::module_& m) {
  m.def("group_start", [] {
    groupStart();
    if (groupDepth() == 1) tlsGroup = new PyGroup();
  });
  m.def("_group_depth", [] { return groupDepth(); }, "How many groups this thread has open (for tests).");
  m.def(
      "group_end",
      [](bool discard) {
        std::unique_ptr<PyGroup> group;
        if (groupDepth() == 1) {
          group.reset(tlsGroup);
          tlsGroup = nullptr;
        }
        if (discard) return groupDiscard();  // (the arrays go with `group`)
        if (group) return PyComm::endGroup(group->comms);
        py_gil::withoutGil([] { groupEnd(); });
      },
      py::arg("discard") = false,
      "Ends this thread's innermost group; the outermost runs its calls, or with discard=True (an "
      "exception left the block) drops them.");

}

// Work (an async_op=True call's handle) and Communicator.
void bindCommunicator(py::module_& m) {
  py::class_<Work>(m, "Work", "Handle of an async_op=True call")
      .def("wait", &Work::wait, "Blocks until the operation finished; raises its error; returns its result.")
      .def("is_completed", &Work::isCompleted)
      .def("result", &Work::result);

  py::class_<PyComm> comm(m, "Communicator");
  comm
      .def(py::init<int, py::bytes, int, int>(), py::arg("nranks"), py::arg("unique_id"), py::arg("rank"),
           py::arg("device") = MNCL_DEVICE_CPU)
      .def_property_readonly("rank", &PyComm::rank)
      .def_property_readonly("nranks", &PyComm::nranks)
      .def_property_readonly("_device_index", &PyComm::device)
      .def_property_readonly("destroyed", &PyComm::destroyed)
      .def("barrier", &PyComm::barrier,
           "Returns once every rank has called it (on a CUDA communicator, once every rank's thread has: "
           "streams are not synchronized).")
      .def("_split_info", &PyComm::splitInfo, py::arg("color"), py::arg("key"))
      .def(
          "_watch_begin",
          [](PyComm& self, std::vector<int> members) {
            tlsMemberWatches.push_back(std::make_unique<WaitCheck>(
                [p = &self, m = std::move(members)] { p->failIfMemberGone(m); }));
          },
          py::arg("members"))
      .def("_watch_end", [](PyComm&) {
        if (!tlsMemberWatches.empty()) tlsMemberWatches.pop_back();
      })
      .def("_shrink_info", &PyComm::shrinkInfo, py::arg("exclude"))
      .def("lost_ranks", &PyComm::lostRanks,
           "The ranks this rank has seen go: they destroyed or aborted their communicator, their process exited (on "
           "this host), or their network connection broke; not a hung rank. (For shrink.)")
      .def("stats", &PyComm::stats,
           "Counters: channels; pointer_steps, steps whose data a receiver read straight from this rank's buffers; "
           "direct_writes, steps written straight into a receiver's output; network_steps_landed, steps from "
           "network peers that this rank's proxy received straight into its output; steps_read_ahead, steps whose "
           "data this rank had already read from the sender's input (CPU processes); readable_peers, peers whose "
           "buffers this rank reads directly; network_peers, peers reached over TCP.")
      .def("_pending_sender", &PyComm::pendingSender,
           "A rank whose send to this rank waits for its receive (the lowest), or -1; raises the "
           "communicator's error if it failed. (For a receive from any source.)")
      .def_property("call_timeout", &PyComm::callTimeout, &PyComm::setCallTimeout,
                    "Seconds one call may wait inside this CPU communicator before it fails with minincl.Timeout "
                    "saying where each rank is; on a GPU, seconds a queued kernel may go unfinished (0 or None: "
                    "no limit; default MININCL_CALL_TIMEOUT, else 0). Once it fired the communicator is failed, "
                    "as after any error.")
      .def("_window_empty", &PyComm::windowEmpty, py::arg("shape"), py::arg("dtype"))
      .def("_topology", &PyComm::topology)
      .def("abort", &PyComm::abort,
           "Stops every call in flight on this communicator, on any thread (they raise minincl.Aborted), then "
           "frees it; the peers' calls raise RemoteError. Safe from a watchdog thread at any moment.")
      .def("destroy", &PyComm::destroy,
           "Frees the communicator once calls on other threads and queued async_op calls have ended (one still "
           "waiting for its peers after MININCL_TIMEOUT is stopped: it raises Aborted). Later calls raise "
           "InvalidUsage; rank, nranks and device stay readable. Also what leaving a `with` block does.");
  bindCalls(comm);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "minincl's compiled core; use the `minincl` package";
  bindErrors();
  py_interrupt::rememberMainThread();
  bindModuleFunctions(m);
  bindGroups(m);
  py_ops::bind(m);
  bindCommunicator(m);
#ifdef MININCL_HAVE_TOPO
  bindTopo(m);
#endif
}
