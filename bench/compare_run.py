"""Starting the comparison runners: which libraries exist here, how each is launched."""

from __future__ import annotations

import importlib.metadata
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import numpy as np

RUNNERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runners")
OMPI_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@dataclass
class Library:
    name: str
    command: list[str]  # runner command line, without the runner's own arguments
    env: dict[str, str] = field(default_factory=dict)
    version: str = ""


def _mpi_version(python: str, env: dict[str, str]) -> str:
    code = "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0].strip())"
    try:
        out = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=60, env={**os.environ, **env}, check=True
        )
        return " ".join(out.stdout.split()).split(",")[0]  # "Open MPI v5.0.11" / "MPICH Version: 5.0.2"
    except (OSError, subprocess.SubprocessError) as e:
        return f"unavailable ({e})"


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# minincl's runners: (script, how its ranks run, for the report, extra environment).
MININCL_RUNNERS = {
    "minincl": ("run_minincl.py", "ranks bound to cores (MININCL_CPU_BIND=1)", {}),
    "minincl-window": (
        "run_minincl.py",
        "ranks bound to cores, buffers from Communicator.empty (a window the peer maps)",
        {"MININCL_BENCH_WINDOW": "1", "MININCL_WINDOW_BYTES": "2G"},
    ),
    "minincl-threads": ("run_minincl_threads.py", "2 ranks as threads of one process", {}),
    "minincl-net": (
        "run_minincl.py",
        "ranks bound to cores, every connection over TCP loopback (MININCL_TRANSPORT=net), as gloo's",
        {"MININCL_TRANSPORT": "net"},
    ),
}


def available_libraries(
    names: list[str], mpich_venv: str, openmpi_venv: str, minincl_env: dict[str, str]
) -> list[Library]:
    """The requested libraries that can run here (a missing venv is reported and skipped)."""
    out = []
    for name in names:
        if name in MININCL_RUNNERS:
            script, how, extra = MININCL_RUNNERS[name]
            note = "".join(f" {k}={v}" for k, v in minincl_env.items())
            out.append(
                Library(
                    name,
                    [sys.executable, os.path.join(RUNNERS, script)],
                    {**minincl_env, **extra},
                    f"minincl {_package_version('minincl')}{note}, {how}",
                )
            )
        elif name == "gloo":
            out.append(
                Library(
                    name,
                    [sys.executable, os.path.join(RUNNERS, "run_gloo.py")],
                    {},
                    f"torch {_package_version('torch')} gloo",
                )
            )
        elif name in ("mpich", "openmpi", "openmpi-tcp"):
            venv = mpich_venv if name == "mpich" else openmpi_venv
            python, mpiexec = os.path.join(venv, "bin", "python"), os.path.join(venv, "bin", "mpiexec")
            if not (os.path.exists(python) and os.path.exists(mpiexec)):
                print(
                    f"# {name}: no {mpiexec}; skipped (python3 -m venv {venv} && {venv}/bin/pip install "
                    f"mpi4py {name} numpy)",
                    file=sys.stderr,
                )
                continue
            env = dict(OMPI_ROOT_ENV) if name.startswith("openmpi") else {}
            if name == "openmpi-tcp":  # its TCP transport only, for the network comparison
                env["OMPI_MCA_btl"] = "tcp,self"
            cmd = [mpiexec, "-n", "2", python, os.path.join(RUNNERS, "run_mpi.py"), "--library", name]
            version = _mpi_version(python, env) + (" (btl tcp,self)" if name == "openmpi-tcp" else "")
            out.append(Library(name, cmd, env, version))
        else:
            known = ", ".join([*MININCL_RUNNERS, "gloo", "mpich", "openmpi", "openmpi-tcp"])
            raise SystemExit(f"unknown library {name!r}: expected one of {known}")
    return out


def run_runner(
    lib: Library, collective: str, sizes: list[int], reps: int, warmup: int, budget_bytes: int, timeout: float
) -> tuple[list[tuple[str, str, int, float, float]], str]:
    """Runs one runner for one collective; returns its rows and an error text ('' if fine).

    The runner gets its own process group so that a hung run is ended whole.
    """
    cmd = lib.command + [
        "--collective",
        collective,
        "--sizes",
        ",".join(map(str, sizes)),
        "--reps",
        str(reps),
        "--warmup",
        str(warmup),
        "--budget-bytes",
        str(budget_bytes),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **lib.env},
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return _parse(out), f"timed out after {timeout:.0f} s"
    rows = _parse(out)
    if proc.returncode != 0:
        tail = " | ".join(err.strip().splitlines()[-3:])
        return rows, f"exit status {proc.returncode}: {tail}"
    return rows, ""


def _parse(out: str) -> list[tuple[str, str, int, float, float]]:
    rows = []
    for line in out.splitlines():
        parts = line.strip().split(",")
        if len(parts) != 5 or parts[0] == "library":
            continue
        rows.append((parts[0], parts[1], int(parts[2]), float(parts[3]), float(parts[4])))
    return rows


def memcpy_bandwidth(nbytes: int = 256 << 20, reps: int = 5) -> float:
    """GB/s of a NumPy copy of nbytes (bytes read + bytes written per second), median."""
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return 2 * nbytes / float(np.median(times)) / 1e9
