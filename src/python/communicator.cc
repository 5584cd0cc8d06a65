#include "communicator.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "../bootstrap/bootstrap.h"
#include "../bootstrap/socket.h"
#include "../core/monitor.h"
#include "gil.h"
#include "group.h"
#include "interrupt.h"
#include "work.h"

namespace mncl::py_comm {

using py_arrays::ArrayView;

namespace {

// What PyComm::run calls to enqueue a collective on a communicator and (GPU) stream.
struct EnqueueColl {
  CollCall call;
  void operator()(Comm& cm, void* stream) {
    call.stream = stream;
    enqueueColl(cm, call);
  }
};

// How to ask the library an array type comes from for its current stream: CuPy's
// get_current_stream, PyTorch's raw-stream getter (what Triton calls per launch; the public
// torch.cuda.current_stream where a build lacks it), or nothing (the legacy default stream).
struct StreamGetter {
  enum Kind { none, cupy, torchRaw, torch } kind = none;
  py::object fn;
};

// Found once per array type: a small GPU call from Python is host-bound, and the type's
// module name, an import and three attribute lookups were on every call.
const StreamGetter& streamGetterFor(py::handle like) {
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
void* callStream(py::handle stream, py::handle like, int device) {
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

// `a` must have `expect` elements of b's type.
void checkCounts(const char* what, const ArrayView& b, const ArrayView& a, size_t expect,
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

std::vector<int64_t> scatteredShape(const std::vector<int64_t>& s, size_t count, size_t n) {
  if (!s.empty() && s[0] % (int64_t)n == 0) {
    std::vector<int64_t> out = s;
    out[0] /= (int64_t)n;
    return out;
  }
  return {(int64_t)(count / n)};
}

// (`op`: the reduction applyOp then sets, or a placeholder for calls without one.)
CollCall callArgs(Coll coll, const ArrayView& s, const ArrayView& r, size_t count, RedOp op, int root) {
  return CollCall{coll, s.data, r.data, count, s.dtype, op, root};
}

}  // namespace

thread_local std::vector<PyComm*> PyComm::tlsHeld;

PyComm::PyComm(int nranks, py::bytes uid, int rank, int device, int64_t windowBytes) {
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
    CommOptions options;
    options.windowBytes = windowBytes;
    comm_ = std::make_unique<Comm>(data, rank, nranks, device, options);
  });
  rank_ = comm_->rank();
  nranks_ = comm_->nranks();
  windowBytes_ = comm_->window() ? comm_->window()->size() : 0;
  device_ = comm_->device();
  commAddress_ = comm_.get();
}

void PyComm::stopFromInside(const std::string& why) {
  comm_->stop(why);
  closeWhenFree_ = true;
}

void PyComm::closeDeferred() noexcept {
  auto closeNow = [this] {
    std::lock_guard<std::mutex> life(lifeMutex_);
    if (!destroyed_) close();
  };
  if (PyGILState_Check()) {
    {
      py_gil::Released nogil;  // (queued async_op calls may need it to end)
      closeNow();
    }
    releaseFinishedAsync();  // (close() waited for the queued calls; touched with the GIL only)
    asyncHeld_.clear();
  } else {
    closeNow();
  }
}

// ---- how a call runs ----

template <typename Op>
py::object PyComm::run(bool asyncOp, py::object stream, py::object result, std::initializer_list<py::object> keep,
                       Op op, py::handle like) {
  // (In a group, a closed communicator's call is no error until the group's end, which runs
  // the others, as the peers do: refused here, the caller's exception would leave the group,
  // and with it calls on healthy communicators that the peers make.)
  if (destroyed_ && groupDepth() == 0) throwClosed();
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
    // logged and run at its end, after them). (The per-call methods refuse the group for any
    // error, their arguments' too, in call_methods.cc; barrier() has only this.)
    try {
      if (!async_.idle()) awaitAsyncCalls();
      ifLive([&](Comm& cm) { op(cm, cudaStream); });  // records only
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
      if (destroyed_) {
        throwError(mnclInvalidUsage, std::string("the communicator was ") +
                                         (aborted_.load(std::memory_order_acquire) ? "aborted" : "destroyed") +
                                         " before this operation ran");
      }
      op(*comm_, nullptr);
    });
    releaseFinishedAsync();
    asyncHeld_.emplace_back(outcome, k);
    return py::cast(py_async::Work(outcome, result, k, [self = py::cast(this)](const std::string& why) {
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

void PyComm::awaitAsyncCalls() {
  py_interrupt::InterruptibleCall interruptible([this](const std::string& why) { failForInterrupt(why); });
  interruptible.withoutGil([this] { async_.drainForCall(); });
}

void PyComm::failInside(const std::string& why) {
  comm_->fail(mnclAborted, why + "; the communicator is aborted");
}

void PyComm::releaseFinishedAsync() {
  while (!asyncHeld_.empty() && asyncHeld_.front().first->done()) {  // (they end in order)
    py::list& arrays = asyncHeld_.front().second;  // (shared with the Work: emptied for it too)
    PyList_SetSlice(arrays.ptr(), 0, PY_SSIZE_T_MAX, nullptr);
    asyncHeld_.pop_front();
  }
}

void PyComm::checkDevice(const ArrayView& v, const char* role) {
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

std::pair<ArrayView, ArrayView> PyComm::sendRecv(py::object send, py::object& recv, bool writtenInPlace) {
  if (recv.is_none()) {  // in place: the one array is read, and written where this rank gets a result
    ArrayView s = py_arrays::view(send, writtenInPlace, "send (in place)");
    checkDevice(s, "send");
    recv = send;
    return {s, std::move(s)};
  }
  ArrayView s = py_arrays::view(send, false, "send");
  ArrayView r = py_arrays::view(recv, true, "recv");
  checkDevice(s, "send");
  checkDevice(r, "recv");
  return {std::move(s), std::move(r)};
}

std::vector<int64_t> PyComm::gatheredShape(const std::vector<int64_t>& s) {
  int64_t n = nranks_;
  if (s.empty()) return {n};
  std::vector<int64_t> out = s;
  out[0] *= n;
  return out;
}

py::object PyComm::applyOp(const py_ops::OpArg& op, CollCall& call) {
  std::optional<ArrayView> v = py_ops::apply(op, call);
  if (!v) return py::none();
  checkDevice(*v, "the PreMulSum scalar");
  return v->keepAlive;
}

// ---- the per-call methods ----

py::object PyComm::allreduce(py::object send, py::object recv, py::handle op, bool asyncOp, py::object stream) {
  py_ops::OpArg rop = py_ops::parse(op);
  auto [s, r] = sendRecv(send, recv);
  checkCounts("allreduce", s, r, s.count);
  CollCall call = callArgs(Coll::allreduce, s, r, s.count, RedOp::sum, 0);
  py::object scalar = applyOp(rop, call);
  return run(asyncOp, stream, recv, {s.keepAlive, r.keepAlive, scalar}, EnqueueColl{call});
}

py::object PyComm::broadcast(py::object send, py::object recv, int root, bool asyncOp, py::object stream) {
  auto [s, r] = sendRecv(send, recv, rank_ != root);  // (in place, the root only reads)
  checkCounts("broadcast", s, r, s.count);
  return run(asyncOp, stream, recv, {s.keepAlive, r.keepAlive},
             EnqueueColl{callArgs(Coll::broadcast, s, r, s.count, RedOp::sum, root)});
}

py::object PyComm::reduce(py::object send, py::object recv, py::handle op, int root, bool asyncOp, py::object stream) {
  py_ops::OpArg rop = py_ops::parse(op);
  auto [s, r] = sendRecv(send, recv, rank_ == root);  // (in place, only the root's is written)
  checkCounts("reduce", s, r, s.count);
  CollCall call = callArgs(Coll::reduce, s, r, s.count, RedOp::sum, root);
  py::object scalar = applyOp(rop, call);
  return run(asyncOp, stream, recv, {s.keepAlive, r.keepAlive, scalar}, EnqueueColl{call});
}

py::object PyComm::allgather(py::object send, py::object recv, bool asyncOp, py::object stream) {
  ArrayView s = py_arrays::view(send, false, "send");
  if (recv.is_none()) recv = py_arrays::emptyLike(send, gatheredShape(s.shape.vector()));
  ArrayView r = py_arrays::view(recv, true, "recv");
  checkDevice(s, "send");
  checkDevice(r, "recv");
  checkCounts("allgather", s, r, s.count * (size_t)nranks_);
  return run(asyncOp, stream, recv, {s.keepAlive, r.keepAlive},
             EnqueueColl{callArgs(Coll::allgather, s, r, s.count, RedOp::sum, 0)});
}

py::object PyComm::reduceScatter(py::object send, py::object recv, py::handle op, bool asyncOp, py::object stream) {
  py_ops::OpArg rop = py_ops::parse(op);
  ArrayView s = py_arrays::view(send, false, "send");
  size_t n = (size_t)nranks_;
  if (recv.is_none()) {
    if (s.count % n != 0) {
      throwError(mnclInvalidArgument, "reduce_scatter: send has " + std::to_string(s.count) +
                                          " elements, not a multiple of " + std::to_string(n) + " ranks");
    }
    recv = py_arrays::emptyLike(send, scatteredShape(s.shape.vector(), s.count, n));
  }
  ArrayView r = py_arrays::view(recv, true, "recv");
  checkDevice(s, "send");
  checkDevice(r, "recv");
  checkCounts("reduce_scatter", r, s, r.count * n, "send");
  CollCall call = callArgs(Coll::reducescatter, s, r, r.count, RedOp::sum, 0);
  py::object scalar = applyOp(rop, call);
  return run(asyncOp, stream, recv, {s.keepAlive, r.keepAlive, scalar}, EnqueueColl{call});
}

py::object PyComm::alltoall(py::object send, py::object recv, bool asyncOp, py::object stream) {
  ArrayView s = py_arrays::view(send, false, "send");
  if (recv.is_none()) recv = py_arrays::emptyLike(send, s.shape.empty() ? std::vector<int64_t>{(int64_t)s.count} : s.shape.vector());
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

py::object PyComm::gather(py::object send, py::object recv, int root, bool asyncOp, py::object stream) {
  ArrayView s = py_arrays::view(send, false, "send");
  checkDevice(s, "send");
  void* rp = nullptr;
  py::object recvKeep = py::none();
  if (rank_ == root) {
    if (recv.is_none()) recv = py_arrays::emptyLike(send, gatheredShape(s.shape.vector()));
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

py::object PyComm::scatter(py::object send, py::object recv, int root, bool asyncOp, py::object stream) {
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
      recv = py_arrays::emptyLike(send, scatteredShape(s->shape.vector(), s->count, n));
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

py::object PyComm::send(py::object buf, int peer, bool asyncOp, py::object stream, int tag) {
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

py::object PyComm::recv(py::object buf, int peer, bool asyncOp, py::object stream, int tag) {
  ArrayView b = py_arrays::view(buf, true, "buf");
  checkDevice(b, "buf");
  P2pCall c{false, b.data, b.count, b.dtype, peer};
  c.tag = tag;
  return run(asyncOp, stream, buf, {b.keepAlive}, [c](Comm& cm, void* st) mutable {
    c.stream = st;
    enqueueP2p(cm, c);
  });
}

py::object PyComm::sendrecv(py::object send, py::object recv, int peer, std::optional<int> recvPeer, bool asyncOp,
                            py::object stream) {
  ArrayView s = py_arrays::view(send, false, "send");
  ArrayView r = py_arrays::view(recv, true, "recv");
  checkDevice(s, "send");
  checkDevice(r, "recv");
  int from = recvPeer.value_or(peer);
  P2pCall out{true, s.data, s.count, s.dtype, peer}, in{false, r.data, r.count, r.dtype, from};
  return run(asyncOp, stream, recv, {s.keepAlive, r.keepAlive}, [out, in](Comm& cm, void* st) mutable {
    out.stream = in.stream = st;
    enqueueSendRecv(cm, out, in);
  });
}

// ---- the other methods: window arrays, settings, counters, split and shrink, abort and destroy ----

py::array PyComm::windowEmpty(const std::vector<int64_t>& shape, const py::dtype& dtype) {
  auto [window, useful] = withLive([](Comm& cm) { return std::make_pair(cm.window(), cm.windowUseful()); });
  if (!window && device_ >= 0) {
    throwError(mnclInvalidUsage, "empty: windows are for CPU communicators; allocate GPU buffers with CuPy or PyTorch");
  }
  if (!window && !useful) return py::array(dtype, shape);
  if (!window) {
    throwError(mnclInvalidUsage, "this communicator has no window: pass window_bytes= (e.g. 1 << 30) when it is created, "
                                 "or set MININCL_WINDOW_BYTES (e.g. 1G) before");
  }
  size_t bytes = (size_t)dtype.itemsize();
  for (int64_t d : shape) {
    if (d < 0) throwError(mnclInvalidArgument, "empty: negative dimension " + std::to_string(d));
    if (__builtin_mul_overflow(bytes, (size_t)d, &bytes)) throwError(mnclInvalidArgument, "empty: too many bytes");
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

int PyComm::pendingSender() {
  return withLive([](Comm& cm) {
    if (cm.failed()) cm.throwStoredError();
    return cm.pendingSender();
  });
}

double PyComm::callTimeout() {
  return withLive([](Comm& cm) { return cm.callTimeout(); });
}

void PyComm::setCallTimeout(py::object seconds) {
  bool number = py::isinstance<py::float_>(seconds) || py::isinstance<py::int_>(seconds);
  if (!seconds.is_none() && (!number || py::isinstance<py::bool_>(seconds))) {
    throw py::type_error("call_timeout must be a number of seconds or None, not " +
                         py::str(py::type::handle_of(seconds).attr("__name__")).cast<std::string>());
  }
  double s = seconds.is_none() ? 0.0 : seconds.cast<double>();
  if (std::isinf(s) && s > 0) s = 0;  // (no limit, as None)
  withLive([s](Comm& cm) { cm.setCallTimeout(s); });
}

py::dict PyComm::stats() {
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

template <typename F>
py::object PyComm::rendezvous(F f) {
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

py::object PyComm::splitInfo(int color, int key, bool refused) {
  return rendezvous([&](Comm& cm, int* n, int* r, UniqueIdData* id, std::vector<int>* members) {
    return cm.splitInfo(color, key, n, r, id, members, refused);
  });
}

std::vector<int> PyComm::lostRanks() {
  return withLive([](Comm& cm) { return cm.lostRanks(); });
}

py::object PyComm::shrinkInfo(const std::vector<int>& exclude) {
  return rendezvous([&](Comm& cm, int* n, int* r, UniqueIdData* id, std::vector<int>* members) {
    cm.shrinkInfo(exclude, false, n, r, id, members);
    return true;
  });
}

void PyComm::failIfMemberGone(const std::vector<int>& members) {
  MNCL_CHECK(!aborted_.load(std::memory_order_acquire), mnclAborted,
             "the communicator was aborted (abort()) while the new communicator of its split or shrink waited "
             "for its ranks");
  std::shared_lock<std::shared_timed_mutex> lock(callMutex_, std::try_to_lock);
  if (lock.owns_lock() && !destroyed_) comm_->failIfMemberGone(members);
}

py::dict PyComm::topology() {
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

void PyComm::barrier() {
  if (device_ >= 0) {  // a host-side barrier: the ranks' threads, not their streams, meet
    py_gil::withoutGil([this] { withLive([](Comm& cm) { cm.bootstrap().barrier(); }); });
    return;
  }
  run(false, py::none(), py::none(), {}, [this](Comm& cm, void*) { enqueueBarrier(cm, &barrierWord_); });
}

void PyComm::abort() { end(true); }
void PyComm::destroy() { end(false); }

void PyComm::end(bool abortFirst) {
  if (destroyed_) return;
  if (abortFirst) aborted_.store(true, std::memory_order_release);
  if (heldHere()) {
    stopFromInside(abortFirst ? "the communicator was aborted (comm.abort(), from a signal handler during this call)"
                              : "the communicator was destroyed (comm.destroy(), from a signal handler during this call)");
    return;
  }
  {
    py_gil::Released nogil;
    std::lock_guard<std::mutex> life(lifeMutex_);
    if (destroyed_) return;
    if (abortFirst) comm_->abort();
    close();
  }
  releaseFinishedAsync();  // (close() waited for the queued calls: their Works let go of their arrays)
  asyncHeld_.clear();
}

void PyComm::close() {
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

void PyComm::failAfterReturn(const std::string& why) {
  std::shared_lock<std::shared_timed_mutex> lock(callMutex_, std::try_to_lock);
  if (lock.owns_lock() && !destroyed_) failInside(why);
}

void PyComm::failForInterrupt(const std::string& why) {
  std::shared_lock<std::shared_timed_mutex> lock(callMutex_);
  if (!destroyed_) failInside(why);
}

void PyComm::endGroup(std::vector<PyComm*> comms) {
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
    int nclosed = 0;
    for (PyComm* c : comms) {
      here.push_back(std::make_unique<HeldHere>(c));
      held.emplace_back(c->callMutex_);
      if (!c->destroyed_) continue;
      groupForget(c->commAddress_);
      closed += (nclosed++ ? ", " : "") + std::string("rank ") + std::to_string(c->rank_) + "'s";
    }
    groupEnd();
    if (nclosed > 0) {
      throwError(mnclInvalidUsage, "the group's calls on " + std::to_string(nclosed) + " communicator(s) (" + closed +
                                       ") did not run: destroyed or aborted before the group ended");
    }
  });
  interruptible.checkAfterReturn([&comms](const std::string& why) {
    for (PyComm* c : comms) c->failAfterReturn(why);
  });
}

}  // namespace mncl::py_comm
