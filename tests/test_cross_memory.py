"""Kernel copies between rank processes (cross-memory attach): an allgather's or broadcast's
receiver reads a sender's input with process_vm_readv (so does a reducing one of allreduce and
reduce_scatter, into its FIFO slot); the root of an in-place broadcast writes
every other step straight into its receiver's output with process_vm_writev, so both cores
copy, and an allreduce's senders write final values into their receivers' outputs the same way.
They are on by default where every channel has a core; MININCL_POINTER_STEPS=2 asks for them
anywhere, 1 never. Every case must give NumPy's answer, and a mismatched call must still fail
clearly."""

from __future__ import annotations

import os

import pytest
import workers
from conftest import skip_without_cross_memory_attach

import minincl

COUNTS = [0, 1, 7, 50021]  # 50021 floats: many 16 KiB steps


@pytest.fixture
def kernel_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernel copies for every Simple step of 1 KiB or more (the tests' FIFO slots are 16 KiB)."""
    monkeypatch.setenv("MININCL_POINTER_STEPS", "2")
    monkeypatch.setenv("MININCL_POINTER_STEP_BYTES", "1024")
    monkeypatch.setenv("MININCL_PROTO", "simple")
    monkeypatch.delenv("MININCL_ALGO", raising=False)


# How far a receiver reads ahead in a sender's input: many 16 KiB steps at once; or 2.5
# steps, so that a read ends inside a step (which the receiver then reads itself).
@pytest.mark.parametrize("read_bytes", ["1M", "40K"])
@pytest.mark.parametrize("channels", ["1", "2"])
@pytest.mark.parametrize("nranks", [2, 3])
def test_copies_through_the_kernel_give_numpys_answer(
    kernel_copies: None, monkeypatch: pytest.MonkeyPatch, nranks: int, channels: str, read_bytes: str
) -> None:
    monkeypatch.setenv("MININCL_NCHANNELS", channels)
    monkeypatch.setenv("MININCL_POINTER_READ_BYTES", read_bytes)
    results = minincl.launch(workers.kernel_copies_with_stats, nranks, COUNTS)
    assert all(checks == len(COUNTS) * 4 * (2 * nranks + 6) for checks, _ in results)
    skip_without_cross_memory_attach(results, nranks)
    # Receivers read inputs (pointer steps), allgather's and broadcast's ahead; with 2 ranks
    # each root wrote into its receiver (direct writes; with 3 the tuner picks algorithms
    # with none, e.g. a broadcast root sending to both).
    assert all(stats["pointer_steps"] > 0 for _, stats in results), results
    assert all(stats["steps_read_ahead"] > 0 for _, stats in results), results
    assert all(stats["direct_writes"] > 0 for _, stats in results) or nranks > 2, results


def test_ring_broadcast_through_the_kernel(kernel_copies: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ring broadcast of 4 ranks: the root's receiver forwards what the root wrote into it."""
    monkeypatch.setenv("MININCL_ALGO", "ring")
    monkeypatch.setenv("MININCL_NCHANNELS", "1")
    results = minincl.launch(workers.kernel_copies_with_stats, 4, [50021])
    assert all(checks == 4 * (2 * 4 + 6) for checks, _ in results)
    skip_without_cross_memory_attach(results, 4)
    assert all(stats["direct_writes"] > 0 for _, stats in results), results


def test_on_by_default_where_every_channel_has_a_core(monkeypatch: pytest.MonkeyPatch) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    monkeypatch.setenv("MININCL_NCHANNELS", "1")
    monkeypatch.delenv("MININCL_POINTER_STEPS", raising=False)
    results = minincl.launch(workers.collectives_with_stats, 2, [50021])
    monkeypatch.setenv("MININCL_POINTER_STEPS", "2")
    skip_without_cross_memory_attach(minincl.launch(workers.collectives_with_stats, 2, [7]), 2)
    assert [stats["readable_peers"] for _, stats in results] == [1, 1]
    monkeypatch.setenv("MININCL_POINTER_STEPS", "1")
    results = minincl.launch(workers.collectives_with_stats, 2, [7])
    assert [stats["readable_peers"] for _, stats in results] == [0, 0]


def test_off_by_default_where_ranks_share_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """More channels than cores: senders would wait for receivers that wait for a core."""
    monkeypatch.setenv("MININCL_NCHANNELS", "1")
    monkeypatch.delenv("MININCL_POINTER_STEPS", raising=False)
    nranks = len(os.sched_getaffinity(0)) + 1
    if nranks > 8:
        pytest.skip("too many cores to oversubscribe cheaply")
    results = minincl.launch(workers.collectives_with_stats, nranks, [50021])
    assert all(checks > 0 and stats["readable_peers"] == 0 for checks, stats in results), results


def test_mismatched_broadcast_fails_clearly_and_writes_nothing(kernel_copies: None) -> None:
    """The root's direct writes need the receiver's output published for the same call; a
    receiver on another call gets none, and names the mismatch."""
    results = minincl.launch(workers.mismatched_broadcast, 2)
    errors = [e for e, _ in results]
    # (Counts as the ranks passed them, though a broadcast's steps carry bytes.)
    assert any("mismatched calls" in e and "count=200000" in e and "count=100000" in e for e in errors), errors
    assert all(e != "ok" for e in errors), errors
    assert results[1][1], "the receiver's buffer was written"


@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
def test_allreduce_senders_write_final_values_into_receivers(
    kernel_copies: None, monkeypatch: pytest.MonkeyPatch, in_place: bool
) -> None:
    """Out of place only: in place, writing into the receiver's input measured slower."""
    monkeypatch.setenv("MININCL_ALGO", "ring")
    results = minincl.launch(workers.allreduce_with_stats, 2, 50021, in_place)
    assert all(ok for ok, _ in results)
    if any(stats["readable_peers"] != 1 for _, stats in results):
        pytest.skip("this kernel does not let sibling processes write each other's memory (cross-memory attach)")
    # Out of place, every step of the allgather half went straight into the peer's output,
    # and the reduce-scatter half read the peer's input (pointer steps). In place, the input
    # is the output: neither.
    wrote = [stats["direct_writes"] > 0 for _, stats in results]
    assert wrote == [not in_place] * 2, results
    read = [stats["pointer_steps"] > 0 for _, stats in results]
    assert read == [not in_place] * 2, results
