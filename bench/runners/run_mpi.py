"""MPI runner (mpi4py; MPICH or Open MPI, whichever the interpreter's venv holds).

Started as `mpiexec -n 2 python run_mpi.py --library NAME ...`; rank 0 prints CSV rows.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import CSV_HEADER, counts, iterations, parse_args, rows, time_reps
from mpi4py import MPI


def make_op(comm: MPI.Comm, collective: str, send: np.ndarray, recv: np.ndarray) -> Callable[[], object]:
    if collective == "allreduce":
        return lambda: comm.Allreduce(send, recv, op=MPI.SUM)
    if collective == "broadcast":
        return lambda: comm.Bcast(send, root=0)
    if collective == "allgather":
        return lambda: comm.Allgather(send, recv)
    if collective == "alltoall":
        return lambda: comm.Alltoall(send, recv)
    if collective == "gather":  # (every rank has the receive buffer; the root's is written)
        return lambda: comm.Gather(send, recv, root=0)
    if collective == "scatter":
        return lambda: comm.Scatter(send, recv, root=0)
    if collective == "sendrecv":  # an exchange with the partner rank
        peer = comm.Get_rank() ^ 1
        return lambda: comm.Sendrecv(send, peer, 0, recv, peer, 0)
    return lambda: comm.Reduce_scatter_block(send, recv, op=MPI.SUM)


def main() -> None:
    argv = sys.argv[1:]
    library = "mpi"
    if "--library" in argv:
        i = argv.index("--library")
        library = argv[i + 1]
        del argv[i : i + 2]
    cfg = parse_args(library, argv)
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    times: dict[int, list[float]] = {}
    for size in cfg.sizes:
        send_n, recv_n = counts(cfg.collective, size, n)
        if min(send_n, recv_n) == 0:
            continue
        send = np.ones(send_n, np.float32)
        recv = np.zeros(recv_n, np.float32)
        op = make_op(comm, cfg.collective, send, recv)
        times[size] = time_reps(op, comm.Barrier, iterations(cfg, size), cfg.reps, cfg.warmup)
    per_rank = comm.gather(times, root=0)
    if comm.Get_rank() == 0:
        print(CSV_HEADER)
        print("\n".join(rows(cfg, n, per_rank)), flush=True)


if __name__ == "__main__":
    main()
