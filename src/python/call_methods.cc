#include "call_methods.h"

#include <exception>
#include <string>

#include "../core/error.h"
#include "../enqueue/enqueue.h"
#include "call_args.h"
#include "communicator.h"
#include "errors.h"

namespace mncl::py_comm {

namespace {

using py_args::Args;
using py_args::Signature;

// A method body's exceptions as Python errors: minincl's own as minincl.<Class>.
template <typename Body>
PyObject* callGuarded(Body body) {
  return py_args::guarded(body, [](const std::exception& e) {
    auto* err = dynamic_cast<const Error*>(&e);
    if (err) PyErr_SetString(py_errors::errorClass(err->code()).ptr(), err->what());
    return err != nullptr;
  });
}

PyComm& self(PyObject* obj) { return py::cast<PyComm&>(py::handle(obj)); }

// A per-call method: `Sig` names its parameters, `Body` calls the communicator with them.
// Inside a group, a call refused for any reason (its arguments, its arrays, its op) refuses
// the group, even where the caller catches the error: the group's end then runs none of its
// calls (run alone, another rank's call that one thread recorded would wait for ever).
using Body = py::object (*)(PyComm&, const Args&);
template <const Signature& Sig, Body F>
PyObject* method(PyObject* obj, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return callGuarded([&] {
    try {
      return F(self(obj), Args(Sig, args, nargs, kwnames));
    } catch (const Error& e) {
      groupRefuse(e.code(), e.what());  // (outside a group: nothing)
      throw;
    } catch (const std::exception& e) {  // (a Python error too: py::error_already_set)
      std::string why = e.what(), method = std::string(Sig.method()) + "()";
      groupRefuse(mnclInvalidArgument, why.find(method) == std::string::npos ? method + ": " + why : why);
      throw;
    }
  });
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
  return c.sendrecv(a.object(0), a.object(1), a.integer(2), a.integerOrNone(3), a.flag(4), a.object(5));
}

}  // namespace

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

}  // namespace mncl::py_comm
