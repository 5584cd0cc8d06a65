"""Every collective x algorithm x protocol, forced through MININCL_ALGO / MININCL_PROTO, with
representative types and ops, on rank counts that are odd, even and not powers of two."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import (
    ALGOS,
    PROTOS,
    TYPES_OPS,
    as_numpy,
    assert_same,
    counts_for,
    empty,
    forced_env,
    make,
    needs,
    rank_values,
    reduce_ref,
    run_ranks,
)

import minincl


class ForcedPool:
    """Keeps one group of thread-ranks at a time, created under forced algorithm/protocol."""

    def __init__(self) -> None:
        self.key: tuple[int, str, str] | None = None
        self.comms: list[minincl.Communicator] = []

    def get(self, nranks: int, algo: str, proto: str) -> list[minincl.Communicator]:
        key = (nranks, algo, proto)
        if key != self.key or any(c.destroyed for c in self.comms):
            self.close()
            with forced_env(algo, proto):
                self.comms = minincl.Communicator.init_all(nranks)
            self.key = key
        return self.comms

    def close(self) -> None:
        for c in self.comms:
            c.destroy()
        self.comms, self.key = [], None


@pytest.fixture(scope="module")
def forced() -> Any:
    pool = ForcedPool()
    yield pool
    pool.close()


def check_collective(comms: list[Any], coll: str, dtype: str, op: str, count: int) -> None:
    n = len(comms)
    root = (count + 1) % n
    block = count * n if coll == "reduce_scatter" else count
    inputs = [rank_values(r, block, dtype, op, seed=count) for r in range(n)]

    def body(c: Any) -> Any:
        send = make(inputs[c.rank], dtype)
        if coll == "allreduce":
            return c.allreduce(send, empty(count, dtype), op=op)
        if coll == "reduce":
            return c.reduce(send, empty(count, dtype), op=op, root=root)
        if coll == "broadcast":
            return c.broadcast(send, empty(count, dtype), root=root)
        if coll == "allgather":
            return c.allgather(send, empty(count * n, dtype))
        return c.reduce_scatter(send, empty(count, dtype), op=op)

    results = run_ranks(comms, body)
    for r, got in enumerate(results):
        if coll == "allreduce" or (coll == "reduce" and r == root):
            assert_same(got, reduce_ref(inputs, op, dtype), dtype, op)
        elif coll == "broadcast":
            assert_same(got, inputs[root], dtype)
        elif coll == "allgather":
            assert_same(got, np.concatenate(inputs), dtype)
        elif coll == "reduce_scatter":
            assert_same(got, reduce_ref(inputs, op, dtype)[r * count : (r + 1) * count], dtype, op)


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 5, 7, 8])
def test_forced_algorithm_and_protocol(forced: ForcedPool, nranks: int, algo: str, proto: str) -> None:
    comms = forced.get(nranks, algo, proto)
    for coll in ALGOS[algo]:
        for dtype, op in TYPES_OPS:
            needs(dtype)
            for count in counts_for(dtype):
                check_collective(comms, coll, dtype, op, count)


@pytest.mark.parametrize("proto", ["simple", "ll128"])
@pytest.mark.parametrize("algo", ["ring", "tree"])
def test_pipelines_cut_into_small_ragged_pieces(monkeypatch: pytest.MonkeyPatch, algo: str, proto: str) -> None:
    """64-byte pieces: a message crosses the tree / ring in many steps with a ragged last one."""
    monkeypatch.setenv("MININCL_PIPELINE_CHUNK_BYTES", "64")
    for nranks in (3, 5):
        with forced_env(algo, proto):
            comms = minincl.Communicator.init_all(nranks)
        try:
            for coll in ("allreduce", "broadcast", "reduce"):
                for count in (1, 7, 1009, 40009):
                    check_collective(comms, coll, "float32", "sum", count)
        finally:
            for c in comms:
                c.destroy()


def test_pipeline_piece_too_small_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MININCL_PIPELINE_CHUNK_BYTES", "32")
    with pytest.raises(minincl.InvalidArgument, match="MININCL_PIPELINE_CHUNK_BYTES"):
        minincl.Communicator.init_all(2)


def test_malformed_stream_output_bytes_fails_at_init(tmp_path: Path) -> None:
    """Read once per process, so in a process of its own; sizes take K / M / G suffixes."""
    code = (
        "import minincl\n"
        "try:\n"
        "    minincl.Communicator.init_all(2)\n"
        "except minincl.InvalidArgument as e:\n"
        "    print('refused:', e)\n"
    )
    for value, refused in (("4M", False), ("lots", True)):
        env = {**os.environ, "MININCL_STREAM_OUTPUT_BYTES": value}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert ("refused:" in out.stdout and "MININCL_STREAM_OUTPUT_BYTES" in out.stdout) == refused, out.stdout


@pytest.mark.parametrize("value", ["0", "17", "four"])
def test_stream_stretches_outside_1_to_16_fail_at_init(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("MININCL_STREAM_STRETCHES", value)
    with pytest.raises(minincl.InvalidArgument, match="MININCL_STREAM_STRETCHES"):
        minincl.Communicator.init_all(2)


def test_algorithm_that_cannot_run_a_collective_is_a_clear_error(forced: ForcedPool) -> None:
    comms = forced.get(2, "tree", "simple")
    with pytest.raises(minincl.InvalidUsage, match="allgather"):
        run_ranks(comms, lambda c: c.allgather(np.ones(4, np.float32)))
    # (at count 0 too: it ran, where count 1 was refused)
    for call in (lambda c: c.allgather(np.ones(0, np.float32)), lambda c: c.reduce_scatter(np.ones(0, np.float32))):
        with pytest.raises(minincl.InvalidUsage, match="allow no algorithm that implements"):
            run_ranks(comms, call)


def _off_alignment(values: np.ndarray) -> np.ndarray:
    """`values` in an array one byte off its type's alignment (NumPy allows such views)."""
    raw = np.zeros(values.nbytes + 1, np.uint8)[1:].view(values.dtype)
    raw[...] = values
    return raw


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "float16"])
def test_reductions_of_arrays_off_their_alignment(forced: ForcedPool, dtype: str) -> None:
    """Inputs and outputs one byte off their type's alignment, in place and not, premul_sum
    too, on every algorithm x protocol: reduced through aligned blocks (typed loads there were
    undefined behaviour, which UBSan reported and x86 forgave)."""
    n = 3
    for algo in ALGOS:
        for proto in PROTOS:
            comms = forced.get(n, algo, proto)
            for count in (1, 97, 4099):
                inputs = [((np.arange(count) * (q + 1)) % 7).astype(dtype) for q in range(n)]
                total = np.add.reduce(np.stack(inputs), axis=0, dtype=dtype)
                scaled = np.add.reduce(np.stack([x * (q + 1) for q, x in enumerate(inputs)]), axis=0, dtype=dtype)

                def body(c: Any) -> list[np.ndarray]:
                    x = _off_alignment(inputs[c.rank])
                    out = c.allreduce(x, _off_alignment(np.zeros(count, dtype)))
                    in_place = _off_alignment(inputs[c.rank])
                    c.allreduce(in_place)
                    premul = c.allreduce(x, _off_alignment(np.zeros(count, dtype)), op=minincl.PreMulSum(c.rank + 1))
                    if algo == "tree":  # (a tree has no reduce_scatter)
                        return [out, in_place, premul]
                    block = c.reduce_scatter(
                        _off_alignment(np.tile(inputs[c.rank], n)), _off_alignment(np.zeros(count, dtype))
                    )
                    return [out, in_place, premul, block]

                for got in run_ranks(comms, body):
                    for label, value, want in zip(
                        ("out of place", "in place", "premul_sum", "reduce_scatter"), got, (total, total, scaled, total)
                    ):
                        np.testing.assert_array_equal(value, want, err_msg=f"{algo}/{proto}, {dtype}, {count}: {label}")


