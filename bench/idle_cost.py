"""What idle communicators cost: the CPU their monitor threads take while no call runs.

    python3 bench/idle_cost.py threads K          # K 2-rank communicators (threads), one process
    python3 bench/idle_cost.py processes P K      # P rank processes, each holding K split()s

Prints CPU seconds used per second of wall time while every communicator sits idle (the
process's own, or all ranks' together), measured over 3 s.
"""

from __future__ import annotations

import os
import sys
import time

import minincl


def _cpu_over(seconds: float) -> float:
    t0, c0 = time.perf_counter(), os.times()
    time.sleep(seconds)
    c1 = os.times()
    return ((c1.user - c0.user) + (c1.system - c0.system)) / (time.perf_counter() - t0)


def _rank_holding_splits(comm: minincl.Communicator, k: int) -> float:
    kept = [comm.split(comm.rank % 2 if i % 2 else 0, key=comm.rank) for i in range(k)]
    comm.barrier()
    cpu = _cpu_over(3.0)
    comm.barrier()
    for c in kept:
        if c is not None:
            c.destroy()
    return cpu


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "threads"
    if mode == "threads":
        k = int(sys.argv[2]) if len(sys.argv) > 2 else 100
        comms = [c for _ in range(k) for c in minincl.Communicator.init_all(2)]
        print(f"{k} idle 2-rank communicators (threads): {_cpu_over(3.0):.3f} CPU s per s")
        for c in comms:
            c.destroy()
    else:
        p, k = (int(a) for a in sys.argv[2:4])
        cpu = minincl.launch(_rank_holding_splits, p, k, timeout=600)
        print(f"{p} processes holding {k} idle splits each: {sum(cpu):.3f} CPU s per s (all ranks)")


if __name__ == "__main__":
    main()
