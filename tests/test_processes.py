"""Ranks as separate processes: the shm transport, peer death, leaked segments."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import workers

import minincl
from minincl import LaunchError


@pytest.mark.parametrize("nranks", [2, 4])
def test_collectives_over_shm(nranks: int) -> None:
    results = minincl.launch(workers.all_collectives, nranks, [0, 1, 7, 50021])
    assert results == [results[0]] * nranks and results[0] > 0


@pytest.mark.parametrize("busy_cores", ["1", "auto"])
@pytest.mark.parametrize("proto", ["", "ll", "simple"])
def test_collectives_beside_busy_processes_with_waits_that_sleep_on_doorbells(
    monkeypatch: pytest.MonkeyPatch, proto: str, busy_cores: str
) -> None:
    """MININCL_BUSY_CORES=1 and auto (the default), with two spinning processes beside the
    ranks: a wait that finds the core taken sleeps on its connection's doorbell, woken by the
    peer's post, instead of yielding. Every collective still matches NumPy."""
    monkeypatch.setenv("MININCL_BUSY_CORES", busy_cores)
    if proto:
        monkeypatch.setenv("MININCL_PROTO", proto)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        results = minincl.launch(workers.all_collectives, 2, [0, 1, 7, 50021, 300007], timeout=300)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert results == [results[0]] * 2 and results[0] > 0


def test_the_busy_cores_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MININCL_BUSY_CORES", "yes")
    with pytest.raises(minincl.InvalidArgument, match=r'MININCL_BUSY_CORES="yes" is not 0 \(off\), 1 \(on\) or auto'):
        minincl.Communicator.init_all(1)
    for setting in ("0", "1", " 1", "auto", "AUTO", ""):
        monkeypatch.setenv("MININCL_BUSY_CORES", setting)
        (comm,) = minincl.Communicator.init_all(1)
        comm.destroy()


def test_busy_cores_auto_counts_a_cpu_that_a_busy_process_keeps_wanting() -> None:
    """The verdict the waits read (a thread of this process looks at /proc when asked, at most
    every 100 ms; a CPU counts once two looks in a row saw another process runnable there)
    comes for a CPU that a spinning process is bound to."""
    cpu = min(os.sched_getaffinity(0))
    spin = f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        deadline = time.monotonic() + 30
        while not minincl._core._others_want_cpu(cpu) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert minincl._core._others_want_cpu(cpu)
    finally:
        spinner.kill()
        spinner.wait()


@pytest.mark.parametrize(
    ("setting", "beside", "sleeps"),
    [
        ("1", "computing thread", True),  # (the waits do lose the core for milliseconds)
        ("auto", "computing thread", False),  # (to the rank's own work: yields stay)
        ("auto", "busy process", True),
        ("0", "busy process", False),
    ],
)
def test_busy_cores_setting_decides_who_a_wait_sleeps_for(
    monkeypatch: pytest.MonkeyPatch, setting: str, beside: str, sleeps: bool
) -> None:
    """2 rank processes on one CPU with a thread of each computing, or with a busy process
    there: waits whose yields keep losing the core sleep instead where the setting says."""
    monkeypatch.setenv("MININCL_BUSY_CORES", setting)
    cpu = min(os.sched_getaffinity(0))
    spinners = []
    if beside == "busy process":
        spin = f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
        spinners.append(subprocess.Popen([sys.executable, "-c", spin]))
    try:
        spells = minincl.launch(workers.sleep_spells_on_one_cpu, 2, cpu, beside == "computing thread", 2.0, timeout=120)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert (sum(spells) > 0) == sleeps, spells


def test_sends_and_receives_beside_a_busy_process_sleep_on_doorbells(monkeypatch: pytest.MonkeyPatch) -> None:
    """2 rank processes passing a message back and forth on one CPU with a busy process there
    (MININCL_BUSY_CORES=1): a receive that keeps losing the core sleeps on its connection's
    doorbell, and the sender's post wakes it before its time, as collectives' waits do."""
    monkeypatch.setenv("MININCL_BUSY_CORES", "1")
    cpu = min(os.sched_getaffinity(0))
    spin = f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        stats = minincl.launch(workers.send_recv_on_one_cpu, 2, cpu, 2.0, timeout=120)
    finally:
        spinner.kill()
        spinner.wait()
    assert stats[0]["rounds"] == stats[1]["rounds"] > 0
    assert all(s["wakes"] > 0 for s in stats), stats


