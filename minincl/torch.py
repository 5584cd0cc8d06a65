"""A ``torch.distributed`` backend named ``minincl``.

    import torch.distributed as dist
    import minincl.torch  # registers the backend

    dist.init_process_group("minincl")           # torchrun's env://, or tcp://..., file://...
    model = torch.nn.parallel.DistributedDataParallel(model)

The process group is a Python subclass of ``torch.distributed.ProcessGroup``: torch calls its
methods both from Python (``dist.all_reduce``, ...) and from C++ (DDP's reducer, parameter
broadcast) through the pybind11 trampoline. Each group owns one minincl communicator per device
type; the unique id travels through the group's own store (rank 0 sets, the others get), so
``new_group`` gets fresh communicators under fresh keys.

Point-to-point ops (``isend``/``irecv``, ``batch_isend_irecv``) are *deferred*: they collect into
a batch that starts as one ``minincl.group()`` when a rank waits on one of them or issues any
other operation on the group, or the same thread waits or issues one on another group (as
NCCL's, they start before the thread's later calls: a peer may need them to finish its own
collective first). Started one by one, a large send to a peer that is itself
sending first would deadlock; batched, they progress together, as NCCL's grouped calls do.
On the CPU they run on a communicator and worker of their own, as ProcessGroupNCCL gives
them communicators of their own: an ``isend`` then overlaps a collective that its receiver
makes first (on one communicator the collective would wait behind the send, which waits for
a receive that comes after the collective).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from datetime import timedelta
from types import FrameType
from typing import Any, Callable, TypeVar, cast

try:
    import torch
except ModuleNotFoundError as missing:  # (minincl itself runs without it; this module is its backend)
    raise ModuleNotFoundError(
        "minincl.torch is minincl's torch.distributed backend and needs PyTorch: pip install torch (or minincl[torch])",
        name="torch",
    ) from missing
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions, FakeProcessGroup
from torch.distributed import ReduceOp

from . import _core
from . import _torch_call_forms as call_forms
from ._comm import Communicator, get_unique_id, group
from ._core import build_info
from ._torch_compile import outside_compiled_code
from ._torch_errors import global_ranks_note
from ._torch_launch import LocalRunError, free_port, run_local
from ._torch_sparse import summed_over_ranks
from ._torch_tensors import Op, Staged, as_bytes, op_name, overlap_refusal, plain_op, reducible, stage
from ._torch_work import Lane, MinincclWork, QueuedWork
from .errors import Error, InvalidUsage, RemoteError, Timeout

BACKEND_NAME = "minincl"
# scatter and gather are sends and receives tagged with what they are and their root (a tag
# minus the root), so that ranks that disagree on either fail where their steps meet instead
# of pairing one call's sends with another's receives. (User tags pair as the user set them.)
SCATTER_TAG = -(1 << 30)
GATHER_TAG = -(1 << 29)

Body = Callable[[Communicator], object]  # (what it returns is dropped)

# A list all_gather of CPU tensors from this size per rank (the same on every rank: torch's
# calls must match) runs as broadcasts into the outputs, not an allgather into a new flat
# buffer then copied out: 1.7-3x faster from 64 KiB to 16 MiB at 2-6 ranks, level at 32 KiB,
# slower below (bench/RESULTS.md, sixtieth session).
_BROADCASTS_FROM_BYTES = 32 << 10

# What an init says when the root of its id refused it: the id is of the past (bootstrap.cc).
_ROOT_GONE = "an id serves one communicator's init, and that init is over"


def _bootstrap_timeout() -> float:
    """MININCL_BOOTSTRAP_TIMEOUT, seconds, read as the core reads it ("2s" and "500ms" too; 60
    by default, or where malformed: an init refuses it, naming the variable)."""
    try:
        return float(_core._bootstrap_timeout())
    except Error:
        return 60.0


@dataclass
class _Op:
    """One operation: ``body`` makes the minincl calls, ``after`` runs once they are done."""

    device: str
    body: Body
    work: MinincclWork
    after: list[Callable[[], None]] = field(default_factory=list)
    p2p: bool = False  # a send or receive (runs on the group's point-to-point communicator)
    thread: int = field(default_factory=threading.get_ident)  # the thread that made it


@dataclass
class _DeviceComm:
    comm: Communicator
    lane: Lane


_Run = TypeVar("_Run", bound=Callable[..., object])


def _on_stream(stream: torch.cuda.Stream, run: _Run) -> _Run:
    """`run` made to queue its GPU work on `stream`, whichever thread runs it and whenever:
    a deferred send runs when the batch starts, maybe on another thread or outside the caller's
    `with torch.cuda.stream(s)`, yet is ordered after the work current at the call (NCCL's)."""

    def on_stream(*args: Any) -> object:
        with torch.cuda.stream(stream):
            return run(*args)

    return cast(_Run, on_stream)


def _together(calls: int) -> contextlib.AbstractContextManager[object]:
    """One minincl group for several calls; none for one (a group costs ~1.5 us)."""
    return group() if calls > 1 else contextlib.nullcontext()


# Every group of this process: a thread's deferred ops on one start before its next call or
# wait on any (see _start_deferred). Replaced whole, under _GROUPS_LOCK, when a group is made;
# read without the lock (a copy of a WeakSet under a lock cost ~1.5-3 us of every wait on a
# send or receive).
_GROUPS: tuple[weakref.ref[ProcessGroupMinincl], ...] = ()
_GROUPS_LOCK = threading.Lock()
# The deferred ops of every group not started yet (changed under _GROUPS_LOCK): while there
# are none, as in a program of collectives only, a call starts no other group's (a look at
# every group cost a quarter of an 8-byte all_reduce).
_deferred_ops = 0


def _add_group(g: ProcessGroupMinincl) -> None:
    global _GROUPS
    with _GROUPS_LOCK:
        _GROUPS = (*(r for r in _GROUPS if r() is not None), weakref.ref(g))


def _count_deferred(change: int) -> None:
    global _deferred_ops
    with _GROUPS_LOCK:
        _deferred_ops += change


def _outputs_after(staged: list[Staged]) -> list[Callable[[], None]]:
    return [s.finish for s in staged if s.origin is not None]


@outside_compiled_code
class ProcessGroupMinincl(dist.ProcessGroup):
    """torch.distributed's view of a group of minincl communicators (one per device type).

    (The `type: ignore[override]`s: torch's stubs give ProcessGroup's methods a second form,
    (tensor, op), for Python callers; torch's dispatcher calls a backend with (tensors, opts).)
    """

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # (torch's stub knows only (store, rank, size))
        self._store = store
        self._timeout = timeout
        self._group_name = ""  # (see getGroupName)
        self._group_desc = ""
        self._lock = threading.Lock()
        self._pending: list[_Op] = []  # deferred p2p ops, or everything while coalescing
        self._coalescing = False
        _add_group(self)
        self._comms: dict[str, _DeviceComm] = {"cpu": self._join("cpu", "cpu")}
        # (Eagerly too: a first send may involve two ranks only. Not on a GPU, where a
        # communicator's FIFOs take tens of MiB per peer: there sends and receives share it.)
        self._p2p_comms: dict[str, _DeviceComm] = {"cpu": self._join("cpu-p2p", "cpu")} if size > 1 else {}
        self._cuda_missing = self._cuda_unavailable_reason()
        if self._cuda_missing is None:
            # Eagerly, while every rank is here: a first CUDA op may be a send between two
            # ranks only, and a lazy init would then wait for ranks that never come.
            index = torch.cuda.current_device()
            self._comms["cuda"] = self._join("cuda", f"cuda:{index}")
        for device in self._comms:
            self._register_backend(
                torch.device(device), dist.ProcessGroup.BackendType.CUSTOM, _device_marker(rank, size)
            )

    # ---- setup ----

    def _join(self, key: str, device: str) -> _DeviceComm:
        # (torchrun's restarts share the store, where an attempt whose init failed left its id:
        # each attempt has its own key.)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
        store_key = f"minincl/unique_id/{key}" + (f"/attempt{attempt}" if attempt else "")
        # The group's timeout bounds the ranks' meeting too, where it is the shorter (gloo's
        # does): ranks that never come end it then, not at MININCL_BOOTSTRAP_TIMEOUT.
        limit = self._timeout.total_seconds() if isinstance(self._timeout, timedelta) else 0.0
        before = _core._cap_bootstrap_timeout(limit)
        try:
            if self.rank() == 0:
                uid = get_unique_id()
                self._store.set(store_key, uid)  # type: ignore[arg-type]  # (a Store takes bytes too)
                comm = Communicator(self.size(), uid, self.rank(), device=device)
            else:
                comm = self._join_by_id_in_store(store_key, device, limit)
        finally:
            _core._cap_bootstrap_timeout(before)
        if self.rank() == 0 and self.size() > 1:
            # Every rank read the id before it joined. A store that outlives the group
            # (torchrun's, across destroy_process_group and init again) must not hand a
            # later group's rank this one's id: it would wait for a root that is gone.
            with contextlib.suppress(RuntimeError, NotImplementedError):  # (a store without deletes)
                self._store.delete_key(store_key)
        self._limit_calls(comm)
        return _DeviceComm(comm, Lane(f"minincl-{key}-rank{self.rank()}", inline=key == "cuda"))

    def _join_by_id_in_store(self, store_key: str, device: str, limit: float) -> Communicator:
        """Rank > 0: joins by the id rank 0 put in the store. An id there may be left from an
        earlier init on this store that failed: its root is gone and refuses us at once, and
        rank 0's new id comes in its place (it may start later than we do)."""
        start = time.monotonic()
        until = start + (min(limit, _bootstrap_timeout()) if limit > 0 else _bootstrap_timeout())
        while True:
            uid = bytes(self._store.get(store_key))
            try:
                return Communicator(self.size(), uid, self.rank(), device=device)
            except RemoteError as e:
                if _ROOT_GONE not in str(e):
                    raise
                if time.monotonic() >= until:
                    raise RemoteError(
                        f"{e}; the group's store still held that id after {time.monotonic() - start:.0f} s: "
                        "rank 0 has put no new one there (is it running this init?)"
                    ) from e
            time.sleep(0.05)

    def _limit_calls(self, comm: Communicator) -> None:
        if isinstance(self._timeout, timedelta):
            # A call waiting longer fails, as gloo's do; on a GPU, a kernel that long unfinished
            # (NCCL's watchdog).
            # (A timeout of 1e9 s, 31 years, or more is no limit: the communicator takes none longer.)
            seconds = self._timeout.total_seconds()
            comm.call_timeout = seconds if seconds < 1e9 else 0

    def set_timeout(self, timeout: timedelta) -> None:
        """A new limit on how long any call of this group may wait (gloo's and NCCL's
        timeout; torch's ``_set_pg_timeout`` reaches only those two, so call this directly)."""
        self._timeout = timeout
        for dc in self._all_comms():
            self._limit_calls(dc.comm)

    @staticmethod
    def _cuda_unavailable_reason() -> str | None:
        if not build_info()["cuda"]:
            return "this build of minincl has no CUDA communicators (build_info()['cuda'] is False)"
        if not torch.cuda.is_available():
            return "torch sees no usable CUDA device"
        return None

    def getBackendName(self) -> str:
        return BACKEND_NAME

    # torch names each group after making it (_set_group_name). A ProcessGroup keeps the name
    # on its registered backends, and a Python subclass has none, so `group.group_name` would
    # raise "ProcessGroup name not set": DeviceMesh, DTensor, FSDP2 and the functional
    # collectives all look groups up by that name. The group keeps them itself.

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def _ranks_note(self) -> str:
        """What this group's errors add to minincl's messages, which name the communicator's
        ranks: which global ranks those are, where they differ ("" where they do not, or where
        torch no longer knows the group)."""
        try:
            return global_ranks_note(dist.get_process_group_ranks(self))
        except (ValueError, RuntimeError, KeyError):
            return ""

    def __repr__(self) -> str:
        return f"<ProcessGroupMinincl rank {self.rank()} of {self.size()} on {sorted(self._comms)}>"

    # ---- running operations ----

    def _device_of(self, call: str, tensors: list[torch.Tensor]) -> str:
        types = {t.device.type for t in tensors}
        if len(types) > 1:
            raise ValueError(f"minincl backend: {call} got tensors on several devices: {sorted(types)}")
        kind = types.pop() if types else "cpu"
        if kind == "cuda":
            if "cuda" not in self._comms:
                raise InvalidUsage(
                    f"minincl backend: {call} on CUDA tensors, but {self._cuda_missing}; "
                    "use CPU tensors with this group, or the nccl/gloo backend for CUDA tensors"
                )
            want = self._comms["cuda"].comm.device
            for t in tensors:
                if str(t.device) != want:
                    raise ValueError(f"minincl backend: {call}: tensor on {t.device}, this group's GPU is {want}")
        elif kind != "cpu":
            raise InvalidUsage(f"minincl backend: {call} on {kind} tensors; minincl handles cpu and cuda")
        return kind

    def _new_op(
        self,
        call: str,
        tensors: list[torch.Tensor],
        outputs: list[torch.Tensor],
        body: Body,
        after: list[Callable[[], None]] | None = None,
        deferred: bool = False,
        opts: Any = None,
        p2p: bool = False,
    ) -> MinincclWork:
        device = self._device_of(call, tensors)
        cuda = [t.device for t in tensors[:1]] if device == "cuda" else None
        stream = torch.cuda.current_stream(tensors[0].device) if cuda else None
        after = after or []
        if stream is not None:
            body, after = _on_stream(stream, body), [_on_stream(stream, step) for step in after]
        work = MinincclWork(
            outputs, start=self._start_deferred, devices=cuda, ranks_note=self._ranks_note, stream=stream
        )
        op = _Op(device, body, work, after, p2p)
        if deferred or self._coalescing:
            with self._lock:
                self._pending.append(op)
                _count_deferred(1)
        else:
            self._start_deferred()  # earlier deferred ops go first: program order is wire order
            self._submit([op], grouped=False, caller_waits=getattr(opts, "asyncOp", True) is False)
        return work

    def _direct(self, opts: Any, tensors: list[torch.Tensor], run: Callable[..., object]) -> MinincclWork | None:
        """Runs ``run(comm, queued, *tensors)`` straight on the communicator where a call is of
        the common plain kind: options as torch makes them (the caller checked their type),
        dense contiguous tensors of this group's device (the output first), with nothing
        deferred or coalescing. There the general path's staging, op record and job (_new_op)
        cost ~5 us of an 8-byte all_reduce's ~15 (bench/RESULTS.md, forty-seventh session).
        A call that torch waits on at once (not asyncOp) runs on the caller's thread
        (Lane.run_now); an asyncOp one is queued on minincl's own async_op worker (`queued`
        true: QueuedWork) where the lane is idle (forty-eighth session). None: the call takes
        the general path."""
        if self._coalescing or _deferred_ops:
            return None
        cuda = tensors[0].is_cuda
        dc = self._comms.get("cuda") if cuda else self._comms["cpu"] if tensors[0].is_cpu else None
        if dc is None:
            return None  # (the general path says what is wrong)
        for t in tensors:
            if t.layout != torch.strided or not t.is_contiguous() or t.is_neg():
                return None
            if t.is_cuda != cuda or (cuda and str(t.device) != dc.comm.device):
                return None
        bufs = [t.detach() if t.requires_grad else t for t in tensors]
        if opts.asyncOp:
            try:
                handle = dc.lane.queue(lambda: run(dc.comm, True, *bufs))
            except Error:
                return None  # (not queued: the general path reports it, from wait(), as torch's error)
            return (
                None
                if handle is None
                else QueuedWork(tensors[:1], handle, dc.lane, self._start_deferred, self._ranks_note)
            )
        work = MinincclWork(
            tensors[:1],
            devices=[tensors[0].device] if cuda else None,
            ranks_note=self._ranks_note,
            stream=torch.cuda.current_stream(tensors[0].device) if cuda else None,
        )
        work._lane = dc.lane  # (run_now queues it where the lane is busy)

        def job() -> None:
            run(dc.comm, False, *bufs)

        dc.lane.run_now(job, [work])
        return work

    def _home(self, op: _Op) -> _DeviceComm:
        """The communicator and lane an op runs on."""
        if op.p2p and op.device in self._p2p_comms:
            return self._p2p_comms[op.device]
        return self._comms[op.device]

    def _start_deferred(self, waited: MinincclWork | None = None) -> None:
        """Starts this group's deferred ops, and this thread's on the other groups (not those
        still coalescing): a thread's isend on one group, then its all_reduce on another, then
        the isend's wait, must not leave the receiver waiting for the send while it waits in
        the all_reduce for this rank (gloo starts every isend at once). `waited`: a work
        whose caller waits on it now (see _flush)."""
        if _deferred_ops == 0:
            return
        me = threading.get_ident()
        for ref in _GROUPS:
            g = ref()
            if g is not None and g is not self and not g._coalescing:
                g._flush(thread=me)
        self._flush(waited=waited)

    def _flush(self, thread: int | None = None, waited: MinincclWork | None = None) -> None:
        """Starts the deferred ops (only those `thread` made, if given). The batch that holds
        `waited` goes last and runs on this thread where its lane is idle, as a call without
        async_op does: a dist.send or a ping-pong's recv then skips the hand-off to the lane's
        thread and back (~30 us of an 8-byte hop; bench/RESULTS.md, forty-seventh session).
        Every other batch runs on its lane's thread, so that none waits behind it."""
        with self._lock:
            if thread is None:
                ops, self._pending = self._pending, []
            else:
                ops = [op for op in self._pending if op.thread == thread]
                self._pending = [op for op in self._pending if op.thread != thread]
            if ops:
                _count_deferred(-len(ops))
        batches: dict[int, list[_Op]] = {}  # (in program order within each communicator)
        for op in ops:
            batches.setdefault(id(self._home(op)), []).append(op)
        waited_batch = next((b for b in batches.values() if any(op.work is waited for op in b)), None)
        for batch in batches.values():  # (a batch of one op needs no minincl group: ~1.5 us)
            if batch is not waited_batch:
                self._submit(batch, grouped=len(batch) > 1)
        if waited_batch is not None:
            self._submit(waited_batch, grouped=len(waited_batch) > 1, caller_waits=True)

    def _submit(self, ops: list[_Op], grouped: bool, caller_waits: bool = False) -> None:
        """Queues the ops on their lane; `caller_waits` (torch's asyncOp is False: a call without
        async_op, which waits at once) runs them on the caller's thread when the lane is idle,
        saving the hand-off to the lane's thread and back (~40 us of an 8-byte all_reduce)."""
        dc = self._home(ops[0])

        def job() -> None:
            if grouped:
                with group():
                    for op in ops:
                        op.body(dc.comm)
            else:
                for op in ops:
                    op.body(dc.comm)
            # Every result is copied out before a refusal (an expand()ed output) is raised: the
            # other outputs of the call and of its batch are the caller's all the same.
            refusal: Exception | None = None
            for op in ops:
                for step in op.after:
                    try:
                        step()
                    except ValueError as e:
                        refusal = refusal or e
            if refusal is not None:
                raise refusal

        for op in ops:
            op.work._lane = dc.lane
        if caller_waits:
            dc.lane.run_now(job, [op.work for op in ops])
        else:
            dc.lane.submit(job, [op.work for op in ops])

    # ---- reductions ----

    def _reduce_op(
        self,
        call: str,
        tensors: list[torch.Tensor],
        opts: Any,
        run: Callable[[Communicator, torch.Tensor, Op], object],
    ) -> MinincclWork:
        name = op_name(opts.reduceOp if opts is not None else ReduceOp.SUM, call)
        staged = [stage(t) for t in tensors]
        pairs = [reducible(s.buf, name, call) for s in staged]

        def body(comm: Communicator) -> None:
            with _together(len(pairs)):
                for buf, redop in pairs:
                    run(comm, buf, redop)

        return self._new_op(call, tensors, tensors, body, _outputs_after(staged), opts=opts)

    def allreduce(  # type: ignore[override]
        self, tensors: list[torch.Tensor], opts: Any = None, op: Any = None, timeout: Any = None
    ) -> MinincclWork:
        if type(tensors) is list and len(tensors) == 1 and type(opts) is dist.AllreduceOptions:
            name = plain_op(opts.reduceOp, tensors[0].dtype)
            work = name and self._direct(opts, tensors, lambda c, q, b: c.allreduce(b, op=name, async_op=q))
            if work:
                return work
        tensors, opts = call_forms.allreduce(tensors, opts, op)
        if any(t.layout == torch.sparse_coo for t in tensors):
            return self._sparse_allreduce(tensors, opts)
        return self._reduce_op("allreduce", tensors, opts, lambda c, b, o: c.allreduce(b, op=o))

    def _sparse_allreduce(self, tensors: list[torch.Tensor], opts: Any) -> MinincclWork:
        """Sums sparse COO tensors (on the CPU, or on the GPU of a group with CUDA
        communicators) over the ranks, as gloo does: each tensor is replaced by the coalesced
        sum (``_torch_sparse``)."""
        call = "allreduce of sparse tensors"
        if op_name(opts.reduceOp, call) != "sum":
            raise ValueError(f"minincl backend: {call} takes ReduceOp.SUM only (as with gloo)")
        for t in tensors:
            if t.layout != torch.sparse_coo:
                raise TypeError(
                    f"minincl backend: {call}: a {t.layout} tensor among them; it takes sparse COO tensors, "
                    "all of them (or use .to_dense())"
                )
        mine = [t.detach().coalesce() for t in tensors]

        def body(comm: Communicator) -> None:
            for t, m in zip(tensors, mine):
                total = summed_over_ranks(comm, m)
                with torch.no_grad():
                    t.copy_(total)  # (a sparse copy_ takes the other's indices and values)

        return self._new_op(call, tensors, tensors, body, opts=opts)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> MinincclWork:
        return self._reduce_op("allreduce_coalesced", tensors, opts, lambda c, b, o: c.allreduce(b, op=o))

    def reduce(  # type: ignore[override]
        self, tensors: list[torch.Tensor], opts: Any = None, op: Any = None, timeout: Any = None, root: Any = None
    ) -> MinincclWork:
        tensors, opts = call_forms.reduce(tensors, opts, op, root)
        root = opts.rootRank
        return self._reduce_op("reduce", tensors, opts, lambda c, b, o: c.reduce(b, op=o, root=root))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> MinincclWork:
        if type(opts) is dist.ReduceScatterOptions and output.dtype == input.dtype:
            name = plain_op(opts.reduceOp, output.dtype)
            work = name and self._direct(
                opts, [output, input], lambda c, q, o, i: c.reduce_scatter(i, o, op=name, async_op=q)
            )
            if work:
                return work
        return self.reduce_scatter_single_coalesced([output], [input], opts)

    def reduce_scatter_single_coalesced(
        self,
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        opts: Any = None,
        call: str = "reduce_scatter_tensor",
    ) -> MinincclWork:
        name = op_name(opts.reduceOp if opts is not None else ReduceOp.SUM, call)
        outs = [stage(t) for t in outputs]
        ins = [stage(t, receives=False) for t in inputs]
        triples = []
        for o, i in zip(outs, ins):
            send, redop = reducible(i.buf.reshape(-1), name, call)
            recv, _ = reducible(o.buf.reshape(-1), name, call)
            triples.append((send, recv, redop))

        def body(comm: Communicator) -> None:
            with _together(len(triples)):
                for send, recv, redop in triples:
                    comm.reduce_scatter(send, recv, op=redop)

        return self._new_op(call, outputs + inputs, outputs, body, _outputs_after(outs), opts=opts)

    def reduce_scatter(  # type: ignore[override]
        self,
        outputs: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: Any = None,
        op: Any = None,
        timeout: Any = None,
    ) -> MinincclWork:
        input_lists, outputs = call_forms.one_each(input_lists, outputs)
        opts = call_forms.options(opts, dist.ReduceScatterOptions, reduceOp=call_forms.reduce_op(opts, op))
        out, parts = outputs[0], input_lists[0]
        if all(p.numel() == out.numel() for p in parts):
            # torch.cat makes the one contiguous send buffer reduce_scatter wants.
            whole = torch.cat([p.reshape(-1) for p in parts])
            return self.reduce_scatter_single_coalesced([out], [whole], opts, call="reduce_scatter")
        return self._uneven_reduce_scatter(out, parts, opts)

    def _uneven_reduce_scatter(self, out: torch.Tensor, parts: list[torch.Tensor], opts: Any) -> MinincclWork:
        """Rank r's share is a reduce to root r; the reduces run as one group."""
        call = "reduce_scatter (uneven)"
        name = op_name(opts.reduceOp if opts is not None else ReduceOp.SUM, call)
        me = self.rank()
        result = stage(out)
        sends = [reducible(p.detach().contiguous(), name, call)[0] for p in parts]
        recvs = [
            reducible(result.buf, name, call)[0] if r == me else torch.empty_like(sends[r]) for r in range(self.size())
        ]
        redop = reducible(result.buf, name, call)[1]

        def body(comm: Communicator) -> None:
            with group():
                for r in range(comm.nranks):
                    comm.reduce(sends[r], recvs[r], op=redop, root=r)

        return self._new_op(call, [out, *parts], [out], body, _outputs_after([result]), opts=opts)

    # ---- copies ----

    def broadcast(  # type: ignore[override]
        self, tensors: list[torch.Tensor], opts: Any = None, timeout: Any = None, root: Any = None
    ) -> MinincclWork:
        if type(tensors) is list and len(tensors) == 1 and type(opts) is dist.BroadcastOptions:
            at = opts.rootRank
            work = self._direct(opts, tensors, lambda c, q, b: c.broadcast(as_bytes(b), root=at, async_op=q))
            if work:
                return work
        tensors, opts = call_forms.broadcast(tensors, opts, root)
        root = opts.rootRank
        staged = [stage(t) for t in tensors]
        bufs = [as_bytes(s.buf) for s in staged]

        def body(comm: Communicator) -> None:
            with _together(len(bufs)):
                for b in bufs:
                    comm.broadcast(b, root=root)

        return self._new_op("broadcast", tensors, tensors, body, _outputs_after(staged), opts=opts)

    def _check_gathered(self, output: torch.Tensor, input: torch.Tensor) -> None:
        """(Here, in elements: the communicator sees bytes, and would count those.)"""
        if output.numel() != input.numel() * self.size():
            raise ValueError(
                f"minincl backend: all_gather_into_tensor: the output has {output.numel()} elements, "
                f"expected {input.numel() * self.size()} ({self.size()} ranks x the input's {input.numel()})"
            )

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> MinincclWork:
        if type(opts) is AllgatherOptions and output.dtype == input.dtype:
            self._check_gathered(output, input)  # (another type: the coalesced form says so first)
            work = self._direct(
                opts, [output, input], lambda c, q, o, i: c.allgather(as_bytes(i), as_bytes(o), async_op=q)
            )
            if work:
                return work
        return self.all_gather_single_coalesced([output], [input], opts)

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> MinincclWork:
        for o, i in zip(outputs, inputs):
            if o.dtype != i.dtype:  # (the bytes are gathered as they are: they would be read as the other type)
                raise TypeError(f"minincl backend: all_gather_into_tensor of {i.dtype} into a {o.dtype} output")
            self._check_gathered(o, i)
        outs = [stage(t) for t in outputs]
        pairs = [(as_bytes(stage(i, receives=False).buf), as_bytes(o.buf)) for o, i in zip(outs, inputs)]

        def body(comm: Communicator) -> None:
            with _together(len(pairs)):
                for send, recv in pairs:
                    comm.allgather(send, recv)

        return self._new_op("all_gather_into_tensor", outputs + inputs, outputs, body, _outputs_after(outs), opts=opts)

    def allgather(  # type: ignore[override]
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None, timeout: Any = None
    ) -> MinincclWork:
        output_lists, inputs = call_forms.one_each(output_lists, inputs)
        outs, inp = output_lists[0], inputs[0]
        if len(inputs) == 1 and any(o.numel() != inp.numel() for o in outs):
            return self._allgather_by_broadcasts(outs, inp, opts, "allgather (outputs of different sizes)")
        if len(inputs) == 1 and inp.is_cpu and inp.numel() * inp.element_size() >= _BROADCASTS_FROM_BYTES:
            return self._allgather_by_broadcasts(outs, inp, opts, "allgather")
        return self.allgather_coalesced(output_lists, inputs, opts)

    def _allgather_by_broadcasts(
        self, outs: list[torch.Tensor], inp: torch.Tensor, opts: Any, call: str
    ) -> MinincclWork:
        """Straight into the outputs, which may differ in size (as NCCL allows; gloo refuses
        them): rank r's input reaches every rank's ``outs[r]`` by a broadcast from root r; the
        broadcasts run as one group."""
        me = self.rank()
        if len(outs) != self.size() or outs[me].numel() != inp.numel():
            raise ValueError(
                f"minincl backend: {call}: {len(outs)} outputs for {self.size()} ranks, this rank's of "
                f"{outs[me].numel() if me < len(outs) else 'no'} elements for an input of {inp.numel()}; "
                "give one output per rank, this rank's the size of its input"
            )
        if any(o.dtype != inp.dtype for o in outs):
            raise TypeError(f"minincl backend: {call} of {inp.dtype} into outputs of {[o.dtype for o in outs]}")
        staged = [stage(o) for o in outs]
        send = as_bytes(stage(inp, receives=False).buf)
        recvs = [as_bytes(s.buf) for s in staged]
        if any(_overlap(send, recv) for q, recv in enumerate(recvs) if q != me):
            send = send.clone()  # (another rank's block lands there while this one's goes out)

        def body(comm: Communicator) -> None:
            with group():
                for root, recv in enumerate(recvs):
                    comm.broadcast(send if root == me else recv, recv, root=root)

        return self._new_op(call, [*outs, inp], outs, body, _outputs_after(staged), opts=opts)

    def allgather_coalesced(
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> MinincclWork:
        """Each input gathers into one flat buffer, then splits into the caller's list."""
        flats, after = [], []
        for outs, inp in zip(output_lists, inputs):
            if any(o.numel() != inp.numel() for o in outs):
                raise NotImplementedError("minincl backend: allgather with outputs of different sizes")
            if any(o.dtype != inp.dtype for o in outs):  # (as gloo: no silent conversion)
                raise TypeError(f"minincl backend: allgather of {inp.dtype} into outputs of {[o.dtype for o in outs]}")
            flat = inp.new_empty((len(outs) * inp.numel(),))
            flats.append((as_bytes(stage(inp, receives=False).buf), as_bytes(flat)))
            after.append(_copy_split(flat, outs))

        def body(comm: Communicator) -> None:
            with _together(len(flats)):
                for send, recv in flats:
                    comm.allgather(send, recv)

        outputs = [t for outs in output_lists for t in outs]
        return self._new_op("allgather", outputs + inputs, outputs, body, after, opts=opts)

    def all_to_all_single(  # type: ignore[override]
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int] | None,
        input_split_sizes: list[int] | None,
        opts: Any = None,
        timeout: Any = None,
    ) -> MinincclWork:
        opts = call_forms.options(opts, dist.AllToAllOptions)
        out, inp = stage(output), stage(input, receives=False)
        if not output_split_sizes and not input_split_sizes:
            send, recv = as_bytes(inp.buf), as_bytes(out.buf)
            return self._new_op(
                "all_to_all_single",
                [output, input],
                [output],
                lambda comm: comm.alltoall(send, recv),
                _outputs_after([out]),
                opts=opts,
            )
        if _overlap(inp.buf, out.buf):  # in place: the receives would overwrite blocks still to send
            inp = Staged(inp.buf.clone())
        sends = _split_rows(inp.buf, input_split_sizes, self.size())
        recvs = _split_rows(out.buf, output_split_sizes, self.size())
        return self._new_op(
            "all_to_all_single",
            [output, input],
            [output],
            _exchange(sends, recvs),
            _outputs_after([out]),
            opts=opts,
        )

    def alltoall(  # type: ignore[override]
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None, timeout: Any = None
    ) -> MinincclWork:
        opts = call_forms.options(opts, dist.AllToAllOptions)
        outs = [stage(t) for t in outputs]
        sends = [as_bytes(stage(t, receives=False).buf) for t in inputs]
        recvs = [as_bytes(o.buf) for o in outs]
        body = _exchange(sends, recvs)
        return self._new_op("all_to_all", outputs + inputs, outputs, body, _outputs_after(outs), opts=opts)

    def gather(  # type: ignore[override]
        self,
        output_lists: list[list[torch.Tensor]],
        inputs: list[torch.Tensor],
        opts: Any = None,
        timeout: Any = None,
        root: Any = None,
    ) -> MinincclWork:
        output_lists, inputs = call_forms.one_each(output_lists, inputs)
        opts = call_forms.rooted(opts, root, dist.GatherOptions)
        root, me = opts.rootRank, self.rank()
        if me == root:
            self._check_root_list("gather", "gather_list", output_lists[0], inputs[0])
        outs = [stage(t) for t in output_lists[0]] if me == root else []
        send = as_bytes(stage(inputs[0], receives=False).buf)

        def body(comm: Communicator) -> None:
            with group():
                comm.send(send, root, tag=GATHER_TAG - root)
                for r, o in enumerate(outs):
                    comm.recv(as_bytes(o.buf), r, tag=GATHER_TAG - root)

        outputs = output_lists[0] if me == root else []
        return self._new_op("gather", outputs + inputs, outputs, body, _outputs_after(outs), opts=opts)

    def scatter(  # type: ignore[override]
        self,
        outputs: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: Any = None,
        timeout: Any = None,
        root: Any = None,
    ) -> MinincclWork:
        input_lists, outputs = call_forms.one_each(input_lists, outputs)
        opts = call_forms.rooted(opts, root, dist.ScatterOptions)
        root, me = opts.rootRank, self.rank()
        if me == root:
            self._check_root_list("scatter", "scatter_list", input_lists[0], outputs[0])
        out = stage(outputs[0])
        sends = [as_bytes(stage(t, receives=False).buf) for t in input_lists[0]] if me == root else []

        def body(comm: Communicator) -> None:
            with group():
                for r, s in enumerate(sends):
                    comm.send(s, r, tag=SCATTER_TAG - root)
                comm.recv(as_bytes(out.buf), root, tag=SCATTER_TAG - root)

        inputs = input_lists[0] if me == root else []
        return self._new_op("scatter", outputs + inputs, outputs, body, _outputs_after([out]), opts=opts)

    def _check_root_list(self, call: str, name: str, tensors: list[torch.Tensor], own: torch.Tensor) -> None:
        """The root's list of a gather or scatter: a tensor per rank, each of this rank's
        tensor's type and size (as gloo asks), checked before any rank's data moves."""
        if len(tensors) != self.size():
            raise ValueError(
                f"minincl backend: {call}: {name} has {len(tensors)} tensors for {self.size()} ranks; give one per rank"
            )
        for r, t in enumerate(tensors):
            if t.dtype != own.dtype or t.numel() != own.numel():
                raise ValueError(
                    f"minincl backend: {call}: {name}[{r}] is {t.dtype} of {t.numel()} elements, but this rank's "
                    f"tensor is {own.dtype} of {own.numel()}; every tensor of {name} must match it"
                )

    def barrier(self, opts: Any = None, timeout: Any = None) -> MinincclWork:  # type: ignore[override]
        opts = call_forms.options(opts, dist.BarrierOptions)
        # With a GPU, NCCL's barrier returns once the caller's stream has run what came before
        # it (a barrier, then a clock read, times GPU work). The ranks meet on the CPU. (Marked
        # before the deferred sends start, which may wait for a receive a peer posts after its
        # barrier: NCCL's do not hold up the caller's stream.)
        gpu = self._comms.get("cuda")
        before = torch.cuda.current_stream(gpu.comm.device).record_event() if gpu is not None else None

        def body(comm: Communicator) -> None:
            if before is not None:
                before.synchronize()
            comm.barrier()

        return self._new_op("barrier", [], [], body, opts=opts)

    # ---- point to point (deferred: see the module's docstring) ----

    # (Sends and receives go as bytes: they pair by bytes, as gloo's and NCCL's do, so a
    # receive may take a send's bits in another type of the same size.)
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> MinincclWork:
        bufs = [as_bytes(stage(t, receives=False).buf) for t in tensors]

        def body(comm: Communicator) -> None:
            for b in bufs:
                comm.send(b, dst, tag=tag)

        return self._new_op("send", tensors, tensors, body, deferred=True, p2p=True)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> MinincclWork:
        staged = [stage(t) for t in tensors]
        bufs = [as_bytes(s.buf) for s in staged]

        def body(comm: Communicator) -> None:
            for b in bufs:
                comm.recv(b, src, tag=tag)

        return self._new_op("recv", tensors, tensors, body, _outputs_after(staged), deferred=True, p2p=True)

    # ---- coalescing (torch's _coalescing_manager with a device) ----

    def _start_coalescing(self, device: torch.device) -> None:
        self._flush()
        self._coalescing = True

    def _end_coalescing(self, device: torch.device) -> MinincclWork:
        self._coalescing = False
        with self._lock:
            works = [op.work for op in self._pending]
        self._flush()
        return _AllOf(works)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> MinincclWork:
        """A receive from whichever rank sends to this one (the lowest if several do): it
        starts in program order, after the deferred ops before it, and waits for a send that
        no receive of this rank has taken yet (``_wait_for_sender``); ``_source_rank()`` then says
        who sent."""
        staged = [stage(t) for t in tensors]
        bufs = [as_bytes(s.buf) for s in staged]
        limit = self._timeout.total_seconds() if isinstance(self._timeout, timedelta) else 0.0
        source: list[int] = []

        def body(comm: Communicator) -> None:
            src = _wait_for_sender(comm, limit)
            source.append(src)
            for b in bufs:
                comm.recv(b, src, tag=tag)

        work = self._new_op("recv", tensors, tensors, body, _outputs_after(staged), p2p=True)
        work._source = source
        return work

    # ---- what minincl does not do ----

    def monitored_barrier(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("minincl backend: monitored_barrier; use barrier()")

    # ---- torch's other names for the same calls ----

    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced  # type: ignore[assignment]
    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # type: ignore[assignment]

    def alltoall_base(  # type: ignore[override]
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
        timeout: Any = None,
    ) -> MinincclWork:
        return self.all_to_all_single(output, input, output_split_sizes, input_split_sizes, opts)

    # ---- teardown ----

    def _all_comms(self) -> list[_DeviceComm]:
        return [*self._comms.values(), *self._p2p_comms.values()]

    def shutdown(self) -> None:
        self._flush()
        for dc in self._all_comms():
            dc.lane.close()
            dc.comm.destroy()

    def abort(self) -> None:
        for dc in self._all_comms():
            dc.comm.abort()
        for dc in self._all_comms():
            dc.lane.close()


@outside_compiled_code
class _AllOf(MinincclWork):
    """One work for several: done when all are (what _end_coalescing returns)."""

    def __init__(self, works: list[MinincclWork]) -> None:
        super().__init__([t for w in works for t in w._outputs])
        self._works = works

    def wait(self, timeout: Any | None = None) -> bool:
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        deadline = time.monotonic() + seconds if seconds else None  # (one limit for them all)
        for w in self._works:
            w.wait(None if deadline is None else max(deadline - time.monotonic(), 1e-6))
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def is_success(self) -> bool:
        return all(w.is_success() for w in self._works)

    def exception(self) -> BaseException | None:
        return next((e for e in (w.exception() for w in self._works) if e is not None), None)

    def get_future(self) -> torch.futures.Future[Any]:
        futures = [w.get_future() for w in self._works]
        # (collect_all fails as soon as one fails; wait() passes that on, else the chained
        # future would succeed with outputs the other works may still be writing.)
        return torch.futures.collect_all(futures).then(lambda every: (every.wait(), self._outputs)[1])


def _copy_split(flat: torch.Tensor, outs: list[torch.Tensor]) -> Callable[[], None]:
    def copy() -> None:
        refusal: str | None = None
        for part, o in zip(flat.view(len(outs), -1), outs):
            if (why := overlap_refusal(o)) is not None:  # (the other outputs are written all the same)
                refusal = refusal or why
                continue
            o.copy_(part.view(o.shape))
        if refusal is not None:
            raise ValueError(refusal)

    return copy


def _split_rows(t: torch.Tensor, sizes: list[int] | None, n: int) -> list[torch.Tensor]:
    """Byte views of the dim-0 blocks of a contiguous tensor (equal blocks when sizes is empty)."""
    rows = t.shape[0] if t.dim() else 1
    sizes = list(sizes) if sizes else [rows // n] * n
    if sum(sizes) != rows:
        raise ValueError(f"minincl backend: all_to_all_single: split sizes {sizes} do not add up to {rows} rows")
    flat = as_bytes(t)
    row_bytes = flat.numel() // rows if rows else 0
    out, offset = [], 0
    for s in sizes:
        out.append(flat[offset * row_bytes : (offset + s) * row_bytes])
        offset += s
    return out


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two contiguous tensors share any bytes."""
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def _exchange(sends: list[torch.Tensor], recvs: list[torch.Tensor]) -> Body:
    """Block i of sends goes to rank i, block i of recvs comes from rank i: one group."""

    def body(comm: Communicator) -> None:
        with group():
            for peer, (s, r) in enumerate(zip(sends, recvs)):
                comm.send(s, peer)
                comm.recv(r, peer)

    return body


def _wait_for_sender(comm: Communicator, limit: float) -> int:
    """The rank whose send to this rank waits for a receive (the lowest if several), once
    there is one; raises minincl.Timeout after `limit` seconds (0: none), or the
    communicator's error if it fails meanwhile. (Senders are seen through the call logs of
    the first 64 ranks.)"""
    if comm.nranks > 64:
        raise NotImplementedError("minincl backend: recv from any source needs a group of at most 64 ranks")
    start, pause = time.monotonic(), 20e-6
    while (src := comm._pending_sender()) < 0:
        if limit and time.monotonic() - start > limit:
            raise Timeout(
                f"minincl backend: recv from any source: no rank sent to rank {comm.rank} within the group's "
                f"timeout ({limit:g} s)"
            )
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)
    return src


def _device_marker(rank: int, size: int) -> Any:
    """A stand-in backend that tells torch which device types the group serves.

    torch lists a group's devices (``pg._device_types``: object collectives, ``dcp.async_save``,
    ``_get_object_coll_device``) from the backends registered with it, and a backend cannot be
    written in Python. Every call reaches this group's own methods; a torch path that would call
    the registered backend directly raises (``error_on_collective``) instead of silently doing
    nothing, as the fake backend otherwise does.
    """
    fake: Any = FakeProcessGroup  # (torch's type stubs predate its options)
    options = fake.Options()
    options.error_on_collective = True
    return fake._create_internal(rank, size, options)


def _create(store: dist.Store, rank: int, size: int, timeout: timedelta) -> ProcessGroupMinincl:
    others = _other_backends_of_this_group()
    if others:
        mixed = ",".join(f"{device}:{backend}" for device, backend in others.items())
        raise ValueError(
            f"minincl backend: this group would also use {mixed}, but torch cannot combine a process group "
            "written in Python (minincl's) with other backends in one group: minincl's would silently take "
            "every device's calls. "
            "Use init_process_group('minincl') (CPU and CUDA tensors), or keep the other backend for the "
            "default group and make a minincl group for CPU tensors: dist.new_group(backend='minincl')"
        )
    return ProcessGroupMinincl(store, rank, size, timeout)


def _other_backends_of_this_group() -> dict[str, str]:
    """The devices that the group torch is making maps to other backends ("cpu:minincl,cuda:nccl").

    torch gives a backend's creator no such thing, so this reads torch's backend_config from the
    frame that calls the creator; {} where no such frame is found (a torch that works otherwise).
    """
    frame: FrameType | None = sys._getframe(1)
    for _ in range(4):
        frame = frame.f_back if frame is not None else None
        if frame is None:
            return {}
        config = frame.f_locals.get("backend_config")
        if config is not None and hasattr(config, "get_device_backend_map"):
            mapping = config.get_device_backend_map()
            return {device: str(b) for device, b in mapping.items() if str(b) != BACKEND_NAME}
    return {}


dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])

__all__ = [
    "BACKEND_NAME",
    "LocalRunError",
    "MinincclWork",
    "ProcessGroupMinincl",
    "free_port",
    "run_local",
]
