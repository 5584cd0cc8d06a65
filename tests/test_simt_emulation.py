"""The GPU's lane logic on CPU threads: the checkers below emulate each channel as a block of
threads in warps of 32 (MNCL_SIMT_EMULATION in cuda/arch.h, tests/simt_block.h) and run the
device code's GPU paths on them, checking every result against values they compute
themselves, and that an abort while a rank is missing, or ranks calling with different
counts, stops every block (a thread left behind in a block- or warp-wide wait hangs it: each
checker fails itself where a case's blocks and connections stand still for a minute, saying
where each block stood, and after a generous total time).

- simt_lines_check.cc: LL and LL128's lane layouts (eight lanes per LL128 line, four lines in
  flight per thread, warp votes and syncs), every algorithm's allreduce and broadcast.
- simt_collectives_check.cc: every collective x algorithm x protocol through the kernels'
  dispatch (runTyped), two channels: Simple's block-wide steps and 16-byte vector loop, with
  and without pointer steps and direct writes between ranks of one process; and allreduces of
  9 ranks. Each block works on a copy of its channel in shared memory and writes its changes
  back at the end, as a launch does (cuda/channel_cache.h), so that state a launch leaves
  behind unsaved fails the next case.
- simt_p2p_check.cc: groups of sends and receives as the p2p kernel runs them, split over
  three channels as the host splits them.
- simt_reduce_copy_check.cc: reduceCopy and copyElems alone, with pointers at every offset
  from a 16-byte boundary, each block's threads in turn: every element written once, every
  source byte loaded once, nothing around the outputs touched.

The kernels themselves need a GPU (test_gpu.py); this runs their lane logic on any machine."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def build(name: str, out_dir: Path) -> Path:
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    exe = out_dir / name
    cmd = [cxx, "-std=c++20", "-O1", "-pthread", "-DMNCL_SIMT_EMULATION", f"-I{ROOT / 'cuda'}", f"-I{ROOT / 'tests'}"]
    built = subprocess.run(
        [*cmd, str(ROOT / "tests" / f"{name}.cc"), "-o", str(exe)], capture_output=True, text=True, timeout=300
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return exe


def run_checker(exe: Path, *args: int) -> None:
    run = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=1300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    summary = re.search(r"(\d+) checks, (\d+) failed", run.stdout)
    assert summary is not None, run.stdout[-2000:]
    assert int(summary.group(1)) > 0 and int(summary.group(2)) == 0


@pytest.fixture(scope="module")
def lines_checker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build("simt_lines_check", tmp_path_factory.mktemp("simt"))


@pytest.fixture(scope="module")
def collectives_checker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build("simt_collectives_check", tmp_path_factory.mktemp("simt"))


@pytest.fixture(scope="module")
def p2p_checker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build("simt_p2p_check", tmp_path_factory.mktemp("simt"))


@pytest.mark.parametrize("threads", [32, 64, 96])
def test_line_protocols_lane_layouts(lines_checker: Path, threads: int) -> None:
    """2 and 3 ranks, blocks of 1-3 warps, LL and LL128 under ring, tree and direct."""
    run_checker(lines_checker, threads)


@pytest.mark.parametrize(("threads", "most_ranks"), [(32, 4), (96, 2)])
def test_every_collective_as_the_kernels_run_it(collectives_checker: Path, threads: int, most_ranks: int) -> None:
    """2 to `most_ranks` ranks, 2 channels each; counts 1 to 20011 (every rank's blocks run at
    once: 96-thread blocks on 2 ranks only, to keep the threads a few hundred)."""
    run_checker(collectives_checker, threads, most_ranks)


def test_allreduce_of_nine_ranks_as_the_kernels_run_it(collectives_checker: Path) -> None:
    """9 ranks (8 peers each: the most direct serves), every algorithm x protocol, 32 threads."""
    run_checker(collectives_checker, 32, 1, 1)


@pytest.mark.parametrize("threads", [32, 96])
def test_sends_and_receives_as_the_p2p_kernel_runs_them(p2p_checker: Path, threads: int) -> None:
    """2, 3 and 4 ranks exchanging messages of 0 to ~210 KB with every peer, 3 channels."""
    run_checker(p2p_checker, threads)


def test_data_movers_at_every_alignment(tmp_path: Path) -> None:
    """Copies of bytes (0-300, source and output each 0-15 bytes off 16) and reductions of
    float32, float64, uint8 and uint16 at every element offset, blocks of 1, 7, 32 and 64."""
    run_checker(build("simt_reduce_copy_check", tmp_path))
