"""The Python face of a communicator: construction, groups, environment init, launch."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import operator
import os
import pickle
import queue as queue_mod
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Union

from . import _core
from . import errors as _errors
from .errors import Error, InvalidArgument, InvalidUsage, RemoteError

if TYPE_CHECKING:
    import numpy as np

Work = _core.Work
get_unique_id = _core.get_unique_id
unique_id_for_address = _core.unique_id_for_address

DeviceSpec = Union[None, str, int]

_CPU = -1
_WINDOW_FROM_ENV = -1  # (the core's "no window_bytes given")
_WINDOW_MAX_BYTES = 1 << 40  # (as mnclConfig_t's windowBytes)


def _check_int32_ranks(nranks: int, rank: int) -> None:
    """Counts past 32 bits get the core's messages, not a TypeError from the binding."""
    if isinstance(nranks, int) and nranks >= 2**31:
        raise InvalidArgument(
            f"nranks={nranks} is more than minincl takes ({_core._MAX_RANKS}); is the world size right?"
        )
    if isinstance(nranks, int) and nranks < -(2**31):
        raise InvalidArgument(f"nranks must be at least 1, got {nranks}")
    if isinstance(rank, int) and not -(2**31) <= rank < 2**31:
        raise InvalidArgument(f"rank {rank} is out of range for nranks={nranks}")


def _window_bytes_setting(window_bytes: object) -> int:
    """``window_bytes`` as the core takes it: bytes, or -1 for MININCL_WINDOW_BYTES."""
    if window_bytes is None:
        return _WINDOW_FROM_ENV
    if isinstance(window_bytes, bool) or not hasattr(window_bytes, "__index__"):
        raise InvalidArgument(
            f"window_bytes must be a whole number of bytes (e.g. 1 << 30), got {type(window_bytes).__name__} "
            f"{window_bytes!r}"
        )
    value = int(window_bytes.__index__())
    if not 0 <= value <= _WINDOW_MAX_BYTES:
        raise InvalidArgument(f"window_bytes = {value}: between 0 (no window) and 2**40")
    return value


def gpu_count() -> int:
    """How many CUDA GPUs this process can use (0 without a driver, a GPU or a CUDA build)."""
    return int(_core.gpu_count())


def _device_index(device: DeviceSpec) -> int:
    """'cpu' -> -1; 'cuda' -> the current CUDA device; 'cuda:N', N -> N; None -> the current
    CUDA device if a GPU is usable, else the CPU."""
    if device == "cpu":
        return _CPU
    if device is None:
        return int(_core._cuda_current_device()) if gpu_count() > 0 else _CPU
    if isinstance(device, bool) or not isinstance(device, (int, str)):
        raise InvalidArgument(f"device={device!r}: expected 'cpu', 'cuda', 'cuda:N', an int or None")
    if isinstance(device, str):
        if device == "cuda":
            index = None
        elif device.startswith("cuda:") and device[5:].isdigit():
            index = int(device[5:])
        else:
            raise InvalidArgument(f"device={device!r}: expected 'cpu', 'cuda', 'cuda:N', an int or None")
    else:
        index = device
    if index is not None and index < 0:
        raise InvalidArgument(f"device={device!r}: a CUDA device number is at least 0")
    if not _core.build_info()["cuda"]:
        raise InvalidUsage(
            f"device={device!r}: this build of minincl has no CUDA backend (built without CUDA: nvcc was not "
            "found, or -C cmake.define.MININCL_CUDA=OFF); use device='cpu'"
        )
    if gpu_count() == 0:
        raise InvalidArgument(f"device={device!r}: no usable CUDA GPU here (no driver or no device)")
    return int(_core._cuda_current_device()) if index is None else index


@dataclass(frozen=True)
class Topology:
    """How a communicator's init ordered its rings (the same on every rank).

    ``rings[c]`` is channel ``c``'s ring as ranks; ``ring_hops[c][i]`` the path class of the
    hop ``rings[c][i] -> rings[c][i + 1]`` (``X``: same device; empty when rank order was
    used without a search). ``devices[r]`` names where rank ``r`` sits in the topology
    (``GPU3``, ``NUMA0``). ``path_bandwidth_gbs`` is the search's per-channel bandwidth and
    ``bandwidth_scale`` what the tuner multiplies its bandwidths by (1.0: unchanged).
    ``hosts[r]`` numbers rank ``r``'s host (0: rank 0's, the others in order of their first
    rank); with several hosts each ring runs through them in turn, its hop out of a host
    named ``NET``. ``trees[c][r]`` is rank ``r``'s parent in channel ``c``'s tree as
    allreduce runs it (rooted at rank 0, -1 there; reduce and broadcast re-root it).
    """

    nchannels: int
    rings: list[list[int]]
    ring_hops: list[list[str]]
    searched: bool
    on_gpus: bool
    search_channels: int
    path_bandwidth_gbs: float
    bandwidth_scale: float
    devices: list[str]
    source: str
    reason: str
    warnings: list[str]
    hosts: list[int] = field(default_factory=list)
    trees: list[list[int]] = field(default_factory=list)


