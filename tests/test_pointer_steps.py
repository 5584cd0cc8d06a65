"""Pointer steps: a receiver reads a big step straight from the sender's buffer (threads of one
process by default; other processes through cross-memory attach with MININCL_POINTER_STEPS=2).
Every algorithm must give NumPy's answer with them, in place and out of place, and a call must
not return before its peers have read its buffers."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import workers
from conftest import ALGOS, assert_same, rank_values, reduce_ref, run_ranks

import minincl

COUNT = 50021  # prime, several 16 KiB steps per channel


@pytest.fixture
def pointer_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Simple step of 1 KiB or more may be a pointer step (the tests' FIFO slots are 16 KiB).
    init_forced sets the algorithm; monkeypatch puts every variable back afterwards."""
    monkeypatch.setenv("MININCL_POINTER_STEP_BYTES", "1024")
    monkeypatch.setenv("MININCL_PROTO", "simple")
    monkeypatch.delenv("MININCL_ALGO", raising=False)


def init_forced(nranks: int, algo: str) -> list[minincl.Communicator]:
    os.environ["MININCL_ALGO"] = algo
    return minincl.Communicator.init_all(nranks)


def run_collective(c: Any, coll: str, send: np.ndarray, n: int, op: str, root: int, in_place: bool) -> np.ndarray:
    if coll == "allreduce":
        return c.allreduce(send, op=op) if in_place else c.allreduce(send, np.empty_like(send), op=op)
    if coll == "broadcast":
        return c.broadcast(send, root=root) if in_place else c.broadcast(send, np.empty_like(send), root=root)
    if coll == "reduce":
        return c.reduce(send, op=op, root=root) if in_place else c.reduce(send, np.empty_like(send), op=op, root=root)
    if coll == "allgather":
        if in_place:  # the input is this rank's block of the output
            out = np.zeros(send.size * n, send.dtype)
            out[c.rank * send.size : (c.rank + 1) * send.size] = send
            return c.allgather(out[c.rank * send.size : (c.rank + 1) * send.size], out)
        return c.allgather(send, np.empty(send.size * n, send.dtype))
    if in_place:  # reduce_scatter into this rank's block of the input
        return c.reduce_scatter(send, send[c.rank * (send.size // n) : (c.rank + 1) * (send.size // n)], op=op)
    return c.reduce_scatter(send, np.empty(send.size // n, send.dtype), op=op)


def expected(coll: str, inputs: list[np.ndarray], r: int, root: int, dtype: str, op: str) -> np.ndarray | None:
    n = len(inputs)
    if coll == "allreduce" or (coll == "reduce" and r == root):
        return reduce_ref(inputs, op, dtype)
    if coll == "broadcast":
        return inputs[root]
    if coll == "allgather":
        return np.concatenate(inputs)
    if coll == "reduce_scatter":
        block = inputs[0].size // n
        return reduce_ref(inputs, op, dtype)[r * block : (r + 1) * block]
    return None


@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("nranks", [2, 3, 5])
def test_pointer_steps_give_numpys_answer(pointer_env: None, nranks: int, algo: str, in_place: bool) -> None:
    comms = init_forced(nranks, algo)
    try:
        for coll in ALGOS[algo]:
            for dtype, op in (("float32", "sum"), ("int32", "max"), ("float16", "sum")):
                root = nranks - 1
                block = COUNT * nranks if coll == "reduce_scatter" else COUNT
                inputs = [rank_values(r, block, dtype, op, seed=nranks) for r in range(nranks)]
                got = run_ranks(
                    comms,
                    lambda c: run_collective(c, coll, inputs[c.rank].astype(dtype), nranks, op, root, in_place),
                )
                for r, g in enumerate(got):
                    want = expected(coll, inputs, r, root, dtype, op)
                    if want is not None:
                        assert_same(g, want, dtype, op)
        # Every rank's steps skip the FIFO. In place too: a tree leaf's only sends are of an
        # input that the allreduce overwrites, but only with final values, after its parent has
        # read it (DevWork::inputReadBeforeOverwritten). A step of final values may go as a
        # direct write instead (tests/test_direct_writes.py).
        posted = [c.stats()["pointer_steps"] + c.stats()["direct_writes"] > 0 for c in comms]
        assert all(posted), [c.stats() for c in comms]
    finally:
        for c in comms:
            c.destroy()


def test_a_returned_call_leaves_no_reader_behind(pointer_env: None) -> None:
    """Each rank scribbles over its input as soon as its call returns: a peer still reading it
    would get the scribbles."""
    comms = init_forced(3, "direct")
    try:

        def body(c: Any) -> int:
            for i in range(200):
                send = np.full(COUNT, c.rank + i, np.int64)
                out = c.allreduce(send, np.empty_like(send))
                send[:] = -(10**9)
                if not (out == 3 * i + 3).all():
                    raise AssertionError(f"call {i}: rank {c.rank} got {np.unique(out)}")
            return 0

        run_ranks(comms, body, timeout=120)
        assert all(c.stats()["pointer_steps"] > 0 for c in comms)
    finally:
        for c in comms:
            c.destroy()


def ring_allreduce_counter(nranks: int, counter: str) -> list[int]:
    """A ring allreduce of COUNT float32 on nranks threads, checked against the sum; returns
    each rank's stats()[counter] after it."""
    comms = init_forced(nranks, "ring")
    try:
        got = run_ranks(comms, lambda c: c.allreduce(np.full(COUNT, c.rank + 1.0, np.float32)))
        for g in got:
            np.testing.assert_array_equal(g, np.full(COUNT, nranks * (nranks + 1) / 2, np.float32))
        return [c.stats()[counter] for c in comms]
    finally:
        for c in comms:
            c.destroy()


def test_pointer_steps_can_be_turned_off(pointer_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MININCL_POINTER_STEPS", "0")
    assert ring_allreduce_counter(2, "pointer_steps") == [0, 0]


@pytest.mark.parametrize("setting", [None, "", "32K"])
def test_thread_ranks_take_pointer_steps_from_1_kib(monkeypatch: pytest.MonkeyPatch, setting: str | None) -> None:
    """Ranks that are threads of one process read each other's memory as their own: by default
    their Simple steps of 1 KiB and more go as pointer steps (an out-of-place ring allreduce of
    16 KiB on 2 ranks has 8 KiB steps), not only those of 32 KiB as between processes.
    MININCL_POINTER_STEP_BYTES still decides where it is set (empty: unset)."""
    monkeypatch.setenv("MININCL_PROTO", "simple")
    monkeypatch.delenv("MININCL_ALGO", raising=False)  # (put back afterwards: init_forced sets it)
    if setting is None:
        monkeypatch.delenv("MININCL_POINTER_STEP_BYTES", raising=False)
    else:
        monkeypatch.setenv("MININCL_POINTER_STEP_BYTES", setting)
    comms = init_forced(2, "ring")
    try:
        got = run_ranks(
            comms, lambda c: c.allreduce(np.full(4096, c.rank + 1.0, np.float32), np.empty(4096, np.float32))
        )
        for g in got:
            np.testing.assert_array_equal(g, np.full(4096, 3.0, np.float32))
        pointer_steps = [c.stats()["pointer_steps"] for c in comms]
        assert all(n > 0 for n in pointer_steps) if not setting else pointer_steps == [0, 0], pointer_steps
    finally:
        for c in comms:
            c.destroy()


def test_bad_pointer_steps_setting_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MININCL_POINTER_STEPS", "7")
    with pytest.raises(minincl.InvalidArgument, match="MININCL_POINTER_STEPS"):
        minincl.Communicator.init_all(2)


@pytest.mark.parametrize("nranks", [2, 3])
def test_pointer_steps_across_processes(pointer_env: None, monkeypatch: pytest.MonkeyPatch, nranks: int) -> None:
    """MININCL_POINTER_STEPS=2: receivers in other processes read through cross-memory attach
    (or, where the kernel forbids it, fall back to the FIFO; the answers are the same)."""
    monkeypatch.setenv("MININCL_POINTER_STEPS", "2")
    results = minincl.launch(workers.collectives_with_stats, nranks, [0, 7, 50021])
    assert all(checks > 0 for checks, _ in results)
    if any(stats["readable_peers"] != nranks - 1 for _, stats in results):
        pytest.skip("this kernel does not let sibling processes read each other's memory (cross-memory attach)")
    assert all(stats["pointer_steps"] > 0 for _, stats in results)
