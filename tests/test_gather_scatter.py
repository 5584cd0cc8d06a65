"""gather and scatter (NCCL 2.28's ncclGather / ncclScatter): every type, rank counts, roots,
counts 0, 1, 7, a prime above a slot and a large one, in place and out of place, against
NumPy; their errors; and their place among the other calls (groups, async_op, mismatches)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import DTYPES, as_numpy, assert_same, counts_for, empty, make, needs, rank_values, run_ranks

import minincl

NRANKS = [1, 2, 3, 5, 8]


def roots_of(nranks: int) -> list[int]:
    return sorted({0, nranks // 2, nranks - 1})


@pytest.mark.parametrize("nranks", NRANKS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gather(comms_of: Any, nranks: int, dtype: str) -> None:
    needs(dtype)
    comms = comms_of(nranks)
    for count in counts_for(dtype):
        inputs = [rank_values(r, count, dtype, "sum", seed=count) for r in range(nranks)]
        want = np.concatenate(inputs)
        for root in roots_of(nranks):

            def body(c: Any, root: int = root, count: int = count) -> tuple[Any, Any, Any, Any]:
                send = make(inputs[c.rank], dtype)
                given = empty(count * nranks, dtype)  # (off the root: never written)
                out = c.gather(send, given, root=root)
                new = c.gather(send, root=root)
                # In place at the root: its input already sits in its block of the output.
                whole = empty(count * nranks, dtype)
                whole[c.rank * count : (c.rank + 1) * count] = send
                c.gather(whole[c.rank * count : (c.rank + 1) * count], whole, root=root)
                return out is given, given, new, (whole, send)

            for r, (same, given, new, (whole, send)) in enumerate(run_ranks(comms, body)):
                assert same
                assert_same(send, inputs[r], dtype)  # (the input is left as it was)
                if r == root:
                    assert_same(given, want, dtype)
                    assert_same(new, want, dtype)
                    assert_same(whole, want, dtype)
                else:  # (nothing but this rank's own block of `whole` was ever written)
                    assert new is None
                    unwritten = as_numpy(empty(1, dtype))[0]
                    assert (as_numpy(given) == unwritten).all()
                    rest = np.delete(as_numpy(whole), np.arange(r * count, (r + 1) * count))
                    assert (rest == unwritten).all()


@pytest.mark.parametrize("nranks", NRANKS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter(comms_of: Any, nranks: int, dtype: str) -> None:
    needs(dtype)
    comms = comms_of(nranks)
    for count in counts_for(dtype):
        blocks = rank_values(nranks, count * nranks, dtype, "sum", seed=count)
        for root in roots_of(nranks):

            def body(c: Any, root: int = root, count: int = count) -> tuple[Any, Any, Any, Any]:
                # Off the root send is not read: None, or any array (whose shape a new recv takes).
                send = make(blocks, dtype) if c.rank == root else None
                given = empty(count, dtype)
                out = c.scatter(send, given, root=root)
                new = c.scatter(make(blocks if c.rank == root else blocks * 0 + 3, dtype), root=root)
                # In place at the root: its block stays where it is in send.
                whole = make(blocks, dtype) if c.rank == root else empty(count * nranks, dtype)
                mine = whole[c.rank * count : (c.rank + 1) * count] if c.rank == root else empty(count, dtype)
                c.scatter(whole if c.rank == root else None, mine, root=root)
                return out is given, given, new, (mine, send, whole)

            for r, (same, given, new, (mine, send, whole)) in enumerate(run_ranks(comms, body)):
                want = blocks[r * count : (r + 1) * count]
                assert same
                assert_same(given, want, dtype)
                assert_same(new, want, dtype)
                assert_same(mine, want, dtype)
                if r == root:  # (send is only read: the in-place one too)
                    assert_same(send, blocks, dtype)
                    assert_same(whole, blocks, dtype)


@pytest.mark.parametrize("nranks", [2, 3])
def test_large_gather_and_scatter(comms_of: Any, nranks: int) -> None:
    """6 MiB per rank: pointer steps and every channel."""
    comms = comms_of(nranks)
    count = 3 << 20
    inputs = [(np.arange(count) % 1999 + r).astype(np.float16) for r in range(nranks)]

    def body(c: Any) -> tuple[Any, Any]:
        g = c.gather(inputs[c.rank], root=nranks - 1)
        s = c.scatter(np.concatenate(inputs) if c.rank == 0 else None, np.empty(count, np.float16), root=0)
        return g, s

    for r, (g, s) in enumerate(run_ranks(comms, body)):
        if r == nranks - 1:
            np.testing.assert_array_equal(g, np.concatenate(inputs))
        np.testing.assert_array_equal(s, inputs[r])


def test_shapes_of_new_outputs(comms_of: Any) -> None:
    """As allgather's and reduce_scatter's: the first dimension times or over nranks."""
    comms = comms_of(2)

    def body(c: Any) -> tuple[Any, Any]:
        g = c.gather(np.full((3, 2), c.rank, np.int32), root=0)
        s = c.scatter(np.arange(8, dtype=np.uint8).reshape(4, 2), root=1)
        return g, s

    (g0, s0), (g1, s1) = run_ranks(comms, body)
    assert g0.shape == (6, 2) and g1 is None
    np.testing.assert_array_equal(g0, np.repeat([0, 1], 6).reshape(6, 2))
    assert s0.shape == s1.shape == (2, 2)
    np.testing.assert_array_equal(np.concatenate([s0, s1]), np.arange(8).reshape(4, 2))


def test_in_a_group_with_other_calls_and_as_async_ops(comms_of: Any) -> None:
    comms = comms_of(3)

    def body(c: Any) -> tuple[Any, ...]:
        x = np.full(5, c.rank + 1, np.float64)
        with minincl.group():  # (a group's calls run in any order: they share no buffer)
            g = c.gather(x.copy(), np.zeros(15), root=2)
            s = c.scatter(np.arange(15.0), np.zeros(5), root=0)
            c.allreduce(x)
        w = c.gather(np.full(2, c.rank, np.int8), root=1, async_op=True)
        v = c.scatter(np.arange(6, dtype=np.int8), root=1, async_op=True)
        return g, s, x, w.wait(), v.wait()

    for r, (g, s, x, w, v) in enumerate(run_ranks(comms, body)):
        if r == 2:
            np.testing.assert_array_equal(g, np.repeat([1.0, 2.0, 3.0], 5))
        np.testing.assert_array_equal(s, np.arange(15.0)[5 * r : 5 * r + 5])
        np.testing.assert_array_equal(x, np.full(5, 6.0))
        if r == 1:
            np.testing.assert_array_equal(w, np.repeat(np.arange(3, dtype=np.int8), 2))
        else:
            assert w is None
        np.testing.assert_array_equal(v, np.arange(6, dtype=np.int8)[2 * r : 2 * r + 2])


def test_every_rank_from_one_thread_in_a_group(comms_of: Any) -> None:
    comms = comms_of(3)
    outs = [np.zeros(4, np.int64) for _ in comms]
    with minincl.group():
        for c in comms:
            c.scatter(np.arange(12, dtype=np.int64), outs[c.rank], root=0)
    for r, o in enumerate(outs):
        np.testing.assert_array_equal(o, np.arange(4 * r, 4 * r + 4))


def test_wrong_arguments_are_clear_errors(comms_of: Any) -> None:
    (c,) = comms_of(1)
    x = np.zeros(4, np.float32)
    cases = [
        (lambda: c.gather(x, root=1), minincl.InvalidArgument, "gather: root 1 is out of range for 1 ranks"),
        (lambda: c.scatter(x, root=-1), minincl.InvalidArgument, "scatter: root -1 is out of range"),
        (lambda: c.gather(x, np.zeros(5, np.float32)), minincl.InvalidArgument, "recv has 5 elements, expected 4"),
        (lambda: c.gather(x, np.zeros(4, np.int32)), minincl.InvalidArgument, "send is float32 but recv is int32"),
        (lambda: c.scatter(x, np.zeros(3, np.float32)), minincl.InvalidArgument, "send has 4 elements, expected 3"),
        (lambda: c.scatter(None, x), minincl.InvalidArgument, r"scatter: send is None on the root \(rank 0\)"),
        (lambda: c.scatter(), minincl.InvalidArgument, "send is None on the root"),
        (lambda: c.gather(x[:3], x[1:]), minincl.InvalidArgument, "overlap without being in place"),
        (lambda: c.scatter(x[1:], x[:3]), minincl.InvalidArgument, "recv is the root's block of send"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
    np.testing.assert_array_equal(c.gather(x + 1), x + 1)  # (nothing was left behind)


def test_off_the_root_scatter_needs_recv_or_a_shape(comms_of: Any) -> None:
    comms = comms_of(2)

    def body(c: Any) -> list[str]:
        errors = []
        if c.rank == 0:  # (errors raised before anything is posted: rank 1 makes no call)
            for call in (lambda: c.scatter(None, root=1), lambda: c.scatter(np.arange(3.0), root=1)):
                try:
                    call()
                except minincl.InvalidArgument as e:
                    errors.append(str(e))
        return errors

    errors, _ = run_ranks(comms, body)
    assert len(errors) == 2, errors
    assert "scatter: send and recv are both None: pass recv" in errors[0]
    assert "scatter: send has 3 elements, not a multiple of 2 ranks" in errors[1]
    outs = run_ranks(comms, lambda c: c.scatter(np.arange(4.0), root=1))  # (nothing was left behind)
    np.testing.assert_array_equal(np.concatenate(outs), np.arange(4.0))


def test_ranks_that_disagree_on_the_root_are_named() -> None:
    """Each rank waits for blocks the other never sends; the call logs name both calls.
    (Communicators of its own: the error fails them.)"""
    comms = minincl.Communicator.init_all(2)

    def body(c: Any) -> str:
        try:
            c.gather(np.ones(8, np.float32), root=c.rank)
        except minincl.Error as e:
            return f"{type(e).__name__}: {e}"
        return "ok"

    try:
        results = run_ranks(comms, body)
    finally:
        for c in comms:
            c.destroy()
    assert all(r.startswith(("InvalidUsage", "RemoteError")) for r in results), results
    assert any(
        "mismatched calls" in r and "gather(count=8, float32, root=0)" in r and "gather(count=8, float32, root=1)" in r
        for r in results
    ), results
