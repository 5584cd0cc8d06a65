"""What a call costs from Python on CPU ranks: the per-call path (argument parsing, array views,
the group context) on a one-rank communicator, where no data moves, and 8-byte collectives
between two processes bound to cores.

    python3 bench/py_overhead.py [--json FILE]

Prints microseconds per call (best of 5 repetitions for the one-rank calls; the slower rank's
median repetition for the two-process ones).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import timeit
from typing import Any

import numpy as np

import minincl

ONE_RANK_CALLS = [
    "c.broadcast(x, root=0)",
    "c.broadcast(x)",
    "c.allreduce(x, y)",
    "c.allreduce(x, op='max')",
]


def one_rank() -> dict[str, float]:
    c = minincl.Communicator.init_all(1)[0]
    names = {"c": c, "x": np.zeros(2, np.float32), "y": np.zeros(2, np.float32)}
    out = {}
    n = 200_000
    for stmt in ONE_RANK_CALLS:
        out[stmt] = min(timeit.repeat(stmt, globals=names, number=n, repeat=5)) / n * 1e6

    def empty_group() -> None:
        with minincl.group():
            pass

    out["with minincl.group(): pass"] = min(timeit.repeat(empty_group, number=n, repeat=5)) / n * 1e6
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        names["t"] = torch.zeros(2)
        stmt = "c.allreduce(t)  # a torch.Tensor"
        out[stmt] = min(timeit.repeat(stmt, globals=names, number=n, repeat=5)) / n * 1e6
    c.destroy()
    return out


def two_ranks(comm: Any, coll: str, calls: int) -> float:
    x = np.zeros(2, np.float32)
    y = np.zeros(2, np.float32)
    op = {
        "broadcast": lambda: comm.broadcast(x, root=0),
        "allreduce": lambda: comm.allreduce(x, y),
        "sendrecv": lambda: comm.sendrecv(x, y, 1 - comm.rank),
        "alltoall": lambda: comm.alltoall(x, y),
    }[coll]
    for _ in range(2000):
        op()
    reps = []
    for _ in range(5):
        comm.barrier()
        t = time.perf_counter()
        for _ in range(calls):
            op()
        reps.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(reps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    os.environ.setdefault("MININCL_CPU_BIND", "1")
    res = one_rank()
    for coll, form in (
        ("broadcast", "(x, root=0)"),
        ("allreduce", "(x, y)"),
        ("sendrecv", "(x, y, peer)"),
        ("alltoall", "(x, y)"),
    ):
        res[f"2 processes, 8 B {coll} {form}"] = max(minincl.launch(two_ranks, 2, coll, 40_000))
    for k, v in res.items():
        print(f"{k:42s} {v:7.3f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
