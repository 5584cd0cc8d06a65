"""minincl under two or more environments, interleaved: an A/B of settings on local CPU ranks.

    python3 bench/ab_env.py --ranks 2 --collectives allgather,broadcast --sizes 1M,8M \\
        fifo:MININCL_POINTER_STEPS=1 default:

Collectives: allreduce, broadcast, allgather, reduce_scatter, alltoall, sendrecv, send, and
allreduce_inplace and allreduce_fresh (out of place, its input rewritten before each call, as
a training step's is: an untouched input stays cached where a peer read it the call before).
`--dtype` picks the element type (float32 by default; bfloat16 as PyTorch tensors), `--op`
the reduction of allreduce and reduce_scatter (sum by default), `--window` takes every buffer
from `Communicator.empty` (the rank's window, which peers map; MININCL_WINDOW_BYTES is 1G
unless set).
Each variant is NAME:VAR=VALUE;VAR=VALUE (nothing after the colon: the environment as it is).
Every round runs each variant once (a fresh `minincl.launch` of the ranks, bound to cores),
in reversed order on every other round; a variant's figure for a size is the median over
rounds of its per-call time (each run: warm-up calls, then 5 repetitions of a call count
sized to move about 256 MiB, the median repetition, the slowest rank). Prints a table with
the last variant's time over the first's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

import numpy as np

import minincl

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper()
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


DTYPE = "float32"  # the child's --dtype
OP = "sum"  # the child's --op
WINDOW: minincl.Communicator | None = None  # the child's --window: buffers from its window


def ones(n: int) -> Any:
    """NumPy arrays of DTYPE (bfloat16: PyTorch tensors, NumPy has none)."""
    if DTYPE == "bfloat16":
        import torch

        return torch.ones(n, dtype=torch.bfloat16)
    if WINDOW is not None:
        a = WINDOW.empty(n, DTYPE)
        a[:] = 1
        return a
    return np.ones(n, DTYPE)


def zeros(n: int) -> Any:
    a = ones(n)
    a[:] = 0
    return a


def make_op(c: minincl.Communicator, collective: str, nbytes: int) -> Callable[[], object]:
    """The call, on buffers of DTYPE; nbytes is the size nccl-tests would print."""
    n = nbytes // (2 if DTYPE == "bfloat16" else np.dtype(DTYPE).itemsize)
    if collective == "allgather":
        send = ones(n // c.nranks)
        recv = zeros(n // c.nranks * c.nranks)
        return lambda: c.allgather(send, recv)
    if collective == "reduce_scatter":
        recv = zeros(n // c.nranks)
        send = ones(n // c.nranks * c.nranks)
        return lambda: c.reduce_scatter(send, recv, op=OP)
    if collective == "broadcast":
        buf = ones(n)
        return lambda: c.broadcast(buf, root=0)  # in place, as MPI_Bcast
    if collective == "alltoall":
        send, out = ones(n - n % c.nranks), zeros(n - n % c.nranks)
        return lambda: c.alltoall(send, out)
    if collective in ("sendrecv", "send"):
        return p2p_op(c, collective, n)
    if collective == "allreduce_inplace":
        buf = ones(n)
        return lambda: c.allreduce(buf, op=OP)
    if collective == "allreduce_fresh":  # the input rewritten before each call, as a model's
        send, out = ones(n), zeros(n)

        def fresh() -> object:
            send[:] = 1
            return c.allreduce(send, out, op=OP)

        return fresh
    send, out = ones(n), zeros(n)
    return lambda: c.allreduce(send, out, op=OP)


def p2p_op(c: minincl.Communicator, pattern: str, n: int) -> Callable[[], object]:
    """sendrecv: an exchange with the partner rank (rank ^ 1), both ways in one group; send:
    even ranks send to the next rank, which receives (one way, each call alone)."""
    send, out = ones(n), zeros(n)
    peer = c.rank ^ 1 if (c.rank ^ 1) < c.nranks else c.rank

    if pattern == "sendrecv" or peer == c.rank:
        return lambda: c.sendrecv(send, out, peer)
    return (lambda: c.send(send, peer)) if c.rank % 2 == 0 else (lambda: c.recv(out, peer))


def rank_main(
    comm: minincl.Communicator,
    collectives: list[str],
    sizes: list[int],
    dtype: str,
    op: str = "sum",
    window: bool = False,
) -> dict[str, float]:
    global DTYPE, OP, WINDOW
    DTYPE, OP, WINDOW = dtype, op, comm if window else None
    times: dict[str, float] = {}
    for collective in collectives:
        for size in sizes:
            op = make_op(comm, collective, size)
            calls = max(5, min(200, (256 << 20) // max(size, 1)))
            for _ in range(3):
                op()
            reps = []
            for _ in range(5):
                comm.barrier()
                t0 = time.perf_counter()
                for _ in range(calls):
                    op()
                reps.append((time.perf_counter() - t0) / calls * 1e6)
            times[f"{collective} {size}"] = statistics.median(reps)
    return times


def child(args: argparse.Namespace) -> None:
    os.environ.setdefault("MININCL_CPU_BIND", "1")
    if args.window:
        os.environ.setdefault("MININCL_WINDOW_BYTES", "1G")
    per_rank = minincl.launch(
        rank_main,
        args.ranks,
        args.collectives.split(","),
        [parse_size(s) for s in args.sizes.split(",")],
        args.dtype,
        args.op,
        args.window,
    )
    print(json.dumps({k: max(r[k] for r in per_rank) for k in per_rank[0]}))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variants", nargs="*", help="NAME:VAR=VALUE;VAR=VALUE (at least two)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--collectives", default="allreduce,broadcast,allgather,reduce_scatter")
    p.add_argument("--sizes", default="128K,1M,8M,32M")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", default="float32", help="float32, float16, bfloat16 (PyTorch), ...")
    p.add_argument("--op", default="sum", help="sum, prod, max, min, avg (allreduce and reduce_scatter)")
    p.add_argument("--window", action="store_true", help="buffers from Communicator.empty (peers map them)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return 0
    if len(args.variants) < 2:
        p.error("give at least two variants")
    if args.window and args.dtype == "bfloat16":
        p.error("--window takes NumPy arrays, and bfloat16 runs as PyTorch tensors")
    variants = [
        (name, dict(kv.split("=", 1) for kv in env.split(";") if kv))
        for name, env in (v.split(":", 1) for v in args.variants)
    ]
    results: dict[str, dict[str, list[float]]] = {}
    for r in range(args.rounds):
        for name, env in variants if r % 2 == 0 else variants[::-1]:
            cmd = [
                sys.executable,
                __file__,
                "--child",
                "--ranks",
                str(args.ranks),
                "--collectives",
                args.collectives,
                "--sizes",
                args.sizes,
                "--dtype",
                args.dtype,
                "--op",
                args.op,
                *(["--window"] if args.window else []),
            ]
            out = subprocess.run(
                cmd, env={**os.environ, "OPENBLAS_NUM_THREADS": "1", **env}, capture_output=True, text=True, timeout=900
            )
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            for case, us in json.loads(out.stdout.strip().splitlines()[-1]).items():
                results.setdefault(case, {}).setdefault(name, []).append(us)
    names = [name for name, _ in variants]
    print(f"| case ({args.ranks} ranks) | " + " | ".join(f"{n} us" for n in names) + f" | {names[-1]} / {names[0]} |")
    print("|---|" + "---:|" * (len(names) + 1))
    for case, by_name in results.items():
        med = [statistics.median(by_name[n]) for n in names]
        collective, size = case.split()
        print(
            f"| {collective} {int(size) >> 10} KiB | "
            + " | ".join(f"{m:.1f}" for m in med)
            + f" | {med[-1] / med[0]:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