FORKED_AFTER_A_LOOK = """
import os, sys, threading, time, warnings
import numpy as np
import minincl

warnings.simplefilter("ignore", DeprecationWarning)  # (fork() with threads: what this checks)
cpu = int(sys.argv[1])

def verdict_comes() -> bool:
    deadline = time.monotonic() + 30
    while not minincl._core._others_want_cpu(cpu) and time.monotonic() < deadline:
        time.sleep(0.02)
    return minincl._core._others_want_cpu(cpu)

comms = minincl.Communicator.init_all(2)  # (registered ranks, and the watcher, in the parent)
assert verdict_comes()
pid = os.fork()
if pid == 0:
    ok = verdict_comes()
    pair = minincl.Communicator.init_all(2)
    xs = [np.full(1000, r + 1.0, np.float32) for r in range(2)]
    threads = [threading.Thread(target=c.allreduce, args=(x,)) for c, x in zip(pair, xs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    os._exit(0 if ok and all((x == 3).all() for x in xs) else 1)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


def test_busy_cores_auto_in_a_child_forked_after_a_look(tmp_path: Path) -> None:
    """A process forked while the parent's watcher thread runs (a DataLoader's workers) gets a
    watcher of its own and can make communicators."""
    cpu = min(os.sched_getaffinity(0))
    spin = f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        run = subprocess.run(
            [sys.executable, "-c", FORKED_AFTER_A_LOOK, str(cpu)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,  # (not the source tree's minincl/)
        )
    finally:
        spinner.kill()
        spinner.wait()
    assert run.stdout.strip() == "child 0", run.stdout + run.stderr


def test_busy_cores_auto_tells_a_busy_process_from_the_ranks(tmp_path: Path) -> None:
    """MININCL_BUSY_CORES=auto sleeps instead of yielding only where a runnable thread is
    none of the ranks': a spinning process is one, a spinning rank process is not while a
    communicator of this process holds it (two, then one), and is once the last is gone."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        saw, _ = minincl.launch(workers.rank_processes_are_not_others, 2, str(tmp_path), spinner.pid, timeout=120)
    finally:
        spinner.kill()
        spinner.wait()
    assert saw == {
        "peer runnable": True,
        "peer seen with two communicators": False,
        "peer seen with one": False,
        "peer seen after destroy": True,
        "this process seen": False,
        "spinner seen": True,
    }


@pytest.mark.parametrize("stretches", [1, 4])
@pytest.mark.parametrize("threads", [False, True])
def test_streamed_outputs_match_numpy(monkeypatch: pytest.MonkeyPatch, threads: bool, stretches: int) -> None:
    """MININCL_STREAM_OUTPUT_BYTES=0: every output written with non-temporal stores, lines in
    order or whole interleaved stretches (MININCL_STREAM_STRETCHES; each CPU's default is one
    of the two), lines and a ragged tail, aligned and not, through the FIFO (processes) and
    through pointer steps and direct writes (threads)."""
    monkeypatch.setenv("MININCL_STREAM_OUTPUT_BYTES", "0")
    monkeypatch.setenv("MININCL_STREAM_STRETCHES", str(stretches))
    counts = [1, 7, 4099, 50021]
    if threads:
        (results,) = minincl.launch(workers.thread_ranks, 1, 3, counts)
    else:
        results = minincl.launch(workers.unaligned_outputs_and_avg, 3, counts)
    assert results == [results[0]] * 3 and results[0] == len(counts) * 4 * (9 + 1)  # (per type: 9 checks, then avg)


def test_launch_timeout_names_the_rank_still_running_and_keeps_the_others_results() -> None:
    with pytest.raises(minincl.LaunchError) as e:
        minincl.launch(workers.rank0_sleeps, 2, 60.0, timeout=2)
    assert "rank 0: still running after the launch timeout of 2 s (killed)" in str(e.value)
    assert e.value.results == {1: 1}


def test_launch_refuses_what_every_rank_would_fail_at_once(tmp_path: Path) -> None:
    """Said before any rank starts: no ranks (it returned []), a launch inside a launched rank
    (each failed on an AssertionError about daemonic processes), and a main script that the
    spawned ranks cannot import (each said to call launch under `if __name__ == ...`)."""
    with pytest.raises(minincl.InvalidArgument, match="nranks must be an integer of at least 1, got 0"):
        minincl.launch(workers.rank0_sleeps, 0, 0.0)
    with pytest.raises(minincl.LaunchError, match="launch inside a launched rank: its processes are daemons"):
        minincl.launch(workers.launches_again, 2)
    tests = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    from_c = "import minincl\ndef f(c):\n    return 1\nminincl.launch(f, 2)"
    out = subprocess.run(
        [sys.executable, "-c", from_c], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env
    )
    assert "InvalidUsage: launch: f is defined in __main__ of `python -c`" in out.stderr, out.stderr[-2000:]
    from_stdin = "import minincl, workers\nminincl.launch(workers.rank0_sleeps, 2, 0.0)"
    out = subprocess.run(
        [sys.executable, "-"], input=from_stdin, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env
    )
    assert "InvalidUsage: launch from a script read from <stdin>" in out.stderr, out.stderr[-2000:]


