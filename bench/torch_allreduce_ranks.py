"""A large torch.distributed all_reduce on N CPU ranks, gloo against minincl, in the same processes.

Every rank runs gloo's default group and a minincl group (``dist.new_group(backend="minincl")``)
in turn, twice each (gloo, minincl, gloo, minincl), so that both see the same moments of a
noisy machine; per round, the median of the calls on rank 0. Useful where ranks outnumber
cores (3 or 4 ranks on a 2-core VM), where minincl's waiting threads share cores with the
ranks they wait for.

    python3 bench/torch_allreduce_ranks.py [--ranks 4] [--mib 64] [--calls 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch_groups import gloo_and_minincl


def rank_main(rank: int, nranks: int, elems: int, calls: int, port: int) -> None:
    groups = gloo_and_minincl(rank, nranks, port)
    x = torch.ones(elems)
    medians: dict[str, list[float]] = {name: [] for name in groups}
    for _ in range(2):
        for name, group in groups.items():
            dist.all_reduce(x, group=group)  # (warm-up)
            dist.barrier()
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                dist.all_reduce(x, group=group)
                times.append(time.perf_counter() - start)
            medians[name].append(statistics.median(times) * 1e3)
    if rank == 0:
        rounds = ", ".join(f"{name} {' / '.join(f'{m:.2f}' for m in ms)} ms" for name, ms in medians.items())
        print(f"{nranks} ranks, {elems * 4 >> 20} MiB float32 all_reduce, rank 0's median per round: {rounds}")
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--calls", type=int, default=5)
    a = p.parse_args()
    port = 29000 + os.getpid() % 1000
    mp.spawn(rank_main, args=(a.ranks, (a.mib << 20) // 4, a.calls, port), nprocs=a.ranks)


if __name__ == "__main__":
    main()
