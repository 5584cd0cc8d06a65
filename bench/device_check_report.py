"""Summarises a bench/device_check.sh run: reads what the steps left in OUT, writes
OUT/results.json and prints a short summary (the device tool returns only the output's tail).

    python3 bench/device_check_report.py OUT [--budget S] [--elapsed S]

Every input may be missing or broken (an earlier step failed or timed out): what cannot be read
is recorded as such. The memory-bound limit for an allreduce of S bytes per rank on R ranks is
the time to read every rank's input once and write every rank's output once at the measured
device-to-device copy bandwidth: ceil(R / GPUs) copies of S bytes per GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

BW_BYTES = 256 << 20
BW_RANKS = 8
TARGET_BACK_TO_BACK_US = 8.0
TARGET_GRAPH_US = 4.0


def read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def read_json(path: Path) -> Any:
    text = read(path)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as e:
        return {"error": f"unreadable JSON: {e}"}


def steps(out: Path) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = {}
    for line in (read(out / "steps.tsv") or "").splitlines()[1:]:
        parts = line.split("\t")
        if len(parts) < 4:
            continue
        name, rc, seconds, limit = parts[:4]
        entry: dict[str, Any] = {"rc": int(rc) if rc.lstrip("-").isdigit() else rc}
        try:
            entry["seconds"] = float(seconds)
        except ValueError:
            entry["seconds"] = None
        entry["limit"] = limit
        entry["timed_out"] = entry["rc"] in (124, 137)
        result[name] = entry
    return result


def environment(out: Path) -> dict[str, Any]:
    text = read(out / "env.txt") or ""
    gpus = [ln.strip() for ln in text.splitlines() if re.match(r"^GPU \d+:", ln.strip())]
    nproc = re.search(r"^nproc: (\d+)", text, re.M)
    missing = [ln.split(":")[0] for ln in text.splitlines() if "MISSING" in ln]
    packages = {}
    for ln in text.splitlines():
        m = re.match(r"^(numpy|pytest|pytest_timeout|pybind11|scikit_build_core|torch|cupy): (.*)$", ln)
        if m:
            packages[m.group(1)] = m.group(2)
    nvcc = re.search(r"^nvcc: (.*)$", text, re.M)
    return {
        "gpus": gpus,
        "gpu_count": len(gpus),
        "nproc": int(nproc.group(1)) if nproc else None,
        "nvcc": nvcc.group(1) if nvcc else None,
        "packages": packages,
        "missing_packages": missing,
    }


def build(out: Path, st: dict[str, Any]) -> dict[str, Any]:
    pip = st.get("pip_install", {})
    log = read(out / "build.log") or ""
    lines = log.splitlines()
    errors = [ln.strip()[:300] for ln in lines if re.search(r"(?i)\berror\b|FAILED:|\bfatal\b", ln)]
    prebuilt = st.get("prebuilt", {}).get("rc") == 0  # carried in, built elsewhere (device_prebuild.sh)
    result: dict[str, Any] = {
        "ok": pip.get("rc") == 0 or prebuilt,
        "prebuilt": prebuilt,
        "rc": pip.get("rc"),
        "seconds": pip.get("seconds"),
        "timed_out": pip.get("timed_out", False),
        "installed": read_json(out / "installed.json"),
    }
    cuda_line = next((ln.strip() for ln in lines if "minincl: CUDA" in ln or "nvcc not found" in ln), None)
    if cuda_line:
        result["cmake_cuda"] = cuda_line[:300]
    if not result["ok"]:
        result["error_lines"] = errors[:15]
        result["log_tail"] = [ln[:300] for ln in lines[-25:]]
    for name in ("perf_build", "perf_build_separate"):
        if name in st:
            result[name] = st[name]
    slowest = ninja_times(out / "ninja_log.txt")
    if slowest:
        result["slowest_objects_s"] = slowest
    return result


def ninja_times(path: Path) -> list[tuple[str, float]]:
    """The slowest objects of a ninja build: .ninja_log v5 lines are start end mtime target hash (ms)."""
    times: dict[str, float] = {}
    for ln in (read(path) or "").splitlines():
        f = ln.split("\t")
        if ln.startswith("#") or len(f) < 4 or not (f[0].isdigit() and f[1].isdigit()):
            continue
        times[f[3]] = (int(f[1]) - int(f[0])) / 1000
    return sorted(((Path(k).name, round(v, 1)) for k, v in times.items()), key=lambda kv: -kv[1])[:8]


def tests(out: Path, st: dict[str, Any]) -> dict[str, Any]:
    step = st.get("gpu_tests", {})
    result: dict[str, Any] = {"rc": step.get("rc"), "seconds": step.get("seconds"), "timed_out": step.get("timed_out")}
    log = read(out / "gpu_tests.log") or ""
    xml = out / "gpu_tests.xml"
    if xml.exists():
        try:
            root = ET.parse(xml).getroot()
            suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
            total = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
            result.update(
                source="junit",
                total=total["tests"],
                failed=total["failures"],
                errors=total["errors"],
                skipped=total["skipped"],
                passed=total["tests"] - total["failures"] - total["errors"] - total["skipped"],
            )
            problems = []
            for case in root.iter("testcase"):
                for kind in ("failure", "error"):
                    node = case.find(kind)
                    if node is not None:
                        problems.append(
                            {
                                "test": case.get("name"),
                                "kind": kind,
                                "message": (node.get("message") or "")[:600],
                                "detail": (node.text or "")[-3000:],
                            }
                        )
            result["problems"] = problems
            skips = [c.find("skipped") for c in root.iter("testcase")]
            result["skip_reasons"] = sorted({(s.get("message") or "")[:200] for s in skips if s is not None})
        except ET.ParseError as e:
            result["junit_error"] = str(e)
    if "total" not in result:
        # No junit (killed, or pytest missing): the counts on the last summary line, if any.
        result["source"] = "log"
        summary = [ln for ln in log.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", ln)]
        if summary:
            last = summary[-1]
            for word, key in (("passed", "passed"), ("failed", "failed"), ("skipped", "skipped"), ("error", "errors")):
                m = re.search(rf"(\d+) {word}", last)
                result[key] = int(m.group(1)) if m else 0
        else:
            seen = re.findall(r"^test_gpu\.py::\S+ (PASSED|FAILED|SKIPPED|ERROR)", log, re.M)
            result.update(
                passed=seen.count("PASSED"),
                failed=seen.count("FAILED"),
                skipped=seen.count("SKIPPED"),
                errors=seen.count("ERROR"),
            )
    started = re.findall(r"^(test_gpu\.py::\S+)", log, re.M)
    if started:
        result["last_test_seen"] = started[-1]
    if result.get("timed_out") or (step.get("rc") not in (0, None) and not result.get("problems")):
        result["log_tail"] = [ln[:300] for ln in log.splitlines()[-30:]]
    return result


def perf_rows(text: str) -> list[dict[str, Any]]:
    rows = []
    for ln in text.splitlines():
        f = ln.split()
        if ln.startswith("#") or len(f) != 9 or not f[0].isdigit():
            continue
        try:
            rows.append(
                {
                    "bytes": int(f[0]),
                    "count": int(f[1]),
                    "type": f[2],
                    "time_us": float(f[5]),
                    "algbw_gbs": float(f[6]),
                    "busbw_gbs": float(f[7]),
                    "wrong": None if f[8] == "N/A" else int(f[8]),
                }
            )
        except ValueError:
            continue
    return rows


def perf(out: Path, st: dict[str, Any], name: str) -> dict[str, Any] | None:
    text = read(out / f"{name}.log")
    if text is None:
        return None
    result: dict[str, Any] = {"rc": st.get(name, {}).get("rc"), "timed_out": st.get(name, {}).get("timed_out")}
    rows = perf_rows(text)
    if rows:
        result.update(rows[-1])
    errors = [ln.strip()[:300] for ln in text.splitlines() if "minincl-perf:" in ln or "WARN" in ln]
    if errors:
        result["errors"] = errors[:5]
    choices = []
    for ln in text.splitlines():
        m = re.search(r"minincl INFO (allreduce \d+ bytes on \d+ ranks: .*)$", ln)
        if m and m.group(1) not in choices and f" {BW_BYTES} bytes" in ln:
            choices.append(m.group(1))
    if choices:
        result["tuner"] = choices[:2]
    if not rows and not errors:
        result["log_tail"] = [ln[:300] for ln in text.splitlines()[-10:]]
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget", type=float, default=None)
    ap.add_argument("--elapsed", type=float, default=None)
    args = ap.parse_args()
    out = Path(args.out)
    st = steps(out)
    env = environment(out)
    res: dict[str, Any] = {
        "budget_s": args.budget,
        "elapsed_s": args.elapsed,
        "env": env,
        "steps": st,
        "build": build(out, st),
        "tests": tests(out, st) if "gpu_tests" in st or (out / "gpu_tests.log").exists() else None,
    }
    d2d = read_json(out / "gpu_bench_d2d.json")
    res["d2d"] = d2d
    res["perf"] = {
        "lat_2_ll": perf(out, st, "perf_lat_2"),
        "lat_2_grouped": perf(out, st, "perf_lat_2_grouped"),
        "lat_2proc": perf(out, st, "perf_lat_2proc"),
        "bw_8": {a: perf(out, st, f"perf_bw_8_{a}") for a in ("ring", "tree", "direct")},
    }
    # The memory-bound limit for the 8-rank 256 MiB allreduce.
    limit: dict[str, Any] | None = None
    if isinstance(d2d, dict) and d2d.get("copy_us"):
        installed = res["build"].get("installed") or {}
        seen = installed.get("gpu_count") if isinstance(installed, dict) else None
        gpus = env["gpu_count"] or (seen if isinstance(seen, int) else 0) or 1
        per_gpu = math.ceil(BW_RANKS / gpus)
        copy_us = float(d2d["copy_us"]) * BW_BYTES / float(d2d.get("bytes") or BW_BYTES)
        limit_us = per_gpu * copy_us
        factor = 2 * (BW_RANKS - 1) / BW_RANKS
        limit = {
            "nranks": BW_RANKS,
            "bytes_per_rank": BW_BYTES,
            "gpus": gpus,
            "ranks_per_gpu": per_gpu,
            "copy_gbs": d2d.get("copy_gbs"),
            "limit_us": limit_us,
            "limit_busbw_gbs": BW_BYTES / limit_us / 1e3 * factor,
            "time_over_limit": {},
        }
        for algo, p in res["perf"]["bw_8"].items():
            if p and p.get("time_us"):
                limit["time_over_limit"][algo] = p["time_us"] / limit_us
    res["limit"] = limit
    lat: dict[str, Any] = {"target_back_to_back_us": TARGET_BACK_TO_BACK_US, "target_graph_us": TARGET_GRAPH_US}
    bench_lat = read_json(out / "gpu_bench_latency.json")
    bench_graph = read_json(out / "gpu_bench_graph.json")
    bench_threads = read_json(out / "gpu_bench_threads.json")
    bench_floor = read_json(out / "gpu_bench_floor.json")
    lat["raw"] = {"latency": bench_lat, "graph": bench_graph, "threads": bench_threads, "floor": bench_floor}
    for variant in ("unfused", "nocache", "general"):
        lat["raw"][f"graph_{variant}"] = read_json(out / f"gpu_bench_graph_{variant}.json")
    if isinstance(bench_lat, dict) and isinstance(bench_lat.get("auto"), dict):
        lat["back_to_back_us"] = bench_lat["auto"].get("us_per_op")
        if isinstance(bench_lat.get("ll"), dict):
            lat["back_to_back_ll_us"] = bench_lat["ll"].get("us_per_op")
    if isinstance(bench_graph, dict):
        lat["graph_us"] = bench_graph.get("us_per_op")
    if isinstance(bench_threads, dict):
        lat["threads_us"] = bench_threads.get("us_per_op")
    if lat.get("back_to_back_us") is not None:
        lat["back_to_back_met"] = lat["back_to_back_us"] <= TARGET_BACK_TO_BACK_US
    if lat.get("graph_us") is not None:
        lat["graph_met"] = lat["graph_us"] <= TARGET_GRAPH_US
    res["latency"] = lat
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    print_summary(res)
    return 0


def fmt(v: Any, spec: str = ".2f") -> str:
    return format(v, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


def err(obj: Any) -> str:
    if isinstance(obj, dict) and obj.get("error"):
        return f" ERROR {str(obj['error'])[:300]}"
    return ""


def print_summary(res: dict[str, Any]) -> None:
    p = print
    p("=" * 100)
    p(f"DEVICE CHECK SUMMARY (elapsed {fmt(res['elapsed_s'], '.0f')} s of {fmt(res['budget_s'], '.0f')})")
    env = res["env"]
    p(f"env: {env['gpu_count']} GPU(s) {env['gpus'][:1]}, {env['nproc']} cores, missing: {env['missing_packages']}")
    b = res["build"]
    how = " (the carried prebuilt package)" if b.get("prebuilt") else ""
    p(f"build: ok={b['ok']}{how} rc={b['rc']} {fmt(b['seconds'], '.0f')} s{' TIMED OUT' if b['timed_out'] else ''}")
    p(f"  installed: {b.get('installed')}")
    if b.get("cmake_cuda"):
        p(f"  {b['cmake_cuda']}")
    for name in ("perf_build", "perf_build_separate"):
        if name in b:
            p(f"  {name}: {b[name]}")
    if b.get("slowest_objects_s"):
        p(f"  slowest objects (s): {b['slowest_objects_s'][:6]}")
    for ln in b.get("error_lines", [])[:10]:
        p(f"  ! {ln}")
    if not b["ok"]:
        for ln in b.get("log_tail", [])[-15:]:
            p(f"  | {ln}")
    t = res["tests"]
    if t:
        p(
            f"tests: passed {t.get('passed')} failed {t.get('failed')} errors {t.get('errors')} "
            f"skipped {t.get('skipped')} (from {t.get('source')}, rc {t.get('rc')}, {fmt(t.get('seconds'), '.0f')} s"
            f"{', TIMED OUT' if t.get('timed_out') else ''})"
        )
        for reason in t.get("skip_reasons", [])[:5]:
            p(f"  skipped: {reason}")
        for prob in t.get("problems", [])[:4]:
            p(f"  {prob['kind'].upper()} {prob['test']}: {prob['message'][:400]}")
            detail = [ln for ln in prob["detail"].splitlines() if ln.strip()][-12:]
            for ln in detail:
                p(f"    | {ln[:200]}")
        if t.get("timed_out") or t.get("log_tail"):
            p(f"  last test seen: {t.get('last_test_seen')}")
            for ln in t.get("log_tail", [])[-15:]:
                p(f"  | {ln}")
    d2d = res["d2d"]
    if d2d:
        p(
            f"d2d copy: {fmt(d2d.get('copy_gbs'))} GB/s one way ({fmt(d2d.get('traffic_gbs'))} GB/s read+write), "
            f"{fmt(d2d.get('copy_us'), '.1f')} us per {d2d.get('bytes')} B on {d2d.get('gpu')}{err(d2d)}"
        )
    pf = res["perf"]
    lat2 = pf["lat_2_ll"]
    if lat2:
        p(
            f"perf allreduce 8 B, 2 ranks (threads), LL: {fmt(lat2.get('time_us'))} us, #wrong {lat2.get('wrong')}, "
            f"rc {lat2.get('rc')} {lat2.get('errors', '')}"
        )
    lat2g = pf["lat_2_grouped"]
    if lat2g:
        p(
            f"perf allreduce 8 B, 2 ranks (one thread, a group per call), LL: {fmt(lat2g.get('time_us'))} us, "
            f"#wrong {lat2g.get('wrong')}, rc {lat2g.get('rc')} {lat2g.get('errors', '')}"
        )
    lim = res["limit"] or {}
    for algo, r in pf["bw_8"].items():
        if not r:
            continue
        ratio = (lim.get("time_over_limit") or {}).get(algo)
        p(
            f"perf allreduce 256 MiB, 8 ranks, {algo:6s}: {fmt(r.get('time_us'), '.0f')} us, busbw "
            f"{fmt(r.get('busbw_gbs'))} GB/s, time/limit {fmt(ratio)}, rc {r.get('rc')}"
            f"{' TIMED OUT' if r.get('timed_out') else ''} {r.get('tuner', '')} {r.get('errors', '')}"
        )
    if lim:
        p(
            f"limit (every input read and every output written once at copy bandwidth, "
            f"{lim['ranks_per_gpu']} rank(s)/GPU): "
            f"{fmt(lim['limit_us'], '.0f')} us = busbw {fmt(lim['limit_busbw_gbs'])} GB/s"
        )
    if pf["lat_2proc"]:
        r = pf["lat_2proc"]
        p(f"perf allreduce 8 B, 2 processes: {fmt(r.get('time_us'))} us, #wrong {r.get('wrong')}, rc {r.get('rc')}")
    lat = res["latency"]
    raw = lat["raw"]
    if not any(raw.values()):
        p("latency: not measured")
        p("=" * 100)
        return
    p(
        f"latency 8 B, 2 ranks, grouped back to back: {fmt(lat.get('back_to_back_us'))} us (LL forced "
        f"{fmt(lat.get('back_to_back_ll_us'))}; target <= {TARGET_BACK_TO_BACK_US}: {lat.get('back_to_back_met')})"
        f"{err(raw['latency'])}"
    )
    if isinstance(raw["latency"], dict):
        for k in ("auto", "ll"):
            v = raw["latency"].get(k)
            if isinstance(v, dict):
                p(
                    f"  {k}: wall {fmt(v.get('us_per_op'))} us, gpu {fmt(v.get('gpu_us_per_op'))} us, enqueue "
                    f"{fmt(v.get('enqueue_us_per_op'))} us per op, correct {v.get('correct')}{err(v)}"
                )
    g = raw["graph"] if isinstance(raw["graph"], dict) else {}
    p(
        f"latency 8 B, 2 ranks, CUDA graph replay: {fmt(lat.get('graph_us'))} us (gpu {fmt(g.get('gpu_us_per_op'))}; "
        f"target <= {TARGET_GRAPH_US}: {lat.get('graph_met')}), correct {g.get('correct')}{err(g)}"
    )
    for variant in ("unfused", "nocache", "general"):
        gv = raw.get(f"graph_{variant}")
        if isinstance(gv, dict):
            p(f"  graph replay, {variant}: {fmt(gv.get('us_per_op'))} us, correct {gv.get('correct')}{err(gv)}")
    th = raw["threads"] if isinstance(raw["threads"], dict) else {}
    p(f"latency 8 B, 2 ranks, a thread + stream per rank: {fmt(lat.get('threads_us'))} us{err(th)}")
    fl = raw.get("floor") if isinstance(raw.get("floor"), dict) else {}
    shapes = [f"{k} {fmt(v.get('back_to_back'))}/{fmt(v.get('graph'))}" for k, v in fl.items() if isinstance(v, dict)]
    p(f"floor (our own kernels, us back to back / graph): {', '.join(shapes) or '-'}{err(fl)}")
    p("=" * 100)


if __name__ == "__main__":
    sys.exit(main())
