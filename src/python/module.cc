// minincl._core, the module: its functions (unique ids, build and machine facts), groups, and
// the Work and Communicator classes, whose parts live beside this file.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "../bootstrap/bootstrap.h"
#include "../bootstrap/socket.h"
#include "../core/busy_cores.h"
#include "../core/error.h"
#include "../core/vector_isa.h"
#include "../enqueue/enqueue.h"
#include "../gpu/cuda_api.h"
#include "call_methods.h"
#include "communicator.h"
#include "errors.h"
#include "gil.h"
#include "group.h"
#include "interrupt.h"
#include "minincl.h"
#include "reduce_op.h"
#include "work.h"

#ifdef MININCL_HAVE_TOPO
void bindTopo(pybind11::module_& m);
#endif

namespace py = pybind11;
using namespace mncl;
using py_async::Work;
using py_comm::PyComm;
using py_comm::PyGroup;
using py_comm::tlsGroup;

namespace {

// parent._watch_begin(members), then the child's init, then parent._watch_end(): the init,
// waiting in the bootstrap for the members of a split or shrink, fails at once if one of
// them exited (it never joins; the init waited MININCL_BOOTSTRAP_TIMEOUT). Begun and ended
// on one thread, as the init runs there; the parent stays alive meanwhile (the caller holds it).
thread_local std::vector<std::unique_ptr<WaitCheck>> tlsMemberWatches;

py::bytes uniqueIdBytes(const mnclUniqueId& id) { return py::bytes(id.internal, sizeof(id.internal)); }

void checkResult(mnclResult_t rc) {
  if (rc != mnclSuccess) py_errors::raise(rc, mnclGetLastError(nullptr));
}

// Sets the minincl.Error subclass of `code`, saying `what`.
void raiseAs(mnclResult_t code, std::string_view what) {
  py::object cls = py_errors::errorClass(code);
  // (Replacing bytes that are not UTF-8: a message may quote what a stranger sent.)
  PyObject* text = PyUnicode_DecodeUTF8(what.data(), (Py_ssize_t)what.size(), "replace");
  PyErr_SetObject(cls.ptr(), text);
  Py_XDECREF(text);
}

// Exceptions from the core become the minincl.Error subclass of their code.
void bindErrors() {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      raiseAs(e.code(), e.what());
    } catch (const std::system_error& e) {  // (a resource the system would not give, as the C API says)
      raiseAs(mnclSystemError, e.what());
    }
  });
}