class Communicator(_core.Communicator):
    """One rank of a group of ranks.

    ``Communicator(nranks, unique_id, rank, device=None)`` joins the group named by
    ``unique_id`` (from :func:`get_unique_id`, shared with every rank by any means).
    Collectives take arrays with DLPack or the buffer protocol (NumPy, PyTorch, ...); with
    ``recv=None`` allreduce, broadcast and reduce work in place, and allgather,
    reduce_scatter and alltoall return a new array. ``window_bytes`` sizes this rank's window
    for :meth:`empty` (default: ``MININCL_WINDOW_BYTES``, else none); the communicators
    split or shrunk from this one get the same.
    """

    def __init__(
        self, nranks: int, unique_id: bytes, rank: int, device: DeviceSpec = None, *, window_bytes: int | None = None
    ) -> None:
        _check_int32_ranks(nranks, rank)  # (before the report below, which takes 32-bit ones)
        try:
            index = _device_index(device)
            window = _window_bytes_setting(window_bytes)
        except Error as e:  # the other ranks' inits fail at once too, rather than wait for this one
            _core._report_init_failure(nranks, unique_id, rank, str(e))
            raise
        super().__init__(nranks, unique_id, rank, index, window)
        self._window_option = window_bytes  # (for the communicators split from this one)

    @property
    def device(self) -> str:
        index = self._device_index
        return "cpu" if index < 0 else f"cuda:{index}"

    @classmethod
    def init_all(
        cls, nranks: int, device: DeviceSpec = "cpu", *, window_bytes: int | None = None
    ) -> list[Communicator]:
        """Creates ``nranks`` communicators of one group, all in this process (ranks as threads;
        they read each other's buffers, so they make no windows whatever ``window_bytes``)."""
        if nranks < 1:
            raise InvalidArgument(f"nranks must be at least 1, got {nranks}")
        _window_bytes_setting(window_bytes)  # (refused here, once, rather than by every rank)
        uid = get_unique_id()
        comms: list[Communicator | None] = [None] * nranks
        errors: list[BaseException | None] = [None] * nranks

        def join(rank: int) -> None:
            try:
                comms[rank] = cls(nranks, uid, rank, device, window_bytes=window_bytes)
            except BaseException as e:  # noqa: BLE001 - re-raised below
                errors[rank] = e

        threads = [threading.Thread(target=join, args=(r,)) for r in range(nranks)]
        for rank, t in enumerate(threads):
            try:
                t.start()
            except RuntimeError as e:  # (the ranks started would wait for this one until the bootstrap timeout)
                message = f"could not start a thread for rank {rank} of {nranks} ({e}): is a limit on threads reached?"
                _core._report_init_failure(nranks, uid, rank, message)
                errors[rank] = _errors.SystemError(message)
                threads = threads[:rank]
                break
        for t in threads:
            t.join()
        failed = [e for e in errors if e is not None]
        if failed:
            for c in comms:
                if c is not None:
                    c.destroy()
            # A rank's own failure first, before the RemoteErrors it caused in the others.
            raise next((e for e in failed if not isinstance(e, RemoteError)), failed[0])
        return [c for c in comms if c is not None]

    def empty(self, shape: int | tuple[int, ...], dtype: Any = "float32") -> np.ndarray[Any, Any]:
        """A NumPy array in this rank's window: shared memory every peer process maps, so that
        collectives read it straight from here instead of passing it through the FIFOs (one
        copy instead of two). Needs a window: ``window_bytes=`` or ``MININCL_WINDOW_BYTES`` when
        the communicator is created (:attr:`window_bytes` says its size); the array keeps the
        window alive and frees its space when collected. Where no peer is another process of
        this host (threads, which read each other's buffers anyway; peers over the network), a
        plain NumPy array."""
        import numpy as np

        dims = tuple(operator.index(d) for d in np.atleast_1d(shape))  # (an int, a sequence, or an array)
        dt = np.dtype(dtype)
        if not dt.isnative:  # (every call would refuse it)
            raise InvalidArgument(f"empty: {dt} is not in this machine's byte order; pass dtype {dt.newbyteorder('=')}")
        return self._window_empty(list(dims), dt)

    def split(self, color: int, key: int = 0) -> Communicator | None:
        """The ranks that pass the same ``color`` form a new communicator, ranked by
        ``(key, rank)``; a negative color joins none and returns None. Every rank of this
        communicator must call it (as ncclCommSplit)."""
        refusal = None
        color, key = operator.index(color), operator.index(key)  # (not a float or a string)
        for name, value in (("color", color), ("key", key)):
            if not -(2**31) <= value < 2**31:
                refusal = f"split: {name} {value} does not fit in 32 bits (as ncclCommSplit's int)"
        # A refused rank still meets the others: theirs then fail at once, naming it, rather
        # than at the bootstrap timeout.
        if refusal:
            with contextlib.suppress(Error):  # (its own story first, whatever the rendezvous met)
                self._split_info(0, 0, True)
            raise InvalidArgument(refusal)
        info = self._split_info(color, key)
        if info is None:
            return None
        nranks, uid, rank, members = info
        return self._join_watched(nranks, uid, rank, members)

    def shrink(self, exclude: Iterable[int]) -> Communicator:
        """A new communicator of this one's ranks but ``exclude``, in rank order (as
        ncclCommShrink). Every rank kept calls it with the same ranks; the excluded ones do not,
        and need not be alive: it works on a communicator that failed because a peer died.
        (This communicator stays as it is: destroy it afterwards. mnclCommShrink's
        MNCL_SHRINK_ABORT has no counterpart here: a call waiting on a dead rank fails at
        once, one waiting on a hung rank after MININCL_TIMEOUT.)"""
        nranks, uid, rank, members = self._shrink_info([int(r) for r in exclude])
        return self._join_watched(nranks, uid, rank, members)

    def _join_watched(self, nranks: int, uid: bytes, rank: int, members: list[int]) -> Communicator:
        """The new communicator of a split or shrink; its init fails at once if one of
        ``members`` (this communicator's ranks) exits before joining."""
        self._watch_begin(members)
        try:
            return type(self)(nranks, uid, rank, self.device, window_bytes=self._window_option)
        except (RemoteError, _errors.SystemError):
            # A member that exited is the story: another may have left the init for it first,
            # and the root said so before this rank's watch looked; or it hosted the init's
            # root, whose connections closed (or were reset) as its process went, a moment
            # before it was gone: look for half a second.
            until = time.monotonic() + 0.5
            self._check_members(members)
            while time.monotonic() < until:
                time.sleep(0.01)
                self._check_members(members)
            raise
        finally:
            self._watch_end()

    def topology(self) -> Topology:
        """The ring order per channel, channel count and bandwidth init chose, and why."""
        return Topology(**self._topology())

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def __repr__(self) -> str:
        state = ", destroyed" if self.destroyed else ""
        return f"<minincl.Communicator rank {self.rank} of {self.nranks} on {self.device}{state}>"


