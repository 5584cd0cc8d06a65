"""The C API's NCCL-shaped extras, called through ctypes on CPU communicators: mnclBcast,
mnclGather, mnclScatter, mnclCommInitRankConfig and configs in mnclCommSplit (channel bounds,
nonblocking init, refused settings), inits inside a group, mnclCommFinalize, mnclCommCuDevice
and the queries' null checks. Results are checked against NumPy; channel counts against what init logs
(MININCL_DEBUG=INFO)."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_ranks

import minincl

MNCL_INVALID_ARGUMENT, MNCL_INVALID_USAGE, MNCL_REMOTE_ERROR, MNCL_IN_PROGRESS, MNCL_TIMEOUT, MNCL_ABORTED = (
    4,
    5,
    6,
    7,
    8,
    9,
)
MISSING_RANK = "only 1 of 2 ranks joined before the bootstrap timeout; missing ranks: 1"
FLOAT32, SUM = 7, 0
UNDEF = -(2**31)  # MNCL_CONFIG_UNDEF_INT
CONFIG_MAGIC = 0x6D6E636C


class Config(ctypes.Structure):
    """mnclConfig_t."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("blocking", ctypes.c_int),
        ("minCTAs", ctypes.c_int),
        ("maxCTAs", ctypes.c_int),
    ]


def config(**fields: int) -> Config:
    """MNCL_CONFIG_INITIALIZER, then `fields`."""
    c = Config(ctypes.sizeof(Config), CONFIG_MAGIC, 100, UNDEF, UNDEF, UNDEF)
    for name, value in fields.items():
        setattr(c, name, value)
    return c


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def open_lib(config_type: type[ctypes.Structure] = Config) -> Any:
    """The C library, with mnclCommInitRankConfig taking a pointer to `config_type` (a
    mnclConfig_t, or a test's extension of it)."""
    lib = ctypes.CDLL(minincl._c_library.library_path())
    lib.mnclGetLastError.restype = ctypes.c_char_p
    lib.mnclCommInitRankConfig.argtypes = [
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_int,
        UniqueId,
        ctypes.c_int,
        ctypes.POINTER(config_type),
    ]
    return lib


@pytest.fixture(scope="module")
def lib() -> Any:
    return open_lib()


