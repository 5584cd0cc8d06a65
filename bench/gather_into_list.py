"""An all_gather into a list of separate outputs (torch's `dist.all_gather`), two ways, on rank
processes: an allgather into a flat buffer then copied out (new each call, or kept), against one
broadcast from each rank straight into the outputs, in one group. minincl's torch backend takes
the broadcasts from 32 KiB a rank (minincl/torch.py, _BROADCASTS_FROM_BYTES).

    python3 bench/gather_into_list.py [KiB a rank ...] [--ranks N]

Prints us per call, the median of 6 rounds (the ways alternate), the slowest rank's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import numpy as np

import minincl


def ways(comm: minincl.Communicator, count: int) -> dict[str, Callable[[], None]]:
    n, me = comm.nranks, comm.rank
    mine = np.full(count, me + 1, np.float32)
    outs = [np.empty(count, np.float32) for _ in range(n)]
    kept = np.empty(n * count, np.float32)

    def split(flat: np.ndarray) -> None:
        for block, out in zip(flat.reshape(n, -1), outs):
            out[...] = block

    def new_flat() -> None:
        flat = np.empty(n * count, np.float32)
        comm.allgather(mine, flat)
        split(flat)

    def kept_flat() -> None:
        comm.allgather(mine, kept)
        split(kept)

    def broadcasts() -> None:
        with minincl.group():
            for root, out in enumerate(outs):
                comm.broadcast(mine if root == me else out, out, root=root)

    return {"new flat + copies": new_flat, "kept flat + copies": kept_flat, "broadcasts": broadcasts}


def measure(comm: minincl.Communicator, kib: float) -> dict[str, float]:
    count = max(1, int(kib * 1024) // 4)
    cases = ways(comm, count)
    calls = max(5, min(2000, (64 << 20) // (count * 4 * comm.nranks)))
    rounds: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(6):
        for name in list(cases) if r % 2 == 0 else list(cases)[::-1]:
            cases[name]()
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                cases[name]()
            rounds[name].append((time.perf_counter() - t0) / calls * 1e6)
    return {name: statistics.median(times) for name, times in rounds.items()}


def run(comm: minincl.Communicator, sizes: list[float]) -> list[dict[str, float]]:
    return [measure(comm, kib) for kib in sizes]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kib", nargs="*", type=float, default=[4, 32, 64, 1024, 16384])
    p.add_argument("--ranks", type=int, default=2)
    args = p.parse_args()
    per_rank = minincl.launch(run, args.ranks, args.kib)
    print(f"# {args.ranks} ranks, us per call (slowest rank)")
    names = list(per_rank[0][0])
    print("| KiB a rank | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(names))
    for i, kib in enumerate(args.kib):
        cells = [f"{max(rank[i][name] for rank in per_rank):.1f}" for name in names]
        print(f"| {kib:g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
