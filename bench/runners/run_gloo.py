"""torch.distributed (gloo) runner: two processes by torch.multiprocessing; prints CSV rows."""

from __future__ import annotations

import os
import socket
import sys
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from common import CSV_HEADER, RunConfig, counts, iterations, parse_args, rows, time_reps

NRANKS = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def exchange(send: torch.Tensor, recv: torch.Tensor) -> None:
    peer = dist.get_rank() ^ 1
    ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()


def make_op(collective: str, send: torch.Tensor, recv: torch.Tensor) -> Callable[[], object]:
    if collective == "allreduce":
        return lambda: dist.all_reduce(send)  # in place: gloo has no out-of-place allreduce
    if collective == "broadcast":
        return lambda: dist.broadcast(send, src=0)
    if collective == "allgather":
        return lambda: dist.all_gather_into_tensor(recv, send)
    if collective == "alltoall":
        return lambda: dist.all_to_all_single(recv, send)
    if collective == "gather":  # (into views of one tensor, at the root only)
        blocks = list(recv.chunk(dist.get_world_size())) if dist.get_rank() == 0 else None
        return lambda: dist.gather(send, blocks, dst=0)
    if collective == "scatter":
        parts = list(send.chunk(dist.get_world_size())) if dist.get_rank() == 0 else None
        return lambda: dist.scatter(recv, parts, src=0)
    if collective == "sendrecv":  # an exchange with the partner rank
        return lambda: exchange(send, recv)
    return lambda: dist.reduce_scatter_tensor(recv, send)


def rank_main(rank: int, cfg: RunConfig, port: int, results: Any) -> None:
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=NRANKS)
    times: dict[int, list[float]] = {}
    for size in cfg.sizes:
        send_n, recv_n = counts(cfg.collective, size, NRANKS)
        if min(send_n, recv_n) == 0:
            continue
        send = torch.ones(send_n, dtype=torch.float32)
        recv = torch.zeros(recv_n, dtype=torch.float32)
        op = make_op(cfg.collective, send, recv)
        times[size] = time_reps(op, dist.barrier, iterations(cfg, size), cfg.reps, cfg.warmup)
    results.put((rank, times))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    cfg = parse_args("gloo")
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.spawn(rank_main, args=(cfg, free_port(), results), nprocs=NRANKS, join=True)
    per_rank: list[dict[int, list[float]]] = [{} for _ in range(NRANKS)]
    for _ in range(NRANKS):
        rank, times = results.get()
        per_rank[rank] = times
    print(CSV_HEADER)
    print("\n".join(rows(cfg, NRANKS, per_rank)), flush=True)


if __name__ == "__main__":
    main()
