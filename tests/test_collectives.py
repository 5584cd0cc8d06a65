"""Every collective x the 10 types x the 5 ops x rank counts, ranks as threads, against NumPy.

Each test runs counts 0, 1, 7 and a prime above one FIFO slot times the channel count, both
out of place and in place, and checks that inputs are left untouched."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from conftest import (
    ALGOS,
    DTYPES,
    OPS,
    PROTOS,
    as_numpy,
    assert_same,
    counts_for,
    empty,
    forced_env,
    make,
    needs,
    rank_values,
    reduce_ref,
    run_ranks,
)
from workers import assert_float_avg

import minincl

NRANKS = [1, 2, 3, 4, 5, 8]


@pytest.mark.parametrize("nranks", NRANKS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_allreduce(comms_of: Any, nranks: int, dtype: str, op: str) -> None:
    needs(dtype)
    comms = comms_of(nranks)
    for count in counts_for(dtype):
        inputs = [rank_values(r, count, dtype, op, seed=count) for r in range(nranks)]
        want = reduce_ref(inputs, op, dtype)

        def body(c: Any) -> tuple[Any, Any, Any]:
            send = make(inputs[c.rank], dtype)
            recv = empty(count, dtype)
            out = c.allreduce(send, recv, op=op)
            assert out is recv
            inplace = make(inputs[c.rank], dtype)
            c.allreduce(inplace, op=op)
            return recv, inplace, send

        for r, (recv, inplace, send) in enumerate(run_ranks(comms, body)):
            assert_same(recv, want, dtype, op)
            assert_same(inplace, want, dtype, op)
            assert_same(send, inputs[r], dtype)


@pytest.mark.parametrize("nranks", NRANKS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_reduce(comms_of: Any, nranks: int, dtype: str, op: str) -> None:
    needs(dtype)
    comms = comms_of(nranks)
    for count in counts_for(dtype):
        root = (count + 1) % nranks
        inputs = [rank_values(r, count, dtype, op, seed=count) for r in range(nranks)]
        want = reduce_ref(inputs, op, dtype)

        def body(c: Any) -> tuple[Any, Any]:
            recv = empty(count, dtype)
            c.reduce(make(inputs[c.rank], dtype), recv, op=op, root=root)
            inplace = make(inputs[c.rank], dtype)
            c.reduce(inplace, op=op, root=root)
            return recv, inplace

        for r, (recv, inplace) in enumerate(run_ranks(comms, body)):
            if r == root:
                assert_same(recv, want, dtype, op)
                assert_same(inplace, want, dtype, op)
            else:  # only the root's output is written
                assert_same(recv, as_numpy(empty(count, dtype)), dtype)
                assert_same(inplace, inputs[r], dtype)


@pytest.mark.parametrize("nranks", NRANKS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_reduce_scatter(comms_of: Any, nranks: int, dtype: str, op: str) -> None:
    needs(dtype)
    comms = comms_of(nranks)
    for count in counts_for(dtype):
        inputs = [rank_values(r, count * nranks, dtype, op, seed=count) for r in range(nranks)]
        want = reduce_ref(inputs, op, dtype)

        def body(c: Any) -> tuple[Any, Any]:
            recv = empty(count, dtype)
            c.reduce_scatter(make(inputs[c.rank], dtype), recv, op=op)
            # In place: the result lands in this rank's block of the send buffer.
            whole = make(inputs[c.rank], dtype)
            mine = whole[c.rank * count : (c.rank + 1) * count]
            c.reduce_scatter(whole, mine, op=op)
            return recv, mine

        for r, (recv, mine) in enumerate(run_ranks(comms, body)):
            assert_same(recv, want[r * count : (r + 1) * count], dtype, op)
            assert_same(mine, want[r * count : (r + 1) * count], dtype, op)


@pytest.mark.parametrize("nranks", NRANKS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast(comms_of: Any, nranks: int, dtype: str) -> None:
    needs(dtype)
    comms = comms_of(nranks)
    for count in counts_for(dtype):
        root = nranks - 1 - count % nranks
        inputs = [rank_values(r, count, dtype, "sum", seed=count) for r in range(nranks)]

        def body(c: Any) -> tuple[Any, Any]:
            recv = empty(count, dtype)
            c.broadcast(make(inputs[c.rank], dtype), recv, root=root)
            inplace = make(inputs[c.rank], dtype)
            c.broadcast(inplace, root=root)
            return recv, inplace

        for recv, inplace in run_ranks(comms, body):
            assert_same(recv, inputs[root], dtype)
            assert_same(inplace, inputs[root], dtype)


@pytest.mark.parametrize("nranks", NRANKS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_allgather(comms_of: Any, nranks: int, dtype: str) -> None:
    needs(dtype)
    comms = comms_of(nranks)
    for count in counts_for(dtype):
        inputs = [rank_values(r, count, dtype, "sum", seed=count) for r in range(nranks)]
        want = np.concatenate(inputs)

        def body(c: Any) -> tuple[Any, Any]:
            recv = empty(count * nranks, dtype)
            c.allgather(make(inputs[c.rank], dtype), recv)
            # In place: this rank's input already sits in its block of the output.
            whole = empty(count * nranks, dtype)
            whole[c.rank * count : (c.rank + 1) * count] = make(inputs[c.rank], dtype)
            c.allgather(whole[c.rank * count : (c.rank + 1) * count], whole)
            return recv, whole

        for recv, whole in run_ranks(comms, body):
            assert_same(recv, want, dtype)
            assert_same(whole, want, dtype)


@pytest.mark.parametrize("nranks", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("dtype", ["int8", "float16", "float64"])
def test_alltoall(comms_of: Any, nranks: int, dtype: str) -> None:
    comms = comms_of(nranks)
    for count in counts_for(dtype):
        inputs = [rank_values(r, count * nranks, dtype, "sum", seed=count) for r in range(nranks)]

        def body(c: Any) -> tuple[Any, Any]:
            recv = c.alltoall(make(inputs[c.rank], dtype))
            inplace = make(inputs[c.rank], dtype)
            c.alltoall(inplace, inplace)
            return recv, inplace

        for r, (recv, inplace) in enumerate(run_ranks(comms, body)):
            want = np.concatenate([inputs[q][r * count : (r + 1) * count] for q in range(nranks)])
            assert_same(recv, want, dtype)
            assert_same(inplace, want, dtype)


@pytest.mark.parametrize("nranks", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("count", [0, 1, 7, 40009])
def test_send_recv_ring_and_pairs(comms_of: Any, nranks: int, count: int) -> None:
    comms = comms_of(nranks)
    import minincl

    data = [rank_values(r, count, "float32", "sum", seed=count).astype(np.float32) for r in range(nranks)]

    def ring(c: Any) -> Any:
        # Everyone sends right and receives from the left at once: needs the grouped progress.
        out = np.full(count, -1, np.float32)
        with minincl.group():
            c.send(data[c.rank], (c.rank + 1) % nranks)
            c.recv(out, (c.rank - 1) % nranks)
        return out

    for r, out in enumerate(run_ranks(comms, ring)):
        np.testing.assert_array_equal(out, data[(r - 1) % nranks])

    def exchange_and_self(c: Any) -> tuple[Any, Any]:
        # Two messages to the same peer keep their order; a send to self is a copy.
        peer = c.rank ^ 1 if (c.rank ^ 1) < nranks else c.rank
        first, second, own = (np.full(count, -1, np.float32) for _ in range(3))
        with minincl.group():
            c.send(data[c.rank], peer)
            c.send(data[c.rank] * 2, peer)
            c.recv(first, peer)
            c.recv(second, peer)
        with minincl.group():
            c.send(data[c.rank], c.rank)
            c.recv(own, c.rank)
        return (first, second), own

    for r, ((first, second), own) in enumerate(run_ranks(comms, exchange_and_self)):
        peer = r ^ 1 if (r ^ 1) < nranks else r
        np.testing.assert_array_equal(first, data[peer])
        np.testing.assert_array_equal(second, data[peer] * 2)
        np.testing.assert_array_equal(own, data[r])


@pytest.mark.parametrize("nranks", [2, 3, 5])
def test_many_sends_and_receives_in_one_group_pair_in_order(comms_of: Any, nranks: int) -> None:
    """Each rank posts a few hundred sends and receives with every peer in one group, the
    connections interleaved at random (each connection's in its order); sizes from 0 to
    above a pointer step and a slot. The i-th send from a to b lands in b's i-th receive from
    a. (The ops are regrouped by connection before they run; a group of thousands of small
    ops took seconds when each op looked back over all those before it.)"""
    comms = comms_of(nranks)
    rng = np.random.default_rng(nranks)
    sizes = {
        (a, b): rng.choice([0, 1, 5, 300, 3000, 20011], size=int(rng.integers(40, 90)))
        for a in range(nranks)
        for b in range(nranks)
        if a != b
    }

    def payload(a: int, b: int, i: int) -> np.ndarray:
        return (np.arange(sizes[(a, b)][i], dtype=np.int32) * 7 + 1000 * a + 100000 * b + 17 * i).astype(np.int32)

    def posts(r: int) -> list[tuple[str, int, int]]:
        """('send' | 'recv', peer, index) in a random interleaving of the connections."""
        queues = [[("send", p, i) for i in range(len(sizes[(r, p)]))] for p in range(nranks) if p != r]
        queues += [[("recv", p, i) for i in range(len(sizes[(p, r)]))] for p in range(nranks) if p != r]
        order = np.random.default_rng(100 + r).permutation(np.repeat(np.arange(len(queues)), [len(q) for q in queues]))
        heads = [0] * len(queues)
        out = []
        for q in order:
            out.append(queues[q][heads[q]])
            heads[q] += 1
        return out

    def body(c: Any) -> dict[tuple[int, int], np.ndarray]:
        got = {}
        with minincl.group():
            for kind, peer, i in posts(c.rank):
                if kind == "send":
                    c.send(payload(c.rank, peer, i), peer)
                else:
                    got[(peer, i)] = np.full(sizes[(peer, c.rank)][i], -1, np.int32)
                    c.recv(got[(peer, i)], peer)
        return got

    for r, got in enumerate(run_ranks(comms, body)):
        for (peer, i), buf in got.items():
            np.testing.assert_array_equal(buf, payload(peer, r, i), err_msg=f"rank {r}: receive {i} from {peer}")


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_copies_to_self_are_shared_among_channels(comms_of: Any, nranks: int) -> None:
    """Copies to self of 64 KiB and more are split among the channels with work: several
    pairs of uneven sizes in one group, beside a send to a peer or alone; a copy whose ends
    overlap still lands as one memmove would."""
    import minincl

    comms = comms_of(nranks)
    sizes = [(129, "uint8"), (2 * 65536 + 1, "uint8"), (70001, "float64"), (300007, "int32")]
    data = [[rank_values(r, n, t, "sum", seed=n).astype(t) for n, t in sizes] for r in range(nranks)]

    shift = 1000  # an overlapping copy: from the start of a buffer to 1000 bytes on

    def body(c: Any) -> tuple[list[Any], list[Any], Any]:
        with_peer = [np.zeros(n, t) for n, t in sizes]
        alone = [np.zeros(n, t) for n, t in sizes]
        ring = np.zeros(sizes[-1][0], sizes[-1][1])
        overlapping = data[c.rank][1].copy()
        with minincl.group():
            for x, out in zip(data[c.rank], with_peer):
                c.send(x, c.rank)
                c.recv(out, c.rank)
            c.send(overlapping[:-shift], c.rank)
            c.recv(overlapping[shift:], c.rank)
            c.send(data[c.rank][-1], (c.rank + 1) % nranks)
            c.recv(ring, (c.rank - 1) % nranks)
        with minincl.group():
            for x, out in zip(data[c.rank], alone):
                c.send(x, c.rank)
                c.recv(out, c.rank)
        return with_peer + [ring], alone, overlapping

    for r, (with_peer, alone, overlapping) in enumerate(run_ranks(comms, body)):
        for got, want in zip(with_peer, data[r] + [data[(r - 1) % nranks][-1]]):
            np.testing.assert_array_equal(got, want)
        for got, want in zip(alone, data[r]):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(overlapping[shift:], data[r][1][:-shift])
        np.testing.assert_array_equal(overlapping[:shift], data[r][1][:shift])


@pytest.mark.parametrize("nranks", [2, 3])
def test_alltoall_of_every_rank_from_one_thread(comms_of: Any, nranks: int) -> None:
    """One thread drives every rank, each call in one group (as NCCL drives several GPUs):
    each rank's copy to self runs on its own channels."""
    import minincl

    comms = comms_of(nranks)
    count = 50021
    inputs = [rank_values(r, count * nranks, "float32", "sum", seed=r).astype(np.float32) for r in range(nranks)]
    outputs = [np.zeros(count * nranks, np.float32) for _ in comms]
    with minincl.group():
        for c, x, out in zip(comms, inputs, outputs):
            c.alltoall(x, out)
    for r, out in enumerate(outputs):
        want = np.concatenate([inputs[q][r * count : (r + 1) * count] for q in range(nranks)])
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("nranks", [2, 3, 5])
@pytest.mark.parametrize("count", [0, 1, 7, 40009])
def test_sendrecv(comms_of: Any, nranks: int, count: int) -> None:
    """One call for a send and a recv (MPI_Sendrecv): a ring, a pairwise exchange, to self,
    and inside a group with another send."""
    import minincl

    comms = comms_of(nranks)
    data = [rank_values(r, count, "int32", "sum", seed=count).astype(np.int32) for r in range(nranks)]

    def body(c: Any) -> tuple[Any, ...]:
        right, left = (c.rank + 1) % nranks, (c.rank - 1) % nranks
        partner = c.rank ^ 1 if (c.rank ^ 1) < nranks else c.rank
        ring, pair, own, extra = (np.full(count, -1, np.int32) for _ in range(4))
        assert c.sendrecv(data[c.rank], ring, right, recv_peer=left) is ring
        c.sendrecv(data[c.rank], pair, partner)
        c.sendrecv(data[c.rank], own, c.rank)
        with minincl.group():
            c.sendrecv(data[c.rank], extra, right, left)
            c.send(data[c.rank] * 3, right)
            c.recv(own, left)
        return ring, pair, extra, own

    for r, (ring, pair, extra, own) in enumerate(run_ranks(comms, body)):
        left, partner = (r - 1) % nranks, r ^ 1 if (r ^ 1) < nranks else r
        np.testing.assert_array_equal(ring, data[left])
        np.testing.assert_array_equal(pair, data[partner])
        np.testing.assert_array_equal(extra, data[left])
        np.testing.assert_array_equal(own, data[left] * 3)


def test_sendrecv_bad_peer_is_a_clear_error_and_leaves_no_group_open(comms_of: Any) -> None:
    import minincl

    comms = comms_of(2)
    x = np.ones(4, np.float32)
    with pytest.raises(minincl.InvalidArgument, match="peer"):
        comms[0].sendrecv(x, np.zeros(4, np.float32), 1, recv_peer=7)

    def body(c: Any) -> Any:  # the failed call recorded nothing: the next exchange pairs up
        return c.sendrecv(x * (c.rank + 1), np.zeros(4, np.float32), 1 - c.rank)

    got = run_ranks(comms, body)
    np.testing.assert_array_equal(got[0], x * 2)
    np.testing.assert_array_equal(got[1], x)


def test_blocking_send_recv_pair(comms_of: Any) -> None:
    comms = comms_of(2)
    x = np.arange(100_000, dtype=np.int64)

    def body(c: Any) -> Any:
        if c.rank == 0:
            c.send(x, 1)
            return None
        out = np.zeros_like(x)
        c.recv(out, 0)
        return out

    np.testing.assert_array_equal(run_ranks(comms, body)[1], x)


def test_results_have_the_callers_array_type(comms_of: Any) -> None:
    comms = comms_of(3)

    def body(c: Any) -> tuple[Any, Any, Any]:
        x = np.full((2, 3), c.rank, np.int32)
        return c.allgather(x), c.reduce_scatter(np.ones((6, 2), np.float32)), c.alltoall(np.arange(6, dtype=np.uint8))

    for gathered, scattered, swapped in run_ranks(comms, body):
        assert gathered.shape == (6, 3) and gathered.dtype == np.int32
        np.testing.assert_array_equal(gathered[:, 0], [0, 0, 1, 1, 2, 2])
        assert scattered.shape == (2, 2)
        np.testing.assert_array_equal(scattered, np.full((2, 2), 3.0, np.float32))
        assert swapped.dtype == np.uint8 and swapped.shape == (6,)


@pytest.mark.parametrize("ndim", [1, 6, 7, 12])
def test_new_results_keep_the_shape_of_arrays_of_many_dimensions(comms_of: Any, ndim: int) -> None:
    """A view holds up to six dimensions in place and more on the heap: either way a new result
    has the input's shape, with the first dimension times (allgather) or over (reduce_scatter)
    the ranks, and NumPy's values."""
    comms = comms_of(3)
    shape = (6,) + tuple(1 + i % 2 for i in range(ndim - 1))  # (6, 1, 2, 1, 2, ...)

    def body(c: Any) -> tuple[Any, Any, Any]:
        x = np.arange(np.prod(shape), dtype=np.int32).reshape(shape) + c.rank
        return c.allgather(x), c.reduce_scatter(x), c.allreduce(x, np.empty_like(x))

    x = np.arange(np.prod(shape), dtype=np.int32).reshape(shape)
    for rank, (gathered, scattered, reduced) in enumerate(run_ranks(comms, body)):
        assert gathered.shape == (18,) + shape[1:] and scattered.shape == (2,) + shape[1:]
        np.testing.assert_array_equal(gathered, np.concatenate([x, x + 1, x + 2]))
        np.testing.assert_array_equal(reduced, 3 * x + 3)
        np.testing.assert_array_equal(scattered, (3 * x + 3)[2 * rank : 2 * rank + 2])


class HostArrayThroughCudaInterface:
    """Host memory described only by __cuda_array_interface__ (the way CuPy and PyTorch describe
    device memory), counting how often the interface is read: those libraries build it anew
    on every read."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a
        self.reads = 0

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        self.reads += 1
        return {"shape": self.a.shape, "typestr": self.a.dtype.str, "data": (self.a.ctypes.data, False), "version": 3}


def test_arrays_through_the_cuda_array_interface_are_read_once_per_call(comms_of: Any) -> None:
    comms = comms_of(2)
    sends = [HostArrayThroughCudaInterface(np.arange(5, dtype=np.float64) * (r + 1)) for r in range(2)]
    recvs = [HostArrayThroughCudaInterface(np.zeros(5, np.float64)) for _ in range(2)]
    for call in range(3):
        run_ranks(comms, lambda c: c.allreduce(sends[c.rank], recvs[c.rank]))
        for r in range(2):
            np.testing.assert_array_equal(recvs[r].a, np.arange(5) * 3.0)
            assert sends[r].reads == recvs[r].reads == call + 1


def test_group_of_collectives_across_communicators() -> None:
    """One thread drives every rank, as single-process multi-GPU NCCL code does."""
    import minincl

    comms = minincl.Communicator.init_all(4)
    try:
        bufs = [np.full(50_000, r + 1, np.float64) for r in range(4)]
        gathered = [np.zeros(4 * 3, np.int64) for _ in range(4)]
        with minincl.group():
            for c in comms:
                c.allreduce(bufs[c.rank])
                c.allgather(np.full(3, c.rank, np.int64), gathered[c.rank])
        for b in bufs:
            np.testing.assert_array_equal(b, np.full(50_000, 10.0))
        for g in gathered:
            np.testing.assert_array_equal(g, np.repeat(np.arange(4), 3))
    finally:
        for c in comms:
            c.destroy()


def test_async_op_handles(comms_of: Any) -> None:
    comms = comms_of(2)

    def body(c: Any) -> list[Any]:
        xs = [np.full(30_000, c.rank + i, np.float32) for i in range(5)]
        works = [c.allreduce(x, async_op=True) for x in xs]
        blocking = np.ones(10, np.float32)
        c.allreduce(blocking)  # ordered after the async calls
        out = [w.wait() for w in works]
        assert all(w.is_completed() for w in works)
        return [*out, blocking]

    for res in run_ranks(comms, body):
        for i, x in enumerate(res[:5]):
            np.testing.assert_array_equal(x, np.full(30_000, 1 + 2 * i, np.float32))
        np.testing.assert_array_equal(res[5], np.full(10, 2, np.float32))


def test_a_wait_with_a_timeout_raises_and_the_call_goes_on(comms_of: Any) -> None:
    """Work.wait(timeout) limits the wait, not the call: rank 1 joins only once rank 0's
    wait of 0.2 s has given up."""
    comms = comms_of(2)
    gave_up = threading.Event()

    def body(c: Any) -> Any:
        if c.rank == 1:
            assert gave_up.wait(60)
        x = np.full(7, c.rank + 1.0, np.float32)
        work = c.allreduce(x, async_op=True)
        if c.rank == 0:
            with pytest.raises(minincl.Timeout, match=r"did not finish within 0\.2 s \(it goes on"):
                work.wait(timeout=0.2)
            assert not work.is_completed()
            gave_up.set()
        return work.wait(timeout=60)

    for x in run_ranks(comms, body):
        np.testing.assert_array_equal(x, np.full(7, 3.0, np.float32))


def test_a_group_after_async_calls_runs_after_them(comms_of: Any) -> None:
    """The group's calls wait for the async_op calls queued before it, as a plain call does.
    (The group ran beside them: "two threads called on rank 0's communicator at once".)"""
    comms = comms_of(3)

    def body(c: Any) -> list[Any]:
        n, r = c.nranks, c.rank
        x = np.full(1 << 20, r + 1.0, np.float32)
        work = c.allreduce(x, async_op=True)
        got, y = np.zeros(5, np.int64), np.arange(5, dtype=np.int64) * (r + 1)
        with minincl.group():
            c.send(np.full(5, r, np.int64), (r + 1) % n)
            c.recv(got, (r - 1) % n)
            c.allreduce(y)
        work.wait()
        return [x[:3], got, y]

    for r, (x, got, y) in enumerate(run_ranks(comms, body)):
        np.testing.assert_array_equal(x, np.full(3, 6.0, np.float32))
        np.testing.assert_array_equal(got, np.full(5, (r - 1) % 3))
        np.testing.assert_array_equal(y, np.arange(5) * 6)


def test_thousands_of_small_calls_on_one_communicator(comms_of: Any) -> None:
    comms = comms_of(3)

    def body(c: Any) -> int:
        for i in range(2000):
            x = np.array([c.rank + i, i], np.int64)
            c.allreduce(x)
            expect = np.array([3 * i + 3, 3 * i], np.int64)
            if not np.array_equal(x, expect):
                raise AssertionError(f"call {i}: {x} != {expect}")
        return 0

    run_ranks(comms, body)


@pytest.mark.parametrize("nranks", [2, 3, 8])
@pytest.mark.parametrize(("algo", "proto"), [(a, p) for a in ALGOS for p in PROTOS])
def test_float_avg_of_values_near_the_largest_is_finite(nranks: int, algo: str, proto: str) -> None:
    """A float avg scales each input by 1/n before the sum (as NCCL does), so it overflows only
    where the average does: float16 avg(65504, 65504) is 65504, where summing first gave inf
    (and 8-bit floats saturated the sum at their largest value, then halved it)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    types = [np.float16, np.float32, np.float64, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2]
    with forced_env(algo, proto):
        comms = minincl.Communicator.init_all(nranks)
    try:
        for dtype in types:
            top = float(ml_dtypes.finfo(dtype).max)
            rng = np.random.default_rng(nranks)
            inputs = [rng.uniform(0.5 * top, top, size=1009).astype(dtype) for _ in range(nranks)]
            inputs[0][:3] = top  # (every rank at the largest value: the average is the largest value)
            for x in inputs[1:]:
                x[:3] = top
            outs = run_ranks(comms, lambda c: c.allreduce(inputs[c.rank], op="avg"))
            if "reduce_scatter" in ALGOS[algo]:
                whole = [np.concatenate([x] * nranks) for x in inputs]
                parts = run_ranks(comms, lambda c: c.reduce_scatter(whole[c.rank], op="avg"))
            else:
                parts = run_ranks(comms, lambda c: c.reduce(inputs[c.rank], op="avg", root=0))[:1]
            name = np.dtype(dtype).name
            for r, out in enumerate(outs):
                assert np.isfinite(out.astype(np.float64)).all(), f"{name} avg on rank {r}"
                assert_float_avg(out, inputs, name)
            for part in parts:
                assert_float_avg(part, inputs, name)
    finally:
        for c in comms:
            c.destroy()
