// minincl.Communicator: the communicator as Python sees it. The per-call path (array ->
// pointer, count, type -> enqueue) stays in compiled code, and every blocking call releases
// the GIL so that ranks running as Python threads of one process progress together.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // (without it a std::vector fails to convert at run time, not at compile time)

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "../core/comm.h"
#include "../core/error.h"
#include "../core/outcome.h"
#include "../enqueue/enqueue.h"
#include "arrays.h"
#include "async_queue.h"
#include "reduce_op.h"

namespace mncl::py_comm {

namespace py = pybind11;

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
  // withLive for a call recorded in a group: on a communicator closed already, nothing (the
  // group's end says its calls did not run, after running the others: see endGroup).
  template <typename F>
  void ifLive(F f) {
    HeldHere here(this);
    std::shared_lock<std::shared_timed_mutex> lock(callMutex_);
    if (!destroyed_) f(*comm_);
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
  void stopFromInside(const std::string& why);
  void closeDeferred() noexcept;

  [[noreturn]] static void throwClosed() {
    throwError(mnclInvalidUsage, "the communicator was destroyed (or aborted); create a new one");
  }

 public:
  // windowBytes: the window's size (Communicator(window_bytes=)); -1: MININCL_WINDOW_BYTES.
  PyComm(int nranks, py::bytes uid, int rank, int device, int64_t windowBytes = -1);
  ~PyComm() { destroy(); }

  // Who this communicator is stays readable once it is destroyed or aborted (for the error
  // handlers that log it).
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  int device() const { return device_; }
  bool destroyed() const { return destroyed_.load(); }

  // The per-call methods (bound in call_methods.cc). Each returns the array it wrote (send:
  // None), or a Work for async_op=True.
  py::object allreduce(py::object send, py::object recv, py::handle op, bool asyncOp, py::object stream);
  py::object broadcast(py::object send, py::object recv, int root, bool asyncOp, py::object stream);
  py::object reduce(py::object send, py::object recv, py::handle op, int root, bool asyncOp, py::object stream);
  py::object allgather(py::object send, py::object recv, bool asyncOp, py::object stream);
  py::object reduceScatter(py::object send, py::object recv, py::handle op, bool asyncOp, py::object stream);
  py::object alltoall(py::object send, py::object recv, bool asyncOp, py::object stream);
  // recv is used at the root only (a new array there when None); elsewhere it is returned as given.
  py::object gather(py::object send, py::object recv, int root, bool asyncOp, py::object stream);
  // send is read at the root only; elsewhere it may be None, or give a new recv its shape
  // (recv None: send's shape with nranks times fewer elements, as at the root).
  py::object scatter(py::object send, py::object recv, int root, bool asyncOp, py::object stream);
  py::object send(py::object buf, int peer, bool asyncOp, py::object stream, int tag);
  py::object recv(py::object buf, int peer, bool asyncOp, py::object stream, int tag);
  py::object sendrecv(py::object send, py::object recv, int peer, std::optional<int> recvPeer, bool asyncOp, py::object stream);

  // A NumPy array in this rank's window (see Communicator.empty). The array keeps the window
  // mapped, whatever happens to the communicator, and gives its space back when collected.
  // Where no window would serve (no peer in another process of this host): a plain array.
  size_t windowBytes() const { return windowBytes_; }  // (as made: readable after destroy too)
  py::array windowEmpty(const std::vector<int64_t>& shape, const py::dtype& dtype);

  int pendingSender();
  double callTimeout();
  void setCallTimeout(py::object seconds);

  // Counters for tests and tuning.
  py::dict stats();

  // (new nranks, unique id, new rank, members) of the group this rank joins, or None for
  // color < 0; members: this communicator's ranks in it, in its rank order.
  py::object splitInfo(int color, int key, bool refused);
  std::vector<int> lostRanks();
  // (new nranks, unique id, new rank, members) of the group of every rank but `exclude`.
  py::object shrinkInfo(const std::vector<int>& exclude);
  // The new group's init after a split or shrink fails at once, with RemoteError, if one of
  // `members` is gone (see Comm::failIfMemberGone), and with Aborted once this communicator
  // was aborted; one destroyed meanwhile watches nothing.
  void failIfMemberGone(const std::vector<int>& members);

  // How init ordered the rings (see Communicator.topology()).
  py::dict topology();

  void barrier();

  // Stops in-flight work on every thread (they raise Aborted), then releases everything.
  // Both run without the GIL: the calls they wait for need it to finish raising.
  void abort();
  void destroy();

  // failInside once a call has returned (InterruptibleCall::checkAfterReturn), unless the
  // communicator is closing (its destroy tells the peers): the handler may have closed it,
  // and a close may wait for work that needs the GIL this thread holds.
  void failAfterReturn(const std::string& why);
  // failInside from an async_op call's Work.wait(), outside any call.
  void failForInterrupt(const std::string& why);

  // Ends this thread's outermost group (called with the GIL, which it releases while the
  // calls run), with every communicator its calls were recorded on held open: an abort() on
  // another thread stops the calls and then waits for them, instead of freeing what they run
  // on. Calls of a communicator closed before the group ended are dropped (nothing is left
  // for them to run on); the rest run.
  static void endGroup(std::vector<PyComm*> comms);

 private:
  // A split's or shrink's rendezvous, `f(comm, &nranks, &rank, &id, &members)`: (nranks,
  // unique id, rank, members) of the new group, or None where f returns false. Ctrl-C while
  // the other ranks are awaited cancels the rendezvous's socket waits and fails this
  // communicator (its ranks are somewhere inside the rendezvous).
  template <typename F>
  py::object rendezvous(F f);

  // abort() (abortFirst) and destroy(): from a signal handler inside a call on this thread,
  // stops that call, and the close follows once it has returned; otherwise closes here.
  void end(bool abortFirst);

  // Frees the communicator once no call uses it: calls on other threads, and queued
  // async_op ones, end first. One still waiting for its peers after MININCL_TIMEOUT is
  // stopped (it raises Aborted): its peers may never come, and destroy() must not hang.
  void close();

  void checkDevice(const py_arrays::ArrayView& v, const char* role);
  std::pair<py_arrays::ArrayView, py_arrays::ArrayView> sendRecv(py::object send, py::object& recv,
                                                                 bool writtenInPlace = true);
  std::vector<int64_t> gatheredShape(const std::vector<int64_t>& s);
  // The call's reduction from `op`; an array scalar on this communicator's device, kept
  // alive with the call (returned; None for a number).
  py::object applyOp(const py_ops::OpArg& op, CollCall& call);

  // `op` enqueues the call on a communicator and stream. A template, so that the synchronous
  // path (the hot one for small CPU collectives) allocates nothing for it.
  template <typename Op>
  py::object run(bool asyncOp, py::object stream, py::object result, std::initializer_list<py::object> keep, Op op,
                 py::handle like = py::none());

  // Waits for the async_op calls queued before a call. Ctrl-C (or another signal's handler that
  // raises) fails the communicator, which ends them; the handler may also have closed it (the
  // wait is outside withLive): failForInterrupt checks.
  void awaitAsyncCalls();

  // Fails the communicator for a call that Ctrl-C interrupted (see py_interrupt), from inside
  // the call (withLive holds it open).
  void failInside(const std::string& why);

  // The arrays of queued async_op calls, alive until they ran even when their Work is dropped
  // first (the worker thread reads and writes them). Touched with the GIL held only.
  void releaseFinishedAsync();
  std::deque<std::pair<std::shared_ptr<Outcome>, py::list>> asyncHeld_;

  std::unique_ptr<Comm> comm_;
  int rank_ = 0, nranks_ = 0, device_ = 0;
  size_t windowBytes_ = 0;
  const Comm* commAddress_ = nullptr;  // comm_'s, kept to find its calls in a group once it is gone
  std::shared_timed_mutex callMutex_;
  std::mutex lifeMutex_;
  std::atomic<bool> destroyed_{false};
  std::atomic<bool> aborted_{false};  // abort(): stops a split's or shrink's new init too
  std::atomic<bool> closeWhenFree_{false};  // stopFromInside: close when no call holds it here
  py_async::AsyncQueue async_;
  int32_t barrierWord_ = 0;
};

}  // namespace mncl::py_comm
