"""torch.distributed all_reduce, gloo against minincl, on CPU ranks that share their cores with busy processes.

A training job's ranks are seldom alone on their cores: data loaders, other jobs. This starts
``--busy`` processes that only spin (none by default), then ``--ranks`` rank processes that
each run gloo's default group and a minincl group (``dist.new_group(backend="minincl")``) in
turn, three rounds, so that both see the same moments of a noisy machine. Per size and
library: the time per call (a loop of calls, rank 0), median over the rounds.

    python3 bench/torch_busy_cores.py [--ranks 2] [--busy 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch_groups import gloo_and_minincl

SIZES = [1 << 10, 64 << 10, 1 << 20, 16 << 20]
ROUNDS = 3


def spin() -> None:
    while True:
        pass


def rank_main(rank: int, nranks: int, port: int) -> None:
    groups = gloo_and_minincl(rank, nranks, port)
    us: dict[tuple[int, str], list[float]] = {}
    for nbytes in SIZES:
        x = torch.ones(nbytes // 4)
        calls = max(5, min(2000, (16 << 20) // nbytes))
        for _ in range(ROUNDS):
            for name, group in groups.items():
                for _ in range(3):
                    dist.all_reduce(x, group=group)  # (warm-up)
                dist.barrier()
                start = time.perf_counter()
                for _ in range(calls):
                    dist.all_reduce(x, group=group)
                us.setdefault((nbytes, name), []).append((time.perf_counter() - start) / calls * 1e6)
    if rank == 0:
        print(f"{nranks} ranks; us per all_reduce (float32), median of {ROUNDS} rounds [each round]")
        for nbytes in SIZES:
            g, m = (statistics.median(us[(nbytes, name)]) for name in groups)
            rounds = " ".join(f"{name} {[round(v) for v in us[(nbytes, name)]]}" for name in groups)
            print(f"{nbytes:>9} B  gloo {g:9.1f}  minincl {m:9.1f}  gloo/minincl {g / m:5.2f}x  ({rounds})", flush=True)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--busy", type=int, default=0, help="processes that spin beside the ranks")
    a = p.parse_args()
    busy = [multiprocessing.Process(target=spin, daemon=True) for _ in range(a.busy)]
    for b in busy:
        b.start()
    try:
        mp.spawn(rank_main, args=(a.ranks, 29000 + os.getpid() % 1000), nprocs=a.ranks)
    finally:
        for b in busy:
            b.terminate()


if __name__ == "__main__":
    main()
