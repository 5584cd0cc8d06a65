"""shrink (NCCL 2.27's ncclCommShrink): a new communicator without some ranks, made by the
others alone: after a peer died (processes), around live ranks that do not call (threads),
through the C API, and refused with a reason where the ranks kept disagree."""

from __future__ import annotations

import ctypes
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import workers
from conftest import run_ranks

import minincl
from minincl import LaunchError

MNCL_INVALID_ARGUMENT, MNCL_INVALID_USAGE, FLOAT32, SUM = 4, 5, 7, 0


def test_the_survivors_of_a_dead_rank_shrink_it_away(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """4 processes; rank 2 is killed mid-run. The others' calls fail naming it, then shrink
    makes a communicator of ranks 0, 1, 3 (new ranks 0, 1, 2) whose calls are right."""
    monkeypatch.setenv("MININCL_TIMEOUT", "5")
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as info:
        minincl.launch(workers.shrink_after_a_death, 4, 2, str(tmp_path), timeout=120)
    assert "rank 2: process killed by SIGKILL" in str(info.value)
    survivors = info.value.results
    assert sorted(survivors) == [0, 1, 3], survivors
    for old, (ended, rank, nranks, summed, ranks) in survivors.items():
        assert ended == "RemoteError", ended
        assert (rank, nranks) == ([0, 1, 3].index(old), 3)
        assert summed == [1.0 + 2.0 + 4.0] * 3
        assert ranks == [0, 1, 3]
    assert time.monotonic() - t0 < 60


def test_live_ranks_left_out_do_not_call_and_the_parent_still_works() -> None:
    comms = minincl.Communicator.init_all(4)
    try:

        def body(c: Any) -> tuple[int, int, list[float]] | None:
            if c.rank in (1, 3):
                return None
            with c.shrink([3, 1, 3]) as new:  # (any order; repeats count once)
                x = np.arange(4, dtype=np.float64) * (c.rank + 1)
                new.allreduce(x)
                return new.rank, new.nranks, x.tolist()

        results = run_ranks(comms, body)
        assert results[1] is None and results[3] is None
        assert results[0] == (0, 2, [0.0, 4.0, 8.0, 12.0])
        assert results[2] == (1, 2, [0.0, 4.0, 8.0, 12.0])
        # The parent is as it was: all four ranks still make calls on it.
        sums = run_ranks(comms, lambda c: c.allreduce(np.full(2, c.rank, np.int32)).tolist())
        assert sums == [[6, 6]] * 4
    finally:
        for c in comms:
            c.destroy()


def test_wrong_exclude_lists_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MININCL_BOOTSTRAP_TIMEOUT", "20")
    comms = minincl.Communicator.init_all(4)
    try:
        with pytest.raises(minincl.InvalidArgument, match="shrink: rank 0 excludes itself"):
            comms[0].shrink([0])
        with pytest.raises(minincl.InvalidArgument, match="shrink: rank 4 is out of range for 4 ranks"):
            comms[0].shrink([4])
        # Ranks 0 and 1 leave out rank 3, rank 2 leaves out ranks 1 and 3: rank 0, the lowest
        # kept in either view, compares what they were given; rank 3 makes no call.
        given = {0: [3], 1: [3], 2: [1, 3]}

        def body(c: Any) -> str:
            if c.rank == 3:
                return ""
            try:
                c.shrink(given[c.rank])
            except minincl.Error as e:
                return f"{type(e).__name__}: {e}"
            return "ok"

        results = run_ranks(comms, body)
        assert "InvalidUsage: shrink: rank(s) 2 were given other ranks to exclude than rank 0 was" in results[0], (
            results
        )
        assert all(
            r.startswith("InvalidUsage: shrink: the ranks kept were given different ranks") for r in results[1:3]
        )
    finally:
        for c in comms:
            c.destroy()


def test_c_api_shrink() -> None:
    lib = ctypes.CDLL(minincl._c_library.library_path())
    lib.mnclGetLastError.restype = ctypes.c_char_p
    arr = (ctypes.c_void_p * 3)()
    assert lib.mnclCommInitAll(arr, 3, None) == 0
    comms = [ctypes.c_void_p(arr[r]) for r in range(3)]
    news = [ctypes.c_void_p() for _ in range(3)]
    exclude = (ctypes.c_int * 1)(1)
    try:
        rc = lib.mnclCommShrink(comms[0], exclude, 1, ctypes.byref(news[0]), None, 7)
        assert rc == MNCL_INVALID_ARGUMENT
        assert b"shrinkFlags must be MNCL_SHRINK_DEFAULT or MNCL_SHRINK_ABORT, not 7" in lib.mnclGetLastError(None)
        codes = [-1] * 3

        def shrink(r: int, flags: int) -> None:
            codes[r] = lib.mnclCommShrink(comms[r], exclude, 1, ctypes.byref(news[r]), None, flags)

        threads = [threading.Thread(target=shrink, args=(r, r // 2)) for r in (0, 2)]  # (DEFAULT, ABORT)
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert codes[0] == codes[2] == 0, lib.mnclGetLastError(None)
        xs = [np.full(5, r + 1, np.float32) for r in (0, 2)]
        assert lib.mnclGroupStart() == 0
        for x, new in zip(xs, (news[0], news[2])):
            p = x.ctypes.data_as(ctypes.c_void_p)
            assert lib.mnclAllReduce(p, p, ctypes.c_size_t(5), FLOAT32, SUM, new, None) == 0
        assert lib.mnclGroupEnd() == 0, lib.mnclGetLastError(None)
        for x in xs:
            np.testing.assert_array_equal(x, np.full(5, 4.0, np.float32))
        count = ctypes.c_int(0)
        assert lib.mnclCommCount(news[2], ctypes.byref(count)) == 0 and count.value == 2
    finally:
        for c in [*news, *comms]:
            if c:
                lib.mnclCommDestroy(c)