def init_with_config(lib: Any, nranks: int, cfg: Config | None) -> list[Any]:
    """Every rank on a thread of its own, as separate processes would init."""
    uid = UniqueId()
    assert lib.mnclGetUniqueId(ctypes.byref(uid)) == 0
    comms = [ctypes.c_void_p() for _ in range(nranks)]
    results = [-1] * nranks

    def init(r: int) -> None:
        results[r] = lib.mnclCommInitRankConfig(ctypes.byref(comms[r]), nranks, uid, r, cfg)

    threads = [threading.Thread(target=init, args=(r,)) for r in range(nranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [0] * nranks, lib.mnclGetLastError(None)
    return comms


def allreduce_all(lib: Any, comms: list[Any], count: int) -> None:
    """One grouped float32 sum over `comms` (ranks in order), checked against NumPy."""
    xs = [np.arange(count, dtype=np.float32) * (r + 1) for r in range(len(comms))]
    want = np.sum(xs, axis=0, dtype=np.float32)
    assert lib.mnclGroupStart() == 0
    for x, c in zip(xs, comms):
        p = x.ctypes.data_as(ctypes.c_void_p)
        assert lib.mnclAllReduce(p, p, ctypes.c_size_t(count), FLOAT32, SUM, c, None) == 0
    assert lib.mnclGroupEnd() == 0, lib.mnclGetLastError(None)
    for x in xs:
        np.testing.assert_array_equal(x, want)


def destroy(lib: Any, comms: list[Any]) -> None:
    for c in comms:
        if c:
            lib.mnclCommDestroy(c)


@pytest.mark.parametrize("count", [0, 1, 1009, 300_007])
def test_bcast_is_an_in_place_broadcast(lib: Any, count: int) -> None:
    arr = (ctypes.c_void_p * 3)()
    assert lib.mnclCommInitAll(arr, 3, None) == 0
    comms = [ctypes.c_void_p(arr[r]) for r in range(3)]
    try:
        bufs = [np.full(count, -1.0, np.float32) for _ in range(3)]
        bufs[1][:] = np.arange(count, dtype=np.float32)
        assert lib.mnclGroupStart() == 0
        for b, c in zip(bufs, comms):
            assert lib.mnclBcast(b.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(count), FLOAT32, 1, c, None) == 0
        assert lib.mnclGroupEnd() == 0, lib.mnclGetLastError(None)
        for b in bufs:
            np.testing.assert_array_equal(b, np.arange(count, dtype=np.float32))
    finally:
        destroy(lib, comms)


@pytest.mark.parametrize("count", [0, 1, 1009, 300_007])
def test_gather_and_scatter(lib: Any, count: int) -> None:
    """mnclGather to root 2 (in place there), then mnclScatter from root 0, as NCCL 2.28's:
    every rank from one thread in a group; the buffers used at the root only are null elsewhere."""
    arr = (ctypes.c_void_p * 3)()
    assert lib.mnclCommInitAll(arr, 3, None) == 0
    comms = [ctypes.c_void_p(arr[r]) for r in range(3)]

    def ptr(a: np.ndarray) -> Any:
        return a.ctypes.data_as(ctypes.c_void_p)

    try:
        inputs = [np.arange(count, dtype=np.float32) + 1000 * r for r in range(3)]
        gathered = np.full(3 * count, -1.0, np.float32)
        gathered[2 * count :] = inputs[2]
        sends = [ptr(inputs[0]), ptr(inputs[1]), ptr(gathered[2 * count :])]
        assert lib.mnclGroupStart() == 0
        for r, c in enumerate(comms):
            recv = ptr(gathered) if r == 2 else None
            assert lib.mnclGather(sends[r], recv, ctypes.c_size_t(count), FLOAT32, 2, c, None) == 0
        assert lib.mnclGroupEnd() == 0, lib.mnclGetLastError(None)
        np.testing.assert_array_equal(gathered, np.concatenate(inputs))

        blocks, parts = gathered[::-1].copy(), [np.full(count, -1.0, np.float32) for _ in range(3)]
        assert lib.mnclGroupStart() == 0
        for r, c in enumerate(comms):
            send = ptr(blocks) if r == 0 else None
            assert lib.mnclScatter(send, ptr(parts[r]), ctypes.c_size_t(count), FLOAT32, 0, c, None) == 0
        assert lib.mnclGroupEnd() == 0, lib.mnclGetLastError(None)
        np.testing.assert_array_equal(np.concatenate(parts), blocks)

        rc = lib.mnclGather(sends[0], None, ctypes.c_size_t(count or 1), FLOAT32, 0, comms[0], None)
        assert rc == MNCL_INVALID_ARGUMENT
        assert b"gather: the receive buffer is null on the root (rank 0)" in lib.mnclGetLastError(comms[0])
        rc = lib.mnclScatter(None, None, ctypes.c_size_t(1), FLOAT32, 3, comms[0], None)
        assert rc == MNCL_INVALID_ARGUMENT
        assert b"scatter: root 3 is out of range for 3 ranks" in lib.mnclGetLastError(comms[0])
    finally:
        destroy(lib, comms)


def config_then_splits(lib: Any) -> None:
    """2 ranks with minCTAs = maxCTAs = 3, then a split without a config and one with
    maxCTAs = 1, an allreduce on each; a line on stderr before each step says which (init logs
    each communicator's channels after it)."""

    def stage(name: str) -> None:
        print(f"STAGE {name}", file=sys.stderr, flush=True)

    stage("config")
    comms = init_with_config(lib, 2, config(minCTAs=3, maxCTAs=3))
    split: list[Any] = []
    try:
        allreduce_all(lib, comms, 100_003)
        for name, cfg in (("split-inherits", None), ("split-max-1", config(maxCTAs=1))):
            stage(name)
            new = [ctypes.c_void_p() for _ in comms]
            results: list[Any] = [None, None]

            def do_split(r: int, cfg: Config | None = cfg, new: list[Any] = new, results: list[Any] = results) -> None:
                ptr = ctypes.byref(cfg) if cfg is not None else None
                rc = lib.mnclCommSplit(comms[r], 0, r, ctypes.byref(new[r]), ptr)
                results[r] = 0 if rc == 0 else (rc, lib.mnclGetLastError(None))

            threads = [threading.Thread(target=do_split, args=(r,)) for r in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            split.extend(new)
            assert results == [0, 0], results
            allreduce_all(lib, new, 5003)
        stage("end")
    finally:
        destroy(lib, split + comms)


def test_config_bounds_the_channels_and_splits_inherit_it(tmp_path: Path) -> None:
    """minCTAs = maxCTAs = 3 over MININCL_NCHANNELS=2: 3 channels, and right results on them;
    a split without a config keeps 3, one with maxCTAs = 1 takes 1. (In a process of its own:
    the log level is read once per process.)"""
    env = dict(os.environ, MININCL_NCHANNELS="2", MININCL_DEBUG="INFO", MININCL_DEBUG_SUBSYS="INIT")
    script = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_c_api as t; "
        "t.config_then_splits(t.open_lib())"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    stages = dict(part.split("\n", 1) for part in run.stderr.split("STAGE ")[1:])
    assert list(stages) == ["config", "split-inherits", "split-max-1", "end"], run.stderr[-3000:]
    for name, channels in (("config", 3), ("split-inherits", 3), ("split-max-1", 1)):
        logged = re.findall(r"rank (\d)/2: (\d+) channel\(s\)", stages[name])
        assert sorted(logged) == [("0", str(channels)), ("1", str(channels))], (name, stages[name])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"blocking": 2}, "config.blocking = 2: 1 (blocking) or 0"),
        ({"magic": 0}, "not set up from MNCL_CONFIG_INITIALIZER"),
        ({"minCTAs": -1}, "config.minCTAs = -1: a channel bound is >= 0"),
        ({"minCTAs": 4, "maxCTAs": 2}, "config.minCTAs = 4 is above maxCTAs = 2"),
        ({"maxCTAs": 65}, "at most 64 on this device"),
    ],
)
def test_config_refused_with_a_reason(lib: Any, fields: dict[str, int], message: str) -> None:
    uid = UniqueId()
    assert lib.mnclGetUniqueId(ctypes.byref(uid)) == 0
    comm = ctypes.c_void_p()
    cfg = config(**fields)
    assert lib.mnclCommInitRankConfig(ctypes.byref(comm), 1, uid, 0, ctypes.byref(cfg)) == MNCL_INVALID_ARGUMENT
    assert message in lib.mnclGetLastError(None).decode()
    assert not comm