class group(contextlib.ContextDecorator):  # noqa: N801 - used as a function: `with minincl.group():`
    """Calls inside run together when the block exits (as ncclGroupStart/End).

    A class rather than a generator-based context manager: entering and leaving an empty
    group takes 0.50 us instead of 1.22, and a small grouped GPU call from Python is
    host-bound."""

    def __enter__(self) -> None:
        _core.group_start()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # An exception leaving the block drops the group: its other calls would wait for the
        # one that raised (on one thread driving several ranks: for ever).
        _core.group_end(discard=exc_type is not None)


def _first_set(*names: str) -> tuple[str, str] | None:
    """(name, value) of the first of `names` set to something in the environment."""
    for n in names:
        v = os.environ.get(n)
        if v:
            return n, v
    return None


def _first_env(*names: str) -> str | None:
    found = _first_set(*names)
    return found[1] if found else None


def _int_from_env(*names: str) -> int | None:
    """The first of `names` that is set, as an integer; InvalidArgument naming it if it is not one."""
    found = _first_set(*names)
    if found is None:
        return None
    name, value = found
    try:
        return int(value)
    except ValueError:
        raise InvalidArgument(f"init_from_env: {name}={value!r} is not an integer") from None


def _first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm host list: 'node[03-05,07],gpu1' -> 'node03',
    'rack[1-2]-node[01-02]' -> 'rack1-node01', 'node[01-02]-ib' -> 'node01-ib'."""
    host, i = "", 0
    while i < len(nodelist) and nodelist[i] != ",":
        if nodelist[i] == "[":
            end = nodelist.index("]", i)
            host += nodelist[i + 1 : end].split(",")[0].split("-")[0]
            i = end + 1
        else:
            host += nodelist[i]
            i += 1
    return host


def _launcher_job(rank_variable: str) -> str:
    """The job id of the launcher that gave this rank its number (`rank_variable`): the same on
    every rank of the job, so it goes into the unique id, and two jobs given the same root
    address (the default port, say) fail at the root instead of joining each other's ranks.
    MININCL_JOB_ID overrides it; MPICH's hydra gives none."""
    if os.environ.get("MININCL_JOB_ID"):
        return "user:" + os.environ["MININCL_JOB_ID"]
    names = {
        "RANK": ("TORCHELASTIC_RUN_ID",),
        "OMPI_COMM_WORLD_RANK": ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"),
        "SLURM_PROCID": ("SLURM_JOB_ID",),
    }.get(rank_variable, ())
    found = _first_set(*names)
    if found is None:
        return ""
    step = f".{os.environ.get('SLURM_STEP_ID', '')}" if found[0] == "SLURM_JOB_ID" else ""
    return f"{found[0]}:{found[1]}{step}"


RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
SIZE_VARIABLES = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")


def init_from_env(device: DeviceSpec = None, *, window_bytes: int | None = None) -> Communicator:
    """Joins the group described by the launcher's environment.

    torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT. Slurm: SLURM_PROCID, SLURM_NTASKS,
    root on the first host of the step (SLURM_STEP_NODELIST, where task 0 runs; else
    SLURM_JOB_NODELIST). Open MPI / MPICH: OMPI_COMM_WORLD_RANK /
    OMPI_COMM_WORLD_SIZE, PMI_RANK / PMI_SIZE. The root listens on MININCL_ROOT_ADDR (default
    MASTER_ADDR, else the first Slurm host, else 127.0.0.1) at MININCL_ROOT_PORT (default
    MASTER_PORT + 1, since torchrun's own store already holds MASTER_PORT; else 29501);
    rank 0 starts it. The job id of the launcher that gave the rank (torchrun's run id, Open
    MPI's PMIx namespace, Slurm's job and step; MININCL_JOB_ID instead, where set) goes into
    the id, so that another job at the same address fails at once. ``window_bytes``: as
    :class:`Communicator` takes it.
    """
    rank = _int_from_env(*RANK_VARIABLES)
    size = _int_from_env(*SIZE_VARIABLES)
    if rank is None and size is None:
        raise InvalidUsage(
            "init_from_env: no launcher variables found (RANK/WORLD_SIZE from torchrun, "
            "SLURM_PROCID/SLURM_NTASKS, OMPI_COMM_WORLD_RANK/SIZE or PMI_RANK/PMI_SIZE)"
        )
    if rank is None or size is None:
        have, missing = (SIZE_VARIABLES, RANK_VARIABLES) if rank is None else (RANK_VARIABLES, SIZE_VARIABLES)
        found = _first_set(*have)
        assert found is not None
        raise InvalidUsage(
            f"init_from_env: {found[0]} is set but none of {', '.join(missing)} is: set the matching one"
        )
    host_from = _first_set("MININCL_ROOT_ADDR", "MASTER_ADDR")
    if host_from is not None:
        host = host_from[1]
    else:
        # (Task 0 runs on the step's first host, which need not be the job's.)
        nodelist = _first_env("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
        host = _first_slurm_host(nodelist) if nodelist else "127.0.0.1"
    port = _int_from_env("MININCL_ROOT_PORT")
    if port is not None and not 0 < port <= 65535:
        raise InvalidArgument(f"init_from_env: MININCL_ROOT_PORT={port} is not a port (1 to 65535)")
    if port is None:
        master_port = _int_from_env("MASTER_PORT")
        port = master_port + 1 if master_port is not None else 29501
        if port > 65535:
            raise InvalidArgument(
                f"init_from_env: the root listens on MASTER_PORT + 1 = {port}, out of range: "
                "set MININCL_ROOT_PORT, or a lower MASTER_PORT"
            )
    rank_variable = _first_set(*RANK_VARIABLES)
    assert rank_variable is not None
    try:
        uid = unique_id_for_address(host, port, _launcher_job(rank_variable[0]))
    except InvalidArgument as e:  # (a host name that does not resolve: say where it came from)
        if host_from is None:
            raise
        raise InvalidArgument(f"init_from_env: {host_from[0]}={host!r}: {e}") from None
    return Communicator(size, uid, rank, device, window_bytes=window_bytes)


# ---- launch: local processes ----


def end_with_parent() -> None:
    """Makes this rank process (started by multiprocessing) end when its launcher does: a
    launcher killed by a signal left its ranks running on as orphans, maybe forever."""
    parent = mp.parent_process()
    if parent is None:
        return
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1  # (the kernel sends the signal when the launching thread exits)
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent.pid:  # (it had gone already)
        os.kill(os.getpid(), signal.SIGTERM)


def _launch_child(
    fn: Callable[..., Any],
    nranks: int,
    rank: int,
    uid: bytes,
    device: DeviceSpec,
    window_bytes: int | None,
    args: tuple[Any, ...],
    queue: Any,
) -> None:
    end_with_parent()
    try:
        if device == "cuda" and gpu_count() > 0:  # one GPU per rank while there are enough
            device = f"cuda:{rank % gpu_count()}"
        with Communicator(nranks, uid, rank, device, window_bytes=window_bytes) as comm:
            result = fn(comm, *args)
        # (The queue pickles on a thread of its own, where a failure is printed and lost.)
        try:
            pickle.dumps(result)
        except Exception as e:  # noqa: BLE001 - the rank's story
            raise TypeError(
                f"the return value of {fn.__name__}, a {type(result).__name__}, cannot be pickled: {e}"
            ) from e
        queue.put((rank, True, result))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        queue.put((rank, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


_LAUNCH_GRACE_SECONDS = 15.0  # a failed rank's peers have MININCL_TIMEOUT (5 s) to notice


class LaunchError(Error):
    """One or more ranks started by :func:`launch` failed; ``results`` holds what the
    other ranks returned, by rank, and ``errors`` each failed rank's story in one line
    (``"InvalidArgument: ..."``; the message adds the tracebacks)."""

    def __init__(self, message: str, results: dict[int, Any], errors: dict[int, str] | None = None) -> None:
        super().__init__(message)
        self.results = results
        self.errors = errors or {}


def _no_result_story(exitcode: int | None, fn_name: str) -> str:
    """Why a rank's process ended without a result, from its exit code."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        oom = " (kill -9, or the out-of-memory killer?)" if exitcode == -signal.SIGKILL else ""
        return f"process killed by {name}{oom} before it returned a result"
    return (
        f"process ended with exit code {exitcode} and no result (it failed before running {fn_name}, or "
        f"{fn_name} exited the process: its traceback is on stderr; a script must call launch() under "
        "`if __name__ == '__main__':`, as its ranks import it)"
    )


def _check_launchable(fn: Callable[..., Any], nranks: int) -> None:
    """What would make every spawned rank fail, said once, before any starts."""
    if isinstance(nranks, bool) or not isinstance(nranks, int) or nranks < 1:
        raise InvalidArgument(f"launch: nranks must be an integer of at least 1, got {nranks!r}")
    if mp.current_process().daemon:
        raise InvalidUsage(
            "launch inside a launched rank: its processes are daemons, which cannot start processes; "
            "use split() of the rank's communicator for a smaller group instead"
        )
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file is not None and not os.path.exists(main_file):
        raise InvalidUsage(
            f"launch from a script read from {main_file}: each spawned rank imports the main script, "
            "so save it to a file and run that"
        )
    if main_file is None and getattr(fn, "__module__", None) == "__main__":
        raise InvalidUsage(
            f"launch: {getattr(fn, '__name__', 'fn')} is defined in __main__ of `python -c` or an interactive "
            "session, which the spawned ranks cannot import: define it in a module (a .py file) and import it"
        )


class _LaunchedRanks:
    """The rank processes of one :func:`launch`, and what each sent back: (ok, value)."""

    def __init__(
        self, fn: Callable[..., Any], nranks: int, args: tuple[Any, ...], device: DeviceSpec, window_bytes: int | None
    ) -> None:
        ctx = mp.get_context("spawn")
        uid = get_unique_id()
        self.nranks = nranks
        self.fn_name = getattr(fn, "__name__", "fn")
        self.queue = ctx.Queue()
        self.procs = [
            ctx.Process(
                target=_launch_child, args=(fn, nranks, r, uid, device, window_bytes, args, self.queue), daemon=True
            )
            for r in range(nranks)
        ]
        for p in self.procs:
            p.start()
        self.results: dict[int, tuple[bool, Any]] = {}
        self.after_failure = False  # the deadline became a failed rank's grace, not the launch timeout
        self.timed_out = False
        self.killed: set[int] = set()

    def collect(self, wait: float) -> None:
        """Takes the results already sent, each waited for at most ``wait`` s."""
        with contextlib.suppress(queue_mod.Empty):
            while len(self.results) < self.nranks:
                rank, ok, value = self.queue.get(timeout=wait)
                self.results[rank] = (ok, value)

    def wait(self, timeout: float | None) -> None:
        """Until every rank has answered or exited, the timeout passed, or a rank failed and its
        peers had their grace."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self.results) < self.nranks:
            self.collect(0.1)
            if any(not ok for ok, _ in self.results.values()):
                # A rank failed: its peers raise within MININCL_TIMEOUT; one stuck in its own code
                # never would, so the job ends soon after (as mpirun and torchrun end theirs).
                soon = time.monotonic() + _LAUNCH_GRACE_SECONDS
                if deadline is None or soon < deadline:
                    deadline, self.after_failure = soon, True
            if all(not p.is_alive() for p in self.procs) or (deadline is not None and time.monotonic() > deadline):
                self.collect(0.5)
                break
        self.timed_out = deadline is not None and not self.after_failure and time.monotonic() > deadline

    def reap(self) -> None:
        """Joins every rank, killing those still running."""
        # One wait for all of them, not 5 s each; none past the launch timeout (those left are stuck).
        join_by = time.monotonic() + (0.5 if self.timed_out else 5)
        for r, p in enumerate(self.procs):
            p.join(timeout=max(0.0, join_by - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
                self.killed.add(r)
        self.collect(0.5)  # (ranks that were waiting on a killed one: it is gone, they raised)

    def errors(self, timeout: float | None) -> dict[int, str]:
        """Each failed rank's story."""
        errors: dict[int, str] = {}
        for r, p in enumerate(self.procs):
            if r in self.killed and r not in self.results:
                why = (
                    "another rank failed"
                    if self.after_failure or timeout is None
                    else f"the launch timeout of {timeout} s"
                )
                errors[r] = f"still running after {why} (killed)"
            elif r not in self.results:
                errors[r] = _no_result_story(p.exitcode, self.fn_name)
            elif not self.results[r][0]:
                errors[r] = self.results[r][1]
        return errors


def launch(
    fn: Callable[..., Any],
    nranks: int,
    *args: Any,
    device: DeviceSpec = "cpu",
    timeout: float | None = None,
    window_bytes: int | None = None,
) -> list[Any]:
    """Runs ``fn(comm, *args)`` in ``nranks`` new local processes, one rank each.

    Returns the results in rank order. ``fn`` and ``args`` must be picklable (define ``fn``
    at module level). The processes are spawned: each imports the main script, so a script
    must call ``launch`` under ``if __name__ == "__main__":``. If a rank fails or dies,
    raises :class:`LaunchError` with every rank's story. ``timeout``: seconds after which
    ranks still running are killed (and named in the LaunchError). The rank processes end
    with the launching process (SIGTERM, on Linux) if it is killed. ``window_bytes``: each
    rank's window, as :class:`Communicator` takes it.
    """
    _check_launchable(fn, nranks)
    _window_bytes_setting(window_bytes)  # (refused here rather than in every rank)
    ranks = _LaunchedRanks(fn, nranks, args, device, window_bytes)
    ranks.wait(timeout)
    ranks.reap()
    errors = ranks.errors(timeout)
    if errors:
        ok = {r: v for r, (good, v) in ranks.results.items() if good}
        stories = "\n".join(f"rank {r}: {e}" for r, e in errors.items())
        first_lines = {r: e.split("\n", 1)[0] for r, e in errors.items()}
        raise LaunchError(f"launch: {len(errors)} rank(s) failed\n{stories}", ok, first_lines)
    return [ranks.results[r][1] for r in range(nranks)]
