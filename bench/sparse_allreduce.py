"""all_reduce of a sparse gradient through torch.distributed on CPU ranks: minincl against gloo.

The gradient of an nn.Embedding(100000, 64, sparse=True) that a batch touched `rows` rows of
(random rows, different on each rank): a sparse COO float32 tensor. Each rank process times
both backends (a gloo default group and a minincl group), in alternating order over rounds;
per backend, the median of the timed calls on the slower rank, then the median over rounds.

    python3 bench/sparse_allreduce.py [--ranks 2] [--rows 256,4096,32768] [--rounds 3] [--threads N]

--threads sets OMP_NUM_THREADS (PyTorch's threads per rank); by default each rank has one, as
torchrun (and minincl.torch.run_local) give several processes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import minincl.torch

TABLE_ROWS, WIDTH, CALLS = 100_000, 64, 20


def gradient(rows: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank)
    indices = torch.randint(0, TABLE_ROWS, (1, rows), generator=g)
    return torch.sparse_coo_tensor(indices, torch.randn(rows, WIDTH, generator=g), (TABLE_ROWS, WIDTH))


def time_group(group: dist.ProcessGroup, rows: int) -> float:
    """Median seconds per all_reduce on this rank (each call on a fresh gradient, as in training)."""
    rank = dist.get_rank()
    times = []
    for i in range(CALLS + 3):
        t = gradient(rows, rank)
        dist.barrier(group=group)
        start = time.perf_counter()
        dist.all_reduce(t, group=group)
        if i >= 3:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def rank_main(rows: list[int], rounds: int) -> dict[tuple[int, str], list[float]]:
    dist.init_process_group("gloo")
    groups = {"gloo": dist.group.WORLD, "minincl": dist.new_group(backend=minincl.torch.BACKEND_NAME)}
    out: dict[tuple[int, str], list[float]] = {}
    for r in rows:
        for round_ in range(rounds):
            order = list(groups) if round_ % 2 == 0 else list(groups)[::-1]
            for backend in order:
                group = groups[backend]
                assert group is not None
                out.setdefault((r, backend), []).append(time_group(group, r))
    dist.destroy_process_group()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rows", default="256,4096,32768")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="PyTorch threads per rank (default: 1)")
    args = p.parse_args()
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    results = minincl.torch.run_local(rank_main, args.ranks, rows, args.rounds, timeout=None)
    threads = os.environ.get("OMP_NUM_THREADS", "1")
    print(f"\nsparse all_reduce, {args.ranks} CPU rank processes, {threads} PyTorch thread(s) each, us per call")
    print(f"(median over {args.rounds} rounds of the slower rank's median)\n")
    print("| rows per rank | gloo | minincl | gloo / minincl |")
    print("|---:|---:|---:|---:|")
    for r in rows:
        per_round = {
            b: [max(res[(r, b)][i] for res in results) * 1e6 for i in range(args.rounds)] for b in ("gloo", "minincl")
        }
        gloo, ours = statistics.median(per_round["gloo"]), statistics.median(per_round["minincl"])
        print(f"| {r} | {gloo:.0f} | {ours:.0f} | {gloo / ours:.2f}x |")


if __name__ == "__main__":
    main()
