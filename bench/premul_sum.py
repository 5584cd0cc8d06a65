"""Pre-multiplied sums against a plain sum and against scaling first: 2 rank processes, an
allreduce of NumPy arrays (PyTorch for bfloat16), median time per call over alternating rounds.

    python3 bench/premul_sum.py [--dtype float32] [--sizes 8,32K,1M,8M,64M] [--rounds 3]

Three ways per size, in turn within each round:
  sum        allreduce(x)                       (no scaling: the floor)
  premulsum  allreduce(x, op=PreMulSum(s))      (each rank scales its input as it is read)
  scale+sum  x *= s; allreduce(x)               (what a caller does without premulsum)
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

import minincl

WAYS = ("sum", "premulsum", "scale+sum")


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def array(nbytes: int, dtype: str) -> Any:
    if dtype == "bfloat16":
        import torch

        torch.set_num_threads(1)  # (a rank per core: PyTorch's own threads would compete)
        return torch.ones(nbytes // 2, dtype=torch.bfloat16)
    return np.ones(nbytes // np.dtype(dtype).itemsize, dtype=dtype)


def time_way(comm: minincl.Communicator, x: Any, way: str, scalar: float, iters: int) -> float:
    op = minincl.PreMulSum(scalar)

    def once() -> None:
        if way == "sum":
            comm.allreduce(x)
        elif way == "premulsum":
            comm.allreduce(x, op=op)
        else:
            x.__imul__(scalar)
            comm.allreduce(x)

    for _ in range(3):
        once()
    comm.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        once()
    return (time.perf_counter() - start) / iters


def worker(comm: minincl.Communicator, dtype: str, sizes: list[int], rounds: int) -> dict[str, list[float]]:
    """Seconds per call, per (size, way), one entry per round; values stay finite (scale 1)."""
    out: dict[str, list[float]] = {}
    for nbytes in sizes:
        iters = max(5, min(2000, (256 << 20) // max(nbytes, 1) // 8))
        for _ in range(rounds):
            for way in WAYS:
                x = array(nbytes, dtype)
                out.setdefault(f"{nbytes} {way}", []).append(time_way(comm, x, way, 1.0, iters))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--sizes", default="8,32K,1M,8M,64M")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    results = minincl.launch(worker, 2, a.dtype, sizes, a.rounds)
    print(f"# allreduce, 2 processes, {a.dtype}: median us per call (ratio to sum)")
    print(f"# {'bytes':>10} " + " ".join(f"{w:>20}" for w in WAYS))
    for nbytes in sizes:
        # The slower rank's time per round, then the median over rounds.
        us = {
            w: statistics.median(max(r[f"{nbytes} {w}"][i] for r in results) for i in range(a.rounds)) * 1e6
            for w in WAYS
        }
        cells = " ".join(f"{us[w]:>11.1f} ({us[w] / us['sum']:4.2f}x)" for w in WAYS)
        print(f"  {nbytes:>10} {cells}")


if __name__ == "__main__":
    main()
