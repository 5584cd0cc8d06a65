"""shrink (NCCL 2.27's ncclCommShrink): a new communicator without some ranks, made by the
others alone: after a peer died (processes), around live ranks that do not call (threads),
through the C API, and refused with a reason where the ranks kept disagree."""

from __future__ import annotations

import ctypes
import re
import signal
import subprocess
import sys
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

MNCL_INVALID_ARGUMENT, MNCL_INVALID_USAGE, MNCL_REMOTE_ERROR, MNCL_ABORTED, INT32, FLOAT32, SUM = 4, 5, 6, 9, 2, 7, 0
MNCL_SHRINK_DEFAULT, MNCL_SHRINK_ABORT = 0, 1


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_the_survivors_of_a_dead_rank_shrink_it_away(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, how: str) -> None:
    """4 processes; rank 2 is killed mid-run, or stops (SIGSTOP) and is given up on after
    MININCL_TIMEOUT. The others' calls fail naming it, lost_ranks() lists it, then shrink with
    that list makes a communicator of ranks 0, 1, 3 (new ranks 0, 1, 2) whose calls are right."""
    sig = signal.SIGKILL if how == "killed" else signal.SIGSTOP
    monkeypatch.setenv("MININCL_TIMEOUT", "5" if how == "killed" else "2")
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as info:
        minincl.launch(workers.shrink_after_a_death, 4, 2, str(tmp_path), int(sig), timeout=120)
    assert "rank 2: process killed by SIGKILL" in str(info.value)
    survivors = info.value.results
    assert sorted(survivors) == [0, 1, 3], survivors
    for old, (ended, lost, rank, nranks, summed, ranks) in survivors.items():
        want = ("RemoteError",) if how == "killed" else ("Timeout", "RemoteError")  # (from a survivor that timed out)
        assert ended in want and lost == [2], (ended, lost)
        assert (rank, nranks) == ([0, 1, 3].index(old), 3)
        assert summed == [1.0 + 2.0 + 4.0] * 3
        assert ranks == [0, 1, 3]
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("how", ["", "hang"])
def test_the_example_training_survives_a_lost_rank(how: str) -> None:
    """examples/survive_a_lost_rank.py: 4 ranks of gradient descent, rank 2 dies (or hangs) at
    step 7; the survivors shrink it away and end with one process's weights (it checks them)."""
    example = Path(__file__).resolve().parent.parent / "examples" / "survive_a_lost_rank.py"
    done = subprocess.run(
        [sys.executable, str(example), *([how] if how else [])], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("lost [2], weights within") == 3 and done.stdout.endswith("ok\n"), done.stdout


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
        # The parent is as it was: all four ranks still make calls on it, and split it (whose
        # rendezvous tags must not have moved on the ranks kept alone).
        sums = run_ranks(comms, lambda c: c.allreduce(np.full(2, c.rank, np.int32)).tolist())
        assert sums == [[6, 6]] * 4

        def split_then_sum(c: Any) -> list[int]:
            with c.split(c.rank % 2) as half:
                return half.allreduce(np.full(2, c.rank, np.int32)).tolist()

        assert run_ranks(comms, split_then_sum) == [[2, 2], [4, 4], [2, 2], [4, 4]]

        def shrink_again(c: Any) -> int | None:  # (rank 1, left out before, now the lowest kept)
            if c.rank == 0:
                return None
            with c.shrink([0]) as new:
                return int(new.allreduce(np.ones(1, np.int64))[0])

        assert run_ranks(comms, shrink_again) == [None, 3, 3, 3]
    finally:
        for c in comms:
            c.destroy()


def test_lost_ranks_are_those_that_left() -> None:
    """Threads of one process: a rank that destroyed its communicator is lost to the others
    (its process lives on: test_the_survivors_of_a_dead_rank_shrink_it_away has one that died)."""
    comms = minincl.Communicator.init_all(3)
    try:
        assert [c.lost_ranks() for c in comms] == [[], [], []]
        comms[1].destroy()
        assert comms[0].lost_ranks() == [1] and comms[2].lost_ranks() == [1]
        others = minincl.Communicator.init_all(3)
        try:
            others[2].abort()  # (its state says failed, not left: it is gone all the same)
            assert others[0].lost_ranks() == [2] and others[1].lost_ranks() == [2]
        finally:
            for c in others:
                c.destroy()
        with pytest.raises(minincl.InvalidUsage, match="destroyed"):
            comms[1].lost_ranks()
        lost = run_ranks([comms[0], comms[2]], lambda c: c.lost_ranks())
        news = run_ranks([comms[0], comms[2]], lambda c: c.shrink(lost[0]))
        try:
            assert run_ranks(news, lambda c: c.allreduce(np.ones(2, np.int8)).tolist()) == [[2, 2]] * 2
        finally:
            for c in news:
                c.destroy()
    finally:
        for c in comms:
            c.destroy()


def test_a_rank_that_aborted_is_lost_and_shrunk_away() -> None:
    """3 processes; rank 1 aborts its communicator and its process lives on. The others' call
    fails, lost_ranks() names rank 1, and shrink with that list works."""
    got = minincl.launch(workers.shrink_after_an_abort, 3, 1, timeout=60)
    assert got[1] == "aborted"
    for old in (0, 2):
        ended, lost, rank, nranks, summed = got[old]
        assert ended == "RemoteError" and lost == [1], got[old]
        assert (rank, nranks, summed) == (old // 2, 2, [4.0] * 3), got[old]


@pytest.mark.parametrize(
    ("victim", "first", "said"),
    [
        (3, {0: [], 1: [], 2: []}, "shrink: rank 3 is kept but gone (lost_ranks() lists it"),
        (0, {1: [], 2: [], 3: []}, "shrink: rank 0 is kept but gone (lost_ranks() lists it)"),
        (3, {0: [], 1: [3], 2: [3]}, "shrink: rank 3 is kept but gone (lost_ranks() lists it"),
        (3, {0: [3], 1: [], 2: [3]}, "were given other ranks to exclude than rank 0"),
        (3, {0: [], 1: [], 2: []}, "shrink: rank 3 is kept but gone (lost_ranks() lists it"),
    ],
    ids=["all keep it", "the leader is gone", "the leader keeps it", "a member keeps it", "all keep it, hung"],
)
def test_a_dead_rank_kept_fails_the_shrink_at_once_and_a_retry_works(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    victim: int,
    first: dict[int, list[int]],
    said: str,
    request: pytest.FixtureRequest,
) -> None:
    """4 processes, the victim killed (or stopped, and given up on after MININCL_TIMEOUT). A
    first shrink that keeps it can never complete: every survivor fails at once (it waited
    MININCL_BOOTSTRAP_TIMEOUT before), the lowest rank kept naming the rank gone or the ranks
    whose lists differ, the others what it found; then a shrink that excludes it works."""
    hung = "hung" in request.node.callspec.id
    monkeypatch.setenv("MININCL_TIMEOUT", "2" if hung else "5")
    monkeypatch.setenv("MININCL_BOOTSTRAP_TIMEOUT", "30")
    sig = int(signal.SIGSTOP if hung else signal.SIGKILL)
    with pytest.raises(LaunchError) as info:
        minincl.launch(workers.shrink_with_a_wrong_list_first, 4, victim, str(tmp_path), first, sig, timeout=120)
    survivors = info.value.results
    assert sorted(survivors) == sorted(first), survivors
    kept = sorted(first)
    for old, (ended, rank, nranks, summed) in survivors.items():
        assert ended.startswith("InvalidUsage after 0."), (old, ended)  # (well within a second)
        assert (rank, nranks, summed) == (kept.index(old), 3, [float(sum(r + 1 for r in kept))] * 3), survivors
    assert any(said in ended for ended, *_ in survivors.values()), survivors
    assert all("every rank kept must" in ended for ended, *_ in survivors.values()), survivors


@pytest.mark.parametrize("how", ["split", "shrink"])
def test_a_member_that_dies_after_the_rendezvous_fails_the_new_init_at_once(
    monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A member of a split (or shrink) that dies between the rendezvous on the parent and the
    new group's init never joins: the others' init used to wait MININCL_BOOTSTRAP_TIMEOUT
    though the parent already listed it lost; it fails at once now, naming it."""
    monkeypatch.setenv("MININCL_BOOTSTRAP_TIMEOUT", "30")
    with pytest.raises(LaunchError) as info:
        minincl.launch(workers.dies_after_the_rendezvous, 4, how, timeout=120)
    survivors = info.value.results
    assert sorted(survivors) == [0, 1, 3], survivors
    # Rank 0, the lowest rank, hosts the new group's root: it names the rank that exited. The
    # others fail as fast, naming it too, or the root that closed, or rank 0 once it exited.
    gone = re.search(r"^RemoteError after 0\.\d s: rank\(s\) ([\d, ]+) of the communicator split", survivors[0])
    assert gone and "2" in gone.group(1).split(", "), survivors[0]
    assert "exited (lost_ranks() lists them)" in survivors[0], survivors[0]
    for story in (survivors[1], survivors[3]):
        assert re.match(r"^(RemoteError|InvalidUsage) after 0\.\d s: ", story), story


@pytest.mark.parametrize("how", ["split", "shrink"])
def test_a_member_on_another_host_that_dies_after_the_rendezvous_fails_the_new_init_at_once(
    monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The same with every rank posing as a host of its own: rank 2's pid says nothing to the
    others, but its control connection ends without its saying it left or failed (a member
    that destroys its parent after its own init says it left first). The others waited
    MININCL_BOOTSTRAP_TIMEOUT (30 s here); they fail at once now, naming it."""
    monkeypatch.setenv("MININCL_BOOTSTRAP_TIMEOUT", "30")
    said = workers.as_hosts(workers.dies_after_the_rendezvous, "ABCD", how)
    assert said[2] == "died", said
    gone = re.match(r"^RemoteError after 0\.\d s: rank\(s\) ([\d, ]+) of the communicator split", said[0])
    assert gone and "2" in gone.group(1).split(", "), said
    assert "exited (or lost their network connection)" in said[0], said
    for story in (said[1], said[3]):  # (it, or rank 0's root, gone once rank 0 failed)
        assert re.match(r"^(RemoteError|InvalidUsage) after 0\.\d s: ", story), said


@pytest.mark.parametrize("how", ["split", "shrink"])
def test_a_member_that_stops_after_the_rendezvous_fails_the_new_init_at_the_timeout(
    monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A member that stops (SIGSTOP) between the rendezvous and the new group's init: the
    parent gives up on it after MININCL_TIMEOUT, and the others' init fails then, naming it
    (it waited MININCL_BOOTSTRAP_TIMEOUT, the watch looking only for exited processes)."""
    monkeypatch.setenv("MININCL_TIMEOUT", "2")
    monkeypatch.setenv("MININCL_BOOTSTRAP_TIMEOUT", "60")
    with pytest.raises(LaunchError) as info:
        minincl.launch(workers.stops_after_the_rendezvous, 3, how, timeout=15)
    survivors = info.value.results
    assert sorted(survivors) == [0, 1], survivors
    for story in survivors.values():
        # (the first to fail may exit before the other looks: it is named as exited too)
        named = re.match(r"^(Timeout|RemoteError) after (\d+\.\d) s: rank\(s\) .*showed no sign of life", story)
        assert named and float(named.group(2)) < 10, story
        assert re.search(r"(rank\(s\) |, )2 (of the communicator split \(or shrunk\) )?showed no sign", story), story


@pytest.mark.parametrize("how", ["split", "shrink"])
def test_abort_stops_the_new_init_of_a_split_or_shrink(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """Rank 0 aborts its communicator while its split's (or shrink's) new init waits for a
    rank that comes 6 s late: the init raises Aborted at once (it went on, and made the new
    communicator when the late rank came)."""
    monkeypatch.setenv("MININCL_BOOTSTRAP_TIMEOUT", "30")
    results = minincl.launch(workers.aborts_while_a_member_is_late, 3, how, timeout=60)
    aborted = re.match(r"^Aborted after (\d+\.\d) s: the communicator was aborted", results[0])
    assert aborted and float(aborted.group(1)) < 4, results
    assert results[2] == "late", results


def test_the_member_hosting_the_new_groups_root_dying_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lowest member of a split hosts the new group's bootstrap root; it is killed while
    the others wait there: each names rank 0, a RemoteError. (Their connections to the root
    closed, or were reset, as its process went, a moment before the watch for exited members
    could see it gone: a RemoteError "the peer closed the connection ... did the root's
    process exit?" or a SystemError "connection reset by peer", in 4 of 24 stories in a trial.)"""
    monkeypatch.setenv("MININCL_BOOTSTRAP_TIMEOUT", "30")
    for _ in range(3):
        with pytest.raises(LaunchError) as info:
            minincl.launch(workers.root_host_dies_in_the_new_init, 3, timeout=120)
        survivors = info.value.results
        assert sorted(survivors) == [1, 2], survivors
        for story in survivors.values():
            assert story.startswith("RemoteError: rank(s) 0 of the communicator split (or shrunk) exited"), story


def test_wrong_exclude_lists_are_refused() -> None:
    comms = minincl.Communicator.init_all(4)
    try:
        with minincl.group():  # (one thread would wait for itself: refused at once)
            for what in (lambda: comms[0].shrink([3]), lambda: comms[0].split(0)):
                with pytest.raises(
                    minincl.InvalidUsage, match="Communicator.split / shrink inside a group is not supported"
                ):
                    what()
        with pytest.raises(minincl.InvalidArgument, match="shrink: rank 0 excludes itself"):
            comms[0].shrink([0])
        with pytest.raises(minincl.InvalidArgument, match="shrink: rank 4 is out of range for 4 ranks"):
            comms[0].shrink([4])
    finally:
        for c in comms:
            c.destroy()


def test_a_split_refused_on_one_rank_fails_the_others_at_once() -> None:
    """A color past 32 bits is refused (a TypeError from the binding would not name it). The
    refused rank still meets the others, whose splits then fail at once, naming it: they
    waited for the bootstrap timeout (60 s) before, told to raise it."""
    comms = minincl.Communicator.init_all(3)
    said: dict[int, str] = {}

    def split(rank: int) -> None:
        try:
            comms[rank].split(2**31 + 5 if rank == 1 else 0)
            said[rank] = "made"
        except minincl.Error as e:
            said[rank] = f"{type(e).__name__}: {e}"

    try:
        start = time.monotonic()
        run_ranks([0, 1, 2], split, timeout=30)
        assert time.monotonic() - start < 10, said
        assert said[1] == "InvalidArgument: split: color 2147483653 does not fit in 32 bits (as ncclCommSplit's int)"
        for r in (0, 2):
            assert said[r].startswith("RemoteError: split: rank(s) 1 refused their arguments"), said
        x = [np.full(4, r + 1.0, np.float32) for r in range(3)]
        run_ranks(comms, lambda c: c.allreduce(x[c.rank]))  # (the communicator is as it was)
        for a in x:
            np.testing.assert_array_equal(a, np.full(4, 6.0, np.float32))
    finally:
        for c in comms:
            c.destroy()


@pytest.mark.parametrize("ranks", ["threads", "processes"])
def test_a_split_fails_at_once_where_a_rank_destroyed_the_communicator_instead(ranks: str) -> None:
    """A rank that destroys its communicator, alive, instead of splitting it never meets the
    others: their splits fail at once naming it (those waiting on the bootstrap ring behind
    it waited for the bootstrap timeout, 60 s, and were told ranks may start slowly)."""
    start = time.monotonic()
    if ranks == "processes":
        said = minincl.launch(workers.split_beside_a_rank_that_destroys, 4, timeout=60)[:3]
    else:
        comms = minincl.Communicator.init_all(4)
        outcome: dict[int, str] = {}

        def split_or_destroy(rank: int) -> None:
            if rank == 3:
                time.sleep(0.2)
                comms[3].destroy()
                return
            try:
                comms[rank].split(rank % 2)
                outcome[rank] = "made"
            except minincl.Error as e:
                outcome[rank] = f"{type(e).__name__}: {e}"

        try:
            run_ranks([0, 1, 2, 3], split_or_destroy, timeout=60)
        finally:
            for c in comms:
                c.destroy()
        said = [outcome[r] for r in range(3)]
    assert time.monotonic() - start < 20, said
    assert all(
        s.startswith("RemoteError: split: rank(s) 3 destroyed or aborted the communicator before the ranks met")
        for s in said
    ), said


@pytest.mark.parametrize(
    "given",
    [
        {0: [3], 1: [3], 2: [1, 3]},  # the same lowest rank kept: it names who differs
        {0: [2, 3], 1: [0, 3]},  # different lowest ranks kept: each waits for another leader
        {0: [3], 1: [3], 2: [7]},  # rank 2's list is refused at once; the others wait for it
    ],
)
def test_ranks_that_disagree_fail(monkeypatch: pytest.MonkeyPatch, given: dict[int, list[int]]) -> None:
    monkeypatch.setenv("MININCL_BOOTSTRAP_TIMEOUT", "3")
    comms = minincl.Communicator.init_all(4)
    try:

        def body(c: Any) -> str:
            if c.rank not in given:
                return ""
            try:
                c.shrink(given[c.rank])
            except minincl.Error as e:
                return f"{type(e).__name__}: {e}"
            return "ok"

        t0 = time.monotonic()
        results = [r for r in run_ranks(comms, body) if r]
        assert time.monotonic() - t0 < 30
        assert all(
            r.startswith(("InvalidUsage: shrink:", "InvalidArgument: shrink:", "Timeout: shrink:")) for r in results
        )
        if 2 in given and given[2] == [7]:
            assert "shrink: rank 7 is out of range for 4 ranks" in results[2]
        if 2 in given and given[2] == [1, 3]:
            assert "were given other ranks to exclude than rank 0 was" in results[0], results
        waited = [r for r in results if r.startswith("Timeout")]
        assert all("every rank kept must call shrink with the same ranks to exclude" in r for r in waited), results

        def agree(c: Any) -> int | None:  # (then a shrink the ranks agree on works)
            if c.rank == 3:
                return None
            with c.shrink([3]) as new:
                return int(new.allreduce(np.ones(1, np.int32))[0])

        assert run_ranks(comms, agree) == [3, 3, 3, None]
    finally:
        for c in comms:
            c.destroy()


def c_api_ranks(n: int) -> tuple[Any, list[ctypes.c_void_p]]:
    """The C library (errors as bytes) and n ranks of one mnclCommInitAll."""
    lib = ctypes.CDLL(minincl._c_library.library_path())
    lib.mnclGetLastError.restype = ctypes.c_char_p
    arr = (ctypes.c_void_p * n)()
    assert lib.mnclCommInitAll(arr, n, None) == 0
    return lib, [ctypes.c_void_p(arr[r]) for r in range(n)]


def test_c_api_shrink() -> None:
    """3 ranks; rank 1 is left out and makes no call. Rank 0 has an allreduce hung on another
    thread (rank 1 never joins it) and shrinks with MNCL_SHRINK_ABORT, which stops it; rank 2
    shrinks with MNCL_SHRINK_DEFAULT. The new communicator's allreduce is right."""
    lib, comms = c_api_ranks(3)
    news = [ctypes.c_void_p() for _ in range(3)]
    exclude = (ctypes.c_int * 1)(1)
    try:
        assert lib.mnclGroupStart() == 0  # (one thread splitting or shrinking several ranks waits for itself)
        rc = lib.mnclCommShrink(comms[0], exclude, 1, ctypes.byref(news[0]), None, 0)
        split = lib.mnclCommSplit(comms[0], 0, 0, ctypes.byref(news[0]), None)
        assert lib.mnclGroupEnd() == 0
        assert rc == split == MNCL_INVALID_USAGE and not news[0]
        assert b"mnclCommSplit inside a group is not supported" in lib.mnclGetLastError(None)
        rc = lib.mnclCommShrink(comms[0], exclude, 1, ctypes.byref(news[0]), None, 7)
        assert rc == MNCL_INVALID_ARGUMENT
        assert b"shrinkFlags must be MNCL_SHRINK_DEFAULT or MNCL_SHRINK_ABORT, not 7" in lib.mnclGetLastError(None)
        bad = (ctypes.c_int * 1)(5)  # (refused before the abort: the parent is untouched)
        assert (
            lib.mnclCommShrink(comms[0], bad, 1, ctypes.byref(news[0]), None, MNCL_SHRINK_ABORT)
            == MNCL_INVALID_ARGUMENT
        )
        state = ctypes.c_int(-1)
        assert lib.mnclCommGetAsyncError(comms[0], ctypes.byref(state)) == 0 and state.value == 0

        hung = np.ones(5, np.float32)
        codes = {}

        def allreduce_that_hangs() -> None:
            p = hung.ctypes.data_as(ctypes.c_void_p)
            codes["allreduce"] = lib.mnclAllReduce(p, p, ctypes.c_size_t(5), FLOAT32, SUM, comms[0], None)

        def shrink(r: int, flags: int) -> None:
            codes[r] = lib.mnclCommShrink(comms[r], exclude, 1, ctypes.byref(news[r]), None, flags)

        waiting = threading.Thread(target=allreduce_that_hangs)
        waiting.start()
        time.sleep(0.2)
        assert "allreduce" not in codes  # (still waiting for ranks 1 and 2)
        threads = [threading.Thread(target=shrink, args=a) for a in ((0, MNCL_SHRINK_ABORT), (2, MNCL_SHRINK_DEFAULT))]
        for t in [*threads]:
            t.start()
        for t in [waiting, *threads]:
            t.join(60)
        assert codes == {"allreduce": MNCL_ABORTED, 0: 0, 2: 0}, (codes, lib.mnclGetLastError(None))
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


def test_c_api_lost_ranks_feed_shrink() -> None:
    """mnclCommLostRanks: 4 ranks, rank 2 destroys its communicator; the others list it (count
    alone with NULL ranks too) and shrink it away with that list."""
    lib, comms = c_api_ranks(4)
    news = [ctypes.c_void_p() for _ in range(4)]
    count = ctypes.c_int(-1)
    try:
        assert lib.mnclCommLostRanks(comms[0], None, ctypes.byref(count)) == 0 and count.value == 0
        assert lib.mnclCommLostRanks(comms[0], None, None) == MNCL_INVALID_ARGUMENT
        assert b"count is null" in lib.mnclGetLastError(None)
        assert lib.mnclCommDestroy(comms[2]) == 0
        comms[2] = ctypes.c_void_p()
        lost: dict[int, list[int]] = {}
        for r in (0, 1, 3):
            ranks = (ctypes.c_int * 4)(-1, -1, -1, -1)
            assert lib.mnclCommLostRanks(comms[r], ranks, ctypes.byref(count)) == 0
            lost[r] = list(ranks[: count.value])
            assert list(ranks[count.value :]) == [-1] * (4 - count.value)  # (nothing past the count written)
        assert lost == {0: [2], 1: [2], 3: [2]}
        codes = {}

        def shrink(r: int) -> None:
            exclude = (ctypes.c_int * len(lost[r]))(*lost[r])
            codes[r] = lib.mnclCommShrink(comms[r], exclude, len(lost[r]), ctypes.byref(news[r]), None, 0)

        threads = [threading.Thread(target=shrink, args=(r,)) for r in (0, 1, 3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert codes == {0: 0, 1: 0, 3: 0}, (codes, lib.mnclGetLastError(None))
        xs = [np.full(3, r + 1, np.int32) for r in (0, 1, 3)]
        assert lib.mnclGroupStart() == 0
        for x, r in zip(xs, (0, 1, 3)):
            p = x.ctypes.data_as(ctypes.c_void_p)
            assert lib.mnclAllReduce(p, p, ctypes.c_size_t(3), INT32, SUM, news[r], None) == 0
        assert lib.mnclGroupEnd() == 0, lib.mnclGetLastError(None)
        for x in xs:
            np.testing.assert_array_equal(x, np.full(3, 1 + 2 + 4, np.int32))
    finally:
        for c in [*news, *comms]:
            if c:
                lib.mnclCommDestroy(c)


@pytest.mark.parametrize("call", ["split", "shrink"])
def test_abort_from_another_thread_stops_a_split_or_shrink_waiting_for_a_rank(
    monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """Rank 2 never comes; rank 0's communicator is aborted from the main thread. The
    rendezvous waited on the bootstrap's sockets, which never looked at the abort: both it
    and abort() itself took the whole bootstrap timeout (here 30 s)."""
    monkeypatch.setenv("MININCL_BOOTSTRAP_TIMEOUT", "30")
    comms = minincl.Communicator.init_all(3)
    outcome: dict[int, str] = {}

    def rendezvous(c: minincl.Communicator) -> None:
        start = time.monotonic()
        try:
            c.split(0, c.rank) if call == "split" else c.shrink([])
            outcome[c.rank] = "returned"
        except minincl.Error as e:
            outcome[c.rank] = f"{type(e).__name__} after {time.monotonic() - start:.1f} s: {e}"

    threads = [threading.Thread(target=rendezvous, args=(c,)) for c in comms[:2]]
    for t in threads:
        t.start()
    time.sleep(1.0)
    start = time.monotonic()
    comms[0].abort()
    aborted_in = time.monotonic() - start
    for t in threads:
        t.join(60)
    for c in comms:
        c.destroy()
    assert aborted_in < 10, aborted_in
    assert outcome[0].startswith("Aborted after "), outcome
    assert float(outcome[0].split()[2]) < 10, outcome
    assert "the communicator was aborted" in outcome[0], outcome


def test_c_api_shrink_with_abort_stops_a_split_waiting_on_another_thread() -> None:
    """Ranks 0 and 1 wait in mnclCommSplit on threads (rank 2 never splits); other threads of
    theirs shrink rank 2 away with MNCL_SHRINK_ABORT, which stops the splits first. The shrink
    waits for the aborted splits to leave (it was refused as a second split or shrink at
    once); the new communicator has 2 ranks."""
    lib, comms = c_api_ranks(3)
    splits = [ctypes.c_void_p() for _ in range(2)]
    news = [ctypes.c_void_p() for _ in range(2)]
    exclude = (ctypes.c_int * 1)(2)
    codes: dict[str, int] = {}

    def split(r: int) -> None:
        codes[f"split {r}"] = lib.mnclCommSplit(comms[r], 0, r, ctypes.byref(splits[r]), None)

    def shrink(r: int) -> None:
        codes[f"shrink {r}"] = lib.mnclCommShrink(comms[r], exclude, 1, ctypes.byref(news[r]), None, MNCL_SHRINK_ABORT)

    try:
        splitters = [threading.Thread(target=split, args=(r,)) for r in range(2)]
        for t in splitters:
            t.start()
        time.sleep(0.5)
        shrinkers = [threading.Thread(target=shrink, args=(r,)) for r in range(2)]
        for t in shrinkers:
            t.start()
        for t in [*splitters, *shrinkers]:
            t.join(60)
        # A split aborted by its own rank's shrink ends with mnclAborted; the other rank's may
        # first hear from the root that this one left its init (mnclRemoteError; 1 in 4 runs
        # beside busy processes).
        splits_ended = sorted(codes.pop(f"split {r}", -1) for r in range(2))
        assert codes == {"shrink 0": 0, "shrink 1": 0}, (codes, lib.mnclGetLastError(None))
        assert splits_ended in ([MNCL_ABORTED] * 2, sorted([MNCL_ABORTED, MNCL_REMOTE_ERROR])), splits_ended
        for new in news:
            count = ctypes.c_int(0)
            assert lib.mnclCommCount(new, ctypes.byref(count)) == 0 and count.value == 2
    finally:
        for c in [*news, *splits, *comms]:
            if c:
                lib.mnclCommDestroy(c)


@pytest.mark.parametrize("call", ["split", "shrink"])
def test_two_threads_splitting_one_communicator_are_refused(monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    """Rank 0's first thread waits in a split (or shrink) for ranks 1 and 2, which come a
    second later; its second thread calls one meanwhile. Both would read the parent's
    bootstrap (they mixed each other's messages: splits of 1 rank where 2 were meant, then
    the bootstrap timeout): the second is refused and the communicator fails. A split then
    fails on every rank at once; a shrink, made for failed communicators, goes on."""
    monkeypatch.setenv("MININCL_BOOTSTRAP_TIMEOUT", "30")
    comms = minincl.Communicator.init_all(3)
    outcome: dict[str, str] = {}
    news: list[minincl.Communicator] = []

    def rendezvous(c: minincl.Communicator, name: str, delay: float) -> None:
        time.sleep(delay)
        start = time.monotonic()
        try:
            news.append(c.split(0, c.rank) if call == "split" else c.shrink([]))
            outcome[name] = "returned"
        except minincl.Error as e:
            outcome[name] = f"{type(e).__name__} after {time.monotonic() - start:.1f} s: {e}"

    plan = [(comms[0], "rank 0 first", 0.0), (comms[0], "rank 0 second", 0.3)]
    plan += [(comms[1], "rank 1", 1.0), (comms[2], "rank 2", 1.0)]
    threads = [threading.Thread(target=rendezvous, args=p) for p in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for c in [*news, *comms]:
        c.destroy()
    why = (
        f"two threads called split or shrink on rank 0's communicator at once (this one {call}); it takes one at a time"
    )
    assert outcome.pop("rank 0 second") == f"InvalidUsage after 0.0 s: {why}", outcome
    if call == "shrink":
        assert outcome == {"rank 0 first": "returned", "rank 1": "returned", "rank 2": "returned"}
        return
    assert outcome["rank 0 first"].startswith("InvalidUsage after "), outcome
    assert outcome["rank 1"].startswith("RemoteError after ") and outcome["rank 2"].startswith("RemoteError after ")
    for story in outcome.values():
        assert why in story and float(story.split()[2]) < 10, outcome
