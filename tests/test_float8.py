"""8-bit floats (OCP FP8: E4M3 as PyTorch's float8_e4m3fn, and E5M2), reduced as NCCL does:
each operation on two values computed in float, rounded to nearest even and saturated to the
largest finite value (a NaN stays a NaN).

The reference is this file's own reading of the two formats (decode by their fields, encode
by the nearest of all codes), independent of the device code and of PyTorch's conversions
(which do not saturate E5M2). Two ranks meet every pair of codes; more ranks add values whose
every partial result is exact, so that any reduction order gives the same bits."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import workers
from conftest import ALGOS, PROTOS, env_as, forced_env, run_ranks, torch

import minincl

pytestmark = pytest.mark.skipif(torch is None, reason="8-bit float tensors need PyTorch")

FORMATS = {"float8_e4m3fn": (4, 3), "float8_e5m2": (5, 2)}  # exponent bits, mantissa bits


def decode(codes: np.ndarray, fmt: str) -> np.ndarray:
    """The float64 value of each code."""
    ebits, mbits = FORMATS[fmt]
    bias = (1 << (ebits - 1)) - 1
    c = codes.astype(np.int64)
    exp, man = (c >> mbits) & ((1 << ebits) - 1), c & ((1 << mbits) - 1)
    mag = np.where(
        exp == 0,
        np.ldexp(man.astype(np.float64), 1 - bias - mbits),
        np.ldexp((man + (1 << mbits)) * 1.0, exp - bias - mbits),
    )
    top = exp == (1 << ebits) - 1
    if fmt == "float8_e4m3fn":
        mag = np.where(top & (man == 7), np.nan, mag)
    else:
        mag = np.where(top, np.where(man == 0, np.inf, np.nan), mag)
    return np.where(c & 0x80, -mag, mag)


def finite_table(fmt: str) -> np.ndarray:
    """Values of codes 0..0x7f (ascending); the NaN and infinity codes at the top excluded."""
    v = decode(np.arange(0x80, dtype=np.uint8), fmt)
    return v[np.isfinite(v)]


def encode(x: np.ndarray, fmt: str) -> np.ndarray:
    """The code nearest each float64 value, ties to the even code; beyond the largest finite
    value (infinity too), that value; NaN -> 0x7f."""
    table = finite_table(fmt)
    mag = np.minimum(np.abs(x), table[-1])
    hi = np.clip(np.searchsorted(table, np.nan_to_num(mag)), 1, len(table) - 1)
    lo = hi - 1
    d_lo, d_hi = mag - table[lo], table[hi] - mag
    code = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(np.signbit(x), code | 0x80, code)
    return np.where(np.isnan(x), 0x7F, code).astype(np.uint8)


def tensor(codes: np.ndarray, fmt: str) -> Any:
    return torch.from_numpy(codes.astype(np.uint8).copy()).view(getattr(torch, fmt))


def codes_of(t: Any) -> np.ndarray:
    return t.view(torch.uint8).numpy().copy()


def combine(a: np.ndarray, b: np.ndarray, op: str, fmt: str, nranks: int = 2) -> np.ndarray:
    """The two ranks' codes combined by op, as codes (or as values, for max and min)."""
    x, y = decode(a, fmt), decode(b, fmt)
    with np.errstate(all="ignore"):
        if op == "sum":
            return encode(x + y, fmt)
        if op == "prod":
            return encode(x * y, fmt)
        if op == "avg":  # (as NCCL: each input times 1/n rounded to the type, then summed)
            s = decode(encode(np.array([1 / nranks]), fmt), fmt)
            return encode(decode(encode(x * s, fmt), fmt) + decode(encode(y * s, fmt), fmt), fmt)
        pick = np.fmax if op == "max" else np.fmin  # (NaN propagates: see below)
        top = finite_table(fmt)[-1]
        v = np.clip(pick(x, y), -top, top)  # (saturated, E5M2's infinities too, as NCCL's)
        return np.where(np.isnan(x) | np.isnan(y), np.nan, v)
    raise AssertionError(op)


def assert_codes(got: np.ndarray, want: np.ndarray, fmt: str, what: str) -> None:
    """Equal codes, except that every NaN code matches every other (0x7f and 0xff)."""
    g, w = decode(got, fmt), decode(want, fmt)
    both_nan = np.isnan(g) & np.isnan(w)
    bad = ~both_nan & (got != want)
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} wrong, first at {int(np.argmax(bad))}: "
        f"got {got[bad][:4]} ({g[bad][:4]}) want {want[bad][:4]} ({w[bad][:4]})"
    )