def test_group_inits_the_ranks_from_one_thread(lib: Any) -> None:
    """mnclCommInitRank of every rank inside one group, on one thread (NCCL's way to make a
    rank per GPU from one thread): the group's end makes them all; they compute right."""
    uid = UniqueId()
    assert lib.mnclGetUniqueId(ctypes.byref(uid)) == 0
    comms = [ctypes.c_void_p() for _ in range(3)]
    try:
        assert lib.mnclGroupStart() == 0
        for r, c in enumerate(comms):
            assert lib.mnclCommInitRank(ctypes.byref(c), 3, uid, r) == 0
        assert lib.mnclGroupEnd() == 0, lib.mnclGetLastError(None)
        allreduce_all(lib, comms, 65_537)
    finally:
        destroy(lib, comms)


def test_async_error_says_in_progress_until_the_group_that_inits_ends(lib: Any) -> None:
    """mnclCommGetAsyncError on a communicator this thread's open group is making: success,
    with mnclInProgress as the value, before and after its init thread is done (once done, it
    used to return mnclInProgress itself and leave the value unwritten); mnclSuccess after."""
    uid = UniqueId()
    assert lib.mnclGetUniqueId(ctypes.byref(uid)) == 0
    comm = ctypes.c_void_p()
    try:
        assert lib.mnclGroupStart() == 0
        assert lib.mnclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0
        for delay in (0.0, 0.5):
            time.sleep(delay)
            state = ctypes.c_int(-1)
            assert lib.mnclCommGetAsyncError(comm, ctypes.byref(state)) == 0, delay
            assert state.value == MNCL_IN_PROGRESS, delay
        assert lib.mnclGroupEnd() == 0, lib.mnclGetLastError(None)
        state = ctypes.c_int(-1)
        assert lib.mnclCommGetAsyncError(comm, ctypes.byref(state)) == 0 and state.value == 0
    finally:
        destroy(lib, [comm])


def test_a_call_on_a_communicator_its_group_is_making_fails_the_group(lib: Any) -> None:
    """A call before the group's end finds its communicator unmade, even once the inits
    (which run on threads of their own) are done (it used to depend on their speed): it
    returns mnclInProgress without running, and fails the group. mnclGroupEnd used to return
    success with the call left out, silently; NCCL refuses such a call (ncclInvalidArgument)."""
    uid = UniqueId()
    assert lib.mnclGetUniqueId(ctypes.byref(uid)) == 0
    comms = [ctypes.c_void_p() for _ in range(2)]
    try:
        assert lib.mnclGroupStart() == 0
        for r, c in enumerate(comms):
            assert lib.mnclCommInitRank(ctypes.byref(c), 2, uid, r) == 0
        time.sleep(0.5)
        x = np.ones(4, np.float32)
        p = x.ctypes.data_as(ctypes.c_void_p)
        assert lib.mnclAllReduce(p, p, ctypes.c_size_t(4), FLOAT32, SUM, comms[0], None) == MNCL_IN_PROGRESS
        assert "use the communicator after mnclGroupEnd" in lib.mnclGetLastError(None).decode()
        assert lib.mnclGroupEnd() == MNCL_INVALID_USAGE
        why = lib.mnclGetLastError(None).decode()
        assert "none of the group's calls ran" in why and "still initializing" in why, why
        np.testing.assert_array_equal(x, np.ones(4, np.float32))
    finally:
        destroy(lib, comms)


def test_a_call_on_a_nonblocking_init_in_progress_fails_its_group(lib: Any) -> None:
    """Rank 0 calls allreduce in a group while its nonblocking init is still waiting for rank
    1: the call returns mnclInProgress, and mnclGroupEnd mnclInvalidUsage (it returned
    success, and rank 1's allreduce later waited for a call rank 0 never made)."""
    uid = UniqueId()
    assert lib.mnclGetUniqueId(ctypes.byref(uid)) == 0
    comm = ctypes.c_void_p()
    cfg = config(blocking=0)
    try:
        assert lib.mnclCommInitRankConfig(ctypes.byref(comm), 2, uid, 0, ctypes.byref(cfg)) == MNCL_IN_PROGRESS
        x = np.ones(4, np.float32)
        p = x.ctypes.data_as(ctypes.c_void_p)
        assert lib.mnclGroupStart() == 0
        assert lib.mnclAllReduce(p, p, ctypes.c_size_t(4), FLOAT32, SUM, comm, None) == MNCL_IN_PROGRESS
        assert lib.mnclGroupEnd() == MNCL_INVALID_USAGE
        assert "still initializing" in lib.mnclGetLastError(None).decode()
    finally:
        destroy(lib, [comm])


