"""Small calls allocate nothing: a malloc costs more than a small call's own work, and the
runtime reuses its plans from call to call for that reason. Counted by a malloc wrapper
preloaded into a fresh interpreter (compiled here, skipped without a C compiler), over calls
on two thread-ranks after a warm-up, on the ranks' own threads."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

COUNTER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
static __thread long calls;
void* malloc(size_t n) {
  static void* (*real)(size_t);
  if (!real) real = (void* (*)(size_t))dlsym(RTLD_NEXT, "malloc");
  ++calls;
  return real(n);
}
long mallocs_on_this_thread(void) { return calls; }
"""

PROGRAM = """
import ctypes, sys, threading
import numpy as np, minincl
counter = ctypes.CDLL(None).mallocs_on_this_thread
comms = minincl.Communicator.init_all(2)
kind, calls = sys.argv[1], int(sys.argv[2])
def body(c, n):
    x, y = np.ones(2, np.float32), np.zeros(2, np.float32)
    if kind == "torch":
        import torch
        x, y = torch.ones(2), torch.zeros(2)
    call = {
        "allreduce": lambda: c.allreduce(x, y),
        "torch": lambda: c.allreduce(x, y),
        "broadcast": lambda: c.broadcast(x, y, root=0),
        "allgather": lambda: c.allgather(x[:1], y),
        "reduce_scatter": lambda: c.reduce_scatter(x, y[:1]),
        "alltoall": lambda: c.alltoall(x, y),
        "gather": lambda: c.gather(x[:1], y if c.rank == 0 else None, root=0),
        "scatter": lambda: c.scatter(x if c.rank == 0 else None, y[:1], root=0),
        "sendrecv": lambda: c.sendrecv(x, y, 1 - c.rank),
        "send/recv": lambda: c.send(x, 1) if c.rank == 0 else c.recv(y, 0),
    }[kind]
    for _ in range(200):  # warm-up: plans, buffers and thread-locals are made once
        call()
    before = counter()
    for _ in range(n):
        call()
    made[c.rank] = counter() - before
made = {}
threads = [threading.Thread(target=body, args=(c, calls)) for c in comms]
[t.start() for t in threads]
[t.join() for t in threads]
print(sum(made.values()))
"""


@pytest.fixture(scope="module")
def counter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the malloc counter")
    d = tmp_path_factory.mktemp("mallocs")
    (d / "counter.c").write_text(COUNTER)
    out = d / "counter.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", str(d / "counter.c"), "-o", str(out), "-ldl"], check=True)
    return out


@pytest.mark.parametrize(
    "kind",
    [
        "allreduce",
        "broadcast",
        "allgather",
        "reduce_scatter",
        "alltoall",
        "gather",
        "scatter",
        "sendrecv",
        "send/recv",
        "torch",
    ],
)
def test_small_calls_from_python_allocate_nothing(counter: Path, kind: str) -> None:
    if kind == "torch":
        pytest.importorskip("torch")
    calls = 2000
    env = {**os.environ, "LD_PRELOAD": str(counter)}
    run = subprocess.run(
        [sys.executable, "-c", PROGRAM, kind, str(calls)],
        env=env,
        cwd=counter.parent,  # (away from the source tree, whose minincl/ has no compiled core)
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    mallocs = int(run.stdout.split()[-1])
    # (Counted on the ranks' own threads: a communicator's monitor thread allocates now and then.)
    assert mallocs < 0.05 * 2 * calls, f"{mallocs} mallocs in {2 * calls} calls of {kind}"


HEAP_PROGRAM = """
import ctypes, gc, sys
import numpy as np, minincl
FIELDS = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in FIELDS.split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
def cycle():
    comm = minincl.Communicator.init_all(1)[0]
    comm.allreduce(np.ones(64))
    comm.destroy()
for _ in range(100):
    cycle()
gc.collect()
before = libc.mallinfo2().uordblks
n = int(sys.argv[1])
for _ in range(n):
    cycle()
gc.collect()
print((libc.mallinfo2().uordblks - before) / n)
"""


def test_communicators_made_and_destroyed_keep_no_memory(tmp_path: Path) -> None:
    """Each communicator left ~115 bytes in the process's registry of regions for good (a map
    entry no lookup ever removed). Heap in use (mallinfo2, glibc), 2000 1-rank communicators
    made and destroyed on this thread, after a warm-up."""
    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("no mallinfo2 (glibc 2.33 or later)")
    run = subprocess.run(
        [sys.executable, "-c", HEAP_PROGRAM, "2000"], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr
    # (0.2-6 bytes here; one block kept by chance, a cache filled under load, shows over the
    # cycles: 25 over 500 once in CI. The leak was 112-117 a communicator.)
    assert float(run.stdout) < 50, f"{run.stdout.strip()} bytes more in use per communicator"
