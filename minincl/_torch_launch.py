"""Run a function on N local processes set up as torchrun would (for examples and tests).

Each process gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and a free MASTER_PORT, so
``dist.init_process_group(backend)`` with the default ``env://`` works inside it; and, as
torchrun does for several processes, one PyTorch thread each unless OMP_NUM_THREADS says
otherwise (each rank's own thread pool, a thread per core, would overload the machine).
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing as mp
import os
import queue as queue_mod
import socket
import time
import traceback
from typing import Any, Callable

import torch

from ._comm import end_with_parent
from .errors import Error


class LocalRunError(Error):
    """One or more ranks started by :func:`run_local` failed, died or timed out."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pack(value: Any) -> bytes:
    # torch.save, not the queue's pickler: torch shares tensors between processes through
    # file descriptors that vanish when the child exits before the parent reads them.
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def _child(fn: Callable[..., Any], rank: int, nranks: int, port: int, args: tuple[Any, ...], results: Any) -> None:
    end_with_parent()
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(nranks),
            "LOCAL_WORLD_SIZE": str(nranks),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    if nranks > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
    try:
        results.put((rank, True, _pack(fn(*args))))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        results.put((rank, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def _collect(procs: list[Any], results: Any, nranks: int, timeout: float | None) -> dict[int, tuple[bool, Any]]:
    got: dict[int, tuple[bool, Any]] = {}
    deadline = None if timeout is None else time.monotonic() + timeout
    while len(got) < nranks:
        with contextlib.suppress(queue_mod.Empty):
            rank, ok, value = results.get(timeout=0.1)
            got[rank] = (ok, value)
            continue
        if all(not p.is_alive() for p in procs):
            with contextlib.suppress(queue_mod.Empty):
                while len(got) < nranks:
                    rank, ok, value = results.get(timeout=0.5)
                    got[rank] = (ok, value)
            break
        if deadline is not None and time.monotonic() > deadline:
            break
    return got


def run_local(fn: Callable[..., Any], nranks: int, *args: Any, timeout: float | None = 300.0) -> list[Any]:
    """Runs ``fn(*args)`` on ``nranks`` new processes; returns the results in rank order.

    ``fn`` must be picklable (defined at module level). A rank that raises, dies or outlives
    ``timeout`` makes this raise :class:`LocalRunError` with every rank's story.
    """
    ctx = mp.get_context("spawn")
    port = free_port()
    results = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(fn, r, nranks, port, args, results), daemon=True) for r in range(nranks)]
    for p in procs:
        p.start()
    got = _collect(procs, results, nranks, timeout)
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()
    failures = []
    for r, p in enumerate(procs):
        if r not in got:
            failures.append(f"rank {r}: no result (exit code {p.exitcode}; timeout {timeout} s)")
        elif not got[r][0]:
            failures.append(f"rank {r}: {got[r][1]}")
    if failures:
        raise LocalRunError(f"run_local: {len(failures)} rank(s) failed\n" + "\n".join(failures))
    return [torch.load(io.BytesIO(got[r][1]), weights_only=False) for r in range(nranks)]
