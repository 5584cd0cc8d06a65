"""How one group of many sends and receives scales: 2 ranks (threads of this process), each
posting K sends and K receives of a few int64 to the other inside one ``minincl.group()``
(as a ``batch_isend_irecv`` of many tensors does), checked against what was sent.

    python3 bench/group_ops.py [K ...]     # default 1000 2000 10000

Prints seconds per group (the slower rank, median of 3).
"""

from __future__ import annotations

import statistics
import sys
import threading
import time

import numpy as np

import minincl


def one_group(comms: list[minincl.Communicator], k: int, count: int = 4) -> float:
    seconds = [0.0, 0.0]
    errors: list[BaseException] = []

    def rank(c: minincl.Communicator) -> None:
        peer = 1 - c.rank
        sent = [np.full(count, c.rank * 1_000_000 + i, np.int64) for i in range(k)]
        got = [np.zeros(count, np.int64) for _ in range(k)]
        t0 = time.perf_counter()
        with minincl.group():
            for i in range(k):
                c.send(sent[i], peer)
                c.recv(got[i], peer)
        seconds[c.rank] = time.perf_counter() - t0
        wrong = [i for i, g in enumerate(got) if not (g == peer * 1_000_000 + i).all()]
        if wrong:
            errors.append(AssertionError(f"rank {c.rank}: receives {wrong[:5]} hold wrong values"))

    threads = [threading.Thread(target=rank, args=(c,)) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return max(seconds)


def main() -> None:
    ks = [int(a) for a in sys.argv[1:]] or [1000, 2000, 10000]
    comms = minincl.Communicator.init_all(2)
    for k in ks:
        print(f"K={k}: {statistics.median(one_group(comms, k) for _ in range(3)):.4f} s per group")
    for c in comms:
        c.destroy()


if __name__ == "__main__":
    main()