def assert_values(got: np.ndarray, want_values: np.ndarray, fmt: str, what: str) -> None:
    g = decode(got, fmt)
    bad = ~((g == want_values) | (np.isnan(g) & np.isnan(want_values)))
    assert not bad.any(), f"{what}: {int(bad.sum())} wrong, got {g[bad][:4]} want {want_values[bad][:4]}"


# ---- the reference itself, checked against facts about the formats ----


def test_reference_reads_the_formats() -> None:
    e4 = decode(np.array([0x01, 0x08, 0x38, 0x7E, 0x7F, 0xFE, 0x80], np.uint8), "float8_e4m3fn")
    np.testing.assert_array_equal(e4[[0, 1, 2, 3, 5]], [2.0**-9, 2.0**-6, 1.0, 448.0, -448.0])
    assert np.isnan(e4[4]) and e4[6] == 0 and np.signbit(e4[6])
    e5 = decode(np.array([0x01, 0x04, 0x3C, 0x7B, 0x7C, 0x7D], np.uint8), "float8_e5m2")
    np.testing.assert_array_equal(e5[:5], [2.0**-16, 2.0**-14, 1.0, 57344.0, np.inf])
    assert np.isnan(e5[5])
    # E5M2 is a float16's upper byte: NumPy's float16 agrees on every code.
    codes = np.arange(256, dtype=np.uint16)
    halves = (codes << 8).view(np.float16).astype(np.float64)
    np.testing.assert_array_equal(decode(codes.astype(np.uint8), "float8_e5m2"), halves)
    # Ties go to the even code; beyond the largest value, saturation.
    assert encode(np.array([1.0625, 1.1875, 464.0, 1e6, -np.inf]), "float8_e4m3fn").tolist() == [
        0x38,
        0x3A,
        0x7E,
        0x7E,
        0xFE,
    ]
    assert encode(np.array([61440.0, np.inf, 2.0**-17, 3 * 2.0**-17]), "float8_e5m2").tolist() == [
        0x7B,
        0x7B,
        0x00,
        0x02,
    ]


# ---- two ranks: every pair of codes ----

PAIRS = 65536 + 5  # every (rank 0, rank 1) pair of codes, then a ragged tail


def pair_codes() -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(PAIRS)
    return (i & 0xFF).astype(np.uint8), ((i >> 8) & 0xFF).astype(np.uint8)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "avg"])
@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("algo", list(ALGOS))
def test_every_pair_of_codes(fmt: str, op: str, algo: str, proto: str) -> None:
    a, b = pair_codes()
    with forced_env(algo, proto):
        comms = minincl.Communicator.init_all(2)
    try:
        outs = run_ranks(comms, lambda c: codes_of(c.allreduce(tensor([a, b][c.rank], fmt), op=op)))
    finally:
        for c in comms:
            c.destroy()
    want = combine(a, b, op, fmt)
    for r, got in enumerate(outs):
        what = f"{fmt} {op} {algo}/{proto} rank {r}"
        if op in ("max", "min"):
            assert_values(got, want, fmt, what)
        else:
            assert_codes(got, want, fmt, what)


ISAS = ["portable", "avx2", "avx512"]
AVAILABLE_ISAS = ISAS[: ISAS.index(minincl.build_info()["cpu_vector_isa"]) + 1]


@pytest.mark.parametrize("isa", AVAILABLE_ISAS)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_pair_under_each_instruction_set(fmt: str, isa: str) -> None:
    """The Simple protocol combines blocks with the CPU's vector instructions (a loop per
    set, MININCL_CPU_ISA): each must give the reference's bits."""
    a, b = pair_codes()
    with env_as({"MININCL_CPU_ISA": isa, "MININCL_PROTO": "simple"}):
        comms = minincl.Communicator.init_all(2)
    try:
        assert minincl.build_info()["cpu_vector_isa"] == isa
        for op in ("sum", "prod", "avg"):
            outs = run_ranks(comms, lambda c: codes_of(c.allreduce(tensor([a, b][c.rank], fmt), op=op)))
            for r, got in enumerate(outs):
                assert_codes(got, combine(a, b, op, fmt), fmt, f"{fmt} {op} {isa} rank {r}")
        scalars = [0.75, -3.0]
        outs = run_ranks(
            comms,
            lambda c: codes_of(c.allreduce(tensor([a, b][c.rank], fmt), op=minincl.PreMulSum(scalars[c.rank]))),
        )
        for r, got in enumerate(outs):
            assert_codes(got, premul_reference(a, b, scalars, fmt), fmt, f"{fmt} premulsum {isa} rank {r}")
    finally:
        for c in comms:
            c.destroy()
        with env_as({"MININCL_CPU_ISA": None}):  # (one set per process: leave the widest)
            for c in minincl.Communicator.init_all(1):
                c.destroy()


