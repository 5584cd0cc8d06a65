"""A first look at a GPU build: every algorithm x protocol, each in a process of its own.

    python3 bench/gpu_smoke.py --json OUT.json [--timeout 40]

The test suite runs everything in one process, where one bad kernel (an illegal address poisons
the CUDA context) or one hang fails every test after it. Here each (ranks, algorithm, protocol)
case runs in a child process under its own timeout, so one broken combination cannot hide the
others: the JSON names, per collective and count, whether the result matched NumPy, the time
of one synchronised call, or the error, and for a case that hung, how far it got.
Run it where ``import minincl`` finds the built package (from the repository root, as
device_check.sh does).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

DEVICE = "cuda:0"
ALGOS = {
    "ring": ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter"],
    "tree": ["allreduce", "broadcast", "reduce"],
    "direct": ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter"],
}
ALL = ALGOS["ring"]
# (nranks, algo or None for the tuner, proto or None): the cheapest first.
CASES: list[tuple[int, str | None, str | None]] = [
    (1, None, None),
    (2, None, None),
    *[(2, a, p) for a in ALGOS for p in ("simple", "ll", "ll128")],
    (3, None, None),
    (8, None, None),
    (8, "ring", "simple"),
]
COUNTS = [1, 1009, (1 << 20) + 3]


def reference(coll: str, inputs: list[Any], count: int, root: int) -> list[Any]:
    import numpy as np

    n = len(inputs)
    if coll == "broadcast":
        return [inputs[root]] * n
    if coll == "allgather":
        return [np.concatenate(inputs)] * n
    total = np.sum(np.stack(inputs), axis=0)
    if coll == "allreduce":
        return [total] * n
    if coll == "reduce":
        return [total if r == root else None for r in range(n)]
    return [total[r * count : (r + 1) * count] for r in range(n)]


def run_case(nranks: int, algo: str | None, proto: str | None) -> None:
    """In the child: one JSON line per (collective, count) on stdout, flushed at once."""
    import cupy as cp
    import numpy as np

    if algo:
        os.environ["MININCL_ALGO"] = algo
    if proto:
        os.environ["MININCL_PROTO"] = proto
    import minincl

    def emit(**kv: Any) -> None:
        print(json.dumps(kv), flush=True)

    t0 = time.perf_counter()
    comms = minincl.Communicator.init_all(nranks, device=DEVICE)
    emit(step="init", seconds=round(time.perf_counter() - t0, 3))
    # A hang becomes an abort after a while, so the parent gets the kernels' own error.
    timer = threading.Timer(float(os.environ.get("SMOKE_ABORT_AFTER", "15")), lambda: [c.abort() for c in comms])
    timer.daemon = True
    timer.start()
    for coll in ALGOS[algo] if algo else ALL:
        for count in COUNTS:
            block = count * nranks if coll == "reduce_scatter" else count
            rng = np.random.default_rng(count)
            inputs = [rng.integers(-8, 8, block).astype(np.float32) for _ in range(nranks)]
            sends = [cp.asarray(x) for x in inputs]
            out_count = count * nranks if coll == "allgather" else count
            outs = [cp.full(out_count, 99, cp.float32) for _ in range(nranks)]
            root = (count + 1) % nranks
            cp.cuda.Device().synchronize()
            t = time.perf_counter()
            try:
                with minincl.group():
                    for c in comms:
                        s, o = sends[c.rank], outs[c.rank]
                        if coll == "allreduce":
                            c.allreduce(s, o)
                        elif coll == "broadcast":
                            c.broadcast(s, o, root=root)
                        elif coll == "reduce":
                            c.reduce(s, o, root=root)
                        elif coll == "allgather":
                            c.allgather(s, o)
                        else:
                            c.reduce_scatter(s, o)
                cp.cuda.Device().synchronize()
                us = (time.perf_counter() - t) * 1e6
                want = reference(coll, inputs, count, root)
                bad = []
                for r in range(nranks):
                    got = cp.asnumpy(outs[r])
                    w = want[r] if want[r] is not None else np.full(count, 99, np.float32)
                    if not np.array_equal(got, w):
                        wrong = np.flatnonzero(got != w)
                        i = wrong[0]
                        bad.append(f"rank {r}: {wrong.size} wrong, first at {i}: {got[i]} != {w[i]}")
                emit(coll=coll, count=count, ok=not bad, us=round(us, 1), wrong=bad[:4])
            except Exception as e:  # noqa: BLE001 - reported, and the case goes on if it can
                emit(coll=coll, count=count, ok=False, error=f"{type(e).__name__}: {e}"[:500])
                if "abort" in str(e).lower() or "cuda" in str(e).lower():
                    timer.cancel()
                    return
    timer.cancel()
    t0 = time.perf_counter()
    for c in comms:
        c.destroy()
    emit(step="destroy", seconds=round(time.perf_counter() - t0, 3))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per case")
    ap.add_argument("--budget", type=float, default=200.0, help="seconds for all cases; the rest are skipped")
    ap.add_argument("--case", nargs=3, metavar=("NRANKS", "ALGO", "PROTO"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        n, a, p = args.case
        try:
            run_case(int(n), None if a == "-" else a, None if p == "-" else p)
        except Exception:  # noqa: BLE001
            print(json.dumps({"step": "crash", "error": traceback.format_exc()[-1500:]}), flush=True)
            return 1
        return 0
    results: list[dict[str, Any]] = []
    start = time.perf_counter()
    for n, a, p in CASES:
        name = f"{n} ranks {a or 'tuner'}/{p or 'tuner'}"
        if time.perf_counter() - start > args.budget:
            results.append({"case": name, "rc": "skipped (budget)"})
            continue
        cmd = [sys.executable, __file__, "--case", str(n), a or "-", p or "-"]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            out, err, rc = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            rc = "timeout"
        lines = []
        for line in out.splitlines():
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                lines.append({"text": line[:300]})
        checks = [x for x in lines if "ok" in x]
        good = sum(bool(x["ok"]) for x in checks)
        case = {
            "case": name,
            "rc": rc,
            "seconds": round(time.perf_counter() - t0, 1),
            "passed": good,
            "checked": len(checks),
            "lines": lines,
            "stderr": err[-2000:],
        }
        results.append(case)
        print(f"{name}: rc={rc} {good}/{len(checks)} ok in {case['seconds']} s", flush=True)
        for x in checks:
            if not x["ok"]:
                print(f"   {x['coll']} count {x['count']}: {x.get('error') or x.get('wrong')}", flush=True)
        if rc not in (0, "timeout") and err:
            print("   stderr: " + err[-600:].replace("\n", "\n   "), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
