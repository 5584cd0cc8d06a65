"""The GPU's lane layouts of LL and LL128 (eight lanes per LL128 line, four lines in flight
per thread, warp votes and syncs) on CPU threads: tests/simt_lines_check.cc emulates a
channel as a block of threads in warps of 32 (MNCL_SIMT_EMULATION in cuda/arch.h) and checks
every algorithm's allreduce and broadcast against its own sums, and that an abort while a rank
is missing, or two ranks calling with different counts, stops every warp (a lane left behind
in a warp-wide wait hangs the block: the checker fails itself after 120 s). The kernels
themselves need a GPU (test_gpu.py); this runs their lane logic on any machine."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def checker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    exe = tmp_path_factory.mktemp("simt") / "simt_lines_check"
    cmd = [cxx, "-std=c++20", "-O1", "-pthread", "-DMNCL_SIMT_EMULATION", f"-I{ROOT / 'cuda'}"]
    built = subprocess.run(
        [*cmd, str(ROOT / "tests" / "simt_lines_check.cc"), "-o", str(exe)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return exe


@pytest.mark.parametrize("threads", [32, 64, 96])
def test_gpu_lane_layouts_on_cpu_threads(checker: Path, threads: int) -> None:
    """2 and 3 ranks, blocks of 1-3 warps, LL and LL128 under ring, tree and direct."""
    run = subprocess.run([str(checker), str(threads)], capture_output=True, text=True, timeout=200)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    summary = re.search(r"(\d+) checks, (\d+) failed", run.stdout)
    assert summary is not None, run.stdout[-2000:]
    assert int(summary.group(1)) > 0 and int(summary.group(2)) == 0
