"""Ctrl-C stops a call that waits for its peers: the call raises KeyboardInterrupt, the
communicator is aborted, and its peers raise RemoteError naming the interruption.

Each story runs in a fresh Python process that sends itself a real SIGINT while its main
thread is blocked in a call whose peer does not come. (Each installs Python's own SIGINT
handler first: a process started in the background by a non-interactive shell, as CI may
be, inherits SIGINT ignored, and Python then leaves it so.)"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

# Rank 0 (the main thread) blocks in CALL; rank 1 (another thread of the process) makes no
# call until rank 0's has ended. A timer thread sends the process SIGINT 0.3 s in.
STORY = """
import json, os, signal, sys, threading
import numpy as np
import minincl

signal.signal(signal.SIGINT, signal.default_int_handler)
comms = minincl.Communicator.init_all(2)
comms[0].call_timeout = 30  # (should the interrupt not work: a Timeout, not a hang)
threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
out = {}
x = np.arange(1000, dtype=np.float32)
try:
    CALL
    out["call"] = "returned"
except KeyboardInterrupt:
    out["call"] = "KeyboardInterrupt"
except Exception as e:
    out["call"] = f"{type(e).__name__}: {e}"
for c in comms:
    try:
        c.allreduce(np.ones(4, np.float32))
        out[c.rank] = "ok"
    except Exception as e:
        out[c.rank] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""

CALLS = {
    "collective": "comms[0].allreduce(x)",
    "group": (
        "with minincl.group():\n        comms[0].send(x, peer=1)\n        comms[0].recv(np.empty_like(x), peer=1)"
    ),
    "async_op wait": "comms[0].allreduce(x, async_op=True).wait()",
    "barrier": "comms[0].barrier()",
    "split": "comms[0].split(0)",
    # (A call waits for the async_op calls queued before it, which wait for the peer.)
    "call behind an async_op call": "comms[0].allreduce(x, async_op=True)\n    comms[0].allreduce(x)",
    "group behind an async_op call": (
        "comms[0].allreduce(x, async_op=True)\n    with minincl.group():\n        comms[0].allreduce(x)"
    ),
}


def run_story(tmp_path: Path, code: str) -> dict[str, str]:
    # (From an empty folder: from the repository root, "import minincl" finds its sources.)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", list(CALLS))
def test_ctrl_c_stops_a_call_whose_peer_never_comes(tmp_path: Path, case: str) -> None:
    out = run_story(tmp_path, STORY.replace("CALL", CALLS[case]))
    assert out["call"] == "KeyboardInterrupt"
    why = "the call was interrupted (KeyboardInterrupt) while it waited for its peers"
    assert out["0"].startswith("Aborted: ") and why in out["0"], out["0"]
    assert out["1"].startswith("RemoteError: rank 0 ") and why in out["1"], out["1"]


@pytest.mark.parametrize("method", ["abort", "destroy"])
@pytest.mark.parametrize("case", ["collective", "group"])
def test_a_sigterm_handler_that_aborts_stops_the_call_it_interrupted(tmp_path: Path, method: str, case: str) -> None:
    """A handler runs on the thread whose call it interrupted: its abort() or destroy() stops
    that call, and the communicator is closed once the call has returned. (Both used to wait
    for the call to end: for ever.)"""
    story = STORY.replace(
        "signal.SIGINT, signal.default_int_handler", f"signal.SIGTERM, lambda *_: comms[0].{method}()"
    )
    story = story.replace("os.kill(os.getpid(), signal.SIGINT)", "os.kill(os.getpid(), signal.SIGTERM)")
    out = run_story(tmp_path, story.replace("CALL", CALLS[case]))
    why = f"the communicator was {method}ed (comm.{method}(), from a signal handler during this call)"
    assert out["call"] == f"Aborted: {why}", out
    assert out["0"] == "InvalidUsage: the communicator was destroyed (or aborted); create a new one", out
    assert out["1"].startswith("RemoteError: rank 0 ") and why in out["1"], out["1"]


def test_ctrl_c_stops_an_init_whose_peers_never_come(tmp_path: Path) -> None:
    # (Without it, the init waits MININCL_BOOTSTRAP_TIMEOUT, 60 s by default.)
    code = textwrap.dedent("""
        import json, os, signal, threading
        import minincl

        signal.signal(signal.SIGINT, signal.default_int_handler)
        uid = minincl.get_unique_id()
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            minincl.Communicator(2, uid, 0)  # rank 1 never comes
            out = "made"
        except KeyboardInterrupt:
            out = "KeyboardInterrupt"
        except Exception as e:
            out = f"{type(e).__name__}: {e}"
        print(json.dumps({"init": out}))
    """)
    env = dict(os.environ, MININCL_BOOTSTRAP_TIMEOUT="30")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"init": "KeyboardInterrupt"}