def premul_reference(a: np.ndarray, b: np.ndarray, scalars: list[float], fmt: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        pa = decode(encode(decode(a, fmt) * scalars[0], fmt), fmt)
        pb = decode(encode(decode(b, fmt) * scalars[1], fmt), fmt)
        return encode(pa + pb, fmt)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_premul_sum_every_pair(comms_of: Any, fmt: str) -> None:
    """Each rank's products rounded first, then the sum rounded (scalars given as numbers are
    rounded to the type, saturating too)."""
    a, b = pair_codes()
    scalars = [0.75, -3.0]
    outs = run_ranks(
        comms_of(2),
        lambda c: codes_of(c.allreduce(tensor([a, b][c.rank], fmt), op=minincl.PreMulSum(scalars[c.rank]))),
    )
    want = premul_reference(a, b, scalars, fmt)
    for r, got in enumerate(outs):
        assert_codes(got, want, fmt, f"{fmt} premulsum rank {r}")


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_reduce_scatter_and_reduce_every_pair(comms_of: Any, fmt: str) -> None:
    a, b = pair_codes()
    half = PAIRS // 2

    def body(c: Any) -> tuple[np.ndarray, np.ndarray]:
        x = tensor([a, b][c.rank], fmt)
        rs = torch.zeros(half, dtype=x.dtype)
        c.reduce_scatter(x[: 2 * half], rs)
        red = torch.zeros(PAIRS, dtype=x.dtype)
        c.reduce(x, red, op="sum", root=1)
        return codes_of(rs), codes_of(red)

    outs = run_ranks(comms_of(2), body)
    want = combine(a, b, "sum", fmt)
    for r, (rs, _) in enumerate(outs):
        assert_codes(rs, want[r * half : (r + 1) * half], fmt, f"reduce_scatter rank {r}")
    assert_codes(outs[1][1], want, fmt, "reduce at the root")


# ---- more ranks: every algorithm x protocol x collective, values exact in any order ----

# Inputs -1, 0, 1 and these scalars: every partial sum is an integer within +-8, every
# partial product +-1, all exact in both formats.
SCALARS = [1.0, -1.0, 2.0, 1.0, -1.0]


def exact_inputs(n: int, count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-1, 2, size=count).astype(np.float64) for _ in range(n)]


def exact_reference(xs: list[np.ndarray], op: str, fmt: str) -> np.ndarray:
    n = len(xs)
    stack = np.stack(xs)
    if op == "premulsum":
        return encode(sum(SCALARS[r] * xs[r] for r in range(n)), fmt)
    red = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op]
    return encode(red(stack, axis=0), fmt)


def assert_avg(got: np.ndarray, xs: list[np.ndarray], fmt: str, what: str) -> None:
    """An avg as NCCL computes it: each input times 1/n rounded to the type, each product
    rounded, then summed. Those terms are not exact, so the sum's roundings follow the
    algorithm's order: allowed half an ulp of the sum of |terms| per rank."""
    n = len(xs)
    s = decode(encode(np.array([1 / n]), fmt), fmt)
    terms = np.stack([decode(encode(x * s, fmt), fmt) for x in xs])
    tol = n * 2.0 ** -(FORMATS[fmt][1] + 1) * np.abs(terms).sum(0)
    bad = ~(np.abs(decode(got, fmt) - terms.sum(0)) <= tol)
    assert not bad.any(), f"{what}: {int(bad.sum())} wrong, first at {int(np.argmax(bad))}"


def reduce_call(c: Any, coll: str, x: Any, count: int, op: str, in_place: bool) -> Any:
    opv = minincl.PreMulSum(SCALARS[c.rank]) if op == "premulsum" else op
    if coll == "allreduce":
        return c.allreduce(x, None if in_place else torch.zeros(count, dtype=x.dtype), op=opv)
    if coll == "reduce":
        out = c.reduce(x, None if in_place else torch.zeros(count, dtype=x.dtype), op=opv, root=c.nranks - 1)
        return out if c.rank == c.nranks - 1 else None
    return c.reduce_scatter(x, torch.zeros(count, dtype=x.dtype), op=opv)


