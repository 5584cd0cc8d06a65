"""Pre-multiplied sums (NCCL's ncclRedOpCreatePreMulSum): the sum over ranks of scalar_r *
input_r, each rank with its own scalar, each product rounded to the type. Through Python
(minincl.PreMulSum) on every algorithm x protocol x type, between rank processes whose peers
could read each other's inputs, and through the C API (mnclRedOpCreatePreMulSum) with both
scalar residences. References from NumPy. (torch's PREMUL_SUM: test_torch_backend.py.)"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest
import workers
from conftest import (
    ALGOS,
    DTYPES,
    PROTOS,
    as_numpy,
    counts_for,
    empty,
    env_as,
    forced_env,
    make,
    needs,
    run_ranks,
    torch,
)

import minincl
from minincl import _c_library

# Per rank: scalars whose products with the inputs (-3..3; 0..3 unsigned) and their sums are
# exact in every type, so every reduction order gives the same bits.
FLOAT_SCALARS = [0.5, -2.0, 1.5, 0.25, 3.0, -1.0, 2.0, -0.5]
SIGNED_SCALARS = [3, -2, 1, 5, -1, 2, 4, -3]
# Unsigned: wrapping products (2**k - 1 times small values wraps around in 8 and 32 bits).
UNSIGNED_SCALARS = [255, 2, 3, (1 << 32) - 1, 7, 1, 5, 6]


def scalars_for(dtype: str) -> list[Any]:
    if dtype.startswith("uint"):
        bits = np.dtype(dtype).itemsize * 8
        return [s % (1 << bits) for s in UNSIGNED_SCALARS]
    if dtype.startswith("int"):
        return SIGNED_SCALARS
    return FLOAT_SCALARS


def inputs_for(n: int, count: int, dtype: str, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    low = 0 if dtype.startswith("uint") else -3
    return [rng.integers(low, 4, size=count) for _ in range(n)]


def premul_ref(inputs: list[np.ndarray], scalars: list[Any], dtype: str) -> np.ndarray:
    """sum_r scalar_r * input_r in the type's arithmetic (integers wrap; floats are exact here)."""
    if dtype == "bfloat16":
        return np.sum([np.float64(s) * x for s, x in zip(scalars, inputs)], axis=0).astype(np.float32)
    t = np.dtype(dtype)
    with np.errstate(over="ignore"):
        prods = [x.astype(t) * t.type(s) for s, x in zip(scalars, inputs)]
        return np.add.reduce(np.stack(prods), axis=0, dtype=t)


def check_premul(comms: list[Any], coll: str, dtype: str, count: int, in_place: bool) -> None:
    n = len(comms)
    root = count % n
    block = count * n if coll == "reduce_scatter" else count
    inputs = inputs_for(n, block, dtype, seed=count + 31 * n)
    scalars = scalars_for(dtype)[:n]
    want = premul_ref(inputs, scalars, dtype)

    def body(c: Any) -> Any:
        op = minincl.PreMulSum(scalars[c.rank])
        send = make(inputs[c.rank], dtype)
        if coll == "allreduce":
            return c.allreduce(send, None if in_place else empty(count, dtype), op=op)
        if coll == "reduce":
            return c.reduce(send, None if in_place else empty(count, dtype), op=op, root=root)
        if in_place:  # this rank's block of send is the output
            c.reduce_scatter(send, send[c.rank * count : (c.rank + 1) * count], op=op)
            return send[c.rank * count : (c.rank + 1) * count]
        return c.reduce_scatter(send, empty(count, dtype), op=op)

    for r, got in enumerate(run_ranks(comms, body)):
        if coll == "reduce" and r != root:
            continue
        expect = want[r * count : (r + 1) * count] if coll == "reduce_scatter" else want
        np.testing.assert_array_equal(as_numpy(got).reshape(-1), expect, err_msg=f"{coll} {dtype} rank {r}")


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("nranks", [1, 2, 3, 5])
def test_every_algorithm_protocol_and_type(nranks: int, algo: str, proto: str) -> None:
    with forced_env(algo, proto):
        comms = minincl.Communicator.init_all(nranks)
    try:
        colls = [c for c in ("allreduce", "reduce", "reduce_scatter") if c in ALGOS[algo] or c == "reduce"]
        for coll in colls:
            for i, dtype in enumerate(DTYPES):
                if dtype == "bfloat16" and torch is None:
                    continue
                counts = counts_for(dtype)
                # Each type with a count above two slots; the others in turn across types.
                for count in (counts[3], counts[i % 3]):
                    check_premul(comms, coll, dtype, count, in_place=(i + count) % 2 == 0)
    finally:
        for c in comms:
            c.destroy()


