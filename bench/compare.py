"""minincl against torch.distributed (gloo), MPICH and Open MPI on this machine, interleaved.

    python3 bench/compare.py            # full: 6 collectives, 8 B .. 256 MiB, 2 rounds
    python3 bench/compare.py --quick    # allreduce + broadcast, 6 sizes (under 2 minutes)

Every library's runner (bench/runners/) is started as 2 processes, times each size (warm-up,
then repetitions of a fixed number of calls; per repetition the slowest rank counts; the
median repetition is the figure) and prints CSV rows. For each collective the libraries run
one after another, in reversed order on every other round, and the median over rounds is
reported. The machine's memory-copy bandwidth (NumPy copy of 256 MiB: bytes read + written
per second) is measured in every round as the hardware line.

Writes bench/results/compare.csv, bench/results/compare_<collective>.png and a section of
bench/RESULTS.md (other sections are kept).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from compare_report import Results, write_csv, write_markdown, write_plots
from compare_run import Library, available_libraries, memcpy_bandwidth, run_runner

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
FULL_SIZES = [8 * 4**k for k in range(9)] + [(1 << 20) << k for k in range(9)]  # 8 B..512 KiB, 1..256 MiB
QUICK_SIZES = [8, 1024, 64 << 10, 1 << 20, 8 << 20, 64 << 20]
FULL_COLLECTIVES = ["allreduce", "broadcast", "allgather", "reduce_scatter", "sendrecv", "alltoall"]
QUICK_COLLECTIVES = ["allreduce", "broadcast"]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="allreduce + broadcast, fewer sizes and repetitions")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (at least 2)")
    p.add_argument("--collectives", help="comma-separated subset of " + ",".join(FULL_COLLECTIVES))
    p.add_argument("--libraries", default="minincl,minincl-window,minincl-threads,gloo,mpich,openmpi")
    p.add_argument("--mpich-venv", default="/tmp/venv-mpich")
    p.add_argument("--openmpi-venv", default="/tmp/venv-ompi")
    p.add_argument(
        "--minincl-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment for the minincl runner, e.g. MININCL_PROTO=simple (repeatable)",
    )
    p.add_argument("--timeout", type=float, default=0, help="seconds per runner (default 120 quick, 900 full)")
    p.add_argument("--out-dir", default=os.path.join(BENCH_DIR, "results"))
    p.add_argument("--results-md", default=os.path.join(BENCH_DIR, "RESULTS.md"))
    p.add_argument("--no-plots", action="store_true")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    collectives = (
        args.collectives.split(",") if args.collectives else (QUICK_COLLECTIVES if args.quick else FULL_COLLECTIVES)
    )
    reps, warmup, budget = (3, 2, 64 << 20) if args.quick else (5, 3, 256 << 20)
    timeout = args.timeout or (120.0 if args.quick else 900.0)
    minincl_env = dict(kv.split("=", 1) for kv in args.minincl_env)
    libraries: list[Library] = available_libraries(
        args.libraries.split(","), args.mpich_venv, args.openmpi_venv, minincl_env
    )
    results = Results(libraries=[lib.name for lib in libraries], collectives=collectives)
    for lib in libraries:
        print(f"# {lib.name}: {lib.version}", flush=True)
    started = time.monotonic()
    for rnd in range(max(args.rounds, 2)):
        results.memcpy_gbps.append(memcpy_bandwidth())
        print(f"# round {rnd + 1}: memcpy {results.memcpy_gbps[-1]:.2f} GB/s", flush=True)
        for coll in collectives:
            order = libraries if rnd % 2 == 0 else list(reversed(libraries))
            for lib in order:
                t0 = time.monotonic()
                rows, error = run_runner(lib, coll, sizes, reps, warmup, budget, timeout)
                if error:
                    results.failures.append(f"round {rnd + 1}, {lib.name} {coll}: {error}")
                    print(f"#   {lib.name:8s} {coll:15s} FAILED: {error}", flush=True)
                for row in rows:
                    results.add(row)
                print(f"#   {lib.name:8s} {coll:15s} {len(rows)} sizes in {time.monotonic() - t0:.1f} s", flush=True)
    results.memcpy_gbps.append(memcpy_bandwidth())
    results.elapsed_s = time.monotonic() - started
    results.command = "python3 bench/compare.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    os.makedirs(args.out_dir, exist_ok=True)
    csv_path = os.path.join(args.out_dir, "compare.csv")
    write_csv(results, csv_path)
    plots = [] if args.no_plots else write_plots(results, args.out_dir)
    section = write_markdown(results, args.results_md, libraries, plots, os.path.dirname(args.results_md))
    print(section)
    print(f"# wrote {csv_path}, {args.results_md}" + "".join(f", {p}" for p in plots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