CASES = [(algo, proto, coll) for algo, colls in ALGOS.items() for proto in PROTOS for coll in colls]


@pytest.mark.parametrize("nranks", [3, 5])
@pytest.mark.parametrize(("algo", "proto", "coll"), CASES)
def test_every_algorithm_protocol_collective(nranks: int, algo: str, proto: str, coll: str) -> None:
    with forced_env(algo, proto):
        comms = minincl.Communicator.init_all(nranks)
    try:
        for k, (fmt, op, count, in_place) in enumerate(
            [
                ("float8_e4m3fn", "sum", 0, False),
                ("float8_e5m2", "premulsum", 1, True),
                ("float8_e4m3fn", "avg", 7, False),
                ("float8_e5m2", "prod", 5003, False),
                ("float8_e4m3fn", "premulsum", 40009, False),
                ("float8_e5m2", "max" if coll != "reduce" else "min", 40009, True),
            ]
        ):
            check_collective(comms, coll, fmt, op, count, in_place, seed=k + 10 * nranks)
    finally:
        for c in comms:
            c.destroy()


def check_collective(comms: list[Any], coll: str, fmt: str, op: str, count: int, in_place: bool, seed: int) -> None:
    if coll in ("broadcast", "allgather"):
        return check_copy(comms, coll, fmt, count, seed)
    n = len(comms)
    block = count * n if coll == "reduce_scatter" else count
    xs = exact_inputs(n, block, seed)
    want = exact_reference(xs, op, fmt) if op != "avg" else np.zeros(0)
    in_place = in_place and coll != "reduce_scatter"
    outs = run_ranks(comms, lambda c: reduce_call(c, coll, tensor(encode(xs[c.rank], fmt), fmt), count, op, in_place))
    for r, out in enumerate(outs):
        if out is None:
            continue
        part = slice(r * count, (r + 1) * count) if coll == "reduce_scatter" else slice(0, count)
        if op == "avg":  # (its scaled inputs are not exact: the sum's rounding follows its order)
            assert_avg(codes_of(out), [x[part] for x in xs], fmt, f"{coll} {fmt} avg count {count} rank {r}")
        else:
            assert_codes(codes_of(out), want[part], fmt, f"{coll} {fmt} {op} count {count} rank {r}")


def check_copy(comms: list[Any], coll: str, fmt: str, count: int, seed: int) -> None:
    """Copies move every code unchanged, NaNs and negative zero included."""
    n = len(comms)
    rng = np.random.default_rng(seed)
    xs = [rng.integers(0, 256, size=count).astype(np.uint8) for _ in range(n)]
    root = count % n
    if coll == "broadcast":
        outs = run_ranks(comms, lambda c: codes_of(c.broadcast(tensor(xs[c.rank], fmt), root=root)))
        want = [xs[root]] * n
    else:
        outs = run_ranks(comms, lambda c: codes_of(c.allgather(tensor(xs[c.rank], fmt))))
        want = [np.concatenate(xs)] * n
    for r in range(n):
        np.testing.assert_array_equal(outs[r], want[r], err_msg=f"{coll} {fmt} count {count} rank {r}")


def test_single_rank(comms_of: Any) -> None:
    (c,) = comms_of(1)
    x = encode(np.array([1.5, -3.0, 300.0, 0.0]), "float8_e4m3fn")
    out = c.allreduce(tensor(x, "float8_e4m3fn"), op=minincl.PreMulSum(2.0))
    assert_codes(codes_of(out), encode(np.array([3.0, -6.0, 600.0, 0.0]), "float8_e4m3fn"), "float8_e4m3fn", "alone")
    assert decode(codes_of(out), "float8_e4m3fn")[2] == 448.0  # saturated


def test_scalar_out_of_range_saturates_and_array_scalar_is_read(comms_of: Any) -> None:
    comms = comms_of(2)
    fmt = "float8_e5m2"
    x = encode(np.array([1.0, -2.0, 0.5]), fmt)
    scalar = [tensor(encode(np.array([4.0]), fmt), fmt), 1e9]  # 1e9 -> 57344

    def body(c: Any) -> np.ndarray:
        return codes_of(c.allreduce(tensor(x, fmt), op=minincl.PreMulSum(scalar[c.rank])))

    outs = run_ranks(comms, body)
    with np.errstate(all="ignore"):
        want = encode(
            decode(encode(decode(x, fmt) * 4.0, fmt), fmt) + decode(encode(decode(x, fmt) * 57344.0, fmt), fmt), fmt
        )
    for got in outs:
        assert_codes(got, want, fmt, "premulsum")


