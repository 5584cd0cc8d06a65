"""Direct writes: for allreduce, allgather and broadcast (the same output on every rank) a
sender writes the final values of a step straight into the receiver's output, which the
receiver publishes when the operation starts (ranks as threads here; windows across processes
in test_windows.py). Every algorithm must give NumPy's answer with them, in place and out of
place; a publication must never outlive its operation; MININCL_DIRECT_WRITES=0 turns them off."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import ALGOS, assert_same, rank_values, run_ranks
from test_pointer_steps import COUNT, expected, init_forced, ring_allreduce_counter, run_collective

import minincl


@pytest.fixture
def simple_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Simple protocol (the one with direct writes); init_forced sets the algorithm, and
    monkeypatch puts both variables back afterwards."""
    monkeypatch.setenv("MININCL_PROTO", "simple")
    monkeypatch.delenv("MININCL_ALGO", raising=False)


@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("nranks", [2, 3, 5])
def test_direct_writes_give_numpys_answer(simple_env: None, nranks: int, algo: str, in_place: bool) -> None:
    comms = init_forced(nranks, algo)
    try:
        for coll in ALGOS[algo]:
            for dtype, op in (("float32", "sum"), ("int32", "max"), ("float16", "avg")):
                op_used = "sum" if in_place else op
                root = 1
                block = COUNT * nranks if coll == "reduce_scatter" else COUNT
                inputs = [rank_values(r, block, dtype, op_used, seed=nranks + 1) for r in range(nranks)]
                got = run_ranks(
                    comms,
                    lambda c: run_collective(c, coll, inputs[c.rank].astype(dtype), nranks, op_used, root, in_place),
                )
                for r, g in enumerate(got):
                    want = expected(coll, inputs, r, root, dtype, op_used)
                    if want is not None:
                        assert_same(g, want, dtype, op_used)
        wrote = [c.stats()["direct_writes"] > 0 for c in comms]
        # A tree's leaves only send partial sums up; ring and direct ranks all send final values.
        assert any(wrote) if algo == "tree" else all(wrote), [c.stats() for c in comms]
    finally:
        for c in comms:
            c.destroy()


def test_direct_writes_can_be_turned_off(simple_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MININCL_DIRECT_WRITES", "0")
    assert ring_allreduce_counter(3, "direct_writes") == [0, 0, 0]


@pytest.mark.parametrize("algo", list(ALGOS))
def test_no_write_lands_after_its_call_returned(simple_env: None, algo: str) -> None:
    """Each rank scribbles over its output as soon as a call returns, between calls of other
    kinds (reduce_scatter and reduce publish nothing; a broadcast's receivers pull), with
    buffers and sizes changing every time: a stale publication or a late write from a peer
    would show up as a wrong answer or a scribble overwritten."""
    n, colls = 3, ALGOS[algo]
    comms = init_forced(n, algo)
    try:

        def body(c: Any) -> int:
            outs: list[np.ndarray] = []
            for i in range(40):
                count = COUNT + 64 * (i % 5)
                send = np.full(count, c.rank + i, np.int64)
                out = c.allreduce(send, np.empty_like(send))
                if not (out == 3 * i + 3).all():
                    raise AssertionError(f"call {i}: rank {c.rank} allreduce got {np.unique(out)}")
                out[:] = -1
                outs.append(out)
                if "reduce_scatter" in colls:
                    rs = c.reduce_scatter(np.full(count * n, i, np.int64), np.empty(count, np.int64))
                    if not (rs == n * i).all():
                        raise AssertionError(f"call {i}: rank {c.rank} reduce_scatter got {np.unique(rs)}")
                if "allgather" in colls:
                    g = c.allgather(np.full(count, c.rank - i, np.int64), np.empty(count * n, np.int64))
                    if not (g == np.repeat(np.arange(n) - i, count)).all():
                        raise AssertionError(f"call {i}: rank {c.rank} allgather got {np.unique(g)}")
                    g[:] = -2
                else:
                    r = c.reduce(np.full(count, i, np.int64), np.empty(count, np.int64), root=i % n)
                    if c.rank == i % n and not (r == n * i).all():
                        raise AssertionError(f"call {i}: rank {c.rank} reduce got {np.unique(r)}")
                b = c.broadcast(np.full(count, c.rank * 100 + i, np.int64), root=i % n)
                if not (b == (i % n) * 100 + i).all():
                    raise AssertionError(f"call {i}: rank {c.rank} broadcast got {np.unique(b)}")
            c.barrier()
            for i, out in enumerate(outs):
                if not (out == -1).all():
                    raise AssertionError(f"rank {c.rank}: output of call {i} was written after it returned")
            return 0

        run_ranks(comms, body, timeout=120)
        assert all(c.stats()["direct_writes"] > 0 for c in comms) or algo == "tree"
    finally:
        for c in comms:
            c.destroy()


def test_bad_direct_writes_setting_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MININCL_DIRECT_WRITES", "2")
    with pytest.raises(minincl.InvalidArgument, match="MININCL_DIRECT_WRITES"):
        minincl.Communicator.init_all(2)


@pytest.mark.parametrize("nranks", [2, 3])
def test_allgather_receivers_read_the_senders_input(
    simple_env: None, monkeypatch: pytest.MonkeyPatch, nranks: int
) -> None:
    """An allgather's receivers read each step of a sender's input themselves (a pointer step),
    as a broadcast's do: no direct write carries a rank's own block. A ring of 3 forwards the
    blocks it received, and those still go as direct writes (our output's freshly written
    lines are slow for another core to read)."""
    monkeypatch.setenv("MININCL_POINTER_STEP_BYTES", "1024")
    comms = init_forced(nranks, "ring")
    try:
        inputs = [rank_values(r, COUNT, "int32", "sum", seed=r).astype(np.int32) for r in range(nranks)]
        got = run_ranks(comms, lambda c: c.allgather(inputs[c.rank], np.empty(COUNT * nranks, np.int32)))
        for g in got:
            np.testing.assert_array_equal(g, np.concatenate(inputs))
        stats = [c.stats() for c in comms]
        assert all(s["pointer_steps"] > 0 for s in stats), stats
        assert all((s["direct_writes"] > 0) == (nranks > 2) for s in stats), stats
    finally:
        for c in comms:
            c.destroy()
