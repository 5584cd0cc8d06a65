"""The torch.distributed backend "minincl": collectives, p2p, groups, errors and DDP.

Ranks are local processes (minincl.torch.run_local). Every collective result is compared with
values computed here in one process; DDP training is compared with the same run on gloo.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Union

import numpy as np
import pytest

import minincl

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mtorch = pytest.importorskip("minincl.torch")  # registers the "minincl" backend
run_local = mtorch.run_local

WORLD = 2
Result = Union[torch.Tensor, list[torch.Tensor]]
REDUCE = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "avg": dist.ReduceOp.AVG,
}
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def values(rank: int, n: int = 6, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Small integers (1..4) differing by rank: exact in every type, even multiplied."""
    return ((torch.arange(n) + rank) % 4 + 1).to(dtype)


def all_values(n: int = 6, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.stack([values(r, n, dtype) for r in range(WORLD)])


def assert_close(got: Any, want: Any, where: str, tol: float) -> None:
    try:
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    except AssertionError as e:
        raise AssertionError(f"{where}: {e}") from None


# ---- the collectives: (what a rank runs, what it must get) ----


def _allreduce_case(op: str, dtype: torch.dtype) -> tuple[Callable[[int], Result], Callable[[int], Result]]:
    def run(rank: int) -> Result:
        t = values(rank, dtype=dtype)
        dist.all_reduce(t, op=REDUCE[op])
        return t

    def want(rank: int) -> Result:
        x = all_values()
        red = {
            "sum": x.sum(0),
            "prod": x.prod(0),
            "max": x.max(0).values,
            "min": x.min(0).values,
            "avg": x.mean(0),
        }[op]
        return red.to(dtype)

    return run, want


def _bool_allreduce(rank: int) -> Result:
    any_ = torch.tensor([True, False, rank == 0, False])
    all_ = torch.tensor([True, False, rank == 0, True])
    dist.all_reduce(any_, op=dist.ReduceOp.SUM)
    dist.all_reduce(all_, op=dist.ReduceOp.PRODUCT)
    return [any_, all_]


def _unsigned_allreduce(rank: int) -> Result:
    """uint32 and uint64 reduce as unsigned (torch itself computes little on them)."""
    u32 = torch.tensor([2**31 + rank, 5 * (rank + 1)], dtype=torch.uint32)
    u64 = torch.tensor([2**62 + rank, 3 + rank], dtype=torch.uint64)
    dist.all_reduce(u32, op=dist.ReduceOp.MAX)
    dist.all_reduce(u64, op=dist.ReduceOp.SUM)  # 2^63 and more: wrong if added as signed
    return [u32.to(torch.int64), u64.view(torch.int64)]


def _want_unsigned(rank: int) -> Result:
    u64 = [sum(2**62 + r for r in range(WORLD)) % 2**64, sum(3 + r for r in range(WORLD))]
    as_signed = [v - 2**64 if v >= 2**63 else v for v in u64]
    return [torch.tensor([2**31 + WORLD - 1, 5 * WORLD]), torch.tensor(as_signed)]


def _broadcast(rank: int) -> Result:
    f = values(rank) * 10
    i16 = values(rank, dtype=torch.int16)  # no reduction in int16, but copies move any type
    c = torch.complex(values(rank), -values(rank))
    for t in (f, i16, c):
        dist.broadcast(t, src=1)
    return [f, i16, c]


def _complex_reductions(rank: int) -> Result:
    """reduce, reduce_scatter_tensor and reduce_scatter of complex numbers: part by part (SUM,
    AVG), as torch's all_reduce does for every backend."""
    c = torch.complex(values(rank), -2 * values(rank))
    dist.reduce(c, dst=0, op=dist.ReduceOp.SUM)
    block = torch.empty(2, dtype=torch.complex128)
    whole = torch.complex(values(rank, 2 * WORLD, torch.float64), values(rank + 1, 2 * WORLD, torch.float64))
    reduce_scatter_single(block, whole, op=dist.ReduceOp.AVG)
    listed = torch.empty(3, dtype=torch.complex64)
    dist.reduce_scatter(listed, [torch.complex(values(rank, 3), values(rank + q, 3)) for q in range(WORLD)])
    return [c if rank == 0 else torch.zeros(0), block, listed]


def _want_complex(rank: int) -> Result:
    s = all_values().sum(0)
    re = all_values(2 * WORLD).mean(0)
    im = torch.stack([values(q + 1, 2 * WORLD, torch.float64) for q in range(WORLD)]).mean(0)
    whole_avg = torch.complex(re, im).chunk(WORLD)[rank]
    listed = torch.stack([torch.complex(values(p, 3), values(p + rank, 3)) for p in range(WORLD)]).sum(0)
    return [torch.complex(s, -2 * s).to(torch.complex64) if rank == 0 else torch.zeros(0), whole_avg, listed]


def _reduce(rank: int) -> Result:
    t = values(rank, dtype=torch.int64)
    dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
    return t if rank == 0 else torch.zeros(0)


def _all_gather(rank: int) -> Result:
    outs = [torch.empty(6) for _ in range(WORLD)]
    dist.all_gather(outs, values(rank))
    return outs


def _all_gather_large(rank: int) -> Result:
    """Past 32 KiB a rank the outputs are received in place (broadcasts); one is a strided view."""
    outs = [torch.empty(10007) for _ in range(WORLD - 1)] + [torch.empty(2 * 10007)[::2]]
    dist.all_gather(outs, values(rank, 10007))
    return outs


def _all_gather_from_another_slot(rank: int) -> Result:
    """The input is the output slot of the next rank, which that rank's block overwrites."""
    outs = [torch.empty(10007) for _ in range(WORLD)]
    mine = outs[(rank + 1) % WORLD]
    mine.copy_(values(rank, 10007))
    dist.all_gather(outs, mine)
    return outs


def _all_gather_uneven(rank: int) -> Result:
    """Outputs of different sizes, as NCCL's all_gather allows: rank 0's is empty, the last a
    strided view."""
    outs = [torch.empty(7 * q, dtype=torch.bfloat16) for q in range(WORLD - 1)]
    outs.append(torch.empty(2 * 7 * (WORLD - 1), dtype=torch.bfloat16)[::2])
    dist.all_gather(outs, values(rank, 7 * rank, torch.bfloat16))
    return outs


def _all_gather_into_tensor(rank: int) -> Result:
    out = torch.empty(WORLD * 6, dtype=torch.bfloat16)
    all_gather_single(out, values(rank, dtype=torch.bfloat16))
    return out


def _all_gather_shapes_and_types(rank: int) -> Result:
    """all_gather_single of a parameter (it requires grad) into an output of three
    dimensions, and of int16, a type minincl has no reductions for (copied as bytes)."""
    out = torch.empty(WORLD, 2, 3)
    all_gather_single(out, torch.nn.Parameter(values(rank).reshape(2, 3)))
    i16 = torch.empty(WORLD * 6, dtype=torch.int16)
    all_gather_single(i16, values(rank, dtype=torch.int16))
    # Outputs of another type are refused (as gloo's are), not converted.
    f64 = [torch.zeros(2, dtype=torch.float64) for _ in range(WORLD)]
    try:
        dist.group.WORLD.allgather([f64], [values(rank, 2)])  # type: ignore[union-attr]
        raise AssertionError("allgather converted float32 into float64 outputs")
    except TypeError as e:
        assert "of torch.float32 into outputs of" in str(e), e
    # A wrong output size is told in elements (the communicator sees bytes).
    try:
        dist.group.WORLD._allgather_base(torch.zeros(3), torch.ones(1)).wait()  # type: ignore[union-attr]
        raise AssertionError("an all_gather_into_tensor output of the wrong size was taken")
    except ValueError as e:
        assert f"the output has 3 elements, expected {WORLD} ({WORLD} ranks x the input's 1)" in str(e), e
    return [out, i16]


def _reduce_scatter(rank: int) -> Result:
    out = torch.empty(3)
    dist.reduce_scatter(out, list(values(rank).chunk(WORLD)), op=dist.ReduceOp.MAX)
    return out


def _reduce_scatter_uneven(rank: int) -> Result:
    """Rank q's share has 3 + 2q elements (gloo requires equal shares; minincl reduces to each root)."""
    out = torch.empty(3 + 2 * rank, dtype=torch.int32)
    dist.reduce_scatter(out, [values(rank + q, 3 + 2 * q, torch.int32) for q in range(WORLD)], op=dist.ReduceOp.PRODUCT)
    return out


def _reduce_scatter_tensor(rank: int) -> Result:
    out = torch.empty(3, dtype=torch.float64)
    reduce_scatter_single(out, values(rank, dtype=torch.float64), op=dist.ReduceOp.AVG)
    return out


def _rows(rank: int, sizes: list[int]) -> torch.Tensor:
    """Rows labelled 100*sender + 10*receiver + i, for all_to_all checks."""
    return torch.cat([torch.tensor([[100.0 * rank + 10 * p + i] * 2 for i in range(s)]) for p, s in enumerate(sizes)])


def _split(sender: int, receiver: int) -> int:
    return sender + 2 * receiver + 1  # uneven in both directions


def _all_to_all_even(rank: int) -> Result:
    out = torch.empty(WORLD * 2, 2)
    dist.all_to_all_single(out, _rows(rank, [2] * WORLD))
    return out


def _all_to_all_uneven(rank: int) -> Result:
    send = [_split(rank, p) for p in range(WORLD)]
    recv = [_split(p, rank) for p in range(WORLD)]
    out = torch.empty(sum(recv), 2)
    dist.all_to_all_single(out, _rows(rank, send), output_split_sizes=recv, input_split_sizes=send)
    return out


# Rows [sender][receiver] of an uneven all_to_all_single in place: each rank receives as many
# rows as it sends.
IN_PLACE_SPLITS = [[1, 3], [3, 1]]


def _all_to_all_uneven_in_place(rank: int) -> Result:
    """The output is the input: the receives must not overwrite blocks still to be sent (they
    were refused as overlapping sends, by the check that keeps sendrecv(x, x) from giving
    wrong data)."""
    send = IN_PLACE_SPLITS[rank]
    t = _rows(rank, send)
    dist.all_to_all_single(
        t, t, output_split_sizes=[IN_PLACE_SPLITS[p][rank] for p in range(WORLD)], input_split_sizes=send
    )
    return t


def _want_all_to_all_uneven_in_place(rank: int) -> Result:
    blocks = []
    for p in range(WORLD):
        first = sum(IN_PLACE_SPLITS[p][:rank])
        blocks.append(_rows(p, IN_PLACE_SPLITS[p])[first : first + IN_PLACE_SPLITS[p][rank]])
    return torch.cat(blocks)


def _all_to_all_list(rank: int) -> Result:
    send = [_rows(rank, [_split(rank, p)])[:, :1] + 10 * p for p in range(WORLD)]
    outs = [torch.empty(_split(p, rank), 1) for p in range(WORLD)]
    dist.all_to_all(outs, send)
    return outs


def _send_recv(rank: int) -> Result:
    t = values(rank) + 100
    if rank == 0:
        dist.send(t, dst=1)
    else:
        dist.recv(t, src=0)
    return t


def _send_recv_across_types(rank: int) -> Result:
    """A receive into another type of the same size takes the send's bits (as gloo's and
    NCCL's do): float32 into int32, bfloat16 into int16."""
    sent = [values(0) + 100, values(0, dtype=torch.bfloat16) * 3]
    if rank == 0:
        for t in sent:
            dist.send(t, dst=1)
        return sent
    got = [torch.zeros(6, dtype=torch.int32), torch.zeros(6, dtype=torch.int16)]
    for t in got:
        dist.recv(t, src=0)
    return got


def _want_send_recv_across_types(rank: int) -> Result:
    sent = [values(0) + 100, values(0, dtype=torch.bfloat16) * 3]
    return sent if rank == 0 else [sent[0].view(torch.int32), sent[1].view(torch.int16)]


def _batch_ring(rank: int) -> Result:
    """A ring exchange of 4 MB each way: started together, so neither send waits on the other."""
    send = torch.full((1 << 20,), float(rank))
    recv = torch.empty_like(send)
    ops = [
        dist.P2POp(dist.isend, send, (rank + 1) % WORLD),
        dist.P2POp(dist.irecv, recv, (rank - 1) % WORLD),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    return recv[::4096]


def _isend_across_a_collective(rank: int) -> Result:
    """Rank 1 takes rank 0's isend (4 MB: more than a FIFO holds) only after an all_reduce that
    rank 0 makes while its send is open: gloo and NCCL run both, and so must minincl."""
    big = torch.full((1 << 20,), float(rank + 1))
    x = values(rank)
    if rank == 0:
        work = dist.isend(big, dst=1)
        dist.all_reduce(x)
        work.wait()
    else:
        dist.all_reduce(x)
        dist.recv(big, src=0)
    return [x, big[::4096]]


def _deferred_across_another_groups_collective(rank: int) -> Result:
    """An isend, then an irecv (4 MB each), left open across an all_reduce on another group
    while the peer blocks in the matching recv or send before that all_reduce. gloo starts
    every isend and irecv at once; minincl deferred them until the same group's next call, and
    both ranks then waited for each other until the timeout."""
    other = dist.new_group(list(range(WORLD)))
    sent, received = torch.full((1 << 20,), 1.0), torch.zeros(1 << 20)
    x, y = values(rank), values(rank) * 2
    if rank == 0:
        work = dist.isend(sent, dst=1)
        dist.all_reduce(x, group=other)
        work.wait()
        dist.send(sent * 2, dst=1)
        dist.all_reduce(y, group=other)
    else:
        dist.recv(received, src=0)
        work = dist.irecv(sent, src=0)  # (a prefetch: the send comes only later)
        dist.all_reduce(x, group=other)
        dist.all_reduce(y, group=other)
        work.wait()
    dist.destroy_process_group(other)
    return [x, y, received[::4096], sent[::4096]]


def _wait_on_a_collective_starts_later_sends(rank: int) -> Result:
    """Waiting on an async all_reduce starts the isend posted after it: its receiver takes it
    before joining the all_reduce (the wait used to leave the send deferred: both timed out)."""
    x, got = values(rank), torch.zeros(5)
    if rank == 0:
        handle = dist.all_reduce(x, async_op=True)
        send = dist.isend(torch.full((5,), 7.0), dst=1)
        handle.wait()
        send.wait()
    else:
        dist.recv(got, src=0)
        dist.all_reduce(x)
    return [x, got]


def _gather_scatter(rank: int) -> Result:
    gathered = [torch.empty(6) for _ in range(WORLD)] if rank == 1 else None
    dist.gather(values(rank), gathered, dst=1)
    part = torch.empty(6)
    dist.scatter(part, [values(r) * 7 for r in range(WORLD)] if rank == 0 else None, src=0)
    return [*(gathered or []), part]


def _empty_of_stride_0(rank: int) -> Result:
    """Empty tensors whose stride is 0 (torch.from_numpy's of an empty array, which torch
    counts as contiguous) in every collective that moves them as bytes, as gloo takes them;
    then a call that moves values."""

    def empty() -> torch.Tensor:
        t = torch.from_numpy(np.zeros(0, np.float32))
        assert t.stride() == (0,)
        return t

    out = [empty() for _ in range(WORLD)]
    dist.broadcast(empty(), src=0)
    dist.all_gather(out, empty())
    dist.all_gather_into_tensor(empty(), empty())
    dist.all_to_all(out, [empty() for _ in range(WORLD)])
    dist.all_to_all_single(empty(), empty())
    dist.gather(empty(), out if rank == 0 else None, dst=0)
    dist.scatter(empty(), out if rank == 1 else None, src=1)
    x = values(rank)
    dist.all_reduce(x)
    return [*out, x]


def _parameters(rank: int) -> Result:
    """Tensors that require grad (a model's parameters, as DDP broadcasts them): written in
    place, as gloo writes them, where minincl refuses them as they are (autograd's tensors)."""
    summed = torch.nn.Parameter(values(rank))
    dist.all_reduce(summed, op=dist.ReduceOp.MAX)
    sent = torch.nn.Parameter(values(rank) * (rank + 1))
    dist.broadcast(sent, src=1)
    return [summed.detach(), sent.detach()]


def _short_forms(rank: int) -> Result:
    """The process group's own methods in the short forms torch's C++ ProcessGroup offers
    (one tensor, loose root and op), as DDP calls ``process_group.allreduce(tensor)``."""
    pg: Any = dist.group.WORLD
    total, most, copy, reduced = values(rank), values(rank), values(rank) * 10, values(rank, dtype=torch.int64)
    gathered = [torch.empty(6) for _ in range(WORLD)]
    share, at_1, part = torch.empty(3), [torch.empty(6) for _ in range(WORLD)] if rank == 1 else [], torch.empty(6)
    works = [
        pg.allreduce(total),
        pg.allreduce([most], dist.ReduceOp.MAX),
        pg.broadcast(copy, 1),
        pg.reduce(reduced, 0, dist.ReduceOp.SUM),
        pg.allgather(gathered, values(rank)),
        pg.reduce_scatter(share, list(values(rank).chunk(WORLD)), dist.ReduceOp.MAX),
        pg.gather(at_1, values(rank), 1),
        pg.scatter(part, [values(q) * 7 for q in range(WORLD)] if rank == 0 else [], 0),
        pg.barrier(),
    ]
    for work in works:
        work.wait()
    return [total, most, copy, reduced if rank == 0 else torch.zeros(0), *gathered, share, *at_1, part]


def _want_short_forms(rank: int) -> Result:
    maxima = all_values().max(0).values.float()
    reduced = _want_sum(rank, dtype=torch.int64) if rank == 0 else torch.zeros(0)
    gathered = [values(q) for q in range(WORLD)]
    return (
        [_want_sum(rank), maxima, values(1) * 10, reduced, *gathered, maxima.chunk(WORLD)[rank]]
        + (gathered if rank == 1 else [])
        + [values(rank) * 7]
    )


def _non_contiguous(rank: int) -> Result:
    m = values(rank, 12).reshape(3, 4)
    view = m.t()  # transposed: not contiguous; the result must land in m
    dist.all_reduce(view)
    b = torch.arange(16.0).reshape(4, 4) if rank == 0 else torch.zeros(4, 4)
    dist.broadcast(b[:, 1], src=0)  # a column: strided
    return [m, b]


def _contiguous_on_one_rank(rank: int) -> Result:
    """Rank 0's tensors are contiguous (a call torch waits on then runs at once, with no
    staging), rank 1's are transposed views (staged copies): both kinds of call must move
    the same elements in the same type, or the ranks' calls do not match."""

    def laid(t: torch.Tensor) -> torch.Tensor:  # the same values; on rank 1 laid out by columns
        return t if rank == 0 else t.t().contiguous().t()

    summed = laid(values(rank, 8).reshape(2, 4))
    dist.all_reduce(summed, op=dist.ReduceOp.MAX)
    sent = laid(values(rank, 8).reshape(2, 4) * (rank + 1))
    dist.broadcast(sent, src=1)
    gathered = laid(torch.zeros(WORLD * 2, 4))
    all_gather_single(gathered, laid(values(rank, 8).reshape(2, 4)))
    scattered = laid(torch.zeros(2, 4))
    reduce_scatter_single(scattered, laid(values(rank, WORLD * 8).reshape(WORLD * 2, 4)))
    return [summed, sent, gathered, scattered]


def _want_contiguous_on_one_rank(rank: int) -> Result:
    return [
        all_values(8).max(0).values.float().reshape(2, 4),
        values(1, 8).reshape(2, 4) * 2,
        torch.cat([values(q, 8).reshape(2, 4) for q in range(WORLD)]),
        _want_sum(rank, WORLD * 8).reshape(WORLD * 2, 4)[2 * rank : 2 * rank + 2],
    ]


def _async_on_both_paths(rank: int) -> Result:
    """contiguous_on_one_rank with async_op=True, all issued before any wait (waited on in
    reverse) and a call without async_op among them: rank 0's go to minincl's own async_op
    worker, rank 1's through the lane; both run them in program order."""

    def laid(t: torch.Tensor) -> torch.Tensor:
        return t if rank == 0 else t.t().contiguous().t()

    summed = laid(values(rank, 8).reshape(2, 4))
    sent = laid(values(rank, 8).reshape(2, 4) * (rank + 1))
    gathered = laid(torch.zeros(WORLD * 2, 4))
    scattered = laid(torch.zeros(2, 4))
    between = values(rank)
    works = [
        dist.all_reduce(summed, op=dist.ReduceOp.MAX, async_op=True),
        dist.broadcast(sent, src=1, async_op=True),
    ]
    dist.all_reduce(between)
    works += [
        all_gather_single(gathered, laid(values(rank, 8).reshape(2, 4)), async_op=True),
        reduce_scatter_single(scattered, laid(values(rank, WORLD * 8).reshape(WORLD * 2, 4)), async_op=True),
    ]
    for w in reversed(works):
        w.wait()
    return [summed, sent, gathered, scattered, between]


def _callback_after_a_queued_call(rank: int) -> Result:
    """A future's callback that makes a call runs where the lane would run it on every rank:
    not on the thread that polls or waits on the work first (it did, for an async call on
    minincl's own worker: rank 0 then made the callback's call after a later one, rank 1
    before it, and the collectives paired wrongly)."""
    a, b, c = values(rank), values(rank) * 10, values(rank) * 100
    if rank == 1:
        time.sleep(0.2)
    work = dist.all_reduce(a, async_op=True)
    future = work.get_future().then(lambda f: dist.all_reduce(c))
    later = dist.all_reduce(b, async_op=True)
    if rank == 0:
        while not work.is_completed():
            pass
    else:
        time.sleep(0.2)
        work.wait()
    future.wait()
    later.wait()
    return [a, b, c]


def _late_future_callback(rank: int) -> Result:
    """A future asked for after a later call was made: its callback's call comes after that
    call on every rank, on both paths (plain tensors, then column-major ones), whether the
    work had ended by then or not. (Rank 1 comes late, and its works end before it asks for
    the future; rank 0's has not ended then: its callback ran right after the work, ahead of
    the later call, and each rank's a2 was summed with the other's b.)"""
    out = []
    for strided in (False, True):
        a1, a2, b = (values(rank, 8).reshape(2, 4) * k for k in (1, 10, 100))
        if strided:
            a1, a2 = (t.t().contiguous().t() for t in (a1, a2))
        if rank == 1:
            time.sleep(0.2)
        first = dist.all_reduce(a1, async_op=True)
        second = dist.all_reduce(a2, async_op=True)
        if rank == 1:
            time.sleep(0.05)
        done = first.get_future().then(lambda f, b=b: dist.all_reduce(b))
        done.wait()
        second.wait()
        out += [a1, a2, b]
    return out


def _want_late_future_callback(rank: int) -> Result:
    want = [_want_sum(rank, 8).reshape(2, 4) * k for k in (1, 10, 100)]
    return want + want


def _negated_views(rank: int) -> Result:
    """Tensors with the negative bit set (_neg_view(); the imaginary part of a conj()) hold
    their values' negations: taken as they lay, a send arrived with the wrong sign and an
    all_reduce MAX gave the minimum (gloo sends them right)."""
    t = values(rank)._neg_view()  # reads as -values(rank)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    received = torch.zeros(6)._neg_view()
    if rank == 0:
        dist.send(values(0)._neg_view(), dst=1)
    else:
        dist.recv(received, src=0)
    out = torch.zeros(3)
    reduce_scatter_single(out, values(rank)._neg_view())
    return [t.resolve_neg(), received.resolve_neg(), out]


def _want_negated_views(rank: int) -> Result:
    received = -values(0) if rank == 1 else torch.zeros(6)
    return [-all_values().min(0).values.float(), received, -_want_sum(rank).chunk(WORLD)[rank]]


def _expanded_output_on_one_rank(rank: int) -> Result:
    """Rank 1's output shares memory (expand()ed): it raises ValueError once the call has run,
    so the others' all_gather completes and the group stays in step. (Refused before the
    call, it left the others' all_gather to meet rank 1's next call: every rank failed, then
    and in every later call.)"""
    out = torch.empty(1).expand(WORLD * 4) if rank == 1 else torch.empty(WORLD * 4)
    try:
        dist.all_gather_into_tensor(out, values(rank, 4))
    except ValueError as e:
        assert rank == 1 and "share memory" in str(e), e
        out = torch.zeros(WORLD * 4)
    after = values(rank, 3)
    dist.all_reduce(after)
    # In a batch, the other calls' outputs (here a transposed one, copied back) are written.
    bad = torch.zeros(1).expand(4) if rank == 1 else torch.zeros(4)
    beside = values(rank, 6).reshape(3, 2).t()
    try:
        with dist._coalescing_manager():
            dist.all_reduce(bad)
            dist.all_reduce(beside)
    except ValueError as e:
        assert rank == 1 and "share memory" in str(e), e
    # The list form (gathered into one buffer, then copied out): the other outputs are written.
    listed = [torch.zeros(1).expand(4) if rank == 1 and q == 0 else torch.zeros(4) for q in range(WORLD)]
    try:
        dist.all_gather(listed, values(rank, 4))
    except ValueError as e:
        assert rank == 1 and "share memory" in str(e), e
    return [out, after, beside, *listed[1:]]


def _want_non_contiguous(rank: int) -> Result:
    b = torch.arange(16.0).reshape(4, 4)
    if rank:
        b[:, [0, 2, 3]] = 0
    return [_want_sum(rank, 12).reshape(3, 4), b]


def _async_future(rank: int) -> Result:
    t = values(rank)
    work = dist.all_reduce(t, async_op=True)
    doubled = work.get_future().then(lambda f: f.value()[0] * 2).wait()
    work.wait()
    return [t, doubled]


def _collective_in_a_callback(rank: int) -> Result:
    """A callback that issues collectives (as PowerSGD's DDP hook does) and runs on the worker
    that completed the work (rank 1, whose work is still waiting for rank 0 when it chains the
    callback): it used to wait for that worker, which waited in the callback."""
    x, y, z = values(rank), values(rank), values(rank)
    if rank == 0:
        time.sleep(0.3)

    def callback(f: Any) -> torch.Tensor:
        dist.all_reduce(y)
        return dist.all_reduce(z, async_op=True).get_future().wait()[0] + f.value()[0]

    out = dist.all_reduce(x, async_op=True).get_future().then(callback).wait()
    return [x, y, z, out]


def _sync_behind_async(rank: int) -> Result:
    """A call without async_op while async ones are queued runs after them (program order is
    wire order); a future asked for after its work finished holds the outputs."""
    big = [values(rank, 50_000) for _ in range(3)]
    works = [dist.all_reduce(b, async_op=True) for b in big]
    small = values(rank)
    dist.all_reduce(small)
    for w in works:
        w.wait()
    late = works[0].get_future().wait()[0]
    return [*big, small, late]


def _coalesced(rank: int) -> Result:
    a, b = values(rank), values(rank, 3, torch.float64)
    with dist._coalescing_manager(async_ops=True) as cm:  # allreduce_coalesced
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    c = values(rank, 4)
    with dist._coalescing_manager(device=torch.device("cpu")):  # _start/_end_coalescing
        dist.all_reduce(c, op=dist.ReduceOp.MAX)
    d = values(rank, 2)
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:  # one work for both
        dist.all_reduce(d)
        dist.all_reduce(c)
    cm.wait()
    assert [(w.is_success(), w.exception()) for w in cm.works] == [(True, None)], cm.works
    return [a, b, c, d]


def _subgroups(rank: int) -> Result:
    both = dist.new_group([0, 1])
    solo = dist.new_group([1])
    t = values(rank)
    dist.all_reduce(t, group=both)
    s = values(rank) * 3
    if rank == 1:
        dist.all_reduce(s, group=solo)  # a group of one: its own communicator
    dist.barrier()
    return [t, s]


BITWISE = {"band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}
FOLD = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}
INTEGERS = (torch.int8, torch.uint8, torch.int32, torch.int64)


def bits(rank: int, dtype: torch.dtype, n: int = 10) -> torch.Tensor:
    """Random bits in every byte, differing by rank (the same on every call)."""
    g = torch.Generator().manual_seed(rank)
    return torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8, generator=g).view(dtype)


def flags(rank: int) -> torch.Tensor:
    return torch.tensor([True, False, rank == 0, rank == 1])


def folded(name: str, per_rank: Callable[[int], torch.Tensor]) -> torch.Tensor:
    acc = per_rank(0)
    for r in range(1, WORLD):
        acc = FOLD[name](acc, per_rank(r))
    return acc


def _bitwise(rank: int) -> Result:
    """Each bitwise op on four integer types and on bools (logical and / or / xor) with
    all_reduce; BOR with reduce_scatter_tensor; BXOR with reduce (to rank 1)."""
    out = []
    for op in BITWISE.values():
        for t in [bits(rank, dtype) for dtype in INTEGERS] + [flags(rank)]:
            dist.all_reduce(t, op=op)
            out.append(t)
    rs = torch.empty(10 // WORLD, dtype=torch.int32)
    reduce_scatter_single(rs, bits(rank, torch.int32), op=dist.ReduceOp.BOR)
    red = bits(rank, torch.int64)
    dist.reduce(red, dst=1, op=dist.ReduceOp.BXOR)
    return out + [rs] + ([red] if rank == 1 else [])


def _want_bitwise(rank: int) -> Result:
    want = []
    for name in BITWISE:
        for dtype in INTEGERS:
            want.append(folded(name, lambda r, dtype=dtype: bits(r, dtype)))
        want.append(folded(name, flags))
    want.append(folded("bor", lambda r: bits(r, torch.int32)).chunk(WORLD)[rank])
    return want + ([folded("bxor", lambda r: bits(r, torch.int64))] if rank == 1 else [])


def _functional(rank: int) -> Result:
    """The functional collectives (DTensor's): they find the group by the name torch gave it."""
    import torch.distributed._functional_collectives as funcol

    world = dist.group.WORLD
    out = [
        funcol.all_reduce(values(rank), "sum", world),
        funcol.all_gather_tensor(values(rank), 0, world),
        funcol.reduce_scatter_tensor(values(rank, 2 * WORLD), "max", 0, world),
    ]
    return [funcol.wait_tensor(t) for t in out]


def _compiled_functional(rank: int) -> Result:
    """Functional collectives inside torch.compile (one graph: dynamo traces them as
    _c10d_functional ops, which reach the group through torch's dispatcher)."""
    import torch.distributed._functional_collectives as funcol

    world = dist.group.WORLD

    def step(x: torch.Tensor) -> list[torch.Tensor]:
        summed = funcol.all_reduce(x * 2, "sum", world)
        return [summed + 1, funcol.all_gather_tensor(x, 0, world)]

    return torch.compile(step, backend="aot_eager", fullgraph=True)(values(rank))


def _group_names(rank: int) -> Result:
    """Each group answers to the name torch registered it under, and torch resolves it back."""
    from torch.distributed.distributed_c10d import _resolve_process_group, _world

    sub = dist.new_group([0, 1], group_desc="pair")
    checks = []
    for pg in (dist.group.WORLD, sub):
        checks += [pg.group_name == _world.pg_names[pg], _resolve_process_group(pg.group_name) is pg]
    checks += [dist.group.WORLD.group_name != sub.group_name, sub.group_desc == "pair"]
    return torch.tensor(checks)


def _premul_sum(rank: int) -> Result:
    """PREMUL_SUM, each rank its own factor: a number; a tensor of another type (read as a
    number); a tensor of the data's type (read where it lies)."""
    a, b, c = values(rank), values(rank, dtype=torch.bfloat16), values(rank)
    dist.all_reduce(a, op=dist._make_nccl_premul_sum([0.5, 2.0][rank]))
    dist.all_reduce(b, op=dist._make_nccl_premul_sum(torch.tensor([[3.0, 0.25][rank]])))
    dist.all_reduce(c, op=dist._make_nccl_premul_sum(torch.tensor([[-1.5, 4.0][rank]])))
    return [a, b, c]


def _want_premul_sum(rank: int) -> Result:
    x = all_values()
    return [
        (0.5 * x[0] + 2.0 * x[1]).float(),
        (3.0 * x[0] + 0.25 * x[1]).to(torch.bfloat16),
        (-1.5 * x[0] + 4.0 * x[1]).float(),
    ]


def _want_sum(rank: int, n: int = 6, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return all_values(n).sum(0).to(dtype)


CASES: dict[str, tuple[Callable[[int], Result], Callable[[int], Result]]] = {
    **{
        f"allreduce-{op}-{str(dt).split('.')[-1]}": _allreduce_case(op, dt)
        for op in REDUCE
        for dt in (
            torch.float32,
            torch.float64,
            torch.bfloat16,
            torch.float16,
            torch.int32,
            torch.int64,
            torch.int8,
            torch.uint8,
            torch.float8_e4m3fn,  # (every result here is exact in both 8-bit formats)
            torch.float8_e5m2,
        )
        if op != "avg" or dt.is_floating_point
    },
    "allreduce-premul_sum": (_premul_sum, _want_premul_sum),
    "allreduce-unsigned": (_unsigned_allreduce, _want_unsigned),
    "allreduce-bool": (
        _bool_allreduce,
        lambda r: [
            torch.tensor([True, False, True, False]),
            torch.tensor([True, False, False, True]),
        ],
    ),
    "broadcast": (
        _broadcast,
        lambda r: [
            values(1) * 10,
            values(1, dtype=torch.int16),
            torch.complex(values(1), -values(1)),
        ],
    ),
    "reduce": (_reduce, lambda r: _want_sum(r, dtype=torch.int64) if r == 0 else torch.zeros(0)),
    "complex_reductions": (_complex_reductions, _want_complex),
    "all_gather": (_all_gather, lambda r: [values(q) for q in range(WORLD)]),
    "all_gather_large": (_all_gather_large, lambda r: [values(q, 10007) for q in range(WORLD)]),
    "all_gather_from_another_slot": (_all_gather_from_another_slot, lambda r: [values(q, 10007) for q in range(WORLD)]),
    "all_gather_uneven": (_all_gather_uneven, lambda r: [values(q, 7 * q, torch.bfloat16) for q in range(WORLD)]),
    "expanded_output_on_one_rank": (
        _expanded_output_on_one_rank,
        lambda r: [
            torch.zeros(WORLD * 4) if r == 1 else torch.cat([values(q, 4) for q in range(WORLD)]),
            _want_sum(r, 3),
            _want_sum(r, 6).reshape(3, 2).t(),
            *[values(q, 4) for q in range(1, WORLD)],
        ],
    ),
    "all_gather_into_tensor": (
        _all_gather_into_tensor,
        lambda r: torch.cat([values(q, dtype=torch.bfloat16) for q in range(WORLD)]),
    ),
    "all_gather_shapes_and_types": (
        _all_gather_shapes_and_types,
        lambda r: [
            torch.stack([values(q).reshape(2, 3) for q in range(WORLD)]),
            torch.cat([values(q, dtype=torch.int16) for q in range(WORLD)]),
        ],
    ),
    "reduce_scatter": (
        _reduce_scatter,
        lambda r: all_values().max(0).values.float().chunk(WORLD)[r],
    ),
    "reduce_scatter_uneven": (
        _reduce_scatter_uneven,
        lambda r: torch.stack([values(p + r, 3 + 2 * r, torch.int32) for p in range(WORLD)]).prod(0, dtype=torch.int32),
    ),
    "reduce_scatter_tensor-avg": (
        _reduce_scatter_tensor,
        lambda r: all_values().mean(0).chunk(WORLD)[r],
    ),
    "all_to_all_single": (
        _all_to_all_even,
        lambda r: torch.cat([_rows(p, [2] * WORLD)[2 * r : 2 * r + 2] for p in range(WORLD)]),
    ),
    "all_to_all_single-uneven": (
        _all_to_all_uneven,
        lambda r: torch.cat(
            [
                _rows(p, [_split(p, q) for q in range(WORLD)])[sum(_split(p, q) for q in range(r)) :][: _split(p, r)]
                for p in range(WORLD)
            ]
        ),
    ),
    "all_to_all_single-uneven-in-place": (_all_to_all_uneven_in_place, _want_all_to_all_uneven_in_place),
    "all_to_all-list": (
        _all_to_all_list,
        lambda r: [_rows(p, [_split(p, r)])[:, :1] + 10 * r for p in range(WORLD)],
    ),
    "send_recv": (_send_recv, lambda r: values(0) + 100),
    "send_recv-across-types": (_send_recv_across_types, _want_send_recv_across_types),
    "batch_isend_irecv": (_batch_ring, lambda r: torch.full((256,), float((r - 1) % WORLD))),
    "isend_across_a_collective": (_isend_across_a_collective, lambda r: [_want_sum(r), torch.ones(256)]),
    "deferred_across_another_groups_collective": (
        _deferred_across_another_groups_collective,
        lambda r: [
            _want_sum(r),
            _want_sum(r) * 2,
            torch.full((256,), 0.0 if r == 0 else 1.0),
            torch.full((256,), 1.0 + r),
        ],
    ),
    "wait_on_a_collective_starts_later_sends": (
        _wait_on_a_collective_starts_later_sends,
        lambda r: [_want_sum(r), torch.full((5,), 0.0 if r == 0 else 7.0)],
    ),
    "gather_scatter": (
        _gather_scatter,
        lambda r: ([values(q) for q in range(WORLD)] if r == 1 else []) + [values(r) * 7],
    ),
    "empty_of_stride_0": (_empty_of_stride_0, lambda r: [torch.zeros(0)] * WORLD + [_want_sum(r)]),
    "parameters": (_parameters, lambda r: [all_values().max(0).values.float(), values(1) * 2]),
    "short_forms": (_short_forms, _want_short_forms),
    "non_contiguous": (_non_contiguous, _want_non_contiguous),
    "contiguous_on_one_rank": (_contiguous_on_one_rank, _want_contiguous_on_one_rank),
    "negated_views": (_negated_views, _want_negated_views),
    "callback_after_a_queued_call": (
        _callback_after_a_queued_call,
        lambda r: [_want_sum(r), _want_sum(r) * 10, _want_sum(r) * 100],
    ),
    "late_future_callback": (_late_future_callback, _want_late_future_callback),
    "async_on_both_paths": (_async_on_both_paths, lambda r: [*_want_contiguous_on_one_rank(r), _want_sum(r)]),
    "async_future": (_async_future, lambda r: [_want_sum(r), _want_sum(r) * 2]),
    "collective_in_a_callback": (_collective_in_a_callback, lambda r: [_want_sum(r)] * 3 + [_want_sum(r) * 2]),
    "sync_behind_async": (
        _sync_behind_async,
        lambda r: [_want_sum(r, 50_000)] * 3 + [_want_sum(r), _want_sum(r, 50_000)],
    ),
    "coalesced": (
        _coalesced,
        lambda r: [
            _want_sum(r),
            _want_sum(r, 3, torch.float64),
            all_values(4).max(0).values.float() * WORLD,
            _want_sum(r, 2),
        ],
    ),
    "new_group": (_subgroups, lambda r: [_want_sum(r), values(r) * 3]),
    "bitwise": (_bitwise, _want_bitwise),
    "functional_collectives": (
        _functional,
        lambda r: [
            _want_sum(r),
            torch.cat([values(q) for q in range(WORLD)]),
            all_values(2 * WORLD).max(0).values.float().chunk(WORLD)[r],
        ],
    ),
    "compiled_functional_collectives": (
        _compiled_functional,
        lambda r: [_want_sum(r) * 2 + 1, torch.cat([values(q) for q in range(WORLD)])],
    ),
    "group_names": (_group_names, lambda r: torch.ones(6, dtype=torch.bool)),
}


def run_cases(port: int) -> dict[str, Any]:
    """One rank: every case, in order; an error is recorded, not raised, so others still run."""
    rank = int(os.environ["RANK"])
    dist.init_process_group("minincl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    results: dict[str, Any] = {}
    try:
        for name, (run, _) in CASES.items():
            try:
                results[name] = run(rank)
            except Exception as e:  # noqa: BLE001 - reported per case by the test
                results[name] = f"{type(e).__name__}: {e}"
                dist.barrier()  # a failed case must not shift the next one's calls
    finally:
        dist.destroy_process_group()
    return results


@pytest.fixture(scope="module")
def case_results() -> list[dict[str, Any]]:
    return run_local(run_cases, WORLD, mtorch.free_port(), timeout=180)


@pytest.mark.parametrize("name", list(CASES))
def test_collective(case_results: list[dict[str, Any]], name: str) -> None:
    want = CASES[name][1]
    for rank, results in enumerate(case_results):
        got = results[name]
        assert not isinstance(got, str), f"rank {rank}: {got}"
        assert_close(got, want(rank), f"{name}, rank {rank}", tol=0.0)


@pytest.mark.parametrize(("value", "seconds"), [("2", 2.0), ("2s", 2.0), ("500ms", 0.5), ("soon", 60.0)])
def test_the_look_for_a_new_id_reads_the_bootstrap_timeout_as_inits_do(
    monkeypatch: pytest.MonkeyPatch, value: str, seconds: float
) -> None:
    """How long a rank refused by a gone root reads the store again for rank 0's new id: "2s"
    was 60 s (a float() of the variable; an init refuses "soon" itself, naming it)."""
    monkeypatch.setenv("MININCL_BOOTSTRAP_TIMEOUT", value)
    assert mtorch._bootstrap_timeout() == seconds


# ---- one rank, in this process: errors and init through file:// ----


@pytest.fixture
def single_rank(tmp_path: Path) -> Any:
    dist.init_process_group("minincl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_single_rank_file_init(single_rank: Any) -> None:
    assert dist.get_backend() == "minincl"
    assert isinstance(single_rank, mtorch.ProcessGroupMinincl)
    t = torch.arange(5.0)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    torch.testing.assert_close(t, torch.arange(5.0))


def test_calls_without_async_op_run_on_the_callers_thread(single_rank: Any) -> None:
    """They wait at once, so the lane's thread is never started; nor by an async call on a
    plain tensor (minincl's own async_op worker runs it), only by one the general path takes."""
    t = torch.arange(4.0)
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    dist.barrier()
    assert single_rank._comms["cpu"].lane._thread is None
    dist.all_reduce(t, async_op=True).wait()
    assert single_rank._comms["cpu"].lane._thread is None
    torch.testing.assert_close(t, torch.arange(4.0))
    columns = torch.arange(6.0).reshape(2, 3).t()  # (not contiguous: staged, so the general path)
    dist.all_reduce(columns, async_op=True).wait()
    assert single_rank._comms["cpu"].lane._thread is not None
    torch.testing.assert_close(columns, torch.arange(6.0).reshape(2, 3).t())


def test_calls_on_an_aborted_group_raise_torch_errors(single_rank: Any) -> None:
    """On every path: an async call on a plain tensor, which minincl's own async worker
    refuses before queueing it, included (it raised minincl's InvalidUsage, not torch's)."""
    single_rank.abort()
    plain, strided = torch.ones(4), torch.ones(2, 2).t()
    calls = {
        "plain": lambda: dist.all_reduce(plain),
        "plain, async": lambda: dist.all_reduce(plain, async_op=True).wait(),
        "strided, async": lambda: dist.all_reduce(strided, async_op=True).wait(),
    }
    for name, call in calls.items():
        with pytest.raises(dist.DistBackendError, match="aborted") as raised:
            call()
        assert isinstance(raised.value, minincl.InvalidUsage), name


def test_single_rank_premul_sum_scales(single_rank: Any) -> None:
    t = torch.arange(4.0)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(-2.5))
    torch.testing.assert_close(t, torch.arange(4.0) * -2.5)
    with pytest.raises(minincl.InvalidArgument, match="not a whole number"):
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist._make_nccl_premul_sum(0.5))
    # (torch's factor is always a float: 3.0 on integers was refused as "not an integer")
    ints = torch.arange(4, dtype=torch.int32)
    dist.all_reduce(ints, op=dist._make_nccl_premul_sum(3.0))
    assert ints.tolist() == [0, 3, 6, 9]


def receives_from_any_source() -> dict[str, Any]:
    """Rank 0 receives from any source: once from each other rank (blocking), then once
    more (async, from the last rank), then in a group of its own where nobody sends."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("minincl", timeout=timedelta(seconds=10))
    alone = dist.new_group([0], timeout=timedelta(seconds=1))
    out: dict[str, Any] = {}
    if rank == 0:
        got = {}
        for _ in range(world - 1):
            t = torch.zeros(3)
            src = dist.recv(t)
            got[src] = t.tolist()
        out["got"] = got
    else:
        dist.send(torch.full((3,), float(rank)), 0)
    dist.barrier()
    if rank == 0:
        t = torch.zeros(3)
        work = dist.irecv(t)
        work.wait()
        out["async"] = [work._source_rank(), t.tolist()]
        try:
            dist.recv(torch.zeros(3), group=alone)
            out["nobody"] = "returned"
        except Exception as e:  # noqa: BLE001 - for the test to inspect
            out["nobody"] = f"{type(e).__name__}: {e}"
    elif rank == world - 1:
        dist.send(torch.full((3,), 10.0 * rank), 0)
    dist.barrier()
    dist.destroy_process_group()
    return out


def test_recv_from_any_source() -> None:
    """dist.recv / irecv without src take the send that waits (as gloo's do); dist.recv
    returns its rank, and a receive nobody sends to ends at the group's timeout."""
    world = 3
    out = run_local(receives_from_any_source, world, timeout=120)[0]
    assert out["got"] == {r: [float(r)] * 3 for r in range(1, world)}, out
    assert out["async"] == [world - 1, [10.0 * (world - 1)] * 3], out
    assert out["nobody"].startswith("Timeout: minincl backend: recv from any source: no rank sent to rank 0"), out


def p2p_lane_threads() -> list[Any]:
    """This rank's story of where its sends and receives ran: a dist.send / dist.recv (an
    isend / irecv waited on at once), then an isend / irecv waited on with a time limit."""
    rank = int(os.environ["RANK"])
    dist.init_process_group("minincl")
    try:
        lane = dist.group.WORLD._p2p_comms["cpu"].lane
        got = torch.zeros(4)
        if rank == 0:
            dist.send(torch.arange(4.0), 1)
        else:
            dist.recv(got, 0)
        at_once = lane._thread is None  # (the lane's thread starts with its first job)
        work = dist.isend(got * 2, 0) if rank == 1 else dist.irecv(got, 1)
        work.wait(timeout=timedelta(seconds=60))
        return [got.tolist(), at_once, lane._thread is not None]
    finally:
        dist.destroy_process_group()


def test_sends_and_receives_waited_on_at_once_run_on_the_waiting_thread() -> None:
    """As a call without async_op does: no hand-off to the lane's thread and back (~30 us of
    an 8-byte hop). A wait with a time limit must be able to give up, so there the ops run on
    the lane's thread."""
    out = run_local(p2p_lane_threads, 2, timeout=120)
    assert out[0] == [[0.0, 2.0, 4.0, 6.0], True, True], out
    assert out[1] == [[0.0, 1.0, 2.0, 3.0], True, True], out


def disagreement(case: str) -> str:
    """This rank's story of "tags": sends tagged 1 and 2 received as 2 then 1 (rank 0 to
    1); "roots": a scatter whose ranks each pass themselves as the root, then a gather to
    rank 0; or "receives first": ranks 0 and 1 each receive from the other before sending."""
    rank = int(os.environ["RANK"])
    dist.init_process_group("minincl", timeout=timedelta(seconds=20))
    try:
        if case == "tags":
            a, b = torch.zeros(2), torch.zeros(2)
            works = []
            if rank == 0:
                works = [dist.isend(torch.ones(2), 1, tag=1), dist.isend(torch.full((2,), 2.0), 1, tag=2)]
            elif rank == 1:
                works = [dist.irecv(a, 0, tag=2), dist.irecv(b, 0, tag=1)]
            for w in works:
                w.wait()
        elif case == "receives first":
            if rank < 2:
                dist.recv(torch.zeros(2), 1 - rank)
                dist.send(torch.ones(2), 1 - rank)
        else:
            got = torch.zeros(2)
            dist.scatter(got, [torch.full((2,), 10.0 * rank + r) for r in range(3)], src=rank)  # (a user's mistake)
            gathered = [torch.zeros(2) for _ in range(3)] if rank == 0 else None
            dist.gather(torch.full((2,), float(rank)), gathered, dst=0)
        dist.barrier()
    except Exception as e:  # noqa: BLE001 - for the test to inspect
        return f"{type(e).__name__}: {e}"
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return "ok"


@pytest.mark.parametrize("case", ["tags", "roots", "receives first"])
def test_ranks_that_disagree_on_tags_or_roots_fail_instead_of_pairing_the_wrong_data(case: str) -> None:
    """The receive tagged 2 meets the send tagged 1: it names both tags (gloo matches by
    tag; minincl pairs in order, and says so). The scatter's sends, each rank's to the others,
    carry their root in their tag: the gather's receives meet them and fail, where they used
    to take their data (gloo times out). Receives that wait for each other are a deadlock,
    with advice in torch's terms."""
    outs = run_local(disagreement, 3, case, timeout=120)
    assert all(o != "ok" for o in outs), outs
    if case == "receives first":
        assert any("deadlock in sends and receives: " in o for o in outs[:2]), outs
        assert all("minincl.group" not in o for o in outs), outs
        assert any("(dist.batch_isend_irecv, or isend and irecv before either wait)" in o for o in outs), outs
    elif case == "tags":
        assert "with tag 2 from rank 0, but rank 0 sent 8 bytes with tag 1" in outs[1], outs
    else:  # (the gather's tag, GATHER_TAG - 0, met a scatter's)
        assert any("mismatched send/recv" in o and "with tag -536870912" in o for o in outs), outs


def subgroup_mismatches() -> list[str]:
    """Ranks 1 and 3 make a subgroup and disagree in it: on a collective's count (in one
    group), on a send's size (in another)."""
    dist.init_process_group("minincl")
    rank, said = dist.get_rank(), []
    try:
        for kind in ("collective", "send/recv"):
            g = dist.new_group([1, 3])
            try:
                if kind == "collective" and rank in (1, 3):
                    dist.all_reduce(torch.ones(4 if rank == 1 else 8), group=g)
                elif rank == 1:
                    dist.send(torch.ones(4), 3, group=g)
                elif rank == 3:
                    dist.recv(torch.ones(8), 1, group=g)
                said.append("ok")
            except Exception as e:  # noqa: BLE001 - for the test to inspect
                said.append(f"{type(e).__name__}: {e}")
        dist.barrier()  # (the world group still works)
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return said


def test_a_subgroups_errors_say_which_global_ranks_its_ranks_are() -> None:
    """minincl's messages name the communicator's ranks; a subgroup's errors add which
    global ranks those are (its rank 0 is global rank 1 here)."""
    outs = run_local(subgroup_mismatches, 4, timeout=120)
    assert outs[0] == outs[2] == ["ok", "ok"], outs
    note = "[rank numbers here are this process group's: its ranks 0-1 are global ranks 1, 3]"
    collective, p2p = outs[3]
    assert "mismatched calls: " in collective and collective.endswith(note), outs
    assert "mismatched send/recv: rank 1 posted a recv of 32 bytes from rank 0, but rank 0 sent 16 bytes" in p2p, outs
    assert p2p.endswith(note), outs
    assert outs[1][0].endswith(note), outs  # (rank 1's send fit: it may end without its receive)


def gather_mismatch() -> str:
    """3 floats against 4 in all_gather_into_tensor: what this rank raised."""
    dist.init_process_group("minincl")
    n = 3 + dist.get_rank()
    try:
        dist.all_gather_into_tensor(torch.empty(2 * n), torch.ones(n))
        return "ok"
    except Exception as e:  # noqa: BLE001 - for the test to inspect
        return f"{type(e).__name__}: {e}"
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def test_mismatch_messages_say_their_counts_are_bytes_where_the_backend_passed_bytes() -> None:
    """all_gather passes its tensors as bytes, so 3 floats read `allgather(count=12, uint8)`."""
    outs = run_local(gather_mismatch, 2, timeout=120)
    assert any("allgather(count=12, uint8)" in o and "allgather(count=16, uint8)" in o for o in outs), outs
    for o in outs:
        assert o.endswith("all_gather and all_to_all tensors as bytes: these counts are bytes]"), outs


def test_the_global_ranks_note_is_empty_for_the_world_and_cut_short_for_many() -> None:
    from minincl._torch_errors import global_ranks_note

    assert global_ranks_note([0, 1, 2]) == ""
    assert global_ranks_note([2, 0]).endswith("its ranks 0-1 are global ranks 2, 0]")
    many = global_ranks_note(list(range(1, 41)))
    assert "its ranks 0-15 (of 40) are global ranks 1, 2, " in many and many.endswith(", 16]"), many


def init_mixed(spec: str) -> str:
    try:
        dist.init_process_group(spec)
    except ValueError as e:
        return str(e)
    dist.destroy_process_group()
    return "no error"


@pytest.mark.parametrize("spec", ["cpu:minincl,cuda:gloo", "cpu:gloo,cuda:minincl"])
def test_a_group_mixing_minincl_with_another_backend_is_refused(spec: str) -> None:
    """torch would keep minincl's group alone and drop the other backend without a word."""
    other = "cuda:gloo" if spec.startswith("cpu:minincl") else "cpu:gloo"
    for message in run_local(init_mixed, WORLD, spec, timeout=60):
        assert f"this group would also use {other}" in message
        assert "dist.new_group(backend='minincl')" in message


# ---- sparse all_reduce (nn.Embedding(sparse=True) gradients) ----

# (shape, sparse dimensions, dtype, non-zeros of rank 0, 1, 2, async_op)
SPARSE_CASES = [
    ((13, 5), 2, torch.float32, (6, 0, 9), False),  # repeated indices; rank 1 has none
    ((11,), 1, torch.int64, (3, 4, 5), True),
    ((7, 4), 1, torch.float64, (5, 2, 3), False),  # hybrid: each non-zero is a row of 4
    ((0, 3), 2, torch.float32, (0, 0, 0), False),
    ((1000, 16), 1, torch.bfloat16, (40, 30, 20), True),
    ((9, 2), 2, torch.float16, (4, 4, 4), False),  # (gloo cannot add float16 sparse tensors)
    ((6, 6), 2, torch.int8, (0, 0, 0), True),  # no rank has any
]


def sparse_input(case: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank `rank`'s indices (sparse dims x non-zeros) and values in case `case`: small
    integers, so sums are exact in every dtype."""
    shape, sparse_dims, _, nnz, _ = SPARSE_CASES[case]
    rng = np.random.default_rng(100 * case + rank)
    n = nnz[rank]
    indices = np.stack([rng.integers(0, max(d, 1), n) for d in shape[:sparse_dims]]).reshape(sparse_dims, n)
    values = rng.integers(1, 4, (n, *shape[sparse_dims:]))
    return indices, values


def sparse_sums(device: str) -> dict[str, Any]:
    rank = int(os.environ["RANK"])
    if device == "cuda":
        device = f"cuda:{rank % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
    dist.init_process_group("minincl")
    sums = []
    for case, (shape, _, dtype, _, async_op) in enumerate(SPARSE_CASES):
        indices, values = sparse_input(case, rank)
        t = torch.sparse_coo_tensor(torch.from_numpy(indices), torch.from_numpy(values).to(dtype), shape).to(device)
        work = dist.all_reduce(t, async_op=async_op)
        if work is not None:
            work.wait()
        sums.append(
            {
                "dense": t.to_dense().to(torch.float64).cpu().numpy(),
                "dtype": str(t.dtype),
                "coalesced": t.is_coalesced(),
                "device": str(t.device),
            }
        )
    mismatch = outcome_of(lambda: str(dist.all_reduce(torch.ones(4 + rank, device=device).to_sparse())))
    dist.destroy_process_group()
    return {"sums": sums, "mismatch": mismatch, "device": device}


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a usable CUDA GPU"),
            ],
        ),
    ],
)
def test_sparse_all_reduce_sums_every_rank_s_tensor(device: str) -> None:
    """As with gloo: each rank's tensor becomes the coalesced sum of every rank's (CUDA
    tensors too, which gloo does not sum)."""
    if device == "cuda" and not minincl.build_info()["cuda"]:
        pytest.skip("this build of minincl has no CUDA communicators")
    ranks = 3
    got = run_local(sparse_sums, ranks, device, timeout=120)
    for case, (shape, _, dtype, _, _) in enumerate(SPARSE_CASES):
        want = np.zeros(shape)
        for r in range(ranks):
            indices, values = sparse_input(case, r)
            np.add.at(want, tuple(indices), values)
        for r in range(ranks):
            s = got[r]["sums"][case]
            assert s["dtype"] == str(dtype) and s["coalesced"] and s["device"] == got[r]["device"], (case, r, s)
            np.testing.assert_array_equal(s["dense"], want, err_msg=f"case {case}, rank {r}")
    for r in range(ranks):
        m = got[r]["mismatch"]
        assert m["type"] == "InvalidArgument", m
        assert "rank 1 gave shape (5,) with 1 sparse dimension(s), torch.float32, rank 0 shape (4,)" in m["message"], m


def test_bitwise_ops_on_floats_are_refused(single_rank: Any) -> None:
    with pytest.raises(TypeError, match="reduce with ReduceOp.BXOR needs integer or bool tensors, not torch.float32"):
        dist.reduce(torch.ones(2), dst=0, op=dist.ReduceOp.BXOR)


def test_a_roots_wrong_gather_or_scatter_list_is_refused_before_data_moves(single_rank: Any) -> None:
    """As gloo: a tensor per rank, each like the root's own (a wrong list at the root once
    sent or received what it could, leaving the other ranks to fail at their next call)."""
    with pytest.raises(ValueError, match="scatter: scatter_list has 2 tensors for 1 ranks; give one per rank"):
        dist.scatter(torch.empty(2), [torch.ones(2), torch.ones(2)], src=0)
    with pytest.raises(ValueError, match=r"gather: gather_list\[0\] is torch.float32 of 3 elements, but this rank's"):
        dist.gather(torch.ones(2), [torch.empty(3)], dst=0)
    out = [torch.empty(2)]
    dist.gather(torch.full((2,), 3.0), out, dst=0)  # (the group still works)
    assert out[0].tolist() == [3.0, 3.0]


def test_unsupported_dtype_and_device_are_clear(single_rank: Any) -> None:
    with pytest.raises(TypeError, match="cannot reduce torch.int16"):
        dist.all_reduce(torch.ones(2, dtype=torch.int16))
    with pytest.raises(TypeError, match="reduce with ReduceOp.MAX on torch.complex64 tensors: complex numbers reduce"):
        dist.reduce(torch.ones(2, dtype=torch.complex64), dst=0, op=dist.ReduceOp.MAX)
    with pytest.raises(TypeError, match="minincl backend: reduce_scatter with ReduceOp.MIN on torch.complex64"):
        dist.reduce_scatter(
            torch.ones(2, dtype=torch.complex64), [torch.ones(2, dtype=torch.complex64)], op=dist.ReduceOp.MIN
        )
    with pytest.raises(
        ValueError, match=r"an output tensor \(shape \(4,\), strides \(0,\)\) whose elements share memory"
    ):
        dist.broadcast(torch.zeros(1).expand(4), src=0)
    with pytest.raises(minincl.InvalidUsage, match="meta tensors"):
        dist.all_reduce(torch.ones(2, device="meta"))
    with pytest.raises(TypeError, match="dense"):  # (it failed deep inside, naming a memory format)
        dist.broadcast(torch.ones(2).to_sparse(), src=0)
    with pytest.raises(TypeError, match="a torch.sparse_csr tensor; minincl's calls take dense"):
        dist.all_reduce(torch.ones(2, 2).to_sparse_csr())
    with pytest.raises(ValueError, match="allreduce of sparse tensors takes ReduceOp.SUM only"):
        dist.all_reduce(torch.ones(2).to_sparse(), op=dist.ReduceOp.MAX)
    with pytest.raises(TypeError, match="of torch.float32 into a torch.float64 output"):  # (bytes were reinterpreted)
        dist.all_gather_into_tensor(torch.zeros(2, dtype=torch.float64), torch.ones(4))
    if not minincl.build_info()["cuda"]:
        # Something that says it is on a GPU checks the routing without one.
        on_gpu = SimpleNamespace(device=torch.device("cuda", 0))
        with pytest.raises(minincl.InvalidUsage, match="allreduce on CUDA tensors, but this build"):
            single_rank._device_of("allreduce", [on_gpu])


def test_torch_sees_the_device_types_the_group_serves(single_rank: Any) -> None:
    """torch asks a group which devices it serves (object collectives, dcp.async_save). The
    marker registered for it never runs a collective: it fails instead of doing nothing."""
    assert single_rank._device_types == [torch.device("cpu")]
    assert dist.distributed_c10d._get_object_coll_device(single_rank) == "cpu"
    assert dist.distributed_c10d._device_capability(single_rank) == ["cpu"]
    with pytest.raises(RuntimeError, match="collective operation error"):
        single_rank._get_backend(torch.device("cpu")).allreduce([torch.ones(2)]).wait()


def async_checkpoint(directory: str) -> list[bool]:
    """Save a state with dcp.async_save (it needs a group serving the CPU), load it back."""
    import torch.distributed.checkpoint as dcp

    dist.init_process_group("minincl")
    state = {"w": torch.arange(6.0), "b": torch.full((3,), 2.5, dtype=torch.bfloat16)}
    dcp.async_save(state, checkpoint_id=directory).result()
    loaded = {"w": torch.zeros(6), "b": torch.zeros(3, dtype=torch.bfloat16)}
    dcp.load(loaded, checkpoint_id=directory)
    dist.destroy_process_group()
    return [torch.equal(loaded[k], state[k]) for k in state]


def test_async_checkpoint_round_trip(tmp_path: Path) -> None:
    assert run_local(async_checkpoint, WORLD, str(tmp_path), timeout=120) == [[True, True]] * WORLD


# ---- a rank that dies ----


def outcome_of(call: Callable[[], str]) -> dict[str, Any]:
    """What `call` raised ({"type": "none", "message": what it returned} if nothing), for a
    test to inspect."""
    try:
        return {"type": "none", "message": call()}
    except Exception as e:  # noqa: BLE001 - written for the test to inspect
        is_minincl_error = isinstance(e, minincl.Error)
        return {
            "type": type(e).__name__,
            "message": str(e),
            "torch": isinstance(e, dist.DistBackendError) and is_minincl_error,
        }


def rank_setup() -> dict[str, Any]:
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS")
    return {"env": {n: os.environ.get(n) for n in names}, "threads": torch.get_num_threads()}


@pytest.mark.parametrize("omp_threads", [None, "2"])
def test_run_local_sets_up_ranks_as_torchrun_does(monkeypatch: pytest.MonkeyPatch, omp_threads: str | None) -> None:
    """torchrun gives each of several processes one PyTorch thread unless OMP_NUM_THREADS is set."""
    if omp_threads is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp_threads)
    got = run_local(rank_setup, 3, timeout=120)
    threads = omp_threads or "1"
    for rank, g in enumerate(got):
        assert g["env"] == {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "3",
            "LOCAL_WORLD_SIZE": "3",
            "OMP_NUM_THREADS": threads,
        }, g
        assert g["threads"] == int(threads), g


def die_or_notice(out: str) -> None:
    rank = int(os.environ["RANK"])
    dist.init_process_group("minincl")
    dist.all_reduce(torch.ones(4))
    ready = Path(out + ".ready")  # rank 0 is past the first allreduce (else it may fail there)
    if rank == 1:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.001)
        os._exit(3)  # gone without a word: no destroy, no error message
    ready.touch()
    start = time.monotonic()

    def allreduces() -> str:
        for _ in range(1000):
            dist.all_reduce(torch.ones(1 << 16), async_op=True).wait()
        return "every allreduce succeeded"

    outcome: dict[str, Any] = outcome_of(allreduces)
    outcome["seconds"] = time.monotonic() - start
    Path(out).write_text(json.dumps(outcome))
    os._exit(0)  # the store and the communicator point at a dead peer: no orderly teardown


def test_dead_peer_raises_through_work_wait(tmp_path: Path) -> None:
    out = tmp_path / "rank0.json"
    with pytest.raises(mtorch.LocalRunError, match="rank 1: no result"):
        run_local(die_or_notice, WORLD, str(out), timeout=90)
    outcome = json.loads(out.read_text())
    assert outcome["type"] in ("RemoteError", "Timeout"), outcome
    assert outcome["torch"], outcome  # (a DistBackendError, as NCCL raises, and a minincl.Error)
    assert outcome["seconds"] < 60, outcome


def die_during_ddp(out: str) -> None:
    """Rank 1 exits after DDP's third step (its first steps' forwards broadcast the rebuilt
    buckets; later ones make no call, and backward's all_reduce is the first to fail), rank 0
    trains on: its backward must raise."""
    rank = int(os.environ["RANK"])
    dist.init_process_group("minincl")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))

    def steps() -> str:
        for step in range(100):
            model(torch.randn(2, 8)).sum().backward()
            if rank == 1 and step == 2:
                os._exit(3)
        return "every step succeeded"

    Path(out).write_text(json.dumps(outcome_of(steps)))
    os._exit(0)


def test_a_dead_peer_fails_ddp_backward(tmp_path: Path) -> None:
    """DDP's reducer reads the all_reduce's future in C++: one completed by set_exception
    looked successful there, with the exception as its value, and the survivor crashed
    (SIGSEGV) in backward. The future now fails, and backward raises, as with gloo."""
    out = tmp_path / "rank0.json"
    with pytest.raises(mtorch.LocalRunError, match="rank 1: no result") as info:
        run_local(die_during_ddp, WORLD, str(out), timeout=90)
    assert out.exists(), str(info.value)
    outcome = json.loads(out.read_text())
    assert outcome["type"] == "RuntimeError" and "RemoteError: rank 1 " in outcome["message"], outcome


def test_a_failed_work_fails_its_future_and_is_freed() -> None:
    """A failed work's future (and a coalesced one's, with another work still running) raises
    on wait, as gloo's does; the work and its outputs are then freed (the error's traceback
    leads back to them, and the outcome's future, which the collector cannot see into, held it)."""
    import gc
    import weakref

    from minincl._torch_work import MinincclWork, _run
    from minincl.torch import _AllOf

    def peer_died() -> None:
        raise RuntimeError("peer died")

    work = MinincclWork([torch.zeros(1000)])
    future = work.get_future()
    _run(peer_died, [work])
    with pytest.raises(RuntimeError, match="peer died"):
        future.wait()
    gone = weakref.ref(work)
    del work, future
    gc.collect()
    assert gone() is None

    failed, running = MinincclWork([torch.zeros(2)]), MinincclWork([torch.zeros(2)])
    both = _AllOf([failed, running]).get_future()
    _run(peer_died, [failed])
    with pytest.raises(RuntimeError, match="peer died"):
        both.wait()
    _run(lambda: None, [running])


def recv_first() -> dict[str, Any]:
    """Both ranks receive before they send: what each raised."""
    rank = int(os.environ["RANK"])
    dist.init_process_group("minincl")

    def recv() -> str:
        dist.recv(torch.zeros(10), 1 - rank)
        return "the recv returned"

    outcome = outcome_of(recv)
    dist.destroy_process_group()
    return outcome


def test_receives_waiting_on_each_other_raise_instead_of_hanging() -> None:
    """gloo and NCCL wait here until the process group's timeout (minutes); minincl names the
    cycle after a second."""
    outcomes = run_local(recv_first, WORLD, timeout=90)
    assert all(o["type"] in ("InvalidUsage", "RemoteError") and o["torch"] for o in outcomes), outcomes
    assert any(
        "deadlock in sends and receives: " in o["message"] and "waits for rank 1 to send" in o["message"]
        for o in outcomes
    ), outcomes


def late_rank_1(set_later: bool) -> dict[str, Any]:
    """Rank 1 stays out of an all_reduce for 4 s, alive, under a 1 s process-group timeout
    (`set_later`: given by ``set_timeout`` after an init with torch's default)."""
    rank = int(os.environ["RANK"])
    if set_later:
        dist.init_process_group("minincl")
        dist.group.WORLD.set_timeout(timedelta(seconds=1))  # type: ignore[union-attr]
    else:
        dist.init_process_group("minincl", timeout=timedelta(seconds=1))
    if rank == 1:
        time.sleep(4)

    def all_reduce() -> str:
        dist.all_reduce(torch.ones(10))
        return "the all_reduce returned"

    outcome = outcome_of(all_reduce)
    dist.destroy_process_group()
    return outcome


def timeout_of_years() -> list[float]:
    """A group timeout of 20000 days (past minincl's 1e9 s limit: no limit) and set_timeout
    of as much, as gloo takes them."""
    dist.init_process_group("minincl", timeout=timedelta(days=20000))
    t = torch.full((3,), float(int(os.environ["RANK"]) + 1))
    dist.all_reduce(t)
    dist.group.WORLD.set_timeout(timedelta(days=40000))  # type: ignore[union-attr]
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.tolist()


def test_a_group_timeout_of_years_means_no_limit() -> None:
    assert run_local(timeout_of_years, WORLD, timeout=90) == [[6.0] * 3] * WORLD


@pytest.mark.parametrize("set_later", [False, True])
def test_the_process_group_timeout_limits_a_call(set_later: bool) -> None:
    """As with gloo, a call waiting longer than the group's timeout raises (by default torch
    gives 30 minutes); minincl's error says where each rank is."""
    waiting, late = run_local(late_rank_1, WORLD, set_later, timeout=90)
    assert waiting["type"] == "Timeout", waiting  # (before rank 1 came: it would have succeeded)
    assert waiting["torch"] and late["torch"], (waiting, late)
    assert "for more than 1 s" in waiting["message"], waiting
    assert "rank 1: in no call" in waiting["message"], waiting
    assert late["type"] == "RemoteError" and "call timeout" in late["message"], late


def init_again_on_one_store(rounds: int) -> list[float]:
    """init_process_group, all_reduce, destroy_process_group, `rounds` times, on one store
    that outlives them all (as torchrun's agent store does). Rank 0 comes late to each later
    round, so that rank 1 looks for the new group's id first."""
    rank = int(os.environ["RANK"])
    store = dist.TCPStore("127.0.0.1", int(os.environ["STORE_PORT"]), WORLD, rank == 0, timeout=timedelta(seconds=60))
    sums = []
    for k in range(rounds):
        if rank == 0 and k > 0:
            time.sleep(0.5)
        dist.init_process_group("minincl", store=store, rank=rank, world_size=WORLD)
        t = torch.full((3,), float(rank + 1))
        dist.all_reduce(t)
        sums.append(t[0].item())
        dist.destroy_process_group()
    return sums


def test_init_again_after_destroy_on_a_store_that_outlives_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """The group's unique id is taken out of the store once every rank has joined: a later
    group on the same store read the last one's and waited for its root, which was gone
    (MININCL_BOOTSTRAP_TIMEOUT; gloo inits again at once)."""
    monkeypatch.setenv("MININCL_BOOTSTRAP_TIMEOUT", "10")
    monkeypatch.setenv("STORE_PORT", str(mtorch.free_port()))
    got = run_local(init_again_on_one_store, WORLD, 3, timeout=120)
    want = float(sum(range(1, WORLD + 1)))
    assert got == [[want] * 3] * WORLD


def _client_of_the_tests_store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", int(os.environ["STORE_PORT"]), is_master=False, timeout=timedelta(seconds=60))


def a_first_init_that_fails() -> str:
    """Rank 1's init fails (a bad setting), after rank 0 put the group's id in the store."""
    if int(os.environ["RANK"]) == 1:
        os.environ["MININCL_NCHANNELS"] = "bogus"
    try:
        dist.init_process_group(
            "minincl", store=_client_of_the_tests_store(), rank=int(os.environ["RANK"]), world_size=WORLD
        )
    except (minincl.Error, RuntimeError) as e:
        return type(e).__name__
    return "ok"


def an_init_where_rank_0_comes_late() -> list[float]:
    rank = int(os.environ["RANK"])
    if rank == 0:
        time.sleep(1.5)  # (rank 1 reads the store first)
    dist.init_process_group("minincl", store=_client_of_the_tests_store(), rank=rank, world_size=WORLD)
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.tolist()


def test_an_init_after_a_failed_one_on_the_same_store_does_not_take_its_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """An init that fails leaves its id in the store, which outlives its processes (torchrun's
    restarts share one). A rank of the next init that read it waited for a root that was gone,
    until the bootstrap timeout, and failed. That root now refuses it at once, and it reads the
    store again."""
    port = mtorch.free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    monkeypatch.setenv("STORE_PORT", str(port))
    monkeypatch.setenv("MININCL_BOOTSTRAP_TIMEOUT", "20")
    assert run_local(a_first_init_that_fails, WORLD, timeout=120) == ["RemoteError", "InvalidArgument"]
    got = run_local(an_init_where_rank_0_comes_late, WORLD, timeout=120)
    want = float(sum(range(1, WORLD + 1)))
    assert got == [[want] * 3] * WORLD
    del server


def test_the_process_group_timeout_bounds_its_init_too(tmp_path: Path) -> None:
    """A group whose other rank never comes fails at the group's timeout (3 s here), as
    gloo's does, not at MININCL_BOOTSTRAP_TIMEOUT (60 s by default)."""
    code = (
        "import time, datetime, torch.distributed as dist, minincl.torch\n"
        f"store = dist.FileStore({str(tmp_path / 'store')!r}, 2)\n"
        "start = time.monotonic()\n"
        "try:\n"
        "    dist.init_process_group('minincl', store=store, rank=0, world_size=2,\n"
        "                            timeout=datetime.timedelta(seconds=3))\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, time.monotonic() - start, str(e).splitlines()[0])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MININCL_BOOTSTRAP_TIMEOUT"}
    # (From an empty folder: from the repository root, "import minincl" finds its sources.)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.stdout.count(" ") >= 2, out.stdout + out.stderr[-3000:]
    kind, seconds, message = out.stdout.split(" ", 2)
    assert kind == "Timeout", out.stdout + out.stderr
    assert 2.5 < float(seconds) < 20, out.stdout
    assert "missing ranks: 1" in message, message


def send_after_a_poll(how: str) -> list[float]:
    """Rank 0 polls its async all_reduce (or asks for its future), then posts an isend, then
    waits on the all_reduce; rank 1 takes the send before it joins the all_reduce. The wait
    must start the send (only the first poll or wait did: both waited for the timeout)."""
    rank = int(os.environ["RANK"])
    dist.init_process_group("minincl", timeout=timedelta(seconds=20))
    t, x = torch.full((4,), float(rank + 1)), torch.arange(8.0)
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)
        if how == "poll":
            work.is_completed()
        else:
            work.get_future()
        send = dist.isend(x, 1)
        work.wait()
        send.wait()
    else:
        got = torch.zeros(8)
        dist.recv(got, 0)
        assert torch.equal(got, x), got
        dist.all_reduce(t)
    dist.destroy_process_group()
    return t.tolist()


@pytest.mark.parametrize("how", ["poll", "future"])
def test_a_send_posted_after_a_poll_starts_at_the_next_wait(how: str) -> None:
    for got in run_local(send_after_a_poll, WORLD, how, timeout=60):
        assert got == [3.0] * 4, got


def destroy_with_a_callback_pending(kind: str) -> dict[str, Any]:
    """destroy_process_group right after chaining a callback that makes a call on a work
    still running: destroy let the lane's jobs finish while the callback's call waited for a
    new thread of that lane, which never ran (it hung for ever)."""
    dist.init_process_group("minincl", timeout=timedelta(seconds=20))
    t, u = torch.ones(1000), torch.ones(1000)
    if kind == "strided":
        t = torch.ones(2, 500).t()
    work = dist.all_reduce(t, async_op=True)
    done = work.get_future().then(lambda f: dist.all_reduce(u))
    dist.destroy_process_group()
    done.wait()
    return {"t": t.flatten()[0].item(), "u": u[0].item()}


@pytest.mark.parametrize("kind", ["plain", "strided"])
def test_destroy_waits_for_a_callback_that_makes_a_call(kind: str) -> None:
    for got in run_local(destroy_with_a_callback_pending, WORLD, kind, timeout=60):
        assert got == {"t": 2.0, "u": 2.0}, got


def wait_briefly_then_fully(strided: bool) -> dict[str, Any]:
    """Rank 1 joins an all_reduce 2 s late; rank 0 first waits on it for 0.2 s, then fully.
    `strided`: a transposed tensor, which the general path takes (else minincl's own async
    worker runs it: QueuedWork)."""
    rank = int(os.environ["RANK"])
    dist.init_process_group("minincl")
    if rank == 1:
        time.sleep(2)
    t = torch.full((2, 5), float(rank + 1)).t() if strided else torch.full((10,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    assert work is not None
    brief = outcome_of(lambda: str(work.wait(timedelta(seconds=0.2))))
    work.wait()
    dist.destroy_process_group()
    return {"brief": brief, "sum": t.flatten().tolist()}


@pytest.mark.parametrize("strided", [False, True], ids=["plain", "strided"])
def test_a_wait_with_a_timeout_raises_and_a_later_wait_still_gets_the_result(strided: bool) -> None:
    """work.wait(timeout) limits one wait, not the operation, as with NCCL."""
    first, second = run_local(wait_briefly_then_fully, WORLD, strided, timeout=90)
    assert first["brief"]["type"] == "Timeout" and first["brief"]["torch"], first
    assert "did not finish within 0.2 s" in first["brief"]["message"], first
    assert first["sum"] == second["sum"] == [3.0] * 10, (first, second)


# ---- DDP: minincl and gloo train the same model to the same parameters ----


def train_ddp(backend: str, device: str) -> dict[str, torch.Tensor]:
    """6 steps of DDP with small buckets (several allreduces in flight) and buffers
    (BatchNorm: broadcast every step); then 3 more with the fp16-compression comm hook
    (futures chained with .then)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    rank = int(os.environ["RANK"])
    if device == "cuda":
        device = f"cuda:{rank % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(20, 64),
        torch.nn.BatchNorm1d(64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 5),
    ).to(device)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.005)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)
    for step in range(9):
        if step == 6:
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        x, y = (
            torch.randn(16, 20, generator=gen).to(device),
            torch.randn(16, 5, generator=gen).to(device),
        )
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    dist.destroy_process_group()
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def _check_same_training(device: str) -> None:
    ours = run_local(train_ddp, WORLD, "minincl", device, timeout=180)
    gloo = run_local(train_ddp, WORLD, "gloo", device, timeout=180)
    parameter_names = {k for k in gloo[0] if k.endswith(("weight", "bias"))}
    for rank in range(WORLD):
        for key, value in gloo[rank].items():
            assert_close(ours[rank][key], value, f"{key}, rank {rank}, minincl vs gloo", tol=1e-5)
            if key in parameter_names:  # BatchNorm's running stats are rank-local after the last step
                assert_close(ours[rank][key], ours[0][key], f"{key}, rank {rank} vs rank 0", tol=0.0)
    assert any((ours[0][k] != train_start()[k]).any() for k in train_start()), "training changed nothing"


def train_start() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(20, 64),
        torch.nn.BatchNorm1d(64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 5),
    )
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_ddp_matches_gloo_cpu() -> None:
    _check_same_training("cpu")


def test_ddp_over_the_network_transport_matches_gloo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every minincl connection over TCP, as between hosts."""
    monkeypatch.setenv("MININCL_TRANSPORT", "net")
    _check_same_training("cpu")


def train_sparse_embedding(backend: str) -> dict[str, torch.Tensor]:
    """4 DDP steps of a model whose embedding has sparse gradients (all_reduce of sparse
    COO tensors: rows touched by either rank)."""
    from torch.nn.parallel import DistributedDataParallel

    rank = int(os.environ["RANK"])
    dist.init_process_group(backend)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 8, sparse=True), torch.nn.Flatten(), torch.nn.Linear(24, 1))
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(4):
        opt.zero_grad()
        ddp(torch.randint(0, 50, (5, 3), generator=gen)).square().sum().backward()
        opt.step()
    dist.destroy_process_group()
    return {"start": start, "end": {k: v.detach() for k, v in model.state_dict().items()}}


def test_ddp_with_sparse_gradients_matches_gloo() -> None:
    ours = run_local(train_sparse_embedding, WORLD, "minincl", timeout=180)
    gloo = run_local(train_sparse_embedding, WORLD, "gloo", timeout=180)
    for rank in range(WORLD):
        for key, value in gloo[rank]["end"].items():
            assert_close(ours[rank]["end"][key], value, f"{key}, rank {rank}, minincl vs gloo", tol=1e-6)
    weight = "0.weight"
    assert (ours[0]["end"][weight] != ours[0]["start"][weight]).any(dim=1).sum() > 5, "few embedding rows trained"


def compiled_calls() -> dict[str, Any]:
    """torch.compile of a DDP model, whose C++ reducer broadcasts from inside the compiled
    forward, and of functions making calls that dynamo runs as they are (a graph break)
    instead of as functional collectives."""
    from torch.nn.parallel import DistributedDataParallel

    rank = int(os.environ["RANK"])
    dist.init_process_group("minincl")
    torch.manual_seed(0)
    model = torch.compile(DistributedDataParallel(torch.nn.Linear(4, 2)), backend="eager")
    for _ in range(2):  # (the gradients add up)
        model(torch.ones(3, 4) * (rank + 1)).sum().backward()
    got: dict[str, Any] = {"grad": model.module.weight.grad.numpy().copy()}

    def broadcast(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        dist.broadcast(y, src=0)
        return y + 1

    def async_all_reduce(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        dist.all_reduce(y, async_op=True).wait()
        return y + 1

    def barrier(x: torch.Tensor) -> torch.Tensor:
        dist.barrier()
        return x + 1

    for fn in (broadcast, async_all_reduce, barrier):
        got[fn.__name__] = torch.compile(fn, backend="eager")(torch.full((4,), float(rank + 1))).numpy()
    dist.destroy_process_group()
    return got


def test_torch_compile_runs_ddp_and_calls_it_cannot_trace() -> None:
    """dynamo tried to compile the group's Python methods where it graph-breaks on a call,
    and failed on their first look at the group (UnsafeScriptObjectError: ProcessGroups are
    opaque to it); gloo's and NCCL's groups are C++. minincl's code is marked for it to skip."""
    got = run_local(compiled_calls, WORLD, timeout=300)
    ranks = np.arange(WORLD)
    for r in range(WORLD):
        # d(sum of outputs)/dW[i, j] = sum over the batch of x[j] = 3 (rank + 1); DDP averages; two steps.
        np.testing.assert_allclose(got[r]["grad"], np.full((2, 4), 2 * np.mean(3 * (ranks + 1))), err_msg=f"rank {r}")
        np.testing.assert_array_equal(got[r]["broadcast"], np.full(4, 3.0))
        np.testing.assert_array_equal(got[r]["async_all_reduce"], np.full(4, np.sum(2 * (ranks + 1)) + 1.0))
        np.testing.assert_array_equal(got[r]["barrier"], np.full(4, r + 2.0))


def train_uneven_with_join_and_zero(backend: str) -> dict[str, torch.Tensor]:
    """DDP's Join: rank r runs 3 + 2r steps (the others shadow the missing all_reduces), with
    find_unused_parameters (the joined ranks then all_reduce their map of used parameters
    through ``process_group.allreduce(tensor)``) and a no_sync step; then
    ZeroRedundancyOptimizer (Adam state sharded over the ranks, parameters broadcast from their
    owners, the state consolidated to rank 0). A module outside DDP stays as it was."""
    from torch.distributed.algorithms.join import Join
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    rank = int(os.environ["RANK"])
    dist.init_process_group(backend)
    torch.manual_seed(0)
    used, unused = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)), torch.nn.Linear(4, 1)
    model = torch.nn.ModuleList([used, unused])
    ddp = DistributedDataParallel(used, find_unused_parameters=True)
    sgd = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x = torch.arange(8.0).reshape(2, 4) * (rank + 1) / 8
    with Join([ddp]):
        for step in range(3 + 2 * rank):
            sgd.zero_grad()
            if step == 1:
                with ddp.no_sync():  # (gradients accumulate locally, then go out with the next step's)
                    ddp(x).sum().backward()
            ddp(x).square().sum().backward()
            sgd.step()
    zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    for _ in range(3):
        zero.zero_grad()
        ddp(x).square().sum().backward()
        zero.step()
    zero.consolidate_state_dict(to=0)
    dist.destroy_process_group()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_ddp_join_with_uneven_inputs_and_zero_match_gloo() -> None:
    ours = run_local(train_uneven_with_join_and_zero, 3, "minincl", timeout=180)
    gloo = run_local(train_uneven_with_join_and_zero, 3, "gloo", timeout=180)
    for rank in range(3):
        for key, value in gloo[rank].items():
            assert_close(ours[rank][key], value, f"{key}, rank {rank}, minincl vs gloo", tol=1e-6)
            assert_close(ours[rank][key], ours[0][key], f"{key}, rank {rank} vs rank 0", tol=0.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a usable CUDA GPU")
def test_ddp_matches_gloo_gpu() -> None:
    if not minincl.build_info()["cuda"]:
        pytest.skip("this build of minincl has no CUDA communicators")
    _check_same_training("cuda")


def stream_ordering() -> dict[str, Any]:
    """GPU ops issued under a side stream whose work is slow (torch.cuda._sleep), waited on
    outside it: what each rank got, and whether its stream had drained at a barrier's end."""
    rank = int(os.environ["RANK"])
    device = f"cuda:{rank % torch.cuda.device_count()}"
    torch.cuda.set_device(device)
    dist.init_process_group("minincl")
    side, peer, spin = torch.cuda.Stream(), 1 - rank, 200_000_000  # (about 0.1 s of GPU cycles)
    x, got, summed = torch.zeros(1000, device=device), torch.zeros(1000, device=device), None
    torch.cuda.synchronize()
    with torch.cuda.stream(side):  # a pipeline stage's send: produced on the side stream
        torch.cuda._sleep(spin)
        x.fill_(rank + 1)
        reqs = [dist.isend(x, peer), dist.irecv(got, peer)]
    for r in reqs:
        r.wait()  # (the deferred ops start here, outside the side stream)
    received = got.cpu()  # (on the default stream)
    with torch.cuda.stream(side):
        torch.cuda._sleep(spin)
        y = torch.full((1000,), float(rank + 1), device=device)
        work = dist.all_reduce(y, async_op=True)
    work.wait()
    summed = y.cpu()
    torch.cuda._sleep(spin)
    dist.barrier()
    drained = torch.cuda.current_stream().query()
    dist.destroy_process_group()
    return {"received": received.unique().tolist(), "summed": summed.unique().tolist(), "drained": drained}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a usable CUDA GPU")
def test_gpu_ops_keep_the_order_of_the_stream_they_were_issued_on() -> None:
    """As NCCL: an isend runs after the work queued before it on the stream current at the
    call (it ran on whatever stream was current when the deferred batch started); wait()
    orders the current stream after the op; a barrier returns once the caller's stream ran."""
    if not minincl.build_info()["cuda"]:
        pytest.skip("this build of minincl has no CUDA communicators")
    outs = run_local(stream_ordering, 2, timeout=180)
    for rank, out in enumerate(outs):
        assert out == {"received": [float(2 - rank)], "summed": [3.0], "drained": True}, (rank, out)


# ---- torch.distributed.pipelining: a GPipe schedule over two stages ----


def gpipe_grads(backend: str) -> torch.Tensor:
    """Stage r holds layer r; 4 micro-batches forward then backward; returns its weight's grad."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    layer = [torch.nn.Linear(8, 8) for _ in range(world)][rank]
    stage = PipelineStage(layer, rank, world, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=lambda out, target: ((out - target) ** 2).mean())
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))
    if rank == 0:
        schedule.step(x)
    else:
        schedule.step(target=torch.zeros(8, 8))
    dist.destroy_process_group()
    assert layer.weight.grad is not None
    return layer.weight.grad


def test_pipelining_schedule_matches_gloo() -> None:
    ours = run_local(gpipe_grads, WORLD, "minincl", timeout=120)
    gloo = run_local(gpipe_grads, WORLD, "gloo", timeout=120)
    for rank in range(WORLD):
        assert ours[rank].abs().sum() > 0
        assert_close(ours[rank], gloo[rank], f"rank {rank}'s gradient, minincl vs gloo", tol=0.0)
