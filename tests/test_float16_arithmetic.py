"""Half and bfloat16 reductions on every 16-bit pattern (subnormals, infinities, NaN, both
zeros), against NumPy's float16 arithmetic and PyTorch's bfloat16 rounding: each result is
computed in float and rounded to nearest even, once per operation on two values (avg's too:
each input times 1/n, rounded, then the sum).

Runs under each vector instruction set this CPU has (MININCL_CPU_ISA; the CPU device code's
16-bit arithmetic has a loop per set) and each protocol (LL and LL128 combine an element at
a time)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import env_as, needs, run_ranks, torch

import minincl

ISAS = ["portable", "avx2", "avx512"]
BEST = minincl.build_info()["cpu_vector_isa"]
AVAILABLE = ISAS[: ISAS.index(BEST) + 1]
COUNT = 65536 + 7  # every pattern, then a ragged tail


def patterns(rank: int) -> np.ndarray:
    """Rank 0: every pattern in order; rank 1: every pattern again, shuffled by an odd
    multiplier, so each pattern meets many others. The tail repeats some."""
    i = np.arange(COUNT, dtype=np.uint32)
    bits = i if rank == 0 else i * 40503 + 12345
    return (bits & 0xFFFF).astype(np.uint16)


def to_array(bits: np.ndarray, dtype: str) -> Any:
    if dtype == "float16":
        return bits.view(np.float16).copy()
    assert torch is not None
    return torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)


def as_float32(a: Any) -> np.ndarray:
    if torch is not None and isinstance(a, torch.Tensor):
        return a.to(torch.float32).numpy()
    return np.asarray(a).astype(np.float32)


def rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded to the 16-bit type (NumPy's float16; PyTorch's bfloat16), as float32."""
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    assert torch is not None
    return torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()


def reference(inputs: list[np.ndarray], op: str, dtype: str) -> np.ndarray:
    """inputs: float32 values of each rank's 16-bit input. With 3 ranks the third holds the
    op's identity, so that every order of combining gives the same rounding."""
    a, b = inputs[0], inputs[1]
    with np.errstate(all="ignore"):
        if op == "max":
            return np.maximum(a, b)
        if op == "min":
            return np.minimum(a, b)
        if op == "prod":
            return rounded(a * b, dtype)
        if op == "avg":  # (as NCCL: each input times 1/n rounded to the type, then summed)
            s = rounded(np.full(1, 1 / len(inputs), np.float32), dtype)
            a, b = rounded(a * s, dtype), rounded(b * s, dtype)
        return rounded(a + b, dtype)


def assert_matches(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Equal values (so -0 == +0, which max and min may pick either of) or NaN on both sides."""
    ok = (got == want) | (np.isnan(got) & np.isnan(want))
    bad = np.flatnonzero(~ok)
    assert bad.size == 0, f"{what}: {bad.size} wrong, first at {bad[0]}: got {got[bad[0]]!r}, want {want[bad[0]]!r}"


def check(comms: list[Any], dtype: str, op: str) -> None:
    n = len(comms)
    identity = {"prod": 1.0, "max": -np.inf, "min": np.inf}.get(op, 0.0)
    bits = [patterns(0), patterns(1)]
    if n == 3:
        fill = np.full(COUNT, identity, np.float32)
        bits.append(
            fill.astype(np.float16).view(np.uint16)
            if dtype == "float16"
            else (fill.view(np.uint32) >> 16).astype(np.uint16)
        )
    arrays = [to_array(b, dtype) for b in bits]
    want = reference([as_float32(a) for a in arrays], op, dtype)

    def body(c: Any) -> Any:
        out = to_array(np.zeros(COUNT, np.uint16), dtype)
        return c.allreduce(arrays[c.rank], out, op=op)

    for r, got in enumerate(run_ranks(comms, body)):
        assert_matches(as_float32(got), want, f"{dtype} {op} on rank {r} of {n}")


def comms_with(env: dict[str, str | None], nranks: int) -> list[Any]:
    with env_as(env):
        return minincl.Communicator.init_all(nranks)


@pytest.fixture(autouse=True)
def widest_afterwards() -> Any:
    """The instruction set is one per process, set by the latest communicator made: leave the
    widest for the tests after these."""
    yield
    for c in comms_with({"MININCL_CPU_ISA": None}, 1):
        c.destroy()


@pytest.mark.parametrize("isa", AVAILABLE)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_pattern_under_each_instruction_set(dtype: str, isa: str) -> None:
    needs(dtype)
    for nranks in (2, 3):
        comms = comms_with({"MININCL_CPU_ISA": isa, "MININCL_PROTO": "simple"}, nranks)
        try:
            assert minincl.build_info()["cpu_vector_isa"] == isa
            for op in ("sum", "prod", "max", "min", "avg"):
                check(comms, dtype, op)
        finally:
            for c in comms:
                c.destroy()


@pytest.mark.parametrize("proto", ["ll", "ll128"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_pattern_under_line_protocols(dtype: str, proto: str) -> None:
    needs(dtype)
    comms = comms_with({"MININCL_PROTO": proto}, 2)
    try:
        for op in ("sum", "prod", "max", "min", "avg"):
            check(comms, dtype, op)
    finally:
        for c in comms:
            c.destroy()


def test_instruction_set_setting_is_checked() -> None:
    with env_as({"MININCL_CPU_ISA": "sse9"}), pytest.raises(minincl.InvalidArgument, match="MININCL_CPU_ISA"):
        minincl.Communicator.init_all(2)
    if BEST != "avx512":
        with env_as({"MININCL_CPU_ISA": "avx512"}), pytest.raises(minincl.InvalidArgument, match="at most"):
            minincl.Communicator.init_all(2)
