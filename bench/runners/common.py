"""Shared by the comparison runners: the size schedule, the timing loop and the CSV row.

Only the standard library and NumPy here: the MPI runners run in virtualenvs that have
neither torch nor minincl.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

COLLECTIVES = ("allreduce", "broadcast", "allgather", "reduce_scatter", "sendrecv", "alltoall", "gather", "scatter")
ITEM_BYTES = 4  # float32 everywhere, op sum
CSV_HEADER = "library,collective,size_bytes,latency_us,busbw_gbps"


@dataclass(frozen=True)
class RunConfig:
    library: str
    collective: str
    sizes: tuple[int, ...]
    reps: int
    warmup: int
    budget_bytes: int  # each repetition moves about this many bytes (bounded iteration count)
    max_iters: int


def parse_args(library: str, argv: Sequence[str] | None = None) -> RunConfig:
    p = argparse.ArgumentParser(description=f"Times {library} collectives; prints CSV rows.")
    p.add_argument("--collective", choices=COLLECTIVES, required=True)
    p.add_argument("--sizes", required=True, help="comma-separated message sizes in bytes")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--budget-bytes", type=int, default=256 << 20)
    p.add_argument("--max-iters", type=int, default=2000)
    a = p.parse_args(argv)
    sizes = tuple(int(s) for s in a.sizes.split(","))
    return RunConfig(library, a.collective, sizes, a.reps, a.warmup, a.budget_bytes, a.max_iters)


def iterations(cfg: RunConfig, size: int) -> int:
    """Calls per repetition: enough to move budget_bytes, between 2 and max_iters.

    A function of the size alone, so every rank makes the same number of calls.
    """
    return max(2, min(cfg.max_iters, cfg.budget_bytes // max(size, 1)))


def counts(collective: str, size: int, nranks: int) -> tuple[int, int]:
    """(send elements, receive elements) per rank for a message of `size` bytes (nccl-tests)."""
    count = size // ITEM_BYTES
    if collective in ("allgather", "gather"):
        count -= count % nranks
        return count // nranks, count
    if collective in ("reduce_scatter", "scatter"):
        count -= count % nranks
        return count, count // nranks
    if collective == "alltoall":
        count -= count % nranks
    return count, count  # sendrecv: each rank sends `size` to its partner and receives as much


def bus_factor(collective: str, nranks: int) -> float:
    if collective == "allreduce":
        return 2 * (nranks - 1) / nranks
    if collective in ("allgather", "reduce_scatter", "alltoall", "gather", "scatter"):
        return (nranks - 1) / nranks
    return 1.0


def time_reps(
    op: Callable[[], object], barrier: Callable[[], object], iters: int, reps: int, warmup: int
) -> list[float]:
    """Seconds per call, one figure per repetition (after `warmup` untimed calls)."""
    for _ in range(warmup):
        op()
    out = []
    for _ in range(reps):
        barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            op()
        out.append((time.perf_counter() - t0) / iters)
    return out


def rows(cfg: RunConfig, nranks: int, per_rank: Sequence[dict[int, list[float]]]) -> list[str]:
    """CSV rows: per repetition the slowest rank's time, then the median over repetitions."""
    out = []
    for size in cfg.sizes:
        if size not in per_rank[0]:
            continue
        reps = [max(r[size][i] for r in per_rank) for i in range(len(per_rank[0][size]))]
        seconds = statistics.median(reps)
        send, recv = counts(cfg.collective, size, nranks)
        nbytes = max(send, recv) * ITEM_BYTES
        busbw = nbytes / seconds / 1e9 * bus_factor(cfg.collective, nranks)
        out.append(f"{cfg.library},{cfg.collective},{nbytes},{seconds * 1e6:.3f},{busbw:.4f}")
    return out
