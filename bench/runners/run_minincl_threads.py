"""minincl runner, ranks as threads: 2 ranks of one process (Communicator.init_all), driven
from one Python thread as NCCL drives several GPUs from one thread: each call is a group of
both ranks' calls (minincl.group()), and each rank runs on its channel threads. Prints CSV
rows. With ranks in one process, big steps are pointer steps (one copy instead of two)."""

from __future__ import annotations

import os
import sys
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import CSV_HEADER, counts, iterations, parse_args, rows, time_reps
from run_minincl import NRANKS, make_op

import minincl


def grouped(ops: list[Callable[[], object]]) -> Callable[[], None]:
    def run() -> None:
        with minincl.group():
            for op in ops:
                op()

    return run


def main() -> None:
    cfg = parse_args("minincl-threads")
    comms = minincl.Communicator.init_all(NRANKS)
    times: dict[int, list[float]] = {}
    for size in cfg.sizes:
        send_n, recv_n = counts(cfg.collective, size, NRANKS)
        if min(send_n, recv_n) == 0:
            continue
        buffers = [(np.ones(send_n, np.float32), np.zeros(recv_n, np.float32)) for _ in comms]
        op = grouped([make_op(c, cfg.collective, s, r) for c, (s, r) in zip(comms, buffers)])
        times[size] = time_reps(op, lambda: None, iterations(cfg, size), cfg.reps, cfg.warmup)
    for c in comms:
        c.destroy()
    print(CSV_HEADER)
    print("\n".join(rows(cfg, NRANKS, [times] * NRANKS)), flush=True)


if __name__ == "__main__":
    main()
