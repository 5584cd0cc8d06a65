#!/usr/bin/env python3
"""Interleaved algorithm x protocol sweep of minincl-perf allreduce, with the tuner's own choice.

  python3 bench/sweep_algos.py --perf /tmp/measure/bench/minincl-perf -p 4 --rounds 3 --out sweep4.json
  python3 bench/sweep_algos.py --perf ... -p 2 --issue3 --rounds 5 --out sweep2.json
  python3 bench/sweep_algos.py --perf ... -t 8 --small --out sweep_t8.json   # 8 thread-ranks, to 64 KiB

Every (size group, configuration) pair is one minincl-perf invocation; within a round the
configurations run back to back per size group, and their order rotates between rounds,
so slow phases of a noisy machine spread over all of them. Reported figures are medians
over rounds of minincl-perf's per-call time (mean over ranks, -a 1). A separate pass with
MININCL_DEBUG=INFO MININCL_DEBUG_SUBSYS=TUNE (1 call per size, not timed) records what the
tuner picks, for the auto configuration and for each forced algorithm (direct's variant).
"""

import argparse
import json
import os
import re
import subprocess
import time

ALGOS = ["ring", "tree", "direct"]
PROTOS = ["simple", "ll", "ll128"]

# (-b, -e, -f, -n, -w): iteration counts shrink with size so one call costs ~0.1-10 s.
GROUPS_FULL = [
    ("8", "8", "2", 2000, 1000),
    ("64", "16K", "4", 1000, 1000),
    ("64K", "1M", "4", 30, 5),
    ("4M", "16M", "4", 5, 1),
    ("64M", "64M", "2", 3, 1),
]
GROUPS_ISSUE3 = [
    ("8", "8", "2", 5000, 500),
    ("64M", "64M", "2", 5, 1),
]

ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+\S+\s+\S+\s+-?\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)")
TUNE = re.compile(r"allreduce (\d+) bytes on (\d+) ranks: (\w+)(?: (one-shot|two-shot))?/(\w+) on (\d+) channel")


def run_perf(perf, ranks, group, algo, proto, debug=False, timeout=900):
    """`ranks`: minincl-perf's ["-p", N] (processes) or ["-t", N] (threads of one process)."""
    b, e, f, n, w = group
    cmd = [perf, "allreduce", *ranks, "-b", b, "-e", e, "-f", f, "-n", str(n), "-w", str(w)]
    if algo:
        cmd += ["-A", algo]
    if proto:
        cmd += ["-P", proto]
    env = dict(os.environ)
    for k in ("MININCL_ALGO", "MININCL_PROTO", "MININCL_DEBUG", "MININCL_DEBUG_SUBSYS"):
        env.pop(k, None)
    if ranks[0] == "-p":
        env.setdefault("MININCL_CPU_BIND", "1")  # one core per rank process, as Open MPI binds
    if debug:
        env["MININCL_DEBUG"] = "INFO"
        env["MININCL_DEBUG_SUBSYS"] = "TUNE"
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-2000:]}")
    rows = {}
    picks = {}
    for line in (r.stdout + "\n" + r.stderr).splitlines():
        m = ROW.match(line)
        if m:
            rows[int(m.group(1))] = {"us": float(m.group(3)), "busbw": float(m.group(5))}
        t = TUNE.search(line)
        if t:
            algo_ = t.group(3) + (" " + t.group(4) if t.group(4) else "")
            picks[int(t.group(1))] = f"{algo_}/{t.group(5)}"
    return cmd, rows, picks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--perf", default="/tmp/measure/bench/minincl-perf")
    ap.add_argument("-p", type=int, default=4, help="ranks as processes")
    ap.add_argument("-t", type=int, default=0, help="ranks as threads of one process (instead of -p)")
    ap.add_argument("--small", action="store_true", help="sizes up to 64 KiB only")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--issue3", action="store_true", help="protocols only (tuner picks the algorithm), 8 B and 64 MiB")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    if args.issue3:
        groups = GROUPS_ISSUE3
        configs = [(None, p) for p in PROTOS] + [(None, None)]
    else:
        groups = GROUPS_FULL[:2] + [("64K", "64K", "2", 100, 10)] if args.small else GROUPS_FULL
        configs = [(a, p) for a in ALGOS for p in PROTOS] + [(None, None)]

    def name(c):
        a, p = c
        if a is None and p is None:
            return "tuner"
        return f"{a or 'auto'}/{p or 'auto'}"

    ranks = ["-t", str(args.t)] if args.t else ["-p", str(args.p)]
    data = {
        "nranks": args.t or args.p,
        "threads": bool(args.t),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "commands": [],
        "runs": {},
        "picks": {},
    }
    # What the tuner picks (and direct's variant when forced), one untimed call per size.
    for c in configs:
        if c[0] not in (None, "direct") and c != (None, None):
            continue
        for g in groups:
            _, _, picks = run_perf(args.perf, ranks, (g[0], g[1], g[2], 1, 0), c[0], c[1], debug=True)
            for size, pick in picks.items():
                data["picks"].setdefault(name(c), {})[size] = pick
    print("picks:", json.dumps(data["picks"], indent=1), flush=True)

    for rnd in range(args.rounds):
        for gi, g in enumerate(groups):
            k = (rnd + gi) % len(configs)
            order = configs[k:] + configs[:k]
            if rnd % 2:
                order = order[::-1]
            for c in order:
                cmd, rows, _ = run_perf(args.perf, ranks, g, c[0], c[1])
                if rnd == 0:
                    data["commands"].append(" ".join(cmd))
                for size, v in rows.items():
                    data["runs"].setdefault(name(c), {}).setdefault(str(size), []).append(v)
                print(
                    f"round {rnd} {name(c):14s} " + " ".join(f"{s}:{v['us']:.1f}" for s, v in rows.items()), flush=True
                )
    data["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    with open(args.out, "w") as fh:
        json.dump(data, fh, indent=1)


if __name__ == "__main__":
    main()