// The module's functions: unique ids, what this build and machine have, init failures.
void bindModuleFunctions(py::module_& m) {
  m.attr("_MAX_RANKS") = kMaxRanks;
  m.def("get_unique_id", [] {
    mnclUniqueId id;
    checkResult(mnclGetUniqueId(&id));
    return uniqueIdBytes(id);
  }, "A new unique id: starts a bootstrap root in this process. Share it with every rank.");
  m.def(
      "unique_id_for_address",
      [](const std::string& host, int port, const std::string& job) {
        UniqueIdData d;
        {
          py_gil::Released nogil;  // (resolving a host name may wait on DNS)
          d = uniqueIdForAddress(host, port, job);
        }
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
  m.def("_bootstrap_timeout", &bootstrapTimeout,
        "MININCL_BOOTSTRAP_TIMEOUT in seconds, as inits read it (\"5\", \"2.5s\", \"500ms\"), at most this "
        "thread's cap; InvalidArgument for a malformed one.");
  m.def("_runnable_threads_of_others", &runnableThreadsOfOthers,
        "(pid, cpu) of each runnable thread of a process that holds none of this host's ranks of a live "
        "communicator of this process (MININCL_BUSY_CORES=auto's test), read from /proc now.");
  m.def("_others_want_cpu", &othersWantCpu, py::arg("cpu"),
        "MININCL_BUSY_CORES=auto's verdict on a CPU: threads of other processes were runnable there at the "
        "last two looks at /proc (asking for a new look where the last is over 100 ms old).");
  m.def(
      "_busy_cores_stats",
      [] {
        py::dict d;
        d["looks"] = busyCoreLooks();
        d["sleep_spells"] = busyCoreSleepSpells();
        dev::CpuDoorbellSleeps bells = doorbellSleeps();
        d["doorbell_sleeps"] = bells.sleeps;
        d["doorbell_wakes"] = bells.wakes;
        return d;
      },
      "This process's looks at /proc (MININCL_BUSY_CORES=auto), the times a thread began a second of "
      "sleeping instead of yielding, its threads' sleeps on a connection's doorbell and those a ring ended.");
  m.def("version", [] {
    return std::to_string(MNCL_MAJOR) + "." + std::to_string(MNCL_MINOR) + "." + std::to_string(MNCL_PATCH);
  });
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
      .def("wait", &Work::wait, py::arg("timeout") = py::none(),
           "Blocks until the operation finished (or raises Timeout after `timeout` seconds, the operation going "
           "on); raises its error; returns its result.")
      .def("is_completed", &Work::isCompleted)
      .def("result", &Work::wait, py::arg("timeout") = py::none(),
           "The same as wait(): the result once the operation has ended (never an output it has not written yet).");

  py::class_<PyComm> comm(m, "Communicator");
  comm
      .def(py::init<int, py::bytes, int, int, int64_t>(), py::arg("nranks"), py::arg("unique_id"), py::arg("rank"),
           py::arg("device") = MNCL_DEVICE_CPU, py::arg("window_bytes") = -1)
      .def_property_readonly("rank", &PyComm::rank)
      .def_property_readonly("nranks", &PyComm::nranks)
      .def_property_readonly("_device_index", &PyComm::device)
      .def_property_readonly("destroyed", &PyComm::destroyed)
      .def("barrier", &PyComm::barrier,
           "Returns once every rank has called it (on a CUDA communicator, once every rank's thread has: "
           "streams are not synchronized).")
      .def("_split_info", &PyComm::splitInfo, py::arg("color"), py::arg("key"), py::arg("refused") = false)
      .def(
          "_watch_begin",
          [](PyComm& self, std::vector<int> members) {
            tlsMemberWatches.push_back(std::make_unique<WaitCheck>(
                [p = &self, m = std::move(members)] { p->failIfMemberGone(m); }));
          },
          py::arg("members"))
      .def(
          "_check_members", [](PyComm& self, const std::vector<int>& members) { self.failIfMemberGone(members); },
          py::arg("members"))
      .def("_watch_end", [](PyComm&) {
        if (!tlsMemberWatches.empty()) tlsMemberWatches.pop_back();
      })
      .def("_shrink_info", &PyComm::shrinkInfo, py::arg("exclude"))
      .def("lost_ranks", &PyComm::lostRanks,
           "The ranks this rank has seen go: they destroyed or aborted their communicator, their process exited (on "
           "this host), their network connection broke, or their heartbeat stopped for MININCL_TIMEOUT (a stopped "
           "or hung process, given up on for good). (For shrink.)")
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
      .def_property_readonly("window_bytes", &PyComm::windowBytes,
                             "The size of this rank's window in bytes (0: it has none).")
      .def("_topology", &PyComm::topology)
      .def("abort", &PyComm::abort,
           "Stops every call in flight on this communicator, on any thread (they raise minincl.Aborted), then "
           "frees it; the peers' calls raise RemoteError. Safe from a watchdog thread at any moment.")
      .def("destroy", &PyComm::destroy,
           "Frees the communicator once calls on other threads and queued async_op calls have ended (one still "
           "waiting for its peers after MININCL_TIMEOUT is stopped: it raises Aborted). Later calls raise "
           "InvalidUsage; rank, nranks and device stay readable. Also what leaving a `with` block does.");
  py_comm::bindCalls(comm);
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