ISAS = ["portable", "avx2", "avx512"]
AVAILABLE_ISAS = ISAS[: ISAS.index(minincl.build_info()["cpu_vector_isa"]) + 1]


@pytest.mark.parametrize("proto, isa", [("simple", isa) for isa in AVAILABLE_ISAS] + [("ll", None), ("ll128", None)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_each_product_is_rounded_to_the_type(dtype: str, proto: str, isa: str | None) -> None:
    """2 ranks, values whose products with the scalars are not representable: the result is
    round(round(s0 * x0) + round(s1 * x1)), every rounding to nearest even in the 16-bit type.
    Simple runs the CPU's vector loops (each instruction set it has: MININCL_CPU_ISA), LL and
    LL128 an element at a time."""
    needs(dtype)
    rng = np.random.default_rng(7)
    count = 4099
    xs = [rng.uniform(-4, 4, count).astype(np.float32) for _ in range(2)]
    scalars = [1.0 / 3.0, 0.7]

    def to16(a: np.ndarray) -> np.ndarray:  # float32 -> the 16-bit type -> float32, nearest even
        if dtype == "float16":
            return a.astype(np.float16).astype(np.float32)
        assert torch is not None
        return torch.from_numpy(np.ascontiguousarray(a)).to(torch.bfloat16).to(torch.float32).numpy()

    inputs = [to16(x) for x in xs]
    s16 = [to16(np.array([s], np.float32))[0] for s in scalars]  # the scalar as the type holds it
    # Products of two 16-bit values are exact in float32, as are sums of two of them: one
    # rounding each, as the reduction does.
    want = to16(to16(inputs[0] * s16[0]) + to16(inputs[1] * s16[1]))
    with forced_env("direct", proto), env_as({"MININCL_CPU_ISA": isa}):
        comms = minincl.Communicator.init_all(2)
    try:
        assert isa is None or minincl.build_info()["cpu_vector_isa"] == isa
        got = run_ranks(
            comms, lambda c: c.allreduce(make(inputs[c.rank], dtype), op=minincl.PreMulSum(scalars[c.rank]))
        )
        for g in got:
            np.testing.assert_array_equal(as_numpy(g).astype(np.float32), want)
    finally:
        for c in comms:
            c.destroy()
        with env_as({"MININCL_CPU_ISA": None}):  # (the setting is the process's: back to the widest)
            minincl.Communicator.init_all(1)[0].destroy()


@pytest.mark.parametrize("window", [False, True])
@pytest.mark.parametrize("nranks", [2, 3])
def test_between_processes_receivers_scale_the_inputs_they_read(
    monkeypatch: pytest.MonkeyPatch, nranks: int, window: bool
) -> None:
    """Kernel copies and windows let a receiver read a sender's input where it is (a pointer
    step): it must scale it by the sender's scalar, not its own."""
    monkeypatch.setenv("MININCL_POINTER_STEPS", "2")
    monkeypatch.setenv("MININCL_POINTER_STEP_BYTES", "1024")
    monkeypatch.delenv("MININCL_ALGO", raising=False)
    monkeypatch.delenv("MININCL_PROTO", raising=False)
    if window:
        monkeypatch.setenv("MININCL_WINDOW_BYTES", str(16 << 20))
    for proto in ("simple", "ll"):
        monkeypatch.setenv("MININCL_PROTO", proto)
        counts = [0, 1, 50021]
        results = minincl.launch(workers.premul_sums, nranks, counts, window)
        assert results == [len(counts) * 3 * 4] * nranks


@pytest.mark.parametrize("algo", list(ALGOS))
def test_thread_ranks_scale_the_inputs_they_read(algo: str) -> None:
    """Ranks of one process read each other's inputs where they lie (pointer steps: here from
    1 KiB), as ranks of one GPU do: each scaled by its own rank's scalar."""
    with forced_env(algo, "simple"), env_as({"MININCL_POINTER_STEP_BYTES": "1024"}):
        comms = minincl.Communicator.init_all(4)
    try:
        before = sum(c.stats()["pointer_steps"] for c in comms)
        for coll in [c for c in ("allreduce", "reduce", "reduce_scatter") if c in ALGOS[algo] or c == "reduce"]:
            for dtype in ("float32", "bfloat16", "int64", "uint8"):
                if dtype == "bfloat16" and torch is None:
                    continue
                for in_place in (False, True):
                    check_premul(comms, coll, dtype, 20011, in_place)
        assert sum(c.stats()["pointer_steps"] for c in comms) > before
    finally:
        for c in comms:
            c.destroy()


def test_array_scalars_are_read_when_the_operation_runs(comms_of: Any) -> None:
    """A one-element array as the scalar (C's mnclScalarDevice): changing it between calls
    changes the next result; in a group, the value it holds at the group's end counts."""
    comms = comms_of(3)
    scalars = [np.array([v], np.float64) for v in (0.5, -2.0, 3.0)]
    xs = [np.arange(1000, dtype=np.float64) % 7 - 3 + r for r in range(3)]
    ops = [minincl.PreMulSum(s) for s in scalars]
    for _ in range(2):
        got = run_ranks(comms, lambda c: c.allreduce(xs[c.rank], np.empty(1000), op=ops[c.rank]))
        want = sum(float(scalars[r][0]) * xs[r] for r in range(3))
        for g in got:
            np.testing.assert_array_equal(g, want)
        for s in scalars:
            s *= 2

    def grouped(c: Any) -> Any:
        out = np.empty(1000)
        with minincl.group():
            c.reduce_scatter(np.tile(xs[c.rank], 3), out, op=ops[c.rank])
            scalars[c.rank][0] = c.rank + 1.0
        return out

    want = sum((r + 1.0) * xs[r] for r in range(3))
    for g in run_ranks(comms, grouped):
        np.testing.assert_array_equal(g, want)


def test_scalar_checks_and_mismatched_ops(comms_of: Any) -> None:
    c = comms_of(2)
    x = np.ones(4, np.int32)
    with pytest.raises(minincl.InvalidArgument, match="not a whole number"):
        c[0].allreduce(x, op=minincl.PreMulSum(0.5))
    for factor in (float("inf"), float("nan")):
        with pytest.raises(minincl.InvalidArgument, match="not a whole number"):
            c[0].allreduce(x, op=minincl.PreMulSum(factor))
    with pytest.raises(minincl.InvalidArgument, match="scalar 256 is out of range for uint8"):
        c[0].allreduce(np.ones(4, np.uint8), op=minincl.PreMulSum(256.0))
    with pytest.raises(minincl.InvalidArgument, match="out of range for uint8"):
        c[0].allreduce(np.ones(4, np.uint8), op=minincl.PreMulSum(-1))
    with pytest.raises(minincl.InvalidArgument, match="out of range for int64"):
        c[0].allreduce(np.ones(4, np.int64), op=minincl.PreMulSum(1 << 63))
    with pytest.raises(minincl.InvalidArgument, match="int, a float or a one-element array"):
        minincl.PreMulSum("2")  # type: ignore[arg-type]
    with pytest.raises(minincl.InvalidArgument, match="must hold one element; this one holds 2"):
        c[0].allreduce(x, op=minincl.PreMulSum(np.ones(2, np.int32)))
    with pytest.raises(minincl.InvalidArgument, match="scalar array is float32 but the data is int32"):
        c[0].allreduce(x, op=minincl.PreMulSum(np.ones(1, np.float32)))
    with pytest.raises(TypeError, match="'op' must be a str or minincl.PreMulSum, not int"):
        c[0].allreduce(x, op=3)  # type: ignore[arg-type]
    with pytest.raises(minincl.InvalidArgument, match='unknown reduction op "mean"'):
        c[0].allreduce(x, op="mean")
    assert repr(minincl.PreMulSum(0.25)) == "PreMulSum(0.25)" and minincl.PreMulSum(3).scalar == 3
    # NumPy scalars are numbers (converted to the data's type), not arrays.
    assert minincl.PreMulSum(np.float32(0.5)).scalar == 0.5 and minincl.PreMulSum(np.int8(-3)).scalar == -3
    got = run_ranks(c, lambda comm: comm.allreduce(np.ones(3), op=minincl.PreMulSum(np.float32(0.25))))
    for g in got:
        np.testing.assert_array_equal(g, np.full(3, 0.5))
    # One rank sums plainly, the other pre-multiplies: a mismatch, named (the rank that finds
    # it raises InvalidUsage, the other RemoteError, whichever comes first).
    # (Communicators of their own: a mismatch leaves them failed, and the pool's are shared.)
    ops: list[Any] = ["sum", minincl.PreMulSum(2)]
    mine = minincl.Communicator.init_all(2)
    try:
        with pytest.raises((minincl.InvalidUsage, minincl.RemoteError), match=r"int32, premulsum[,)]"):
            run_ranks(mine, lambda comm: comm.allreduce(np.ones(5, np.int32), op=ops[comm.rank]))
    finally:
        for m in mine:
            m.destroy()


# ---- the C API, through ctypes on the module's own library ----

MNCL_FLOAT32, MNCL_INT32, MNCL_FLOAT64 = 7, 2, 8
SCALAR_DEVICE, SCALAR_HOST_IMMEDIATE = 0, 1


class CApi:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL(_c_library.library_path())
        self.lib.mnclGetLastError.restype = ctypes.c_char_p

    def check(self, rc: int) -> None:
        assert rc == 0, self.lib.mnclGetLastError(None).decode()

    def error(self, rc: int) -> str:
        assert rc != 0
        return str(self.lib.mnclGetLastError(None).decode())

    def comms(self, n: int) -> list[ctypes.c_void_p]:
        arr = (ctypes.c_void_p * n)()
        self.check(self.lib.mnclCommInitAll(arr, n, None))
        return [ctypes.c_void_p(arr[i]) for i in range(n)]

    def create(self, comm: ctypes.c_void_p, scalar: Any, dtype: int, residence: int) -> int:
        op = ctypes.c_int()
        self.check(self.lib.mnclRedOpCreatePreMulSum(ctypes.byref(op), scalar, dtype, residence, comm))
        return op.value

    def allreduce(self, comm: ctypes.c_void_p, send: np.ndarray, recv: np.ndarray, dtype: int, op: int) -> int:
        return int(
            self.lib.mnclAllReduce(
                send.ctypes.data_as(ctypes.c_void_p),
                recv.ctypes.data_as(ctypes.c_void_p),
                ctypes.c_size_t(send.size),
                dtype,
                op,
                comm,
                None,
            )
        )


@pytest.fixture
def capi() -> Any:
    api = CApi()
    comms = api.comms(3)
    yield api, comms
    for c in comms:
        api.lib.mnclCommDestroy(c)


def test_c_api_immediate_and_device_scalars(capi: Any) -> None:
    api, comms = capi
    n, count = len(comms), 30011
    xs = [((np.arange(count) * (r + 2)) % 9 - 4).astype(np.float64) for r in range(n)]
    # Immediate: read at creation; changing the variable afterwards changes nothing.
    held = [ctypes.c_double(s) for s in (0.5, -2.0, 1.5)]
    imm = [api.create(c, ctypes.byref(held[r]), MNCL_FLOAT64, SCALAR_HOST_IMMEDIATE) for r, c in enumerate(comms)]
    # Device residence (host memory on a CPU communicator): read when each operation runs.
    live = [np.array([s], np.float64) for s in (3.0, 0.25, -1.0)]
    dev = [
        api.create(c, live[r].ctypes.data_as(ctypes.c_void_p), MNCL_FLOAT64, SCALAR_DEVICE) for r, c in enumerate(comms)
    ]
    assert imm[0] >= 5 and dev[0] != imm[0]
    for h in held:
        h.value = 100.0
    outs = [np.zeros(count) for _ in range(n)]
    run_ranks(list(range(n)), lambda r: api.check(api.allreduce(comms[r], xs[r], outs[r], MNCL_FLOAT64, imm[r])))
    for o in outs:
        np.testing.assert_array_equal(o, 0.5 * xs[0] - 2.0 * xs[1] + 1.5 * xs[2])
    for _ in range(2):
        run_ranks(list(range(n)), lambda r: api.check(api.allreduce(comms[r], xs[r], outs[r], MNCL_FLOAT64, dev[r])))
        want = sum(float(live[r][0]) * xs[r] for r in range(n))
        for o in outs:
            np.testing.assert_array_equal(o, want)
        for a in live:
            a[0] *= 2  # the next operation reads the new values
    # Misuse: the wrong type, an op of another communicator, a destroyed op, a bad residence.
    f32 = np.ones(4, np.float32)
    assert "created for float64" in api.error(api.allreduce(comms[0], f32, f32.copy(), MNCL_FLOAT32, imm[0]))
    other = api.comms(1)[0]
    try:
        assert "not one of this communicator's" in api.error(api.allreduce(other, xs[0], outs[0], MNCL_FLOAT64, imm[0]))
    finally:
        api.lib.mnclCommDestroy(other)
    api.check(api.lib.mnclRedOpDestroy(imm[0], comms[0]))
    assert "mnclRedOpDestroy" in api.error(api.allreduce(comms[0], xs[0], outs[0], MNCL_FLOAT64, imm[0]))
    assert "not a live" in api.error(api.lib.mnclRedOpDestroy(imm[0], comms[0]))
    assert "unknown reduction op" in api.error(api.allreduce(comms[0], xs[0], outs[0], MNCL_FLOAT64, -3))
    op = ctypes.c_int()
    rc = api.lib.mnclRedOpCreatePreMulSum(ctypes.byref(op), ctypes.byref(held[0]), MNCL_FLOAT64, 7, comms[0])
    assert "residence 7" in api.error(rc)
    # A destroyed op's number is given to the next one created.
    assert api.create(comms[0], ctypes.byref(held[1]), MNCL_FLOAT64, SCALAR_HOST_IMMEDIATE) == imm[0]


def test_c_api_single_rank_scales_in_place(capi: Any) -> None:
    api, _ = capi
    (comm,) = api.comms(1)
    try:
        scalar = ctypes.c_int32(-3)
        op = api.create(comm, ctypes.byref(scalar), MNCL_INT32, SCALAR_HOST_IMMEDIATE)
        x = np.arange(-5, 6, dtype=np.int32)
        want = x * -3
        api.check(api.allreduce(comm, x, x, MNCL_INT32, op))
        np.testing.assert_array_equal(x, want)
    finally:
        api.lib.mnclCommDestroy(comm)
