"""`minincl perf`: the nccl-tests-style benchmark on the C API that the package ships
(minincl/bin/minincl-perf, linked against libminincl.so). Each run checks every result against
the benchmark's own host reference (-c 1); here every table row must say 0 wrong elements, and
the rows must reach the largest size asked for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import minincl._c_library as c_library

pytestmark = pytest.mark.skipif(c_library.perf_program() is None, reason="package built without minincl-perf")


def perf(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`minincl perf` run away from the source tree (whose minincl/ has no compiled core)."""
    return subprocess.run(
        [sys.executable, "-m", "minincl", "perf", *args], capture_output=True, text=True, timeout=180, cwd=cwd
    )


def table_rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize(
    "collective,ranks,dtype,op",
    [
        ("allreduce", ["-t", "3"], "float", "sum"),
        ("reduce_scatter", ["-p", "2"], "bfloat16", "max"),
        ("allgather", ["-t", "3", "-g"], "int8", "sum"),
        ("broadcast", ["-p", "3"], "double", "sum"),
        ("alltoall", ["-t", "4"], "int32", "sum"),
        ("sendrecv", ["-t", "2"], "half", "sum"),
        ("gather", ["-p", "3"], "uint8", "sum"),
        ("scatter", ["-t", "3", "-g"], "int64", "sum"),
    ],
)
def test_perf_checks_every_size_without_a_wrong_element(
    tmp_path: Path, collective: str, ranks: list[str], dtype: str, op: str
):
    run = perf(
        tmp_path,
        collective,
        *ranks,
        "-b",
        "8",
        "-e",
        "1M",
        "-f",
        "16",
        "-n",
        "2",
        "-w",
        "1",
        "-c",
        "1",
        "-d",
        dtype,
        "-o",
        op,
        "-r",
        "1",
    )
    assert run.returncode == 0, run.stdout + run.stderr
    rows = table_rows(run.stdout)
    element = {"float": 4, "bfloat16": 2, "int8": 1, "uint8": 1, "double": 8, "int32": 4, "int64": 8, "half": 2}[dtype]
    nranks = int(ranks[1])
    # Sizes 8 B, 128 B, ... 512 KiB (16x steps up to 1 MiB), each rounded down to whole elements
    # per rank (per pair of ranks for an alltoall) as nccl-tests does; a size that rounds to
    # nothing has no row.
    largest = 8 * 16**4
    assert len(rows) >= 4 and largest - nranks * nranks * element < int(rows[-1][0]) <= largest, run.stdout
    assert all(row[2] == dtype for row in rows), run.stdout
    assert [row[-1] for row in rows] == ["0"] * len(rows), run.stdout


@pytest.mark.parametrize(
    "collective,ranks,dtype,op",
    [
        ("allreduce", ["-t", "3"], "float", "avg"),
        ("allreduce", ["-p", "2"], "half", "sum"),
        ("broadcast", ["-t", "3", "-g"], "int32", "sum"),
        ("reduce", ["-p", "3"], "double", "max"),
        ("allgather", ["-t", "5"], "int8", "sum"),
        ("reduce_scatter", ["-t", "3", "-g"], "bfloat16", "premulsum"),
    ],
)
def test_perf_in_place_checks_every_size(tmp_path: Path, collective: str, ranks: list[str], dtype: str, op: str):
    """-I 1, as nccl-tests' in-place column: the output over the input (allgather: the input as
    this rank's block of the output; reduce_scatter: the output as its block of the input),
    each checked against the host reference."""
    args = ["-b", "8", "-e", "256K", "-f", "8", "-n", "2", "-w", "1", "-c", "1", "-d", dtype, "-o", op, "-r", "1"]
    run = perf(tmp_path, collective, *ranks, "-I", "1", *args)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "in place: 1" in run.stdout.splitlines()[0], run.stdout
    rows = table_rows(run.stdout)
    assert len(rows) >= 4 and [row[-1] for row in rows] == ["0"] * len(rows), run.stdout


@pytest.mark.parametrize(
    "collective,ranks,in_place",
    [
        ("allreduce", ["-p", "2"], "0"),
        ("allgather", ["-p", "3"], "1"),
        ("reduce_scatter", ["-p", "3"], "0"),
        ("broadcast", ["-p", "2"], "1"),
        ("sendrecv", ["-p", "2"], "0"),
        ("allreduce", ["-t", "3", "-g"], "0"),  # (threads: plain memory, no window needed)
    ],
)
def test_perf_window_buffers_check_every_size(tmp_path: Path, collective: str, ranks: list[str], in_place: str):
    """-R 1, as nccl-tests' registered buffers: every buffer from mnclCommMemAlloc, in the rank's
    window, which minincl-perf sizes through MININCL_WINDOW_BYTES."""
    args = ["-b", "8", "-e", "2M", "-f", "8", "-n", "2", "-w", "1", "-c", "1", "-I", in_place]
    run = perf(tmp_path, collective, *ranks, "-R", "1", *args)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "window buffers: 1" in run.stdout.splitlines()[0], run.stdout
    rows = table_rows(run.stdout)
    assert len(rows) >= 4 and [row[-1] for row in rows] == ["0"] * len(rows), run.stdout


