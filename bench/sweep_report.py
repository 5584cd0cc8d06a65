#!/usr/bin/env python3
"""Markdown tables and a tuner-model check for bench/sweep_algos.py output.

  python3 bench/sweep_report.py sweep4.json [more.json ...]          # tables (runs merged)
  python3 bench/sweep_report.py --model sweep4.json                  # + what tuner.cc's two
                                                                     #   cost tables pick
The model below is a copy of Tuner::estimate in src/tune/tuner.cc (CPU, allreduce, nch
channels): ONE_CORE_EACH is tuner.cc's table for channel threads that each have a core,
OVERSUBSCRIBED its table
for oversubscribed hosts (use it on the 4-rank sweeps).
"""

import argparse
import json
import math
import statistics

ALGOS = ["ring", "tree", "direct"]
PROTOS = ["simple", "ll", "ll128"]
COMBOS = [f"{a}/{p}" for a in ALGOS for p in PROTOS]

# tuner.cc's kCpuCost (every channel thread has a core) and kCpuCostOversubscribed, fitted to
# the sixth session's sweeps (bench/RESULTS.md); the latter refitted in the fifty-fifth.
ONE_CORE_EACH = {
    "base": 1.0,
    "cost": {"simple": (0.3, 6.0), "ll": (0.1, 0.3), "ll128": (0.2, 1.5)},
    "cacheBoost": 3.0,
    "treeStepCost": 1.0,
    "treeLineStepCost": 1.0,
    "treeFactor": 1.6,
    "oversubscribed": False,
}
OVERSUBSCRIBED = {
    "base": 1.0,
    "cost": {"simple": (1.0, 4.0), "ll": (0.8, 0.2), "ll128": (0.6, 1.2)},
    "cacheBoost": 3.0,
    "treeStepCost": 1.0,
    "treeLineStepCost": 2.0,
    "treeFactor": 1.6,
    "oversubscribed": True,
}
CACHE_BYTES = 256 << 10


def fmt_size(b):
    b = int(b)
    for unit, s in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s and b % s == 0:
            return f"{b // s} {unit}"
    return f"{b} B"


def load(paths):
    runs, picks, meta = {}, {}, []
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        meta.append(d)
        for c, v in d["runs"].items():
            for s, samples in v.items():
                runs.setdefault(c, {}).setdefault(int(s), []).extend(samples)
        for c, v in d["picks"].items():
            for s, pk in v.items():
                picks.setdefault(c, {})[int(s)] = pk
    return runs, picks, meta


def med(runs, c, s, key="us"):
    samples = runs.get(c, {}).get(s)
    return statistics.median(x[key] for x in samples) if samples else math.nan


def tree_depth(n):
    d = 0
    while (2 << d) <= n:
        d += 1
    return d


def estimate(model, n, algo, proto, variant, nbytes, nch=1):
    if algo == "ring":
        steps, factor = 2 * (n - 1), 2 * (n - 1) / n
    elif algo == "tree":
        cost = model["treeStepCost"] if proto == "simple" else model["treeLineStepCost"]  # (allreduce only)
        steps, factor = 2 * tree_depth(n) * cost, model["treeFactor"]
    elif variant == 0:  # CPU one-shot: Simple's memory traffic (see Tuner::estimate)
        traffic = n - 1 if model["oversubscribed"] else (2 * n + 1) / 4
        steps, factor = n - 1, traffic if proto == "simple" else n
    else:
        steps, factor = 2 * (n - 1), 2 * (n - 1) / n
    lat, bw = model["cost"][proto]
    if nbytes <= CACHE_BYTES:
        bw *= model["cacheBoost"]
    return model["base"] + steps * lat + factor * nbytes / (bw * nch * 1e3)


def choose(model, n, nbytes, nch=1):
    best = None
    for a in ALGOS:
        for p in PROTOS:
            for v in (0, 1) if a == "direct" else (0,):
                t = estimate(model, n, a, p, v, nbytes, nch)
                if best is None or t < best[0]:
                    best = (t, a, p, v)
    t, a, p, v = best
    return f"{a}{(' one-shot', ' two-shot')[v] if a == 'direct' else ''}/{p}", t


def combo_of(pick):
    a, p = pick.split("/")
    return f"{a.split()[0]}/{p}"


def tables(runs, picks, n):
    sizes = sorted(runs["tuner"])
    out = []
    hdr = (
        "| size | "
        + " | ".join(COMBOS)
        + " | tuner | tuner's pick | best forced | tuner / best | pick's forced / best |"
    )
    sep = "|---:|" + "---:|" * (len(COMBOS) + 1) + "---|---|---:|---:|"
    out += ["#### time per call (us, median over rounds)", "", hdr, sep]
    summary = []
    for s in sizes:
        times = {c: med(runs, c, s) for c in COMBOS}
        best = min(times, key=lambda c: times[c])
        tt = med(runs, "tuner", s)
        pick = picks.get("tuner", {}).get(s, "?")
        pf = times.get(combo_of(pick), math.nan) if pick != "?" else math.nan
        cells = [f"**{times[c]:.1f}**" if c == best else f"{times[c]:.1f}" for c in COMBOS]
        dbest = best
        if best.startswith("direct"):
            dbest = picks.get(best, {}).get(s, best)
        out.append(
            f"| {fmt_size(s)} | "
            + " | ".join(cells)
            + f" | {tt:.1f} | {pick} | {dbest} | {tt / times[best]:.2f} | {pf / times[best]:.2f} |"
        )
        summary.append((s, best, dbest, tt / times[best], pf / times[best], pick))
    out += [
        "",
        "#### busbw (GB/s, median over rounds)",
        "",
        "| size | " + " | ".join(COMBOS) + " | tuner |",
        "|---:|" + "---:|" * (len(COMBOS) + 1),
    ]
    for s in sizes:
        out.append(
            f"| {fmt_size(s)} | " + " | ".join(f"{med(runs, c, s, 'busbw'):.3f}" for c in COMBOS + ["tuner"]) + " |"
        )
    return out, summary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json", nargs="+")
    ap.add_argument("--model", action="store_true")
    args = ap.parse_args()
    runs, picks, meta = load(args.json)
    n = meta[0]["nranks"]
    print(f"rounds: {[len(v) for v in runs['tuner'].values()]}")
    out, summary = tables(runs, picks, n)
    print("\n".join(out))
    if args.model:
        for name, m in (("one core per channel", ONE_CORE_EACH), ("oversubscribed", OVERSUBSCRIBED)):
            if m is None:
                continue
            print(f"\n{name} model picks:")
            for s, best, dbest, *_ in summary:
                pk, t = choose(m, n, s)
                meas = med(runs, combo_of(pk), s)
                bt = med(runs, best, s)
                print(
                    f"  {fmt_size(s):>8}: best {dbest:24s} model {pk:24s} est {t:9.1f} us, "
                    f"measured {meas:9.1f} vs best {bt:9.1f} ({meas / bt:.2f}x)"
                )


if __name__ == "__main__":
    main()
