"""What a rank's wait for a late peer costs: CPU time of the waiting rank, and the late
rank's own compute meanwhile.

    python3 bench/wait_cpu.py [--mode sleep|busy] [--seconds 1.0] [--rounds 3]

Two rank processes (minincl.launch). In each round rank 1 first either sleeps or computes
(matrix products on two threads, competing with the waiting rank for the cores) for
--seconds, while rank 0 waits in an 8-byte allreduce. Prints rank 0's CPU seconds and wall
seconds per wait, and (busy) rank 1's matrix products per round.
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np

import minincl


def _products(seconds: float) -> int:
    a, n, t0 = np.random.rand(200, 200), 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a = a @ a
        a /= a.max()
        n += 1
    return n


def _late_rank(mode: str, seconds: float) -> int:
    if mode == "sleep":
        time.sleep(seconds)
        return 0
    counts: list[int] = []
    threads = [threading.Thread(target=lambda: counts.append(_products(seconds))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts)


def rank_main(comm: minincl.Communicator, mode: str, seconds: float, rounds: int) -> dict[str, list[float]]:
    x = np.ones(2, np.float32)
    out: dict[str, list[float]] = {"wait_cpu_s": [], "wait_wall_s": [], "products": []}
    for _ in range(rounds):
        comm.allreduce(x)  # (both ranks start the round together)
        if comm.rank == 0:
            cpu, wall = time.process_time(), time.perf_counter()
            comm.allreduce(x)
            out["wait_cpu_s"].append(round(time.process_time() - cpu, 4))
            out["wait_wall_s"].append(round(time.perf_counter() - wall, 4))
        else:
            out["products"].append(_late_rank(mode, seconds))
            comm.allreduce(x)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["sleep", "busy"], default="busy")
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    waiting, late = minincl.launch(rank_main, 2, args.mode, args.seconds, args.rounds)
    print(f"mode {args.mode}: rank 0 waits {args.seconds} s per round")
    print(f"  waiting rank's CPU s per wait: {waiting['wait_cpu_s']}")
    print(f"  waiting rank's wall s per wait: {waiting['wait_wall_s']}")
    if args.mode == "busy":
        print(f"  late rank's matrix products per round: {late['products']}")


if __name__ == "__main__":
    main()