def poll_until_made(lib: Any, comms: list[Any], seconds: float = 60) -> list[int]:
    """mnclCommGetAsyncError on each until none says mnclInProgress; their last answers."""
    deadline = time.monotonic() + seconds
    while True:
        states = []
        for c in comms:
            state = ctypes.c_int(-1)
            assert lib.mnclCommGetAsyncError(c, ctypes.byref(state)) == 0
            states.append(state.value)
        if MNCL_IN_PROGRESS not in states or time.monotonic() > deadline:
            return states
        time.sleep(0.01)


def test_nonblocking_init(lib: Any) -> None:
    """config.blocking = 0: init returns mnclInProgress at once, so one thread starts both
    ranks; until rank 1 has started, rank 0 is in progress and refuses calls; then both are
    made and compute right."""
    uid = UniqueId()
    assert lib.mnclGetUniqueId(ctypes.byref(uid)) == 0
    cfg = config(blocking=0)
    comms = [ctypes.c_void_p() for _ in range(2)]
    try:
        assert lib.mnclCommInitRankConfig(ctypes.byref(comms[0]), 2, uid, 0, ctypes.byref(cfg)) == MNCL_IN_PROGRESS
        assert poll_until_made(lib, comms[:1], seconds=0) == [MNCL_IN_PROGRESS]  # (rank 1 has not started)
        x = np.ones(4, np.float32)
        p = x.ctypes.data_as(ctypes.c_void_p)
        assert lib.mnclAllReduce(p, p, ctypes.c_size_t(4), FLOAT32, SUM, comms[0], None) == MNCL_IN_PROGRESS
        assert "still initializing" in lib.mnclGetLastError(None).decode()
        assert lib.mnclCommInitRankConfig(ctypes.byref(comms[1]), 2, uid, 1, ctypes.byref(cfg)) == MNCL_IN_PROGRESS
        assert poll_until_made(lib, comms) == [0, 0]
        allreduce_all(lib, comms, 1009)
    finally:
        destroy(lib, comms)


