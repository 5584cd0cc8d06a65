"""Allreduce of float32, float16, bfloat16 and 8-bit float PyTorch CPU tensors, 2 rank
processes: minincl (under each vector instruction set asked for, MININCL_CPU_ISA) against
gloo, in place, as DDP and its fp16 / bf16 compression hooks call it. (MPI has no 16-bit
float type; gloo has no 8-bit one: n/a.)

    python3 bench/float16_allreduce.py --sizes 128K,1M,8M,32M --rounds 3 --isas portable,avx512

Every round runs each library once (fresh processes; the order alternates between rounds);
per size and type: warm-up calls, then 5 repetitions of a call count sized to move about
256 MiB, the median repetition, the slowest rank. Prints the median over rounds, in us.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Callable

import torch

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}
GLOO_DTYPES = ["float32", "float16", "bfloat16"]
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper()
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def time_all(
    allreduce: Callable[[torch.Tensor], object], barrier: Callable[[], object], sizes: list[int], dtypes: list[str]
) -> dict:
    times = {}
    for size in sizes:
        for name in dtypes:
            dtype = DTYPES[name]
            x = torch.ones(size // torch.tensor([], dtype=dtype).element_size(), dtype=dtype)
            calls = max(5, min(200, (256 << 20) // size))
            for _ in range(3):
                allreduce(x)
            reps = []
            for _ in range(5):
                barrier()
                t0 = time.perf_counter()
                for _ in range(calls):
                    allreduce(x)
                reps.append((time.perf_counter() - t0) / calls * 1e6)
            times[f"{name} {size}"] = statistics.median(reps)
    return times


def minincl_rank(comm: object, sizes: list[int]) -> dict:
    return time_all(lambda x: comm.allreduce(x), comm.barrier, sizes, list(DTYPES))  # type: ignore[attr-defined]


def gloo_rank(rank: int, port: int, sizes: list[int], out: object) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    out.put((rank, time_all(lambda x: dist.all_reduce(x), dist.barrier, sizes, GLOO_DTYPES)))  # type: ignore[attr-defined]
    dist.destroy_process_group()


def child(library: str, sizes: list[int]) -> dict:
    if library == "gloo":
        import torch.multiprocessing as mp

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        queue = mp.get_context("spawn").SimpleQueue()
        mp.spawn(gloo_rank, args=(port, sizes, queue), nprocs=2, join=True)
        per_rank = [queue.get()[1] for _ in range(2)]
    else:
        import minincl

        os.environ.setdefault("MININCL_CPU_BIND", "1")
        per_rank = minincl.launch(minincl_rank, 2, sizes)
    return {k: max(r[k] for r in per_rank) for k in per_rank[0]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="128K,1M,8M,32M")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--isas", default="", help="comma list of MININCL_CPU_ISA values (default: the widest only)")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.child:
        print(json.dumps(child(args.child, sizes)))
        return 0
    variants = [(f"minincl {isa}" if isa else "minincl", isa) for isa in (args.isas.split(",") if args.isas else [""])]
    variants.append(("gloo", ""))
    results: dict[str, dict[str, list[float]]] = {}
    for r in range(args.rounds):
        for name, isa in variants if r % 2 == 0 else variants[::-1]:
            env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
            if isa:
                env["MININCL_CPU_ISA"] = isa
            library = "gloo" if name == "gloo" else "minincl"
            cmd = [sys.executable, __file__, "--child", library, "--sizes", args.sizes]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            for case, us in json.loads(out.stdout.strip().splitlines()[-1]).items():
                results.setdefault(case, {}).setdefault(name, []).append(us)
    names = [n for n, _ in variants]
    print("| type | size | " + " | ".join(f"{n} us" for n in names) + f" | gloo / {names[-2]} |")
    print("|---|---:|" + "---:|" * (len(names) + 1))
    for case, by_name in results.items():
        dtype, size = case.split()
        med = [statistics.median(by_name[n]) if n in by_name else None for n in names]
        shown = ["n/a" if m is None else f"{m:.1f}" for m in med]
        ratio = "n/a" if med[-1] is None or med[-2] is None else f"{med[-1] / med[-2]:.2f}"
        print(f"| {dtype} | {int(size) >> 10} KiB | " + " | ".join(shown) + f" | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