def test_a_sigint_handler_that_does_not_raise_leaves_the_call_running(tmp_path: Path) -> None:
    # The program handles SIGINT itself (and goes on): the call must end normally once its
    # peer comes, with the right sum, and the communicator stay usable.
    code = textwrap.dedent("""
        import json, os, signal, threading, time
        import numpy as np
        import minincl

        seen = []
        signal.signal(signal.SIGINT, lambda *_: seen.append("SIGINT"))
        comms = minincl.Communicator.init_all(2)
        x = [np.arange(1000, dtype=np.float64) * (r + 1) for r in range(2)]

        def late_peer():
            time.sleep(1.0)  # after the signal was handled
            comms[1].allreduce(x[1])

        peer = threading.Thread(target=late_peer)
        peer.start()
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        comms[0].allreduce(x[0])
        peer.join()
        y = [np.full(3, r + 1.0) for r in range(2)]
        t = threading.Thread(target=lambda: comms[1].allreduce(y[1]))
        t.start()
        comms[0].allreduce(y[0])
        t.join()
        print(json.dumps({"seen": seen, "x": [a.tolist() for a in x], "y": [a.tolist() for a in y]}))
    """)
    out = run_story(tmp_path, code)
    assert out["seen"] == ["SIGINT"]
    expected = [3.0 * i for i in range(1000)]
    assert out["x"] == [expected, expected]
    assert out["y"] == [[3.0] * 3, [3.0] * 3]


def test_ctrl_c_in_one_process_fails_the_other_processes_call(tmp_path: Path) -> None:
    # Two processes (minincl.launch): rank 0 is interrupted inside an allreduce that rank 1
    # makes only later; rank 1's allreduce raises RemoteError naming the interruption.
    (tmp_path / "interrupted_rank.py").write_text(
        textwrap.dedent("""
            import os, signal, threading, time
            import numpy as np

            def story(comm):
                x = np.ones(100, np.float32)
                if comm.rank == 0:
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
                    try:
                        comm.allreduce(x)
                        return "returned"
                    except KeyboardInterrupt:
                        return "KeyboardInterrupt"
                time.sleep(1.0)
                try:
                    comm.allreduce(x)
                    return "returned"
                except Exception as e:
                    return f"{type(e).__name__}: {e}"
        """)
    )
    code = textwrap.dedent("""
        import json, sys
        sys.path.insert(0, ".")
        import minincl
        from interrupted_rank import story
        print(json.dumps(minincl.launch(story, 2, timeout=60)))
    """)
    env = dict(os.environ)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert results[0] == "KeyboardInterrupt"
    assert results[1].startswith("RemoteError: rank 0 "), results[1]
    assert "interrupted (KeyboardInterrupt)" in results[1]