def test_launch_names_a_result_it_cannot_send_back() -> None:
    with pytest.raises(minincl.LaunchError, match="a lock, cannot be pickled"):
        minincl.launch(workers.returns_a_lock, 2)


def test_launch_without_a_timeout_ends_ranks_stuck_after_another_failed() -> None:
    start = time.monotonic()
    with pytest.raises(minincl.LaunchError) as e:
        minincl.launch(workers.rank0_fails_the_others_hang, 2)  # (it used to wait for ever)
    assert "rank 0: ValueError: rank 0 gives up" in str(e.value)
    assert "rank 1: still running after another rank failed (killed)" in str(e.value)
    assert time.monotonic() - start < 60


def test_no_segment_outlives_init() -> None:
    before = workers.shm_segments()
    during = minincl.launch(workers.report_segments, 3)
    # Segments are unlinked once every rank has mapped them: none is visible while running.
    assert all(set(seen) <= set(before) for seen in during)
    assert workers.shm_segments() == before


def test_a_new_communicator_removes_segments_left_by_a_rank_killed_in_init() -> None:
    """A rank killed between creating its segment and its peers mapping it left the segment
    in /dev/shm for good. Removed now: those named by a process that is gone and older than
    10 minutes (younger, or a live process's, may belong to an init still running)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    made = {
        "old, process gone": (gone.pid, 700),
        "young, process gone": (gone.pid, 0),
        "old, process alive": (os.getpid(), 700),
    }
    paths = {}
    for what, (pid, age) in made.items():
        path = Path(f"/dev/shm/minincl-{pid}-r1-{abs(hash(what))}")
        path.write_bytes(b"x" * 4096)
        os.utime(path, (time.time() - age, time.time() - age))
        paths[what] = path
    try:
        minincl.launch(workers.report_segments, 2)
        left = {what for what, path in paths.items() if path.exists()}
        assert left == {"young, process gone", "old, process alive"}, left
    finally:
        for path in paths.values():
            path.unlink(missing_ok=True)


def test_peer_killed_mid_collective_raises_on_survivors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MININCL_TIMEOUT", "3")
    before = workers.shm_segments()
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as info:
        minincl.launch(workers.die_mid_run, 3, 1, str(tmp_path))
    elapsed = time.monotonic() - t0
    # Rank 1 died (no result); ranks 0 and 2 raised a RemoteError naming it. Each found the
    # dead process itself, or through the other survivor's failure; neither waited for the
    # heartbeat timeout (the slower net under the process check).
    assert (
        "rank 1: process killed by SIGKILL (kill -9, or the out-of-memory killer?) before it returned a result"
        in str(info.value)
    )
    survivors = info.value.results
    assert sorted(survivors) == [0, 2]
    for story in survivors.values():
        assert story.startswith("RemoteError after") and "rank 1 (pid" in story, story
        assert "exited (or was killed)" in story and "no sign of life" not in story, story
    assert elapsed < 30
    assert workers.shm_segments() == before
    assert os.environ.get("MININCL_TIMEOUT") == "3"


def test_a_rank_stopped_past_the_timeout_says_so_when_it_resumes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Rank 1 stops (SIGSTOP) between calls; rank 0 times out, destroys its communicator, and
    resumes it. Rank 1's error names rank 0's reason and says that this process stopped; its
    own stale view of rank 0's heartbeat is no reason for a Timeout of its own."""
    monkeypatch.setenv("MININCL_TIMEOUT", "2")
    stories = minincl.launch(workers.freeze_then_resume, 2, 1, str(tmp_path), timeout=60)
    assert stories[0].startswith("Timeout after") and "rank 1 (pid" in stories[0], stories
    assert stories[1].startswith("RemoteError after"), stories
    assert re.search(r"rank 0 \(pid \d+\) failed: rank 1 \(pid \d+\) has shown no sign of life", stories[1]), stories
    assert re.search(r"this process did not run for \d+\.\d s just before: stopped", stories[1]), stories


def test_cpu_bind_puts_each_rank_process_on_its_own_core(monkeypatch: pytest.MonkeyPatch) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("MININCL_CPU_BIND", "1")
    got = minincl.launch(workers.affinity_after_init, 3)
    assert got == [[cpus[r % len(cpus)]] for r in range(3)]


def test_cpu_bind_does_not_shrink_the_channel_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default channel count is the process's cores per local rank, counted before binding."""
    monkeypatch.delenv("MININCL_NCHANNELS", raising=False)
    monkeypatch.setenv("MININCL_CPU_BIND", "1")
    assert minincl.launch(workers.channels_after_init, 1) == [min(4, len(os.sched_getaffinity(0)))]
