"""The kernel-copy path and the FIFO path between two CPU processes, timed in the same moments.

    python3 bench/paired_paths.py --launches 8 --size 1M [--fresh]

Whole runs on a shared VM are sometimes several times slower than others, and an A/B of two
launches can land one variant in a slow period and the other in a fast one. Here each launch
holds two communicators over the same two processes: the first with the default pointer
steps (2: receivers of reducing collectives read senders' inputs through the kernel, senders
write final values into receivers' outputs), the second with MININCL_POINTER_STEPS=1 (every
step through the shared-memory FIFO). Six times per launch it times, back to back: a NumPy
copy of 64 MiB on one core (memory bandwidth), an out-of-place allreduce of --size on each
communicator. --fresh rewrites the input before each call, as a training step does (an
input left untouched stays in the reader's cache after the first call). Prints one line per
launch: copy time, kernel path, FIFO path (us per call, median of 3 repetitions).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable

import numpy as np

import minincl


def timed(fn: Callable[[], object], calls: int) -> float:
    for _ in range(3):
        fn()
    reps = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        reps.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(reps)


def rank_main(comm: minincl.Communicator, nbytes: int, fresh: bool) -> list[tuple[float, float, float]]:
    os.environ["MININCL_POINTER_STEPS"] = "1"  # (read when the split communicator starts)
    fifo = comm.split(0, comm.rank)
    assert fifo is not None
    send, out = np.ones(nbytes // 4, np.float32), np.zeros(nbytes // 4, np.float32)
    big_from, big_to = np.ones(16 << 20, np.float32), np.zeros(16 << 20, np.float32)

    def allreduce_on(c: minincl.Communicator) -> Callable[[], object]:
        def call() -> object:
            if fresh:
                send[:] = 1
            return c.allreduce(send, out)

        return call

    calls = max(5, min(200, (64 << 20) // nbytes))
    rows = []
    for _ in range(6):
        comm.barrier()
        copy = timed(lambda: np.copyto(big_to, big_from), 3)
        rows.append((copy, timed(allreduce_on(comm), calls), timed(allreduce_on(fifo), calls)))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launches", type=int, default=8)
    p.add_argument("--size", default="1M", help="bytes per rank (K and M suffixes)")
    p.add_argument("--fresh", action="store_true", help="rewrite the input before each call")
    a = p.parse_args()
    nbytes = int(a.size[:-1]) << {"K": 10, "M": 20}[a.size[-1]] if a.size[-1] in "KM" else int(a.size)
    os.environ.setdefault("MININCL_CPU_BIND", "1")
    print(
        f"allreduce {nbytes} bytes, {'fresh' if a.fresh else 'unchanged'} input: copy 64 MiB us | kernel us | fifo us"
    )
    for i in range(a.launches):
        rows = minincl.launch(rank_main, 2, nbytes, a.fresh)[0]
        print(i, "  ".join(f"{c:6.0f} | {k:6.1f} | {f:6.1f}" for c, k, f in rows), flush=True)


if __name__ == "__main__":
    main()
