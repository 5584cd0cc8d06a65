"""The command line: `minincl bench` (the README's main job) with --check, and `minincl info`."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

import minincl


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # From an empty directory: `python -m` puts the working directory first on the path, and
    # the repository root's minincl/ has no compiled core.
    with tempfile.TemporaryDirectory() as cwd:
        return subprocess.run(
            [sys.executable, "-m", "minincl", *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            cwd=cwd,
            env=env,
        )


@pytest.mark.parametrize(
    "collective", ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall", "gather", "scatter"]
)
def test_bench_checks_every_row_against_numpy(collective: str) -> None:
    args = ("--ranks", "3", "-b", "8", "-e", "256K", "-f", "8", "--check", "--iters", "3", "--root", "1")
    out = run_cli("bench", collective, *args)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.strip() and not line.startswith("#")]
    sizes = [int(r[0]) for r in rows]
    # allgather, reduce_scatter, alltoall, gather and scatter round a size down to whole blocks per
    # rank, and have no 8 B row: 8 B holds no float32 for each of 3 ranks
    asked = [8, 64, 512, 4096, 32768, 262144]
    if collective in ("allgather", "reduce_scatter", "alltoall", "gather", "scatter"):
        asked = asked[1:]
    assert len(sizes) == len(asked) and all(0 <= want - got < 3 * 4 for got, want in zip(sizes, asked)), sizes
    assert all(r[-1] == "0" for r in rows), out.stdout  # the #wrong column
    assert "Out of bounds values : 0 OK" in out.stdout


@pytest.mark.parametrize(
    ("dtype", "op"),
    [("bfloat16", "sum"), ("float8_e4m3fn", "avg"), ("float8_e5m2", "premulsum"), ("float8_e4m3fn", "max")],
)
def test_bench_narrow_floats_through_ml_dtypes(dtype: str, op: str) -> None:
    """bfloat16 and the 8-bit floats as ml_dtypes' NumPy arrays, checked (within the rounding
    of each step); 5 ranks, so partial sums round."""
    pytest.importorskip("ml_dtypes")
    args = ("bench", "allreduce", "--ranks", "5", "-b", "2", "-e", "64K", "-f", "16", "--check", "--iters", "3")
    out = run_cli(*args, "--dtype", dtype, "--op", op)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert len(rows) == 4 and all(r[2] == dtype and r[-1] == "0" for r in rows), out.stdout


def test_bench_checks_bitwise_ops_and_refuses_them_on_floats() -> None:
    args = ("bench", "reduce_scatter", "--ranks", "3", "-b", "24", "-e", "64K", "-f", "32", "--check", "--iters", "3")
    out = run_cli(*args, "--dtype", "int64", "--op", "bxor")
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert len(rows) == 3 and all(r[3] == "bxor" and r[-1] == "0" for r in rows), out.stdout
    refused = run_cli(*args, "--dtype", "float32", "--op", "band")
    assert refused.returncode != 0
    assert "--op band combines integers bit by bit" in refused.stdout + refused.stderr


def test_bench_takes_a_bitwise_op_with_a_collective_that_reduces_nothing() -> None:
    # (allgather takes no op, as the table's "none" says, but a float type with band was refused)
    out = run_cli("bench", "allgather", "--ranks", "2", "-b", "8", "-e", "8", "--iters", "1", "--op", "band")
    assert out.returncode == 0, out.stderr
    assert ", op none," in out.stdout.splitlines()[0], out.stdout


def test_bench_rejects_an_unknown_algorithm() -> None:
    out = run_cli("bench", "allreduce", "--ranks", "2", "-b", "8", "-e", "8", "--algo", "butterfly")
    assert out.returncode != 0
    # One line for both ranks, without their tracebacks (there were one per rank).
    lines = out.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith("minincl bench: ranks 0, 1: InvalidArgument: "), out.stderr
    assert 'MININCL_ALGO: unknown name "butterfly"' in lines[0]


def test_bench_names_no_op_for_collectives_without_one() -> None:
    out = run_cli("bench", "broadcast", "--ranks", "2", "-b", "8", "-e", "8", "--iters", "1")
    assert out.returncode == 0, out.stderr
    assert ", op none," in out.stdout.splitlines()[0], out.stdout
    gather = run_cli("bench", "gather", "--ranks", "2", "-b", "8", "-e", "8", "--iters", "1")
    assert gather.returncode == 0, gather.stderr
    assert ", algo none (sends and receives), proto Simple," in gather.stdout.splitlines()[0], gather.stdout


def test_bench_refuses_an_algorithm_for_collectives_made_of_sends() -> None:
    # (It was ignored, and the table's header named it.)
    out = run_cli("bench", "gather", "--ranks", "2", "-b", "8", "-e", "8", "--algo", "ring")
    assert out.returncode != 0
    assert "--algo ring: gather runs as sends and receives, which have no algorithm or protocol" in out.stderr


def test_bench_times_collectives_of_sends_whatever_minincl_algo_allows() -> None:
    """MININCL_ALGO=direct allows no allreduce on 10 ranks; alltoall runs there, and so must the
    bench's own timing and counting (they went through allreduce and barrier, and failed)."""
    args = ("bench", "alltoall", "--ranks", "10", "-b", "40", "-e", "640", "-f", "4", "--check", "--iters", "2")
    out = run_cli(*args, env={**os.environ, "MININCL_ALGO": "direct"})
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert [(r[0], r[-1]) for r in rows] == [("40", "0"), ("160", "0"), ("640", "0")], out.stdout