def test_barrier_runs_where_the_forced_algorithm_has_no_allreduce(forced: ForcedPool) -> None:
    """A barrier is the runtime's own allreduce: MININCL_ALGO=direct (at most 9 ranks) left
    10 ranks' barrier() an InvalidUsage about an allreduce nobody called. The user's own
    allreduce is still refused, and their alltoall (sends) runs."""
    comms = forced.get(10, "direct", "simple")
    with pytest.raises(minincl.InvalidUsage, match="allow no algorithm that implements allreduce on 10 ranks"):
        run_ranks(comms, lambda c: c.allreduce(np.ones(4, np.float32)))
    comms = forced.get(10, "direct", "simple")  # (the refusal did not fail the communicators)

    def body(c: Any) -> np.ndarray:
        c.barrier()
        out = c.alltoall(np.arange(10, dtype=np.int32) + 100 * c.rank)
        c.barrier()
        return out

    for rank, out in enumerate(run_ranks(comms, body)):
        np.testing.assert_array_equal(out, np.arange(10) * 100 + rank)


def check_small_allreduces(comms: list[Any], calls: int, label: str) -> None:
    """`calls` 3-element allreduces on 3 ranks whose values change every call."""

    def body(c: Any) -> int:
        for i in range(calls):
            x = np.array([c.rank * i, i, 1], np.int32)
            c.allreduce(x)
            if x[0] != 3 * i or x[1] != 3 * i or x[2] != 3:
                raise AssertionError(f"{label} call {i}: {x}")
        return 0

    run_ranks(comms, body, timeout=120)


