"""Send / recv pointer steps: in a group that also receives, a send posts where its data is and
the receiver copies it from there (threads: a plain copy; processes: cross-memory attach, or the
sender's window), one copy instead of two; a receiver that has started its recv gets the rest
of the message as one step, which it reads in pieces (MININCL_POINTER_READ_BYTES). Every case
must give NumPy's answer, and a send must still complete before its receiver starts, as a FIFO
send does."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import workers
from conftest import run_ranks, skip_without_cross_memory_attach

import minincl

COUNTS = [0, 1, 7, 50021]  # 50021 floats: several 16 KiB slots, and several 4 KiB pieces
# More than the FIFOs hold (2 channels x 8 slots x 16 KiB): a lone send's receiver starts
# while it is still sending.
BIG = 200021


@pytest.fixture
def pointer_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pointer steps from 1 KiB (the tests' FIFO slots are 16 KiB), read 4 KiB at a time."""
    monkeypatch.setenv("MININCL_POINTER_STEPS", "2")
    monkeypatch.setenv("MININCL_POINTER_STEP_BYTES", "1024")
    monkeypatch.setenv("MININCL_POINTER_READ_BYTES", "4096")


@pytest.mark.parametrize("channels", ["1", "2"])
@pytest.mark.parametrize("nranks", [2, 3])
def test_exchanges_between_processes(
    pointer_env: None, monkeypatch: pytest.MonkeyPatch, nranks: int, channels: str
) -> None:
    monkeypatch.setenv("MININCL_NCHANNELS", channels)
    results = minincl.launch(workers.exchanges_with_stats, nranks, COUNTS)
    assert all(checks == len(COUNTS) * 3 * 3 for checks, _ in results)
    skip_without_cross_memory_attach(results, nranks)
    assert all(stats["pointer_steps"] > 0 for _, stats in results), results


