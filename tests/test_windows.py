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


@pytest.mark.parametrize("setting", [None, "32K"])
def test_window_arrays_skip_the_fifo_from_1_kib(monkeypatch: pytest.MonkeyPatch, setting: str | None) -> None:
    """A peer process reads our window as its own memory, with no system call: by default
    steps in it go as pointer steps from 1 KiB, as between threads, while plain arrays between
    processes keep 32 KiB (each of their pointer steps is a kernel read, and so is each
    direct write). MININCL_POINTER_STEP_BYTES still decides for both where it is set."""
    monkeypatch.setenv("MININCL_WINDOW_BYTES", "4M")
    monkeypatch.setenv("MININCL_ALGO", "ring")
    monkeypatch.setenv("MININCL_PROTO", "simple")
    if setting is None:
        monkeypatch.delenv("MININCL_POINTER_STEP_BYTES", raising=False)
    else:
        monkeypatch.setenv("MININCL_POINTER_STEP_BYTES", setting)
    windows = [pointer_steps for pointer_steps, _ in minincl.launch(workers.small_steps_shortcuts, 2, True)]
    plain = minincl.launch(workers.small_steps_shortcuts, 2, False)
    assert plain == [(0, 0), (0, 0)]
    assert all(n > 0 for n in windows) if setting is None else windows == [0, 0], windows


def test_window_full_freed_and_outliving_its_communicator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MININCL_WINDOW_BYTES", "4M")
    for full, total in minincl.launch(workers.window_errors, 2):
        assert "window cannot hold" in full and "MININCL_WINDOW_BYTES" in full
        assert total == str(5 * (3 << 20))


@pytest.mark.parametrize("setting", [None, "4M"])
def test_ranks_that_need_no_window_get_plain_arrays(monkeypatch: pytest.MonkeyPatch, setting: str | None) -> None:
    """Threads read each other's buffers anyway: empty() gives a plain array, whatever the
    setting (it used to raise "set MININCL_WINDOW_BYTES", set or not), so code written for
    processes runs on threads too."""
    if setting:
        monkeypatch.setenv("MININCL_WINDOW_BYTES", setting)
    comms = minincl.Communicator.init_all(2)
    try:
        arrays = [c.empty((3, 5), np.float32) for c in comms]
        assert all(a.shape == (3, 5) and a.dtype == np.float32 for a in arrays)
        for r, a in enumerate(arrays):
            a[:] = r + 1
        workers.run_ranks(comms, lambda c: c.allreduce(arrays[c.rank]))
        for a in arrays:
            np.testing.assert_array_equal(a, np.full((3, 5), 3, np.float32))
    finally:
        for c in comms:
            c.destroy()


def test_processes_without_the_setting_are_told_to_set_it() -> None:
    for story in minincl.launch(workers.empty_without_a_window, 2):
        assert (
            story
            == "InvalidUsage: this communicator has no window: set MININCL_WINDOW_BYTES (e.g. 1G) before it is created"
        )
