"""What compare.py writes: the CSV, the plots and the RESULTS.md section with target checks."""

from __future__ import annotations

import csv
import datetime
import os
import platform
import statistics
from dataclasses import dataclass, field
from typing import Any

Row = tuple[str, str, int, float, float]  # library, collective, bytes, latency us, busbw GB/s


@dataclass
class Results:
    libraries: list[str]
    collectives: list[str]
    samples: dict[tuple[str, str, int], list[tuple[float, float]]] = field(default_factory=dict)
    memcpy_gbps: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    command: str = ""
    elapsed_s: float = 0.0

    def add(self, row: Row) -> None:
        lib, coll, size, lat, bw = row
        self.samples.setdefault((lib, coll, size), []).append((lat, bw))

    def sizes(self, coll: str) -> list[int]:
        return sorted({s for (_, c, s) in self.samples if c == coll})

    def median(self, lib: str, coll: str, size: int) -> tuple[float, float] | None:
        got = self.samples.get((lib, coll, size))
        if not got:
            return None
        return statistics.median(x[0] for x in got), statistics.median(x[1] for x in got)

    def memcpy(self) -> float:
        return statistics.median(self.memcpy_gbps) if self.memcpy_gbps else 0.0


def human(size: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def write_csv(results: Results, path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["library", "collective", "size_bytes", "latency_us", "busbw_gbps", "rounds"])
        for coll in results.collectives:
            for size in results.sizes(coll):
                for lib in results.libraries:
                    m = results.median(lib, coll, size)
                    if m:
                        n = len(results.samples[(lib, coll, size)])
                        w.writerow([lib, coll, size, f"{m[0]:.3f}", f"{m[1]:.4f}", n])
        w.writerow(["memcpy", "hardware", 256 << 20, "", f"{results.memcpy():.4f}", len(results.memcpy_gbps)])


def write_plots(results: Results, out_dir: str) -> list[str]:
    """One PNG per collective: busbw and latency against size, a line per library."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib is not installed (pip install matplotlib): no plots")
        return []
    paths = []
    for coll in results.collectives:
        sizes = results.sizes(coll)
        if not sizes:
            continue
        fig, (ax_bw, ax_lat) = plt.subplots(1, 2, figsize=(13, 4.8))
        for lib in results.libraries:
            pts = [(s, results.median(lib, coll, s)) for s in sizes]
            xs = [s for s, m in pts if m]
            ax_bw.plot(xs, [m[1] for _, m in pts if m], marker="o", ms=3, label=lib)
            ax_lat.plot(xs, [m[0] for _, m in pts if m], marker="o", ms=3, label=lib)
        ax_bw.axhline(results.memcpy(), color="black", ls="--", lw=1, label=f"memcpy {results.memcpy():.1f} GB/s")
        ax_bw.set(xscale="log", xlabel="size (bytes)", ylabel="busbw (GB/s)", title=f"{coll}: bus bandwidth")
        ax_lat.set(xscale="log", yscale="log", xlabel="size (bytes)", ylabel="latency (us)", title=f"{coll}: latency")
        for ax in (ax_bw, ax_lat):
            ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle("2 ranks on one machine, float32 sum; median over interleaved rounds")
        fig.tight_layout()
        path = os.path.join(out_dir, f"compare_{coll}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _best_other(results: Results, coll: str, size: int) -> tuple[str, float, float] | None:
    """(library, latency, busbw) of the other library with the highest busbw at this size."""
    best = None
    for lib in results.libraries:
        if lib.startswith("minincl"):
            continue
        m = results.median(lib, coll, size)
        if m and (best is None or m[1] > best[2]):
            best = (lib, m[0], m[1])
    return best


def targets(results: Results, me: str = "minincl") -> list[str]:
    """The issue's targets for runner `me`, each PASS / FAIL / n/a with its numbers."""
    out = []

    def verdict(ok: bool | None) -> str:
        return "n/a " if ok is None else ("PASS" if ok else "FAIL")

    ar8, ompi8 = results.median(me, "allreduce", 8), results.median("openmpi", "allreduce", 8)
    ok = None if not (ar8 and ompi8) else ar8[0] <= ompi8[0]
    detail = f"{me} {ar8[0]:.2f} us vs Open MPI {ompi8[0]:.2f} us" if ar8 and ompi8 else "missing data"
    out.append(f"- {verdict(ok)} allreduce 8 B no slower than Open MPI: {detail}")

    big = [s for s in results.sizes("allreduce") if s >= 8 << 20]
    worst: tuple[float, int] | None = None
    for s in big:
        m, b = results.median(me, "allreduce", s), _best_other(results, "allreduce", s)
        if m and b:
            r = m[1] / b[2]
            worst = (r, s) if worst is None or r < worst[0] else worst
    ok = None if worst is None else worst[0] >= 2.0
    detail = f"lowest ratio {worst[0]:.2f}x at {human(worst[1])}" if worst else "missing data"
    out.append(f"- {verdict(ok)} allreduce busbw >= 2x best of the others at every size >= 8 MiB: {detail}")

    top = max(results.sizes("allreduce"), default=0)
    m = results.median(me, "allreduce", top) if top else None
    ok = None if not (m and top >= 256 << 20) else m[1] >= results.memcpy() / 2
    detail = f"{m[1]:.2f} GB/s at {human(top)} vs memcpy/2 = {results.memcpy() / 2:.2f} GB/s" if m else "missing data"
    out.append(f"- {verdict(ok)} allreduce at 256 MiB >= half the memcpy bandwidth: {detail}")

    for coll in ("broadcast", "allgather"):
        worst = None
        for s in (s for s in results.sizes(coll) if s >= 1 << 20):
            m, b = results.median(me, coll, s), _best_other(results, coll, s)
            if m and b:
                r = m[1] / b[2]
                worst = (r, s, b[0]) if worst is None or r < worst[0] else worst
        ok = None if worst is None else worst[0] >= 1.0
        detail = f"lowest ratio {worst[0]:.2f}x ({worst[2]}) at {human(worst[1])}" if worst else "not measured"
        out.append(f"- {verdict(ok)} {coll} busbw >= best of the others at every size >= 1 MiB: {detail}")
    return out


def section_markdown(results: Results, libraries: list[Any], plots: list[str], md_dir: str) -> str:
    mode = "quick" if "--quick" in results.command else "full"
    lines = [f"## Comparison with gloo and MPI, 2 ranks ({mode})", ""]
    lines.append(
        f"Command: `{results.command}` (from the repository root; {results.elapsed_s / 60:.1f} min, "
        f"{datetime.date.today().isoformat()})."
    )
    lines.append(
        f"Machine: {_cpu_model()}, {os.cpu_count()} cores. Hardware line: NumPy copy of 256 MiB, "
        f"{results.memcpy():.2f} GB/s (bytes read + written; median of {len(results.memcpy_gbps)} "
        "measurements spread over the run)."
    )
    lines.append("Libraries: " + "; ".join(f"{lib.name} = {lib.version}" for lib in libraries) + ".")
    lines.append(
        "Method: float32 sum; each library's runner is 2 processes (minincl-threads: 2 ranks as "
        "threads of one process, shown for reference; minincl-window: minincl's processes with buffers "
        "from `Communicator.empty`, which peers read directly; the first ratio column and the first "
        "targets use plain NumPy buffers, like the other libraries); "
        "per size warm-up calls, then "
        "repetitions of a fixed call count (the slowest rank counts, median repetition); "
        "libraries alternate order between rounds; figures are medians over rounds. "
        "busbw uses nccl-tests' factors (allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall, gather "
        "and scatter (n-1)/n; broadcast 1; sendrecv 1: each rank sends the size to its partner and receives as "
        "much, MPI_Sendrecv). Broadcast, gather and scatter have root 0. Latency is per call, from Python."
    )
    lines.append("")
    for coll in results.collectives:
        sizes = results.sizes(coll)
        if not sizes:
            continue
        libs = results.libraries
        lines.append(f"### {coll}")
        lines.append("")
        lines.append(
            "| size | "
            + " | ".join(f"{lib} us" for lib in libs)
            + " | "
            + " | ".join(f"{lib} GB/s" for lib in libs)
            + " | minincl / best other (busbw) |"
            + (" minincl-window / best other |" if "minincl-window" in libs else "")
        )
        lines.append("|---:|" + "---:|" * (2 * len(libs) + 1 + ("minincl-window" in libs)))
        for s in sizes:
            ms = [results.median(lib, coll, s) for lib in libs]
            lat = [f"{m[0]:.2f}" if m else "-" for m in ms]
            bw = [f"{m[1]:.3f}" if m else "-" for m in ms]
            best = _best_other(results, coll, s)
            ratios = []
            for me in [lib for lib in ("minincl", "minincl-window") if lib in libs]:
                mine = results.median(me, coll, s)
                ratios.append(f"{mine[1] / best[2]:.2f}x ({best[0]})" if mine and best and best[2] > 0 else "-")
            cells = [human(s), *lat, *bw, *ratios]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines.append("Targets (minincl, plain NumPy buffers):")
    lines.append("")
    lines.extend(targets(results))
    lines.append("")
    if "minincl-window" in results.libraries:
        lines.append("Targets (minincl-window, buffers from `Communicator.empty`):")
        lines.append("")
        lines.extend(targets(results, "minincl-window"))
        lines.append("")
    if results.failures:
        lines.append("Runs that failed (their sizes are missing above):")
        lines.append("")
        lines.extend(f"- {f}" for f in results.failures)
        lines.append("")
    for p in plots:
        lines.append(f"![{os.path.basename(p)}]({os.path.relpath(p, md_dir)})")
    if plots:
        lines.append("")
    return "\n".join(lines)


def write_markdown(results: Results, path: str, libraries: list[Any], plots: list[str], md_dir: str) -> str:
    """Replaces this mode's section of RESULTS.md (or appends it); other sections stay."""
    section = section_markdown(results, libraries, plots, md_dir)
    heading = section.splitlines()[0]
    text = "# minincl benchmark results\n"
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == heading), None)
    if start is None:
        new = text.rstrip("\n") + "\n\n" + section
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        new = "\n".join(lines[:start] + section.splitlines() + lines[end:])
    with open(path, "w") as f:
        f.write(new.rstrip("\n") + "\n")
    return section