# ---- other ways in: ml_dtypes NumPy arrays, rank processes ----


def test_ml_dtypes_arrays(comms_of: Any) -> None:
    """JAX's NumPy types (ml_dtypes) reach the library through __array_interface__."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    comms = comms_of(2)
    a, b = pair_codes()
    xs = [a.view(ml_dtypes.float8_e4m3fn), b.view(ml_dtypes.float8_e5m2)]

    def body(c: Any) -> tuple[np.ndarray, np.ndarray]:
        s = c.allreduce(xs[0].copy())  # both ranks: float8_e4m3fn
        g = c.allgather(xs[1][c.rank * 1000 : (c.rank + 1) * 1000].copy())
        return s.view(np.uint8), g.view(np.uint8)

    outs = run_ranks(comms, body)
    want_sum = combine(a, a, "sum", "float8_e4m3fn")
    for s, g in outs:
        assert_codes(s, want_sum, "float8_e4m3fn", "ml_dtypes sum")
        np.testing.assert_array_equal(g, b[:2000])
    with pytest.raises(minincl.InvalidArgument, match="not contiguous"):
        comms[0].allreduce(xs[0][::2])
    frozen = xs[0].copy()
    frozen.flags.writeable = False
    with pytest.raises(minincl.InvalidArgument, match="read-only"):
        comms[0].allreduce(frozen)
    # ml_dtypes' bfloat16 arrays take the same path.
    halves = [np.arange(-8, 9, dtype=np.float32).astype(ml_dtypes.bfloat16) * (r + 1) for r in range(2)]
    sums = run_ranks(comms, lambda c: c.allreduce(halves[c.rank].copy()))
    for got in sums:
        np.testing.assert_array_equal(got.astype(np.float32), np.arange(-8, 9, dtype=np.float32) * 3)


def test_rank_processes() -> None:
    """Between processes receivers may read a sender's input where it lies (kernel copies),
    and scale it by the sender's scalar."""
    assert minincl.launch(workers.float8_sums, 3, [0, 1, 9, 70001]) == [24] * 3


def test_c_api_types() -> None:
    """mnclFloat8e4m3 = 10 and mnclFloat8e5m2 = 11 (NCCL's numbers) through the C API; 12 is
    no type."""
    from test_premul_sum import CApi

    api = CApi()
    comms = api.comms(2)
    try:
        a, b = pair_codes()
        for code, fmt in ((10, "float8_e4m3fn"), (11, "float8_e5m2")):
            outs = [np.zeros(PAIRS, np.uint8) for _ in range(2)]
            run_ranks([0, 1], lambda r: api.check(api.allreduce(comms[r], [a, b][r], outs[r], code, 0)))
            for o in outs:
                assert_codes(o, combine(a, b, "sum", fmt), fmt, f"C API type {code}")
        assert "unknown data type 12" in api.error(api.allreduce(comms[0], a, a.copy(), 12, 0))
    finally:
        for c in comms:
            api.lib.mnclCommDestroy(c)


def test_conversions_match_cuda() -> None:
    """The CPU's conversions against CUDA's cuda_fp8.h (tests/fp8_conversion_check.cc), where
    the CUDA headers are here: every code decoded, and encoding over the float range."""
    cxx = shutil.which("c++") or shutil.which("g++")
    homes = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    if shutil.which("nvcc"):
        homes.insert(0, str(Path(shutil.which("nvcc") or "").resolve().parent.parent))
    found = [Path(h) / "include" for h in homes if h and (Path(h) / "include" / "cuda_fp8.h").exists()]
    if cxx is None or not found:
        pytest.skip("needs a C++ compiler and the CUDA headers (cuda_fp8.h)")
    include = found[0]
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "fp8_conversion_check"
        cmd = [
            cxx,
            "-std=c++20",
            "-O2",
            f"-I{root / 'cuda'}",
            f"-I{include}",
            str(root / "tests" / "fp8_conversion_check.cc"),
        ]
        built = subprocess.run([*cmd, "-o", str(exe)], capture_output=True, text=True, timeout=300)
        assert built.returncode == 0, built.stderr[-4000:]
        run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:]
    summary = re.search(r"(\d+) checks, (\d+) failed", run.stdout)
    assert summary is not None and int(summary.group(1)) > 4_000_000 and int(summary.group(2)) == 0, run.stdout
