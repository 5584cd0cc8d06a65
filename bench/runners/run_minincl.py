"""minincl runner: two local processes through minincl.launch; prints CSV rows. With
MININCL_BENCH_WINDOW=1 (the minincl-window line) the buffers come from Communicator.empty;
with MININCL_TRANSPORT=net (the minincl-net line) every connection goes over TCP."""

from __future__ import annotations

import os
import sys
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import CSV_HEADER, RunConfig, counts, iterations, parse_args, rows, time_reps

import minincl

NRANKS = 2
WINDOW = os.environ.get("MININCL_BENCH_WINDOW") == "1"
NET = os.environ.get("MININCL_TRANSPORT") == "net"


def make_op(comm: minincl.Communicator, collective: str, send: np.ndarray, recv: np.ndarray) -> Callable[[], object]:
    if collective == "allreduce":
        return lambda: comm.allreduce(send, recv)
    if collective == "broadcast":
        return lambda: comm.broadcast(send, root=0)  # in place, as MPI_Bcast and gloo are
    if collective == "allgather":
        return lambda: comm.allgather(send, recv)
    if collective == "alltoall":
        return lambda: comm.alltoall(send, recv)
    if collective == "gather":
        return lambda: comm.gather(send, recv, 0)
    if collective == "scatter":
        return lambda: comm.scatter(send, recv, 0)
    if collective == "sendrecv":  # an exchange with the partner rank, as MPI_Sendrecv
        return lambda: comm.sendrecv(send, recv, comm.rank ^ 1)
    return lambda: comm.reduce_scatter(send, recv)


def rank_main(comm: minincl.Communicator, cfg: RunConfig) -> dict[int, list[float]]:
    times: dict[int, list[float]] = {}
    for size in cfg.sizes:
        send_n, recv_n = counts(cfg.collective, size, comm.nranks)
        if min(send_n, recv_n) == 0:
            continue
        if WINDOW:  # the same arrays, in the communicator's window (see Communicator.empty)
            send, recv = comm.empty(send_n, np.float32), comm.empty(recv_n, np.float32)
            send[:], recv[:] = 1, 0
        else:
            send = np.ones(send_n, np.float32)
            recv = np.zeros(recv_n, np.float32)
        op = make_op(comm, cfg.collective, send, recv)
        times[size] = time_reps(op, comm.barrier, iterations(cfg, size), cfg.reps, cfg.warmup)
    return times


def main() -> None:
    cfg = parse_args("minincl-window" if WINDOW else "minincl-net" if NET else "minincl")
    # One core per rank process, as Open MPI binds its ranks by default (unbound, a fresh pair
    # of processes often shares a core for its first milliseconds).
    os.environ.setdefault("MININCL_CPU_BIND", "1")
    per_rank = minincl.launch(rank_main, NRANKS, cfg)
    print(CSV_HEADER)
    print("\n".join(rows(cfg, NRANKS, per_rank)), flush=True)


if __name__ == "__main__":
    main()