@pytest.mark.parametrize("how", ["nonblocking", "group"])
def test_init_that_fails_in_the_background_says_why(lib: Any, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """Rank 1 of 2 never comes: a nonblocking init's state turns from in progress into the
    bootstrap's error (the root names the missing rank), which mnclGetLastError(comm)
    explains; a group's end returns it. Either way the handle is then destroyed at once."""
    monkeypatch.setenv("MININCL_BOOTSTRAP_TIMEOUT", "1")
    uid = UniqueId()
    assert lib.mnclGetUniqueId(ctypes.byref(uid)) == 0
    comm = ctypes.c_void_p()
    try:
        if how == "nonblocking":
            cfg = config(blocking=0)
            assert lib.mnclCommInitRankConfig(ctypes.byref(comm), 2, uid, 0, ctypes.byref(cfg)) == MNCL_IN_PROGRESS
            assert poll_until_made(lib, [comm]) == [MNCL_TIMEOUT]
            assert MISSING_RANK in lib.mnclGetLastError(comm).decode()
        else:
            assert lib.mnclGroupStart() == 0
            assert lib.mnclCommInitRank(ctypes.byref(comm), 2, uid, 0) == 0
            assert lib.mnclGroupEnd() == MNCL_TIMEOUT
            message = lib.mnclGetLastError(None).decode()
            assert "a communicator's init in this group failed" in message and MISSING_RANK in message, message
        count = ctypes.c_int(0)
        assert lib.mnclCommCount(comm, ctypes.byref(count)) == MNCL_TIMEOUT  # (its init's error: rank 1 never came)
        assert MISSING_RANK in lib.mnclGetLastError(None).decode()
    finally:
        start = time.monotonic()
        assert lib.mnclCommDestroy(comm) == 0
        assert time.monotonic() - start < 5


@pytest.mark.parametrize("stop", ["mnclCommDestroy", "mnclCommAbort"])
def test_destroy_or_abort_stops_a_nonblocking_init_waiting_for_its_peers(
    lib: Any, monkeypatch: pytest.MonkeyPatch, stop: str
) -> None:
    """Rank 1 never comes and the bootstrap would wait 60 s: destroying (or aborting) rank
    0's handle while its init waits stops that wait within a fraction of a second."""
    monkeypatch.setenv("MININCL_BOOTSTRAP_TIMEOUT", "60")
    uid = UniqueId()
    assert lib.mnclGetUniqueId(ctypes.byref(uid)) == 0
    comm = ctypes.c_void_p()
    cfg = config(blocking=0)
    assert lib.mnclCommInitRankConfig(ctypes.byref(comm), 2, uid, 0, ctypes.byref(cfg)) == MNCL_IN_PROGRESS
    time.sleep(0.3)
    assert poll_until_made(lib, [comm], seconds=0) == [MNCL_IN_PROGRESS]
    start = time.monotonic()
    assert getattr(lib, stop)(comm) == 0
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("when", ["before the group ends", "while the group ends"])
def test_a_watchdog_aborts_a_group_init(lib: Any, monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """Rank 0's mnclCommInitRank inside a group whose rank 1 never comes; another thread aborts
    the handle before mnclGroupEnd, or while mnclGroupEnd waits for that init. Both return
    within seconds (the abort stops the init), the group's end with the init's error, and
    nothing touches the freed handle (the group waited on it, joined its thread, or read its
    outcome from it before: a crash, a hang, or garbage)."""
    monkeypatch.setenv("MININCL_BOOTSTRAP_TIMEOUT", "60")
    uid = UniqueId()
    assert lib.mnclGetUniqueId(ctypes.byref(uid)) == 0
    comm = ctypes.c_void_p()
    assert lib.mnclGroupStart() == 0
    assert lib.mnclCommInitRank(ctypes.byref(comm), 2, uid, 0) == 0
    aborted: list[tuple[int, float]] = []

    def watchdog() -> None:
        if when == "while the group ends":
            time.sleep(0.5)
        start = time.monotonic()
        rc = lib.mnclCommAbort(comm)
        aborted.append((rc, time.monotonic() - start))

    thread = threading.Thread(target=watchdog)
    thread.start()
    if when == "before the group ends":
        thread.join(10)
    start = time.monotonic()
    rc = lib.mnclGroupEnd()
    group_end = time.monotonic() - start
    why = lib.mnclGetLastError(None).decode()
    thread.join(10)
    assert not thread.is_alive(), "mnclCommAbort still waits"
    assert aborted and aborted[0][0] == 0 and aborted[0][1] < 5, aborted
    assert rc != 0 and group_end < 5, (rc, group_end)
    assert "a communicator's init in this group failed" in why, why


def test_abort_stops_a_split_waiting_for_a_rank_that_never_splits(lib: Any) -> None:
    """Rank 0 calls mnclCommSplit on a thread; rank 1 never does. Another thread's
    mnclCommAbort stops the split (mnclAborted) at once, instead of after the bootstrap's
    timeout (59.5 s before, then mnclTimeout)."""
    arr = (ctypes.c_void_p * 2)()
    assert lib.mnclCommInitAll(arr, 2, None) == 0
    c0, c1 = ctypes.c_void_p(arr[0]), ctypes.c_void_p(arr[1])
    new = ctypes.c_void_p()
    split: list[int] = []
    thread = threading.Thread(target=lambda: split.append(lib.mnclCommSplit(c0, 0, 0, ctypes.byref(new), None)))
    try:
        thread.start()
        time.sleep(0.5)
        start = time.monotonic()
        assert lib.mnclCommAbort(c0) == 0
        took = time.monotonic() - start
        thread.join(10)
        assert not thread.is_alive() and split == [MNCL_ABORTED] and took < 5, (split, took)
        assert not new
    finally:
        lib.mnclCommDestroy(c1)


def test_split_refuses_a_nonblocking_config(lib: Any) -> None:
    """A split always blocks: a config asking otherwise is refused before the rendezvous (one
    thread splitting several ranks would wait for the others for ever)."""
    arr = (ctypes.c_void_p * 2)()
    assert lib.mnclCommInitAll(arr, 2, None) == 0
    comms = [ctypes.c_void_p(arr[r]) for r in range(2)]
    try:
        new = ctypes.c_void_p()
        cfg = config(blocking=0)
        assert lib.mnclCommSplit(comms[0], 0, 0, ctypes.byref(new), ctypes.byref(cfg)) == MNCL_INVALID_ARGUMENT
        assert "split always blocks" in lib.mnclGetLastError(None).decode()
        assert not new
        allreduce_all(lib, comms, 1009)  # (nothing was left half done)
    finally:
        destroy(lib, comms)


def test_a_split_refused_on_one_rank_fails_the_others_at_once(lib: Any) -> None:
    """Rank 2's config is refused (minCTAs = -3); it still meets the others, whose splits
    fail at once, naming it (they waited for the bootstrap timeout, 60 s, told to raise it);
    no rank made a communicator, and the parent still works."""
    arr = (ctypes.c_void_p * 3)()
    assert lib.mnclCommInitAll(arr, 3, None) == 0
    comms = [ctypes.c_void_p(arr[r]) for r in range(3)]
    new = [ctypes.c_void_p() for _ in comms]
    said: list[Any] = [None] * 3
    bad = config(minCTAs=-3)

    def split(r: int) -> None:
        rc = lib.mnclCommSplit(comms[r], 0, 0, ctypes.byref(new[r]), ctypes.byref(bad) if r == 2 else None)
        said[r] = (rc, lib.mnclGetLastError(None).decode())

    try:
        start = time.monotonic()
        run_ranks([0, 1, 2], split, timeout=30)
        assert time.monotonic() - start < 10, said
        assert said[2] == (MNCL_INVALID_ARGUMENT, "config.minCTAs = -3: a channel bound is >= 0"), said
        for r in (0, 1):
            assert said[r][0] == MNCL_REMOTE_ERROR and "split: rank(s) 2 refused their arguments" in said[r][1], said
        assert not any(new)
        allreduce_all(lib, comms, 1009)
    finally:
        destroy(lib, comms)


def test_finalize_refuses_a_communicator_this_threads_group_holds(lib: Any) -> None:
    """Finalize inside an open group that recorded calls on the communicator would return
    before those calls ran (they run at the group's end): refused, saying to end the group
    first; the group then runs its calls, and finalize works after it."""
    arr = (ctypes.c_void_p * 2)()
    assert lib.mnclCommInitAll(arr, 2, None) == 0
    comms = [ctypes.c_void_p(arr[r]) for r in range(2)]
    try:
        xs = [np.full(1009, r + 1, np.float32) for r in range(2)]
        assert lib.mnclGroupStart() == 0
        for x, c in zip(xs, comms):
            p = x.ctypes.data_as(ctypes.c_void_p)
            assert lib.mnclAllReduce(p, p, ctypes.c_size_t(1009), FLOAT32, SUM, c, None) == 0
        assert lib.mnclCommFinalize(comms[0]) == MNCL_INVALID_USAGE
        assert "end the group (mnclGroupEnd) before finalizing" in lib.mnclGetLastError(None).decode()
        assert lib.mnclGroupEnd() == 0, lib.mnclGetLastError(None)
        for x in xs:
            np.testing.assert_array_equal(x, np.full(1009, 3, np.float32))
        for c in comms:
            assert lib.mnclCommFinalize(c) == 0
    finally:
        destroy(lib, comms)


def test_finalize_then_no_more_operations(lib: Any) -> None:
    arr = (ctypes.c_void_p * 2)()
    assert lib.mnclCommInitAll(arr, 2, None) == 0
    comms = [ctypes.c_void_p(arr[r]) for r in range(2)]
    try:
        allreduce_all(lib, comms, 4099)
        for c in comms:
            assert lib.mnclCommFinalize(c) == 0
            assert lib.mnclCommFinalize(c) == 0  # (again: nothing more to wait for)
        x = np.ones(4, np.float32)
        p = x.ctypes.data_as(ctypes.c_void_p)
        assert lib.mnclAllReduce(p, p, ctypes.c_size_t(4), FLOAT32, SUM, comms[0], None) == MNCL_INVALID_USAGE
        assert "finalized" in lib.mnclGetLastError(None).decode()
        assert lib.mnclSend(p, ctypes.c_size_t(4), FLOAT32, 1, comms[0], None) == MNCL_INVALID_USAGE
        count = ctypes.c_int(0)
        assert lib.mnclCommCount(comms[1], ctypes.byref(count)) == 0 and count.value == 2  # queries still answer
    finally:
        destroy(lib, comms)


def test_finalize_waits_for_a_call_on_another_thread(lib: Any) -> None:
    """Rank 0's allreduce runs on a thread of its own and waits for rank 1, which comes 0.5 s
    later: finalize on rank 0, called meanwhile, returns only after that allreduce ended."""
    arr = (ctypes.c_void_p * 2)()
    assert lib.mnclCommInitAll(arr, 2, None) == 0
    comms = [ctypes.c_void_p(arr[r]) for r in range(2)]
    xs = [np.full(1000, r + 1, np.float32) for r in range(2)]
    ended: dict[str, float] = {}
    seen_at_finalize: list[np.ndarray] = []

    def allreduce(r: int, name: str) -> None:
        p = xs[r].ctypes.data_as(ctypes.c_void_p)
        assert lib.mnclAllReduce(p, p, ctypes.c_size_t(1000), FLOAT32, SUM, comms[r], None) == 0
        ended[name] = time.monotonic()

    def finalize() -> None:
        assert lib.mnclCommFinalize(comms[0]) == 0
        ended["finalize"] = time.monotonic()
        seen_at_finalize.append(xs[0].copy())  # (rank 0's result, as finalize returns)

    try:
        rank0 = threading.Thread(target=allreduce, args=(0, "rank 0"))
        rank0.start()
        time.sleep(0.1)
        finalizer = threading.Thread(target=finalize)
        finalizer.start()
        time.sleep(0.5)
        assert "finalize" not in ended and "rank 0" not in ended
        allreduce(1, "rank 1")
        rank0.join(30)
        finalizer.join(30)
        # (Rank 0's thread notes its time only after its call returned, which may come after
        # finalize noted its own: what finalize saw of the result is what tells.)
        assert seen_at_finalize, ended
        np.testing.assert_array_equal(seen_at_finalize[0], np.full(1000, 3, np.float32))
        for x in xs:
            np.testing.assert_array_equal(x, np.full(1000, 3, np.float32))
    finally:
        destroy(lib, comms)


def test_device_queries(lib: Any) -> None:
    arr = (ctypes.c_void_p * 1)()
    assert lib.mnclCommInitAll(arr, 1, None) == 0
    comm = ctypes.c_void_p(arr[0])
    try:
        device = ctypes.c_int(7)
        assert lib.mnclCommCuDevice(comm, ctypes.byref(device)) == 0 and device.value == -1  # MNCL_DEVICE_CPU
        for query in ("mnclCommCuDevice", "mnclCommDevice", "mnclCommCount", "mnclCommUserRank"):
            assert getattr(lib, query)(comm, None) == MNCL_INVALID_ARGUMENT, query
            assert "is null" in lib.mnclGetLastError(None).decode()
            assert getattr(lib, query)(None, None) == MNCL_INVALID_ARGUMENT, query
            assert "the communicator is null" in lib.mnclGetLastError(None).decode()  # (not the output)
    finally:
        lib.mnclCommDestroy(comm)


def test_init_all_refuses_rank_counts_it_cannot_start(lib: Any) -> None:
    """mnclCommInitAll starts a thread per rank: 2**22 + 1 of them aborted the process
    (std::system_error out of the thread's start) after 3 s. Now refused before any starts,
    as an init of that many ranks is, and each argument is named on its own."""
    arr = (ctypes.c_void_p * 1)()
    assert lib.mnclCommInitAll(arr, 2**22 + 1, None) == MNCL_INVALID_ARGUMENT
    assert "nranks=4194305 is more than minincl takes (4194304)" in lib.mnclGetLastError(None).decode()
    assert lib.mnclCommInitAll(arr, 0, None) == MNCL_INVALID_ARGUMENT
    assert lib.mnclGetLastError(None).decode() == "mnclCommInitAll: ndev=0 is less than 1"
    assert lib.mnclCommInitAll(None, 2, None) == MNCL_INVALID_ARGUMENT
    assert lib.mnclGetLastError(None).decode() == "mnclCommInitAll: comms is null"


def test_counts_whose_bytes_overflow_are_refused(lib: Any) -> None:
    # count x the element size used to wrap around: SIZE_MAX crashed, 2^62 + 1 floats copied one.
    arr = (ctypes.c_void_p * 1)()
    assert lib.mnclCommInitAll(arr, 1, None) == 0
    comm = ctypes.c_void_p(arr[0])
    x = np.arange(64, dtype=np.float32)
    p = x.ctypes.data_as(ctypes.c_void_p)
    try:
        for count in (2**64 - 1, 2**62 + 1, 2**62):
            assert lib.mnclAllReduce(p, p, ctypes.c_size_t(count), FLOAT32, SUM, comm, None) == MNCL_INVALID_ARGUMENT
            assert "is more bytes than a buffer can hold" in lib.mnclGetLastError(comm).decode()
        assert lib.mnclSend(p, ctypes.c_size_t(2**63), FLOAT32, 0, comm, None) == MNCL_INVALID_ARGUMENT
        np.testing.assert_array_equal(x, np.arange(64, dtype=np.float32))  # nothing written
        assert lib.mnclAllReduce(p, p, ctypes.c_size_t(64), FLOAT32, SUM, comm, None) == 0  # still usable
    finally:
        lib.mnclCommDestroy(comm)


@pytest.mark.parametrize("device", [-3, -100, -(2**31)])
def test_a_device_that_is_neither_a_gpu_nor_the_cpu_is_refused(lib: Any, device: int) -> None:
    uid = UniqueId()
    assert lib.mnclGetUniqueId(ctypes.byref(uid)) == 0
    comm = ctypes.c_void_p()
    assert lib.mnclCommInitRankDevice(ctypes.byref(comm), 1, uid, 0, device) == MNCL_INVALID_ARGUMENT
    assert f"device {device} is neither a CUDA device" in lib.mnclGetLastError(None).decode()


def test_a_rank_whose_init_fails_before_joining_fails_the_others_at_once(
    lib: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One thread inits 3 ranks in a group; rank 2 asks for a GPU this machine does not have.
    # The others used to wait MININCL_BOOTSTRAP_TIMEOUT for it, then name it as missing.
    monkeypatch.setenv("MININCL_BOOTSTRAP_TIMEOUT", "30")
    missing_gpu = max(5, minincl.gpu_count())
    uid = UniqueId()
    assert lib.mnclGetUniqueId(ctypes.byref(uid)) == 0
    comms = [ctypes.c_void_p() for _ in range(3)]
    assert lib.mnclGroupStart() == 0
    for r, device in enumerate([-1, -1, missing_gpu]):
        lib.mnclCommInitRankDevice(ctypes.byref(comms[r]), 3, uid, r, device)
    rc = lib.mnclGroupEnd()
    message = lib.mnclGetLastError(None).decode()
    try:
        assert rc == MNCL_REMOTE_ERROR, message
        assert f"rank 2 could not make its communicator: device cuda:{missing_gpu}" in message, message
    finally:
        destroy(lib, comms)


@pytest.mark.parametrize("dtype", [-1, 12, 255])
def test_an_unknown_data_type_is_named_as_passed(lib: Any, dtype: int) -> None:
    arr = (ctypes.c_void_p * 1)()
    assert lib.mnclCommInitAll(arr, 1, None) == 0
    comm = ctypes.c_void_p(arr[0])
    x = np.zeros(4, np.float32)
    p = x.ctypes.data_as(ctypes.c_void_p)
    try:
        assert lib.mnclAllReduce(p, p, ctypes.c_size_t(4), dtype, SUM, comm, None) == MNCL_INVALID_ARGUMENT
        assert lib.mnclGetLastError(comm).decode().endswith(f"unknown data type {dtype}")  # (-1 read 255)
        assert lib.mnclSend(p, ctypes.c_size_t(4), dtype, 0, comm, None) == MNCL_INVALID_ARGUMENT
        assert lib.mnclGetLastError(comm).decode().endswith(f"unknown data type {dtype}")
    finally:
        lib.mnclCommDestroy(comm)


@pytest.mark.parametrize("refused", ["allreduce", "recv"])
def test_a_call_refused_in_a_group_fails_the_group(lib: Any, refused: str) -> None:
    """One thread's group holding both ranks' calls, one of them refused (an unknown data
    type, a null buffer): mnclGroupEnd runs none of them and returns that error, as NCCL's (it
    ran rank 0's and waited for ever for rank 1's). Nothing is logged or counted for the
    dropped calls, so the communicators then work on."""
    arr = (ctypes.c_void_p * 2)()
    assert lib.mnclCommInitAll(arr, 2, None) == 0
    comms = [ctypes.c_void_p(arr[r]) for r in range(2)]
    try:
        x = np.full(3, 5, np.float32)
        p = x.ctypes.data_as(ctypes.c_void_p)
        n = ctypes.c_size_t(3)
        assert lib.mnclGroupStart() == 0
        if refused == "allreduce":
            assert lib.mnclAllReduce(p, p, n, FLOAT32, SUM, comms[0], None) == 0
            assert lib.mnclAllReduce(p, p, n, 77, SUM, comms[1], None) == MNCL_INVALID_ARGUMENT
            why = "unknown data type 77"
        else:
            assert lib.mnclSend(p, n, FLOAT32, 1, comms[0], None) == 0
            assert lib.mnclRecv(None, n, FLOAT32, 0, comms[1], None) == MNCL_INVALID_ARGUMENT
            why = "recv: the buffer is null"
        start = time.monotonic()
        assert lib.mnclGroupEnd() == MNCL_INVALID_ARGUMENT
        assert time.monotonic() - start < 10
        assert lib.mnclGetLastError(None).decode() == (
            f"none of the group's calls ran, as one of them was refused: {why}"
        )
        np.testing.assert_array_equal(x, np.full(3, 5, np.float32))
        allreduce_all(lib, comms, 1009)
        allreduce_all(lib, comms, 7)
    finally:
        destroy(lib, comms)


@pytest.mark.parametrize("refused", ["last", "first"])
def test_an_init_refused_in_a_group_stops_the_groups_other_inits(lib: Any, refused: str) -> None:
    """A rank out of range is refused by mnclCommInitRank itself inside a group too (it used
    to start, and the group's end said RemoteError); the group's other inits then stop, or
    never start, instead of waiting for a rank that never comes."""
    uid = UniqueId()
    assert lib.mnclGetUniqueId(ctypes.byref(uid)) == 0
    comms = [ctypes.c_void_p() for _ in range(3)]
    try:
        assert lib.mnclGroupStart() == 0
        order = [0, 1, 2] if refused == "last" else [2, 0, 1]
        for r in order:
            rc = lib.mnclCommInitRank(ctypes.byref(comms[r]), 3, uid, 5 if r == 2 else r)
            assert rc == (MNCL_INVALID_ARGUMENT if r == 2 else 0)
            if r == 2:
                assert lib.mnclGetLastError(None).decode() == "rank 5 is out of range for nranks=3"
        start = time.monotonic()
        assert lib.mnclGroupEnd() == MNCL_INVALID_ARGUMENT
        assert time.monotonic() - start < 10  # (not the 60 s bootstrap timeout)
        assert lib.mnclGetLastError(None).decode().endswith("was refused: rank 5 is out of range for nranks=3")
        assert not comms[2]
    finally:
        destroy(lib, comms)


def test_an_init_refused_up_front_fails_the_other_ranks_at_once(lib: Any) -> None:
    """A rank out of range, refused by mnclCommInitRank before it joins, still tells the root:
    the other ranks fail at once naming it, not at the bootstrap timeout."""
    uid = UniqueId()
    assert lib.mnclGetUniqueId(ctypes.byref(uid)) == 0
    comm = ctypes.c_void_p()
    result: list[Any] = []

    def rank0() -> None:
        start = time.monotonic()
        result.append(lib.mnclCommInitRank(ctypes.byref(comm), 2, uid, 0))
        result.append(lib.mnclGetLastError(None).decode())
        result.append(time.monotonic() - start)

    t = threading.Thread(target=rank0)
    t.start()
    bad = ctypes.c_void_p()
    assert lib.mnclCommInitRank(ctypes.byref(bad), 2, uid, 5) == MNCL_INVALID_ARGUMENT
    t.join(60)
    assert result[0] == MNCL_REMOTE_ERROR, result
    assert "rank 5 could not make its communicator: rank 5 is out of range for nranks=2" in result[1], result
    assert result[2] < 10, result


def test_last_errors_of_two_communicators_stay_readable(lib: Any) -> None:
    """mnclGetLastError(comm) of a failed communicator stays valid while it lives: two in one
    printf used to read freed memory (the second call freed the first's text)."""
    arr = (ctypes.c_void_p * 2)()
    assert lib.mnclCommInitAll(arr, 2, None) == 0
    comms = [ctypes.c_void_p(arr[r]) for r in range(2)]
    try:
        xs = [np.zeros(20, np.float32) for _ in range(2)]

        def call(r: int) -> None:
            p = xs[r].ctypes.data_as(ctypes.c_void_p)
            lib.mnclAllReduce(p, p, ctypes.c_size_t(10 + 10 * r), FLOAT32, SUM, comms[r], None)

        threads = [threading.Thread(target=call, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        get = lib.mnclGetLastError
        raw = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(("mnclGetLastError", lib))
        first = raw(comms[1])
        text = ctypes.string_at(first).decode()
        assert "mismatched calls" in text
        assert "mismatched calls" in get(comms[0]).decode()
        assert ctypes.string_at(first).decode() == text
    finally:
        destroy(lib, comms)