def test_ctrl_c_while_a_call_is_busy_fails_the_peers_next_call(tmp_path: Path) -> None:
    """The SIGINT lands while rank 1 copies and reduces a 64 MiB allreduce, not while it
    waits: the call ended, then raised KeyboardInterrupt with the communicator still up, and
    the peers waited in their next call until rank 1 destroyed it (here after 20 s; in a REPL,
    never). Now the peers' next call raises RemoteError naming the interruption at once."""
    (tmp_path / "busy_rank.py").write_text(
        textwrap.dedent("""
            import os, signal, threading, time
            import numpy as np
            import minincl

            def story(comm):
                x = np.ones(1 << 24, np.float32)
                comm.barrier()
                if comm.rank == 1:
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                    threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
                start = time.monotonic()
                try:
                    while time.monotonic() - start < 60:
                        comm.allreduce(x)
                    return "no interruption"
                except KeyboardInterrupt:
                    time.sleep(20)  # (saving a checkpoint, say)
                    return "KeyboardInterrupt"
                except minincl.Error as e:
                    return f"{type(e).__name__} after {time.monotonic() - start:.1f} s: {e}"
        """)
    )
    code = textwrap.dedent("""
        import json, sys
        sys.path.insert(0, ".")
        import minincl
        from busy_rank import story
        print(json.dumps(minincl.launch(story, 3, timeout=120)))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert results[1] == "KeyboardInterrupt", results
    for peer in (results[0], results[2]):
        assert peer.startswith("RemoteError after "), results
        assert float(peer.split()[2]) < 15, results  # (not the 21 s of rank 1's sleep)
        assert "rank 1 " in peer and "interrupted (KeyboardInterrupt)" in peer, results


def test_a_handler_that_destroys_then_exits_as_a_busy_call_ends(tmp_path: Path) -> None:
    """A SIGTERM handler that destroys the communicator, then exits, runs as a busy call
    returns (one rank: no wait polls for it); the communicator is gone by the time the call
    would fail it for the interruption, and the process exits with the handler's status."""
    code = textwrap.dedent("""
        import os, signal, sys, threading
        import numpy as np
        import minincl

        comm = minincl.Communicator.init_all(1)[0]
        def handler(signum, frame):
            comm.destroy()
            sys.exit(3)
        signal.signal(signal.SIGTERM, handler)
        x, y = np.ones(1 << 24, np.float32), np.zeros(1 << 24, np.float32)
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
        while True:
            comm.allreduce(x, y)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 3, (out.returncode, out.stderr[-3000:])


def test_killing_the_launcher_ends_its_rank_processes(tmp_path: Path) -> None:
    """launch()'s ranks ran on as orphans when the launching process was killed."""
    code = textwrap.dedent("""
        import os, time
        import minincl

        def story(comm):
            os.write(1, f"rank {os.getpid()}\\n".encode())  # (one write: the ranks' print()s interleaved)
            while True:
                comm.barrier()
                time.sleep(0.01)

        if __name__ == "__main__":
            minincl.launch(story, 2, timeout=300)
    """)
    (tmp_path / "launcher.py").write_text(code)
    parent = subprocess.Popen([sys.executable, "launcher.py"], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    ranks: list[int] = []
    try:
        assert parent.stdout is not None
        stdout = parent.stdout

        def read_ranks() -> None:  # (on a thread: a readline that never returns must not hang the test)
            for line in stdout:
                ranks.append(int(line.split()[1]))
                if len(ranks) == 2:
                    return

        reader = threading.Thread(target=read_ranks, daemon=True)
        reader.start()
        reader.join(120)
        assert len(ranks) == 2, ranks
        parent.kill()
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while [pid for pid in ranks if running(pid)] and time.monotonic() < deadline:
            time.sleep(0.1)
        alive = [pid for pid in ranks if running(pid)]
        assert alive == [], f"rank processes {alive} outlived their launcher"
    finally:
        parent.kill()
        for pid in ranks:  # (should the test fail, not left spinning on the machine)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def running(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    try:
        return "(zombie)" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


EXIT_WHILE_BLOCKED = """
import sys, threading, time
import numpy as np
import minincl

comms = minincl.Communicator.init_all(2)
threading.Thread(target=lambda: comms[0].allreduce(np.ones(1 << 16, np.float32)), daemon=True).start()
time.sleep(0.3)  # (its rank 1 never calls)
print("leaving", flush=True)
HOW
"""


@pytest.mark.parametrize("how", ["sys.exit(0)", "pass", "raise RuntimeError('a bug')"])
def test_the_process_exits_while_a_daemon_thread_waits_in_a_call(tmp_path: Path, how: str) -> None:
    """Only the main thread polls for signals: a daemon thread that took the GIL while the
    interpreter exited was ended by force, and the process aborted (exit -6, "terminate
    called without an active exception") in most runs."""
    code = EXIT_WHILE_BLOCKED.replace("HOW", how)
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90, cwd=tmp_path)
        assert out.stdout.strip() == "leaving", out
        assert out.returncode == (1 if how.startswith("raise") else 0), out.stderr[-3000:]
        assert "terminate called" not in out.stderr, out.stderr[-3000:]


EXIT_WHILE_CALLING = """
import threading, time
import numpy as np
import minincl

comms = minincl.Communicator.init_all(2)

def loop(c):
    x = np.ones(1 << 16, np.float32)
    while True:
        c.allreduce(x)

for c in comms:
    threading.Thread(target=loop, args=(c,), daemon=True).start()
time.sleep(0.3)
print("leaving", flush=True)
"""


def test_the_process_exits_while_daemon_threads_make_calls(tmp_path: Path) -> None:
    """Calls that return, on daemon threads, while the interpreter exits: a thread retaking the
    GIL then was ended by force inside a destructor, and the process aborted (exit -6,
    "terminate called without an active exception"; 5 runs of 5). Such threads now park."""
    for _ in range(3):
        out = subprocess.run(
            [sys.executable, "-c", EXIT_WHILE_CALLING], capture_output=True, text=True, timeout=90, cwd=tmp_path
        )
        assert (out.stdout.strip(), out.returncode) == ("leaving", 0), out.stderr[-3000:]
        assert "terminate called" not in out.stderr, out.stderr[-3000:]


def test_a_handler_that_destroys_then_exits_while_a_call_waits_behind_async_calls(tmp_path: Path) -> None:
    """The wait for queued async_op calls runs signal handlers; one that destroys the
    communicator and raises SystemExit ends the call with that exception (it used to fail the
    communicator it had just freed: a segfault)."""
    code = textwrap.dedent("""
        import os, signal, threading, numpy as np, minincl
        comms = minincl.Communicator.init_all(2)
        def handler(*_):
            comms[0].destroy()
            raise SystemExit(3)
        signal.signal(signal.SIGINT, handler)
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        x = np.ones(4, np.float32)
        comms[0].allreduce(x, async_op=True)  # rank 1 never comes
        try:
            comms[0].allreduce(x)  # waits behind it
        except BaseException as e:
            print("raised", type(e).__name__, flush=True)
    """)
    env = dict(os.environ, MININCL_TIMEOUT="1")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=90, cwd=tmp_path, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "raised SystemExit", out.stdout + out.stderr[-2000:]