def test_perf_window_buffers_need_room_in_a_window_set_too_small(tmp_path: Path):
    env = {**os.environ, "MININCL_WINDOW_BYTES": "64K"}
    run = subprocess.run(
        [sys.executable, "-m", "minincl", "perf", "allreduce", "-p", "2", "-b", "1M", "-e", "1M", "-R", "1"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env=env,
    )
    assert run.returncode != 0, run.stdout
    assert "mnclCommMemAlloc of 1048576 B: invalid usage (the communicator's window cannot hold" in run.stderr, (
        run.stderr
    )


def test_perf_in_place_is_refused_where_there_is_none(tmp_path: Path):
    run = perf(tmp_path, "sendrecv", "-t", "2", "-I", "1")
    assert run.returncode == 2
    assert "-I 1: sendrecv has no in-place form here" in run.stderr, run.stderr


def test_perf_long_help_is_the_usage(tmp_path: Path):
    run = perf(tmp_path, "--help")  # (getopt said: invalid option -- '-')
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: ")


def test_perf_names_a_wrong_option(tmp_path: Path):
    run = perf(tmp_path, "allreduce", "-t", "2", "-d", "complex128")
    assert run.returncode != 0
    assert "complex128" in run.stdout + run.stderr


@pytest.mark.parametrize(
    "options,said",
    [
        (["-t", "3abc"], "bad value for -t: '3abc' is not an integer"),  # (ran as -t 3)
        (["-t", "2", "-C", "0"], "bad value for -C: 0 is not from 1 to 64"),  # (ignored)
        (["-t", "2", "-c", "7"], "bad value for -c: 7 is not from 0 to 1"),  # (taken as 1)
        (["-t", "2", "-b", "-8"], "bad value for -b: '-8' is not a size such as 8, 64K or 1M"),
        (["-t", "2", "-b", "abc"], "bad value for -b: 'abc' is not a size"),  # (said: stod)
        (["-t", "abc"], "bad value for -t: 'abc' is not an integer"),  # (said: stol)
        (["-t", "2", "-f", "x"], "bad value for -f: 'x' is not a number"),
        (["-t", "2", "-e", "1e17G"], "bad value for -e: '1e17G' is more bytes than a size can be"),  # (read as 0)
        # (it printed the table's header, then every rank's error)
        (["-t", "2", "-o", "band", "-d", "float"], "-o band / bor / bxor combine integers bit by bit"),
        # (these two said "need -b <= -e, -f > 1 (or -i > 0), -n >= 1, -w >= 0, -a in 0..3")
        (["-t", "2", "-b", "1K", "-e", "8"], "-b 1024 is larger than -e 8"),
        (["-t", "2", "-f", "1"], "-f must be above 1 (or give -i BYTES)"),
        # (a std::bad_alloc in every rank, or the OOM killer)
        (["-t", "2", "-e", "100000G"], "minincl-perf: -e 107374182400000 (100000.0 GiB) needs about"),
        (["-p", "2", "-e", "100000G"], "of buffers for 2 ranks; this machine has"),
        (["-t", "2", "-R", "1", "-D", "cuda"], "-R 1: windows are for CPU ranks (-D cpu)"),
        (["-t", "2", "-R", "2"], "bad value for -R: 2 is not from 0 to 1"),
    ],
)
def test_perf_refuses_what_it_ignored_or_misread(tmp_path: Path, options: list[str], said: str):
    run = perf(tmp_path, "allreduce", *options)
    assert run.returncode == 2
    assert said in run.stderr, run.stderr
    assert "usage:" not in run.stderr, run.stderr  # (the one line, not under 24 of usage)


@pytest.mark.parametrize("check,gib", [("0", 600000), ("1", 1000000)])
def test_perf_counts_the_check_buffers_in_what_it_needs(tmp_path: Path, check: str, gib: int):
    """Each CPU rank of an allreduce of B bytes holds its send and receive buffers and the host
    input: 3B; with -c 1 also the host output and the poison written before each check: 5B.
    The estimate said 4B either way, so a run with -c 1 could pass it and meet the OOM killer."""
    run = perf(tmp_path, "allreduce", "-t", "2", "-e", "100000G", "-c", check)
    assert run.returncode == 2
    assert f"needs about {gib}.0 GiB of buffers for 2 ranks" in run.stderr, run.stderr


@pytest.mark.parametrize("collective,count", [("allgather", 85), ("reduce_scatter", 85), ("alltoall", 85)])
def test_perf_count_column_is_the_calls_count_as_in_nccl_tests(tmp_path: Path, collective: str, count: int):
    """nccl-tests prints the count each rank passes to the call; it said 255 (every rank's)."""
    run = perf(tmp_path, collective, "-t", "3", "-b", "1020", "-e", "1020", "-n", "1", "-w", "0", "-c", "1")
    assert run.returncode == 0, run.stderr
    assert [(row[0], row[1], row[-1]) for row in table_rows(run.stdout)] == [("1020", str(count), "0")], run.stdout


def test_perf_rows_are_each_size_once(tmp_path: Path):
    """-f 1.01 from 8 B named 8 four times (sizes rounded down to whole elements)."""
    run = perf(tmp_path, "allreduce", "-t", "2", "-b", "8", "-e", "16", "-f", "1.01", "-n", "1", "-w", "0")
    assert run.returncode == 0, run.stderr
    assert [row[0] for row in table_rows(run.stdout)] == ["8", "12", "16"], run.stdout


def test_perf_a_factor_past_2_to_the_64_ends_the_sizes(tmp_path: Path):
    """The next size went through size_t: past 2^64 it wrapped, and the sizes walked from -b to
    -e one byte at a time (-b 1M -e 1G: no row in 20 s)."""
    for b, e, f in (("1K", "8K", "1e17"), ("1M", "1G", "1e14")):
        run = perf(tmp_path, "allreduce", "-t", "2", "-b", b, "-e", e, "-f", f, "-n", "1", "-w", "0")
        assert run.returncode == 0, run.stderr
        assert [row[0] for row in table_rows(run.stdout)] == [str({"1K": 1024, "1M": 1 << 20}[b])], run.stdout


@pytest.mark.parametrize("collective", ["alltoall", "gather", "scatter", "sendrecv"])
@pytest.mark.parametrize("option", [["-A", "direct"], ["-P", "ll"]])
def test_perf_refuses_an_algorithm_for_collectives_of_sends(tmp_path: Path, collective: str, option: list[str]):
    """As `minincl bench` does; perf took -A, and its own timing allreduce ran under it (-A direct
    on 10 ranks, past direct's 9: exit 2 in "timing allreduce")."""
    run = perf(tmp_path, collective, "-t", "2", *option)
    assert run.returncode == 2
    assert f"{' '.join(option)}: {collective} runs as sends and receives" in run.stderr, run.stderr


@pytest.mark.parametrize("ranks", [["-t", "10"], ["-p", "10"]])
def test_perf_times_collectives_of_sends_whatever_minincl_algo_allows(tmp_path: Path, ranks: list[str]):
    """MININCL_ALGO=direct allows no allreduce on 10 ranks; alltoall runs there, and so must
    perf's own bookkeeping (it timed through an allreduce and stopped in "timing allreduce")."""
    env = {**os.environ, "MININCL_ALGO": "direct"}
    run = subprocess.run(
        [sys.executable, "-m", "minincl", "perf", "alltoall", *ranks, "-b", "40", "-e", "640", "-f", "4"]
        + ["-n", "2", "-w", "1", "-c", "1"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    assert [(row[0], row[-1]) for row in table_rows(run.stdout)] == [("40", "0"), ("160", "0"), ("640", "0")]


def test_perf_exits_with_the_first_failed_ranks_status(tmp_path: Path):
    """Every rank fails at init with status 1; those the launcher stopped (143) used to decide it."""
    env = {**os.environ, "MININCL_NCHANNELS": "abc"}
    run = subprocess.run(
        [sys.executable, "-m", "minincl", "perf", "allreduce", "-p", "4", "-b", "8", "-e", "8"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env=env,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert 'MININCL_NCHANNELS="abc" is not an integer' in run.stderr, run.stderr
    assert run.stderr.count("ended with status") == 1, run.stderr


def test_perf_header_says_an_additive_step(tmp_path: Path):
    run = perf(tmp_path, "allreduce", "-t", "2", "-b", "8", "-e", "16", "-i", "8", "-n", "1", "-w", "0")
    assert run.returncode == 0, run.stderr
    assert "step: +8, warmup" in run.stdout.splitlines()[0], run.stdout  # (it said +80)


@pytest.mark.parametrize("ranks", [["-t", "3"], ["-p", "2"], ["-t", "3", "-g"]])
def test_perf_times_a_zero_byte_call_as_a_row(tmp_path: Path, ranks: list[str]):
    run = perf(tmp_path, "alltoall", *ranks, "-b", "0", "-e", "0", "-n", "2", "-w", "1", "-c", "1")
    assert run.returncode == 0, run.stderr
    rows = table_rows(run.stdout)  # (there was no row at all)
    assert [(row[0], row[1], row[-1]) for row in rows] == [("0", "0", "0")], run.stdout


def test_perf_refuses_sizes_too_small_for_one_element_per_rank(tmp_path: Path):
    run = perf(tmp_path, "allgather", "-t", "3", "-b", "1", "-e", "8", "-d", "double")
    assert run.returncode != 0
    said = "no size from -b 1 to -e 8 holds a whole double element per rank for allgather on 3 ranks (it takes 24 B)"
    assert said in run.stderr, run.stdout + run.stderr
