"""Random sequences of calls, every result checked against NumPy. Each call leaves state
behind for the next (FIFO positions, read-ahead records, published outputs, direct writes,
streamed stores): whatever follows what, none of it may leak into another call's result."""

from __future__ import annotations

import pytest
import workers
from conftest import run_ranks

import minincl

STEPS = 120


@pytest.mark.parametrize("nranks", [3, 5])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_sequences_on_threads(seed: int, nranks: int) -> None:
    comms = minincl.Communicator.init_all(nranks)
    try:
        results = run_ranks(comms, lambda c: workers.call_sequence(c, seed, STEPS, False))
    finally:
        for c in comms:
            c.destroy()
    assert results == [[]] * nranks


@pytest.mark.parametrize("streamed", [False, True], ids=["default", "streamed_from_64k"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_sequences_on_processes(monkeypatch: pytest.MonkeyPatch, seed: int, streamed: bool) -> None:
    """With and without window buffers mixed in; streamed: outputs from 64 KiB are written with
    non-temporal stores, as big ones are (so that both kinds of store follow each other)."""
    monkeypatch.setenv("MININCL_WINDOW_BYTES", "64M")
    if streamed:
        monkeypatch.setenv("MININCL_STREAM_OUTPUT_BYTES", "64K")
    results = minincl.launch(workers.call_sequence, 3, seed, STEPS, True, timeout=300)
    assert results == [[], [], []]