def test_an_exchange_waits_for_its_receiver_then_goes_as_one_step(
    pointer_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send longer than a slot, in a group that also receives, is not cut into slot-long
    pointer steps while its receiver has not started (one kernel read per slot costs): it
    waits for the receiver, then goes as one step. Every call, whichever rank comes first."""
    monkeypatch.setenv("MININCL_NCHANNELS", "1")
    results = minincl.launch(workers.repeated_exchanges, 2, BIG, 40)
    assert [checks for checks, _, _ in results] == [40, 40]
    skip_without_cross_memory_attach([(steps, stats) for _, steps, stats in results], 2)
    assert [steps for _, steps, _ in results] == [40, 40], results


def test_exchanges_from_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without kernel copies, a receiver still reads pointer steps from the sender's window."""
    monkeypatch.setenv("MININCL_POINTER_STEPS", "1")
    monkeypatch.setenv("MININCL_POINTER_STEP_BYTES", "1024")
    monkeypatch.setenv("MININCL_WINDOW_BYTES", "16M")
    results = minincl.launch(workers.exchanges_with_stats, 2, COUNTS, True)
    assert all(checks == len(COUNTS) * 3 * 3 for checks, _ in results)
    assert all(stats["readable_peers"] == 0 and stats["pointer_steps"] > 0 for _, stats in results), results


def test_exchanges_between_threads(pointer_env: None) -> None:
    comms = minincl.Communicator.init_all(3)
    try:
        for checks, _ in run_ranks(comms, lambda c: workers.exchanges_with_stats(c, COUNTS)):
            assert checks == len(COUNTS) * 3 * 3
        assert all(c.stats()["pointer_steps"] > 0 for c in comms)
    finally:
        for c in comms:
            c.destroy()


def test_no_pointer_steps_when_turned_off(pointer_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MININCL_POINTER_STEPS", "0")
    comms = minincl.Communicator.init_all(2)
    try:
        run_ranks(comms, lambda c: workers.exchanges_with_stats(c, [50021]))
        assert [c.stats()["pointer_steps"] for c in comms] == [0, 0]
    finally:
        for c in comms:
            c.destroy()


def send_alone(comms: list[Any], x: np.ndarray) -> None:
    """Rank 0 sends x to rank 1, which checks it: a sender with nothing to receive."""

    def body(c: Any) -> Any:
        if c.rank == 0:
            c.send(x, 1)
            return None
        return c.recv(np.zeros_like(x), 0)

    np.testing.assert_array_equal(run_ranks(comms, body)[1], x)


def test_a_send_alone_splits_the_copy_with_its_receiver(pointer_env: None) -> None:
    """Once its receiver has started, an idle sender writes every other step into the
    receiver's buffer and posts the others as pointer steps (before, it fills FIFO slots)."""
    comms = minincl.Communicator.init_all(2)
    try:
        send_alone(comms, np.arange(BIG, dtype=np.float32))
        stats = comms[0].stats()
        assert stats["direct_writes"] > 0 and stats["pointer_steps"] > 0, stats
    finally:
        for c in comms:
            c.destroy()


def test_split_sends_between_processes(pointer_env: None) -> None:
    results = minincl.launch(workers.one_way_sends_with_stats, 2, [*COUNTS, BIG])
    assert all(checks == (len(COUNTS) + 1) * 3 for checks, _ in results)
    skip_without_cross_memory_attach(results, 2)
    stats = results[0][1]
    assert stats["direct_writes"] > 0 and stats["pointer_steps"] > 0, stats


def test_split_sends_through_windows(pointer_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without kernel copies: the receiver reads the sender's window, the sender writes into
    the receiver's."""
    monkeypatch.setenv("MININCL_POINTER_STEPS", "1")
    monkeypatch.setenv("MININCL_WINDOW_BYTES", "16M")
    results = minincl.launch(workers.one_way_sends_with_stats, 2, [*COUNTS, BIG], True)
    assert all(checks == (len(COUNTS) + 1) * 3 for checks, _ in results)
    stats = results[0][1]
    assert stats["direct_writes"] > 0 and stats["pointer_steps"] > 0, stats


def test_a_send_alone_without_kernel_copies_goes_through_the_fifo(
    pointer_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MININCL_POINTER_STEPS", "1")
    results = minincl.launch(workers.one_way_sends_with_stats, 2, COUNTS)
    assert all(checks == len(COUNTS) * 3 for checks, _ in results)
    assert all(stats["direct_writes"] == 0 and stats["pointer_steps"] == 0 for _, stats in results), results


@pytest.mark.parametrize("two_sends", [False, True])
@pytest.mark.parametrize("count", [3000, 24000])  # one pointer step; six, filling most of the FIFO
def test_a_send_completes_before_its_receiver_starts(
    pointer_env: None, tmp_path: Path, count: int, two_sends: bool
) -> None:
    """Also when the group sends to two peers that start late (a send waits for its receiver
    only while the group has recvs to move)."""
    flag = str(tmp_path / f"rank0-returned-{os.getpid()}")
    results = minincl.launch(workers.send_done_before_receiver_starts, 3, count, flag, two_sends)
    assert [ok for ok, _ in results] == [True, True, True], results
    # Rank 0's steps to rank 1 were taken back into the FIFO: none was read where it was.
    skip_without_cross_memory_attach(results, 3)
    assert results[0][1]["pointer_steps"] == 0, results


def test_bad_read_size_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MININCL_POINTER_READ_BYTES", "100")
    with pytest.raises(minincl.InvalidArgument, match="MININCL_POINTER_READ_BYTES"):
        minincl.Communicator.init_all(2)


@pytest.mark.parametrize("count", [3000, BIG])
def test_a_mismatched_exchange_fails_clearly_and_hangs_nobody(pointer_env: None, count: int) -> None:
    """Rank 1 expects one element more than rank 0 sends. Rank 1 must say so and write
    nothing; rank 0, whose receive matches, either completes (its send fitted in the FIFO) or
    learns that rank 1 failed; neither waits forever."""
    (r0, r0_buffer_ok), (r1, r1_untouched) = minincl.launch(workers.mismatched_exchange, 2, count, timeout=60)
    assert r1.startswith("InvalidUsage") and "rank 0" in r1, r1
    assert r1_untouched
    assert r0 == "ok" or (r0.startswith("RemoteError") and "rank 1" in r0), r0
    assert r0_buffer_ok or r0 != "ok"
