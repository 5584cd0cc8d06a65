"""minincl runner, ranks as threads: 2 ranks of one process (Communicator.init_all), each
driven by its own Python thread; prints CSV rows. With ranks in one process, big steps are
pointer steps (the receiver reads the sender's buffer directly)."""

from __future__ import annotations

import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import CSV_HEADER, parse_args, rows
from run_minincl import NRANKS, rank_main

import minincl


def main() -> None:
    cfg = parse_args("minincl-threads")
    comms = minincl.Communicator.init_all(NRANKS)
    per_rank: list[dict[int, list[float]]] = [{} for _ in comms]
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            per_rank[i] = rank_main(comms[i], cfg)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            comms[i].abort()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(NRANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    for c in comms:
        c.destroy()
    print(CSV_HEADER)
    print("\n".join(rows(cfg, NRANKS, per_rank)), flush=True)


if __name__ == "__main__":
    main()