@pytest.mark.parametrize("command", [["topo"], ["bench", "allreduce", "-b", "8", "-e", "1M", "--iters", "1"]])
def test_a_reader_that_leaves_ends_the_command_quietly(command: list[str]) -> None:
    # (`minincl topo | head`: it printed "BrokenPipeError" and, for bench, a traceback per rank.)
    with tempfile.TemporaryDirectory() as cwd:
        p = subprocess.Popen(
            [sys.executable, "-m", "minincl", *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd
        )
        assert p.stdout is not None and p.stderr is not None
        p.stdout.close()  # before it writes its first line
        err = p.stderr.read().decode()
        assert p.wait(timeout=120) == 141, err
    assert "BrokenPipe" not in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "options, words",
    [
        (["--ranks", "0"], "--ranks/-n: 0 is below 1"),  # (an IndexError)
        (["-b", "1M", "-e", "8"], "-b 1M is above -e 8"),  # (an empty table, exit 0)
        (["-f", "1"], "-f/--stepfactor: 1 is below"),  # (a row per byte)
        (["--iters", "-1"], "--iters: -1 is below 0"),
        (["-b", "abc"], "'abc' is not a size"),
        # (a MemoryError after minutes of smaller rows, or the OOM killer)
        (["-e", "100000G"], "minincl bench: -e 100000G needs about"),
        # (a traceback out of argparse: OverflowError, cannot convert float infinity to integer)
        (["-e", "infK"], "-e/--maxbytes: 'infK' is not a size"),
        (["-e", "1e400K"], "-e/--maxbytes: '1e400K' is not a size"),
        # (OverflowError and ValueError, naming no option)
        (["-f", "inf"], "-f/--stepfactor: 'inf' is not a finite number"),
        (["-f", "nan"], "-f/--stepfactor: 'nan' is not a finite number"),
    ],
)
def test_bench_refuses_bad_options_naming_them(options: list[str], words: str) -> None:
    r = run_cli("bench", "allreduce", *options)
    assert r.returncode != 0
    assert words in r.stderr


def test_bench_times_a_zero_byte_call_and_refuses_sizes_too_small_for_every_rank() -> None:
    zero = run_cli("bench", "alltoall", "--ranks", "3", "-b", "0", "-e", "0", "--check", "--iters", "2")
    assert zero.returncode == 0, zero.stdout + zero.stderr
    rows = [line.split() for line in zero.stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert [(r[0], r[1], r[-1]) for r in rows] == [("0", "0", "0")], zero.stdout
    small = run_cli("bench", "allgather", "--ranks", "3", "-b", "1", "-e", "16", "--dtype", "float64")
    assert small.returncode != 0
    said = "no size from -b 1 to -e 16 holds a whole float64 element per rank for allgather on 3 ranks (it takes 24 B)"
    assert said in small.stderr, small.stdout + small.stderr  # (it printed 0-byte rows as if asked)


def test_bench_rows_are_each_size_once_and_end_with_the_average_bus_bandwidth() -> None:
    """-f 1.01 from 8 B gave 8, 8, 8, 8, 12, ...: sizes rounded down to whole elements, repeated."""
    out = run_cli("bench", "allreduce", "-b", "8", "-e", "40", "-f", "1.01", "--iters", "2", "--check")
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert [int(r[0]) for r in rows] == list(range(8, 41, 4)), out.stdout
    average = [line for line in out.stdout.splitlines() if line.startswith("# Avg bus bandwidth")]
    assert len(average) == 1 and float(average[0].split(":")[1]) > 0, out.stdout


def test_info_names_the_build() -> None:
    out = run_cli("info")
    assert out.returncode == 0, out.stderr
    assert "minincl" in out.stdout
    assert minincl.build_info()["cpu_vector_isa"] in out.stdout
    compiler = minincl.build_info()["compiler"]
    assert "GCC" in compiler or "clang" in compiler.lower(), compiler  # (GCC's version alone named nothing)
