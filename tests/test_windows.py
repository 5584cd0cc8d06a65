"""Windows: user buffers from Communicator.empty live in shared memory every peer process
maps, so collectives read them straight from the sender (pointer steps between processes,
no kernel involved) and write final values straight into the receiver's output (direct
writes). Real processes, results against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import workers

import minincl


@pytest.mark.parametrize("nranks", [2, 3])
def test_collectives_on_window_arrays(monkeypatch: pytest.MonkeyPatch, nranks: int) -> None:
    monkeypatch.setenv("MININCL_WINDOW_BYTES", "64M")
    monkeypatch.setenv("MININCL_POINTER_STEP_BYTES", "4096")  # the tests' FIFO slots are 16 KiB
    counts = [1, 50021, 1 << 18]  # below, around and well above the pointer-step size
    results = minincl.launch(workers.window_collectives, nranks, counts)
    for checks, pointer_steps, direct_writes in results:
        assert checks == 6 * 2 * len(counts)
        assert pointer_steps > 0  # the big steps really went as pointers into the window
        assert direct_writes > 0  # and final values straight into the peers' windows


def test_window_full_freed_and_outliving_its_communicator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MININCL_WINDOW_BYTES", "4M")
    for full, total in minincl.launch(workers.window_errors, 2):
        assert "window cannot hold" in full and "MININCL_WINDOW_BYTES" in full
        assert total == str(5 * (3 << 20))


def test_no_window_without_the_setting() -> None:
    comms = minincl.Communicator.init_all(2)  # threads: no window, whatever the setting
    try:
        with pytest.raises(minincl.InvalidUsage, match="no window"):
            comms[0].empty(8, np.float32)
    finally:
        for c in comms:
            c.destroy()
