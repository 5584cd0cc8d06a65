"""Windows: user buffers from Communicator.empty live in shared memory every peer process
maps, so collectives read them straight from the sender (pointer steps between processes,
no kernel involved) and write final values straight into the receiver's output (direct
writes). Real processes, results against NumPy."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

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


def test_processes_without_the_setting_are_told_to_set_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MININCL_WINDOW_BYTES", raising=False)
    for story in minincl.launch(workers.empty_without_a_window, 2):
        assert story == (
            "InvalidUsage: this communicator has no window: pass window_bytes= (e.g. 1 << 30) when it is created, "
            "or set MININCL_WINDOW_BYTES (e.g. 1G) before"
        )


def test_window_bytes_sizes_the_window_and_those_of_splits(monkeypatch: pytest.MonkeyPatch) -> None:
    """window_bytes= instead of the setting, per communicator; split and shrink pass it on.
    The pointer steps show the arrays from empty() really lie in windows the peer maps
    (plain arrays between processes take none at these sizes)."""
    monkeypatch.delenv("MININCL_WINDOW_BYTES", raising=False)
    monkeypatch.setenv("MININCL_ALGO", "ring")
    monkeypatch.setenv("MININCL_PROTO", "simple")
    for rank_windows in minincl.launch(workers.windows_of_splits, 2, window_bytes=3 << 20):
        assert [size for size, _ in rank_windows] == [3 << 20] * 3
        assert all(steps > 0 for _, steps in rank_windows), rank_windows


def test_window_bytes_zero_overrides_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MININCL_WINDOW_BYTES", "4M")
    stories = minincl.launch(workers.empty_without_a_window, 2, window_bytes=0)
    assert all("has no window: pass window_bytes=" in story for story in stories), stories
    # threads make no window whatever they are given
    comms = minincl.Communicator.init_all(2, window_bytes=4 << 20)
    try:
        assert [c.window_bytes for c in comms] == [0, 0]
    finally:
        for c in comms:
            c.destroy()


@pytest.mark.parametrize("bad", [-1, (1 << 40) + 1, "1G", True, 1.5])
def test_window_bytes_out_of_range_or_not_a_count_is_refused(bad: object) -> None:
    """Refused before any rank starts: init_all and launch check once; a rank's own
    Communicator(...) tells the others' inits (here there are none: 1 rank)."""
    want = (
        r"between 0 \(no window\) and 2\*\*40" if isinstance(bad, int) and not isinstance(bad, bool) else "whole number"
    )
    with pytest.raises(minincl.InvalidArgument, match=want):
        minincl.Communicator.init_all(2, window_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(minincl.InvalidArgument, match=want):
        minincl.launch(workers.empty_without_a_window, 2, window_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(minincl.InvalidArgument, match=want):
        minincl.Communicator(1, minincl.get_unique_id(), 0, window_bytes=bad)  # type: ignore[arg-type]


def in_a_small_dev_shm(megabytes: int, code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`code` run by Python in a mount namespace of its own whose /dev/shm holds `megabytes`."""
    tests = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    shell = f"mount -t tmpfs -o size={megabytes}m tmpfs /dev/shm && exec {sys.executable} -c '{code}'"
    run = ["unshare", "-m", "sh", "-c", shell]
    return subprocess.run(run, capture_output=True, text=True, timeout=120, env=env, cwd=tests)  # (not the source tree)


def can_mount_a_dev_shm() -> bool:
    try:
        return in_a_small_dev_shm(1, "pass", {}).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.skipif(not can_mount_a_dev_shm(), reason="needs unshare -m and mount (root)")
def test_a_dev_shm_too_small_for_a_window_array_is_an_error_not_sigbus() -> None:
    """tmpfs hands out pages as they are first touched: a window array bigger than /dev/shm
    could give killed its ranks with SIGBUS (a container's default /dev/shm is 64 MiB). Its
    pages are claimed when it is made, and the error names the room needed. Connection
    buffers that could outgrow /dev/shm get a warning at init (a ring touches few of them)."""
    launch = "import minincl, workers; print(minincl.launch(workers.{}, 2, {}))"
    fifo = in_a_small_dev_shm(1, launch.format("bitwise_collectives", "[1]"), {})
    assert fifo.returncode == 0 and fifo.stdout.strip() == "[9, 9]", fifo.stderr
    assert fifo.stderr.count("of /dev/shm, which holds 1 MiB") == 1 and "--shm-size" in fifo.stderr, fifo.stderr
    window = in_a_small_dev_shm(
        16, launch.format("window_arrays_past_dev_shm", "48 << 20, 1 << 20"), {"MININCL_WINDOW_BYTES": "64M"}
    )
    assert window.returncode == 0, window.stderr
    for said in ast.literal_eval(window.stdout.strip()):  # (the ranks' lists of strings)
        assert said[0].startswith("SystemError: /dev/shm has no room for 50331648 more bytes of the communicator"), said
        assert said[1] == "small: 2..2", said


@pytest.mark.skipif(not can_mount_a_dev_shm(), reason="needs unshare -m and mount (root)")
@pytest.mark.parametrize("protocol", ["Simple", "LL", "LL128"])
def test_connection_buffers_past_dev_shm_fail_the_call_not_the_process(protocol: str) -> None:
    """Connection buffers are not claimed (a ring touches few of them), so a call may touch a
    page /dev/shm cannot give. In a 2 MiB /dev/shm, 3 processes' small allreduces run, and a 4
    MiB one fails on every rank, naming /dev/shm; the processes live on (they died of SIGBUS
    before). Python's faulthandler, on in each process, is not in the way."""
    code = "import minincl, workers; print(minincl.launch(workers.allreduces_past_dev_shm, 3, {}))"
    # (One channel, and FIFOs of 1-2 MiB a connection for each protocol: a 4 MiB ring fills
    # them, 3 ranks past 2 MiB.)
    env = {
        "MININCL_NCHANNELS": "1",
        "MININCL_PROTO": protocol,
        "MININCL_SIMPLE_SLOT_BYTES": "128K",
        "MININCL_LL_SLOT_LINES": "8K",
        "MININCL_LL128_SLOT_LINES": "2K",
        "PYTHONFAULTHANDLER": "1",
    }
    run = in_a_small_dev_shm(2, code.format("[1000] * 5 + [1 << 20, 1000]"), env)
    assert run.returncode == 0, run.stderr
    said = ast.literal_eval(run.stdout.strip())
    assert [rank[:5] for rank in said] == [["1000: right"] * 5] * 3, said
    last = [rank[5:] for rank in said]
    assert all(len(e) == 1 and "/dev/shm had no room for a page" in e[0] and "--shm-size" in e[0] for e in last), last
    assert any(e[0].startswith("SystemError: /dev/shm had no room") for e in last), last
    assert "Fatal Python error" not in run.stderr, run.stderr


@pytest.mark.skipif(not can_mount_a_dev_shm(), reason="needs unshare -m and mount (root)")
@pytest.mark.parametrize("free_kib", [4100, 4300, 4500])
def test_a_network_step_past_dev_shm_fails_the_call_naming_dev_shm(free_kib: int) -> None:
    """Ranks 0 and 1 pose as one host, 2 and 3 as another. A proxy thread receives a Simple
    step from the network straight into its rank's FIFO, and where /dev/shm has no page for it
    the kernel's copy fails with EFAULT (no SIGBUS): every rank raised "lost its network
    connection (Bad address)", none named /dev/shm. Now the pages go through the SIGBUS
    handler as a channel's would: every page of the recv's range, since the copy may fail
    past its first (with 4300 KiB free, a proxy that touched only the first spun on EFAULT for
    good). A 16 MiB /dev/shm, filled to leave `free_kib`: each allreduce runs right, or the
    first that cannot fails on every rank naming /dev/shm."""
    fill = f'open("/dev/shm/fill", "wb").write(bytes({(16384 - free_kib) << 10}))'
    counts = "[100, 10000, 1 << 20, 1 << 21]"
    code = f'import workers; {fill}; print(workers.as_hosts(workers.allreduces_past_dev_shm, "AABB", {counts}))'
    env = {"MININCL_NCHANNELS": "1", "MININCL_PROTO": "Simple", "MININCL_SIMPLE_SLOT_BYTES": "128K"}
    run = in_a_small_dev_shm(16, code, env)
    assert run.returncode == 0, run.stderr
    said = ast.literal_eval(run.stdout.strip())
    assert len({len(rank) for rank in said}) == 1, said  # (every rank stopped at the same call)
    assert all(e.endswith(": right") for rank in said for e in rank[:-1]), said
    last = [rank[-1] for rank in said]
    if all(e == "2097152: right" for e in last):
        return
    assert all("/dev/shm had no room for a page" in e for e in last), last
    assert any(e.startswith("SystemError: /dev/shm had no room") for e in last), last


@pytest.mark.skipif(not can_mount_a_dev_shm(), reason="needs unshare -m and mount (root)")
@pytest.mark.parametrize("faulthandler", [False, True])
@pytest.mark.parametrize("how", ["kill", "file"])
def test_a_sigbus_not_from_minincl_still_kills_the_process(how: str, faulthandler: bool) -> None:
    """minincl's SIGBUS handler takes only faults on its own connection buffers: a SIGBUS sent
    by kill, or from a file mapping past its file's end, kills the process as before, through
    Python's faulthandler where that is on."""
    code = f'import minincl, workers; minincl.launch(workers.sigbus_not_from_minincl, 2, "{how}")'
    run = in_a_small_dev_shm(16, code, {"PYTHONFAULTHANDLER": "1"} if faulthandler else {})
    assert run.returncode == 1, run.stderr
    assert "rank 0: process killed by SIGBUS" in run.stderr, run.stderr
    assert ("Fatal Python error: Bus error" in run.stderr) == faulthandler, run.stderr