def test_thousands_of_small_allreduces_per_protocol(forced: ForcedPool) -> None:
    """Flags must never be taken from an earlier lap or operation: values change every call."""
    for proto in PROTOS:
        check_small_allreduces(forced.get(3, "ring", proto), 5000, proto)


# Relative rounding of one addition in each floating type.
EPSILON = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


@pytest.mark.parametrize("nranks", [3, 5])
def test_inexact_sums_are_bitwise_identical_on_every_rank(forced: ForcedPool, nranks: int) -> None:
    """Data parallelism keeps its replicas equal only if every rank gets the very same bits from
    an allreduce. With values whose sums round, a rank that added in another order would get
    other bits; each must also lie within n roundings of the exact sum."""
    rng = np.random.default_rng(nranks)
    for algo in ALGOS:
        for proto in PROTOS:
            comms = forced.get(nranks, algo, proto)
            for dtype in EPSILON:
                needs(dtype)
                for count in (7, 1009, 40009):
                    inputs = [rng.standard_normal(count) * 10.0 ** rng.uniform(-2, 2, count) for _ in range(nranks)]
                    inputs = [as_numpy(make(x, dtype)).astype(np.float64) for x in inputs]  # as the type holds them
                    results = run_ranks(comms, lambda c: c.allreduce(make(inputs[c.rank], dtype)))
                    first = as_numpy(results[0])
                    label = f"{algo}/{proto} {dtype} x{count}"
                    for r in range(1, nranks):
                        assert as_numpy(results[r]).tobytes() == first.tobytes(), (
                            f"{label}: rank {r} differs from rank 0"
                        )
                    exact = np.sum(inputs, axis=0)
                    bound = nranks * EPSILON[dtype] * np.sum(np.abs(inputs), axis=0)
                    assert np.all(np.abs(first.astype(np.float64) - exact) <= bound), label


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_propagate_nan_as_numpy(forced: ForcedPool, op: str) -> None:
    """A NaN on any rank makes that element NaN, as np.maximum / np.minimum do, under every
    algorithm and protocol (a comparison that keeps the other operand would drop it in one
    order of the ranks and keep it in another); infinities as NumPy's too (a zero's sign is
    not compared)."""
    nranks, count = 3, 2003
    rng = np.random.default_rng(7)
    for algo in ALGOS:
        for proto in PROTOS:
            comms = forced.get(nranks, algo, proto)
            for dtype in EPSILON:
                needs(dtype)
                values = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.5, -2.0])
                inputs = [as_numpy(make(rng.choice(values, count), dtype)).astype(np.float64) for _ in range(nranks)]
                results = run_ranks(comms, lambda c: c.allreduce(make(inputs[c.rank], dtype), op=op))
                want = (np.maximum if op == "max" else np.minimum).reduce(inputs)
                for r in range(nranks):
                    got = as_numpy(results[r]).astype(np.float64)
                    same = (got == want) | (np.isnan(got) & np.isnan(want))
                    assert same.all(), f"{algo}/{proto} {dtype} rank {r}: {got[~same][:4]} for {want[~same][:4]}"


def test_tuner_remembers_its_last_choice_per_collective(tmp_path: Path) -> None:
    """MININCL_DEBUG=INFO logs a choice when the tuner makes it: once for a loop of same-sized
    calls, again when the size changes, and the remembered plan keeps giving NumPy's answer."""
    code = (
        "import numpy as np, minincl\n"
        "cs = minincl.Communicator.init_all(2)\n"
        "for n in [1000] * 5 + [3000] * 3 + [1000]:\n"
        "    with minincl.group():\n"
        "        outs = [c.allreduce(np.full(n, c.rank + 1.0, np.float32)) for c in cs]\n"
        "    assert all((o == 3.0).all() and o.size == n for o in outs)\n"
        "[c.destroy() for c in cs]\n"
    )
    env = {**os.environ, "MININCL_DEBUG": "INFO", "MININCL_DEBUG_SUBSYS": "TUNE"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    choices = [line for line in out.stderr.splitlines() if "allreduce" in line and "estimated" in line]
    per_rank = [sum(f"allreduce {b} bytes" in line for line in choices) for b in (4000, 12000)]
    assert per_rank == [2 * 2, 2], choices  # 2 ranks: 4000 B chosen twice (it came back), 12000 B once
