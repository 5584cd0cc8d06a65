"""GPU communicators: every collective x algorithm x protocol on one GPU, ranks as one thread
(``minincl.group()``) or as a thread each with its own stream, CuPy arrays and PyTorch CUDA
tensors, two processes over CUDA IPC, CUDA graph capture and replay, abort of a spinning
kernel, and the errors. Every result is compared with NumPy on the host.

The whole module is skipped when minincl was built without CUDA or no GPU is usable
(``minincl.gpu_count() == 0``; with no driver ``cudaGetDeviceCount`` returns error 35). CuPy and
PyTorch are imported where a test needs them, so collection never fails without them.
Run it as the README runs the tests (``cd tests && python -m pytest test_gpu.py -m gpu``), so
that ``import minincl`` finds the installed package. Rank processes started by
``minincl.launch`` import this module by name to find :func:`ipc_worker`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from typing import Any, Callable

import numpy as np
import pytest
from conftest import ALGOS, PROTOS, TYPES_OPS, assert_same, env_as, forced_env, reduce_ref, run_ranks

import minincl


def _usable_gpus() -> int:
    try:
        if not minincl.build_info().get("cuda", False):
            return 0
        return int(getattr(minincl, "gpu_count", lambda: 0)())
    except Exception:  # noqa: BLE001 - any failure to ask means no GPU to test on
        return 0


GPUS = _usable_gpus()
if GPUS == 0:
    pytest.skip(
        "GPU tests: minincl was built without CUDA or sees no usable GPU (minincl.gpu_count() == 0)",
        allow_module_level=True,
    )

pytestmark = pytest.mark.gpu

DEVICE = "cuda:0"
REDUCING = ("allreduce", "reduce", "reduce_scatter")
# Reductions: each type with an op that exercises it (bfloat16 goes through PyTorch).
REDUCE_CASES = [
    ("float32", "sum"),
    ("float16", "sum"),
    ("int32", "max"),
    ("float64", "avg"),
    ("uint8", "prod"),
    ("int64", "min"),
]
# Copies are type-agnostic kernels: an aligned and a byte-sized type cover them.
COPY_CASES = [("float32", "sum"), ("uint8", "sum")]
COUNTS = [0, 1, 1009]
BIG = (1 << 20) + 3  # float32: 4 MiB per rank, crosses every slot, step and channel boundary
PERIOD = 65537


# ---- arrays: CuPy for NumPy's types, PyTorch for bfloat16 (and its own tests) ----


def _cupy() -> Any:
    return pytest.importorskip("cupy")


def _torch_cuda() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch was built without CUDA or sees no GPU")
    return torch


@pytest.fixture(scope="session")
def cp() -> Any:
    return _cupy()


@pytest.fixture(scope="session")
def torch_cuda() -> Any:
    return _torch_cuda()


def _torch_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def inputs_for(nranks: int, count: int, dtype: str, op: str, seed: int = 0) -> list[np.ndarray]:
    """Per-rank inputs, in `dtype` (float32 for bfloat16), whose reductions are exact in every
    type: small integers (for prod, 1, 2 and -1 only), a different pattern on every rank,
    repeating every 65537 (prime) elements so that 8 ranks x 8M elements stay cheap to make."""
    base = np.arange(min(count, PERIOD), dtype=np.int64)
    unsigned = dtype.startswith("uint")
    out = []
    for r in range(nranks):
        k = base * (2 * r + 3) + 5 * r + seed
        if op == "prod":
            x = np.array([1, 2, 1] if unsigned else [1, 2, -1], np.int64)[k % 3]
        elif unsigned:
            x = k % 4
        else:
            x = k % 7 - 3
        x = x.astype(np.float32 if dtype == "bfloat16" else dtype)
        out.append(np.resize(x, count) if count > PERIOD else x)
    return out


class Lib:
    """Moves NumPy values to the GPU (CuPy, or PyTorch for bfloat16 / torch tests) and back."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.mod = _cupy() if kind == "cupy" else _torch_cuda()

    @classmethod
    def for_dtype(cls, dtype: str) -> Lib:
        return cls("torch" if dtype == "bfloat16" else "cupy")

    def put(self, values: np.ndarray, dtype: str) -> Any:
        if self.kind == "cupy":
            return self.mod.asarray(values.astype(dtype))
        torch = self.mod
        if dtype == "bfloat16":
            return torch.from_numpy(values.astype(np.float32)).to(device=DEVICE, dtype=torch.bfloat16)
        return torch.from_numpy(values.astype(dtype)).to(DEVICE)

    def filled(self, count: int, dtype: str) -> Any:
        """An output buffer holding a value no result has (99, or -7 in bfloat16)."""
        if self.kind == "torch" and dtype == "bfloat16":
            torch = self.mod
            return torch.full((count,), -7.0, dtype=torch.bfloat16, device=DEVICE)
        return self.put(np.full(count, 99), dtype)

    def get(self, x: Any) -> np.ndarray:
        if self.kind == "cupy":
            return self.mod.asnumpy(x)
        t = x.detach().cpu()
        if t.dtype == self.mod.bfloat16:
            t = t.to(self.mod.float32)
        return t.numpy()

    def sentinel(self, dtype: str) -> np.ndarray:
        return np.array(-7.0 if (self.kind == "torch" and dtype == "bfloat16") else 99).astype(
            np.float32 if dtype == "bfloat16" else dtype
        )


# ---- communicators: one group per (nranks, algo, proto), reused across tests ----


class GpuPool:
    """Default-tuned groups stay for the session; one forced (algo, proto) group at a time."""

    def __init__(self) -> None:
        self.groups: dict[tuple[int, str | None, str | None], list[minincl.Communicator]] = {}

    def get(self, nranks: int, algo: str | None = None, proto: str | None = None) -> list[minincl.Communicator]:
        key = (nranks, algo, proto)
        group = self.groups.get(key)
        if group is not None and not any(c.destroyed for c in group):
            return group
        if algo is not None:
            for k in [k for k in self.groups if k[1] is not None]:
                self.discard(k)
        with forced_env(algo, proto):
            group = minincl.Communicator.init_all(nranks, device=DEVICE)
        self.groups[key] = group
        return group

    def discard(self, key: tuple[int, str | None, str | None]) -> None:
        for c in self.groups.pop(key, []):
            c.destroy()

    def close(self) -> None:
        for k in list(self.groups):
            self.discard(k)


@pytest.fixture(scope="module")
def gpus() -> Any:
    pool = GpuPool()
    yield pool
    pool.close()


# Every GPU communicator a test makes, so that the watchdog can stop their kernels.
LIVE: list[Any] = []
# (The device check shortens it, so that a hang costs less of its few minutes.)
WATCHDOG_SECONDS = float(os.environ.get("MININCL_TEST_WATCHDOG", "60"))
_original_init_all = minincl.Communicator.init_all.__func__  # type: ignore[attr-defined]


def _tracked_init_all(cls: Any, nranks: int, device: Any = "cpu") -> list[Any]:
    comms = _original_init_all(cls, nranks, device)
    LIVE.extend(comms)
    return comms


@pytest.fixture(autouse=True)
def watchdog(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A test still running after WATCHDOG_SECONDS aborts every GPU communicator: the abort
    word stops any spinning kernel, so a hang becomes this test's failure instead of the
    rest of the device check's time."""
    monkeypatch.setattr(minincl.Communicator, "init_all", classmethod(_tracked_init_all))
    fired = threading.Event()

    def fire() -> None:
        fired.set()
        for c in list(LIVE):
            with contextlib.suppress(Exception):
                c.abort()

    timer = threading.Timer(WATCHDOG_SECONDS, fire)
    timer.daemon = True
    timer.start()
    yield
    timer.cancel()
    LIVE[:] = [c for c in LIVE if not c.destroyed]
    if fired.is_set():
        pytest.fail(f"the test ran past {WATCHDOG_SECONDS:.0f} s: the watchdog aborted every GPU communicator")


# ---- one collective on every rank, one thread, one group; checked against NumPy ----


def call(c: Any, coll: str, send: Any, recv: Any, op: str, root: int, stream: Any = None) -> Any:
    if coll == "allreduce":
        return c.allreduce(send, recv, op=op, stream=stream)
    if coll == "broadcast":
        return c.broadcast(send, recv, root=root, stream=stream)
    if coll == "reduce":
        return c.reduce(send, recv, op=op, root=root, stream=stream)
    if coll == "allgather":
        return c.allgather(send, recv, stream=stream)
    return c.reduce_scatter(send, recv, op=op, stream=stream)


def expected(coll: str, inputs: list[np.ndarray], op: str, dtype: str, root: int, count: int) -> list[Any]:
    """Every rank's result; None where the collective leaves the output alone (reduce, non-root).
    The reference is computed once and shared (8 ranks x 8M elements add up)."""
    n = len(inputs)
    if coll == "broadcast":
        return [inputs[root]] * n
    if coll == "allgather":
        return [np.concatenate(inputs)] * n
    reduced = reduce_ref(inputs, op, dtype)
    if coll == "allreduce":
        return [reduced] * n
    if coll == "reduce":
        return [reduced if r == root else None for r in range(n)]
    return [reduced[r * count : (r + 1) * count] for r in range(n)]


def check_group(comms: list[Any], coll: str, dtype: str, op: str, count: int, in_place: bool, lib: Lib) -> None:
    n = len(comms)
    host_type = np.float32 if dtype == "bfloat16" else dtype
    root = (count + 1) % n
    block = count * n if coll == "reduce_scatter" else count
    inputs = inputs_for(n, block, dtype, op, seed=count % 11)
    sends = [lib.put(x, dtype) for x in inputs]
    if in_place:
        if coll == "allgather":
            outs = [lib.filled(count * n, dtype) for _ in range(n)]
            for r in range(n):
                outs[r][r * count : (r + 1) * count] = sends[r]
            sends = [outs[r][r * count : (r + 1) * count] for r in range(n)]
        elif coll == "reduce_scatter":
            outs = [sends[r][r * count : (r + 1) * count] for r in range(n)]
        else:
            outs = sends
        recvs: list[Any] = [outs[r] if coll in ("allgather", "reduce_scatter") else None for r in range(n)]
    else:
        outs = [lib.filled(count * n if coll == "allgather" else count, dtype) for _ in range(n)]
        recvs = outs
    with minincl.group():
        for c in comms:
            call(c, coll, sends[c.rank], recvs[c.rank], op, root)
    where = f"{coll} {dtype} {op} count {count} {'in place' if in_place else 'out of place'} on {n} ranks"
    wants = expected(coll, inputs, op, dtype, root, count)
    for r in range(n):
        got = lib.get(outs[r])
        want = wants[r]
        if want is None:  # non-root reduce: out of place untouched, in place still the input
            want = inputs[r] if in_place else np.full(count, lib.sentinel(dtype))
        try:
            assert_same(got, want.astype(host_type, copy=False), dtype, op)
        except AssertionError as e:
            raise AssertionError(f"{where}, rank {r}: {e}") from None
    if not in_place:  # inputs are left as they were
        for r in range(n):
            np.testing.assert_array_equal(lib.get(sends[r]), inputs[r], err_msg=f"{where}: input")


# ---- tests: cheapest and most basic first (the device check runs with -x) ----


def test_gpu_count_and_device_names(cp: Any) -> None:
    assert 1 <= minincl.gpu_count() <= cp.cuda.runtime.getDeviceCount()
    assert minincl.build_info()["cuda"] is True


def test_allreduce_smoke(gpus: GpuPool, cp: Any) -> None:
    comms = gpus.get(2)
    assert [c.device for c in comms] == [DEVICE, DEVICE]
    xs = [cp.full(1000, r + 1, cp.float32) for r in range(2)]
    with minincl.group():
        for c in comms:
            assert c.allreduce(xs[c.rank]) is xs[c.rank]
    for x in xs:
        np.testing.assert_array_equal(cp.asnumpy(x), np.full(1000, 3, np.float32))


def test_host_array_to_gpu_communicator_is_refused(gpus: GpuPool, cp: Any) -> None:
    c = gpus.get(2)[0]
    host = np.ones(8, np.float32)
    dev = cp.ones(8, cp.float32)
    with pytest.raises(minincl.InvalidArgument):
        c.allreduce(host)
    with pytest.raises(minincl.InvalidArgument):
        c.allreduce(dev, np.zeros(8, np.float32))
    with pytest.raises(minincl.InvalidArgument):
        c.allreduce(host, cp.zeros(8, cp.float32))
    with pytest.raises(minincl.InvalidArgument, match="must match"):
        c.allreduce(dev, cp.zeros(8, cp.int32))
    with pytest.raises(minincl.InvalidArgument, match="expected 8"):
        c.allreduce(dev, cp.zeros(9, cp.float32))
    np.testing.assert_array_equal(host, np.ones(8, np.float32))
    np.testing.assert_array_equal(cp.asnumpy(dev), np.ones(8, np.float32))


def test_cuda_array_to_cpu_communicator_is_refused(cp: Any) -> None:
    (c,) = minincl.Communicator.init_all(1)
    try:
        x = cp.ones(8, cp.float32)
        with pytest.raises(minincl.InvalidArgument):
            c.allreduce(x)
        with pytest.raises(minincl.InvalidArgument):
            c.allreduce(np.ones(8, np.float32), x)
        np.testing.assert_array_equal(cp.asnumpy(x), np.ones(8, np.float32))
    finally:
        c.destroy()


def test_torch_cuda_tensor_to_cpu_communicator_is_refused(torch_cuda: Any) -> None:
    torch = torch_cuda
    (c,) = minincl.Communicator.init_all(1)
    try:
        with pytest.raises(minincl.InvalidArgument):
            c.allreduce(torch.ones(8, device=DEVICE))
    finally:
        c.destroy()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MININCL_GPU_THREADS", "48"),
        ("MININCL_GPU_CHANNEL_CACHE", "yes"),
        ("MININCL_GPU_TRANSPORT", "carrier-pigeon"),
        ("MININCL_GPU_SPINS", "-1"),
    ],
)
def test_a_bad_gpu_setting_fails_the_init(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    """A GPU rank reads its own settings before it joins (MININCL_GPU_THREADS was read at the
    first launch), so a malformed one fails the init naming it, not a later call; across
    processes the peers then fail at once (test_a_bad_setting_on_one_rank_fails_the_others_at_once)."""
    monkeypatch.setenv(name, value)
    with pytest.raises(minincl.Error) as info:
        for c in minincl.Communicator.init_all(2, device=DEVICE):
            c.destroy()
    assert name in str(info.value), info.value


@pytest.mark.skipif(GPUS < 2, reason="needs two GPUs")
def test_array_on_another_gpu_is_refused(gpus: GpuPool, cp: Any) -> None:
    c = gpus.get(2)[0]  # on cuda:0
    with cp.cuda.Device(1):
        other = cp.ones(8, cp.float32)
    with pytest.raises(minincl.InvalidArgument):
        c.allreduce(other)
    with pytest.raises(minincl.InvalidArgument):
        c.allreduce(cp.ones(8, cp.float32), other)


@pytest.mark.parametrize("nranks", [2, 4])
def test_send_recv_ring_exchange(gpus: GpuPool, cp: Any, nranks: int) -> None:
    """Every rank sends to the next and receives from the previous, in one group per call
    (both directions at once: no order can deadlock), plus a send to itself."""
    comms = gpus.get(nranks)
    for dtype, count in (("float32", 0), ("float32", 1), ("int8", 1009), ("float64", 65537), ("float32", BIG)):
        inputs = inputs_for(nranks, count, dtype, "sum", seed=count % 5)
        sends = [cp.asarray(x) for x in inputs]
        recvs = [cp.full(count, 99, dtype) for _ in range(nranks)]
        selfs = [cp.full(count, 99, dtype) for _ in range(nranks)]
        with minincl.group():
            for c in comms:
                r = c.rank
                c.send(sends[r], (r + 1) % nranks)
                c.recv(recvs[r], (r - 1) % nranks)
                c.send(sends[r], r)
                c.recv(selfs[r], r)
        for r in range(nranks):
            where = f"{dtype} count {count} rank {r}"
            np.testing.assert_array_equal(cp.asnumpy(recvs[r]), inputs[(r - 1) % nranks], err_msg=where)
            np.testing.assert_array_equal(cp.asnumpy(selfs[r]), inputs[r], err_msg=where)


def check_alltoall(comms: list[Any], cp: Any, count: int) -> None:
    """An int32 alltoall of `count` elements a block on every rank, in one group, against NumPy."""
    n = len(comms)
    inputs = [np.arange(count * n, dtype=np.int32) * 10 + r for r in range(n)]
    sends = [cp.asarray(x) for x in inputs]
    recvs = [cp.full(count * n, -1, cp.int32) for _ in range(n)]
    with minincl.group():
        for c in comms:
            c.alltoall(sends[c.rank], recvs[c.rank])
    for r in range(n):
        want = np.concatenate([inputs[q][r * count : (r + 1) * count] for q in range(n)])
        np.testing.assert_array_equal(cp.asnumpy(recvs[r]), want, err_msg=f"count {count} rank {r}")


@pytest.mark.parametrize("nranks", [2, 4])
def test_alltoall(gpus: GpuPool, cp: Any, nranks: int) -> None:
    comms = gpus.get(nranks)
    for count in (1, 1009, 300_007):
        check_alltoall(comms, cp, count)
    x = cp.ones(2 * nranks, cp.float32)
    with pytest.raises(minincl.InvalidUsage, match="in-place alltoall"):
        comms[0].alltoall(x, x)


@pytest.mark.parametrize("nranks", [2, 4])
def test_gather_and_scatter(gpus: GpuPool, cp: Any, nranks: int) -> None:
    """Every rank's calls in one group: gathers to the last rank (in place there) and to rank
    0 (out of place), scatters from rank 1 (out of place, then in place), int32, against NumPy."""
    comms = gpus.get(nranks)
    g, s = nranks - 1, 1
    for count in (1, 1009, 300_007):
        inputs = [np.arange(count, dtype=np.int32) * 10 + r for r in range(nranks)]
        whole = cp.full(count * nranks, -1, cp.int32)
        whole[g * count : (g + 1) * count] = cp.asarray(inputs[g])
        sends = [cp.asarray(x) for x in inputs]
        sends[g] = whole[g * count : (g + 1) * count]  # (in place: the root's block of recv)
        blocks = np.concatenate(inputs)[::-1].copy()
        on_gpu = cp.asarray(blocks)
        parts = [cp.full(count, -1, cp.int32) for _ in range(nranks)]
        apart = cp.full(count * nranks, -1, cp.int32)  # (out of place: the root copies its own block)
        own = [cp.full(count, -1, cp.int32) for _ in range(nranks)]
        with minincl.group():
            for c in comms:
                c.gather(sends[c.rank], whole if c.rank == g else None, root=g)
                c.scatter(on_gpu if c.rank == s else None, parts[c.rank], root=s)
                c.gather(cp.asarray(inputs[c.rank]), apart if c.rank == 0 else None, root=0)
                # In place at the root: recv is its block of send.
                c.scatter(
                    on_gpu if c.rank == s else None,
                    on_gpu[s * count : (s + 1) * count] if c.rank == s else own[c.rank],
                    root=s,
                )
        np.testing.assert_array_equal(cp.asnumpy(whole), np.concatenate(inputs), err_msg=f"count {count}")
        np.testing.assert_array_equal(cp.asnumpy(apart), np.concatenate(inputs), err_msg=f"count {count}")
        np.testing.assert_array_equal(cp.asnumpy(on_gpu), blocks)
        for r in range(nranks):
            np.testing.assert_array_equal(cp.asnumpy(parts[r]), blocks[r * count : (r + 1) * count])
            if r != s:
                np.testing.assert_array_equal(cp.asnumpy(own[r]), blocks[r * count : (r + 1) * count])


@pytest.mark.parametrize("nranks", [2, 4, 8])
def test_every_type_default_tuner(gpus: GpuPool, nranks: int) -> None:
    """All ten types under the tuner's own choice (the full build compiles every (op, type))."""
    comms = gpus.get(nranks)
    for dtype, op in TYPES_OPS:
        if dtype == "bfloat16" and not _torch_available():
            continue
        lib = Lib.for_dtype(dtype)
        for coll in REDUCING:
            for count in (1, 1009, 65537):
                check_group(comms, coll, dtype, op, count, in_place=False, lib=lib)
        check_group(comms, "allreduce", dtype, "sum", 40009, in_place=True, lib=lib)


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("nranks", [2, 4, 8])
def test_forced_algorithm_and_protocol(gpus: GpuPool, nranks: int, algo: str, proto: str) -> None:
    """Every collective the algorithm runs, under each protocol, one thread driving all ranks."""
    comms = gpus.get(nranks, algo, proto)
    cupy_lib = Lib("cupy")
    for coll in ALGOS[algo]:
        cases = REDUCE_CASES if coll in REDUCING else COPY_CASES
        # Every case at a prime count; the edge counts and in place with the first two (the
        # default-tuner test covers all ten types): ~12 groups per collective keep 27
        # (nranks, algo, proto) combinations inside the device check's budget.
        for i, (dtype, op) in enumerate(cases):
            for count in COUNTS if i == 0 else [1009]:
                check_group(comms, coll, dtype, op, count, in_place=False, lib=cupy_lib)
            if i < 2:
                check_group(comms, coll, dtype, op, 1009, in_place=True, lib=cupy_lib)
        if coll in REDUCING and _torch_available():
            check_group(comms, coll, "bfloat16", "sum", 1009, in_place=False, lib=Lib("torch"))
        check_group(comms, coll, "float32", "sum", BIG, in_place=False, lib=cupy_lib)
        check_group(comms, coll, "float32", "sum", BIG, in_place=True, lib=cupy_lib)


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("algo", list(ALGOS))
def test_premul_sum(gpus: GpuPool, cp: Any, algo: str, proto: str) -> None:
    """Pre-multiplied sums (minincl.PreMulSum), each rank its own scalar: every reducing
    collective the algorithm runs on 2 and 4 ranks (ranks of one GPU read each other's inputs
    where they lie, and scale them), and a single rank (a scaling kernel). Inputs and scalars
    keep every product and sum exact."""
    cases = [("float32", [0.5, -2.0, 1.5, 3.0]), ("int32", [3, -2, 1, 5])]
    if _torch_available():
        cases.append(("bfloat16", [0.25, 2.0, -1.0, 0.5]))
    for n in (1, 2, 4):
        comms = gpus.get(n, algo, proto)
        for dtype, scalars in cases:
            lib = Lib.for_dtype(dtype)
            host_type = np.float32 if dtype == "bfloat16" else np.dtype(dtype)
            for coll in [c for c in REDUCING if c in ALGOS[algo] or c == "reduce"]:
                # (A big count once per algorithm and protocol: the device check's budget.)
                for count in (1009, BIG) if (dtype, coll, n) == ("float32", "allreduce", 4) else (1009,):
                    block = count * n if coll == "reduce_scatter" else count
                    rng = np.random.default_rng(count + n)
                    inputs = [rng.integers(-3, 4, size=block).astype(host_type) for _ in range(n)]
                    total = np.sum([host_type.type(scalars[r]) * inputs[r] for r in range(n)], axis=0).astype(host_type)
                    sends = [lib.put(x, dtype) for x in inputs]
                    outs = [lib.filled(count, dtype) for _ in range(n)]
                    with minincl.group():
                        for c in comms:
                            call(c, coll, sends[c.rank], outs[c.rank], minincl.PreMulSum(scalars[c.rank]), 0)  # type: ignore[arg-type]
                    for r in range(n):
                        if coll == "reduce" and r != 0:
                            continue
                        want = total[r * count : (r + 1) * count] if coll == "reduce_scatter" else total
                        got = lib.get(outs[r])
                        np.testing.assert_array_equal(
                            got, want, err_msg=f"{coll} {dtype} {count} on {n} ranks, rank {r}"
                        )


def test_premul_sum_scalar_on_the_device(gpus: GpuPool, cp: Any) -> None:
    """One-element CuPy arrays as the scalars: read by the kernel when it runs, so a value set
    on the stream before the next call counts (no host sync)."""
    comms = gpus.get(2)
    scalars = [cp.asarray([0.5], dtype=cp.float32), cp.asarray([-2.0], dtype=cp.float32)]
    xs = [np.arange(1009, dtype=np.float32) % 7 - 3 + r for r in range(2)]
    for factor in (1.0, 4.0):
        for s in scalars:
            s *= factor
        outs = [cp.zeros(1009, dtype=cp.float32) for _ in range(2)]
        with minincl.group():
            for c in comms:
                c.allreduce(cp.asarray(xs[c.rank]), outs[c.rank], op=minincl.PreMulSum(scalars[c.rank]))
        want = (0.5 * factor) * xs[0] + (-2.0 * factor) * xs[1]
        for o in outs:
            np.testing.assert_array_equal(cp.asnumpy(o), want)


@pytest.mark.parametrize("proto", PROTOS)
def test_float8(gpus: GpuPool, torch_cuda: Any, proto: str) -> None:
    """8-bit floats (PyTorch CUDA tensors): on 2 ranks every pair of codes through each
    algorithm's allreduce (the GPU's conversions must give the bits the CPU reference gives:
    rounded to nearest even, saturated); on 4 ranks exact pre-multiplied sums."""
    from test_float8 import assert_codes, assert_values, codes_of, combine, decode, encode, pair_codes

    torch = torch_cuda
    a, b = pair_codes()
    for fmt in ("float8_e4m3fn", "float8_e5m2"):
        dt = getattr(torch, fmt)
        for algo in ALGOS:
            comms = gpus.get(2, algo, proto)
            for op in ("sum", "prod", "max", "avg"):
                sends = [torch.from_numpy(x.copy()).view(dt).to(DEVICE) for x in (a, b)]
                outs = [torch.zeros(len(a), dtype=dt, device=DEVICE) for _ in range(2)]
                with minincl.group():
                    for c in comms:
                        c.allreduce(sends[c.rank], outs[c.rank], op=op)
                want = combine(a, b, op, fmt)
                for r in range(2):
                    got = codes_of(outs[r].cpu())
                    what = f"{fmt} {op} {algo}/{proto} rank {r}"
                    (assert_values if op == "max" else assert_codes)(got, want, fmt, what)
        comms = gpus.get(4, None, proto)
        scalars = [1.0, -1.0, 2.0, 1.0]
        xs = [((np.arange(40009) * (q + 2) + q) % 3 - 1).astype(np.float64) for q in range(4)]
        sends = [torch.from_numpy(encode(x, fmt)).view(dt).to(DEVICE) for x in xs]
        with minincl.group():
            for c in comms:
                c.allreduce(sends[c.rank], op=minincl.PreMulSum(scalars[c.rank]))
        want = encode(sum(s * x for s, x in zip(scalars, xs)), fmt)
        for r in range(4):
            assert_codes(codes_of(sends[r].cpu()), want, fmt, f"{fmt} premulsum 4 ranks rank {r}")
            assert not np.isnan(decode(want, fmt)).any()


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("op", ["sum", "bxor"])
def test_buffers_off_word_boundaries(gpus: GpuPool, cp: Any, proto: str, op: str) -> None:
    """Arrays that start one element into an allocation: the kernels' 8-byte word paths (an
    LL word, an LL128 lane's part) must fall back to elements there (float64 stays aligned:
    the word path at an offset). bxor runs on bytes: where the pointers never align to 16
    bytes together, in shifted vectors (cuda/reduce_copy.h, reduceBytesApart). 3 ranks, ring."""
    comms = gpus.get(3, "ring", proto)
    n = 3
    cases = (("int8", 1009), ("float16", 517), ("float32", 3001), ("float64", 131))
    for dtype, count in cases if op == "sum" else (("int8", 1009), ("int32", 3001), ("uint8", 70_001)):
        inputs = [((np.arange(count) * (r + 3)) % 7 + r).astype(dtype) for r in range(n)]
        held = [cp.zeros(count + 1, dtype) for _ in range(n)]
        outs = [cp.full(count + 2, 99, dtype) for _ in range(n)]
        for r in range(n):
            held[r][1:] = cp.asarray(inputs[r])
        with minincl.group():
            for c in comms:
                c.allreduce(held[c.rank][1:], outs[c.rank][2:], op=op)  # off by one and by two elements
        with minincl.group():
            for c in comms:
                c.allreduce(held[c.rank][1:], op=op)  # in place, off by one
        want = reduce_ref(inputs, op, dtype)
        for r in range(n):
            where = f"{dtype} count {count} rank {r} ({proto})"
            np.testing.assert_array_equal(cp.asnumpy(outs[r][2:]), want, err_msg=where)
            np.testing.assert_array_equal(cp.asnumpy(outs[r][:2]), np.full(2, 99, dtype), err_msg=where)
            np.testing.assert_array_equal(cp.asnumpy(held[r][1:]), want, err_msg=where)
            assert cp.asnumpy(held[r][:1]).tolist() == [0], where


@pytest.mark.parametrize("proto", PROTOS)
def test_copies_off_word_boundaries(gpus: GpuPool, cp: Any, proto: str) -> None:
    """Copies run on bytes: arrays off 16 bytes from the FIFO slots go in 16-byte vectors all
    the same, the slots' vectors loaded whole and joined or the outputs' stored in pieces
    (reduceBytesApart in cuda/reduce_copy.h; float64 one element in is 8 bytes off, int8 one
    byte), and buffers at the same offset on every rank take the vector loop after a head.
    Allgather, broadcast and a ring of sends, 3 ranks, ring, against NumPy."""
    comms = gpus.get(3, "ring", proto)
    n = 3
    for dtype, count in (("int8", 1009), ("float16", 70_001), ("float32", 300_007), ("float64", 65_537)):
        inputs = [((np.arange(count) * (r + 3)) % 7 + r).astype(dtype) for r in range(n)]
        held = [cp.zeros(count + 1, dtype) for _ in range(n)]
        for r in range(n):
            held[r][1:] = cp.asarray(inputs[r])
        gathered = [cp.full(n * count + 2, 99, dtype) for _ in range(n)]
        received = [cp.full(count + 1, 99, dtype) for _ in range(n)]
        with minincl.group():
            for c in comms:
                c.allgather(held[c.rank][1:], gathered[c.rank][2:])  # off by one and by two elements
        with minincl.group():
            for c in comms:
                r = c.rank
                c.send(held[r][1:], (r + 1) % n)
                c.recv(received[r][1:], (r - 1) % n)
        with minincl.group():
            for c in comms:
                c.broadcast(held[c.rank][1:], root=1)  # in place, off by one on every rank
        for r in range(n):
            where = f"{dtype} count {count} rank {r} ({proto})"
            np.testing.assert_array_equal(cp.asnumpy(gathered[r][2:]), np.concatenate(inputs), err_msg=where)
            np.testing.assert_array_equal(cp.asnumpy(gathered[r][:2]), np.full(2, 99, dtype), err_msg=where)
            np.testing.assert_array_equal(cp.asnumpy(received[r][1:]), inputs[(r - 1) % n], err_msg=where)
            assert cp.asnumpy(received[r][:1]).tolist() == [99], where
            np.testing.assert_array_equal(cp.asnumpy(held[r][1:]), inputs[1], err_msg=where)


@pytest.mark.parametrize("proto", ["ll", "ll128"])
@pytest.mark.parametrize("algo", list(ALGOS))
def test_line_protocols_at_default_step_sizes(gpus: GpuPool, cp: Any, algo: str, proto: str) -> None:
    """LL and LL128 with the GPU's default steps, 3 ranks: a few lines of one warp, several
    passes of whole blocks, and ragged last lines of 1-, 2-, 4- and 8-byte elements."""
    for k in [k for k in gpus.groups if k[1] is not None]:
        gpus.discard(k)
    # The GPU's own slot sizes (conftest shrinks them for every other test): steps of several
    # passes, a pass of four lines per thread.
    with env_as({"MININCL_LL_SLOT_LINES": None, "MININCL_LL128_SLOT_LINES": None}), forced_env(algo, proto):
        comms = minincl.Communicator.init_all(3, device=DEVICE)
    try:
        cupy_lib = Lib("cupy")
        cases = (("uint8", 1009), ("float16", 70_001), ("float32", 1), ("float32", 300_007), ("int64", 40_009))
        for dtype, count in cases:
            check_group(comms, "allreduce", dtype, "sum", count, in_place=False, lib=cupy_lib)
        check_group(comms, "allreduce", "float32", "max", 300_007, in_place=True, lib=cupy_lib)
        check_group(comms, "broadcast", "uint8", "sum", 250_001, in_place=False, lib=cupy_lib)
    finally:
        for c in comms:
            c.destroy()


def test_several_collectives_in_one_group(gpus: GpuPool, cp: Any) -> None:
    comms = gpus.get(4)
    n = 4
    a = [cp.full(50_000, r + 1, cp.float64) for r in range(n)]
    g = [cp.zeros(3 * n, cp.int64) for _ in range(n)]
    b = [cp.full(777, r, cp.int32) for r in range(n)]
    with minincl.group():
        for c in comms:
            c.allreduce(a[c.rank])
            c.allgather(cp.full(3, c.rank, cp.int64), g[c.rank])
            c.broadcast(b[c.rank], root=2)
            c.allreduce(a[c.rank], op="max")  # ordered after the first on the same rank
    for r in range(n):
        np.testing.assert_array_equal(cp.asnumpy(a[r]), np.full(50_000, 10.0))
        np.testing.assert_array_equal(cp.asnumpy(g[r]), np.repeat(np.arange(n), 3))
        np.testing.assert_array_equal(cp.asnumpy(b[r]), np.full(777, 2))


@pytest.mark.parametrize("fuse", ["1", "0"])
def test_group_of_ranks_in_one_kernel_or_one_each(gpus: GpuPool, cp: Any, fuse: str) -> None:
    """A group of one collective per rank on one stream runs as one kernel (MININCL_GPU_FUSE=1,
    the default, while every rank's channels fit one launch) or as a kernel per rank on forked
    streams (0). Both at every collective, small counts (fused) and large (too many channels)."""
    comms = gpus.get(4)
    lib = Lib("cupy")
    with env_as({"MININCL_GPU_FUSE": fuse}):
        for coll in ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter"):
            for count in (1, 1009, 1 << 20):
                check_group(comms, coll, "float32", "sum", count, in_place=False, lib=lib)
        check_group(comms, "allreduce", "int32", "max", 12345, in_place=True, lib=lib)


@pytest.mark.parametrize("path_kernels", ["1", "0"])
def test_direct_ll_in_its_own_kernel_or_the_ll_one(cp: Any, path_kernels: str) -> None:
    """Direct LL, the small operations' path, runs a kernel of that path alone
    (MININCL_GPU_PATH_KERNELS=1, the default) or the LL kernel (0): the same results for
    every collective, one-shot and two-shot sizes, a reduction of each kind."""
    forced = {"MININCL_GPU_PATH_KERNELS": path_kernels, "MININCL_ALGO": "direct", "MININCL_PROTO": "ll"}
    with env_as(forced):
        comms = minincl.Communicator.init_all(3, device=DEVICE)
    lib = Lib("cupy")
    try:
        for coll in ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter"):
            for count in (1, 1009, 100_003):
                check_group(comms, coll, "float32", "sum", count, in_place=False, lib=lib)
        check_group(comms, "allreduce", "bfloat16", "max", 4099, in_place=True, lib=lib)
        check_group(comms, "allreduce", "int64", "prod", 17, in_place=False, lib=lib)
        check_group(comms, "allreduce", "float16", "avg", 777, in_place=True, lib=lib)
    finally:
        for c in comms:
            c.destroy()


@pytest.mark.parametrize("nranks", [2, 4])
def test_one_thread_per_rank_with_own_streams(gpus: GpuPool, cp: Any, nranks: int) -> None:
    """Each rank's thread orders its calls on its own non-blocking stream, between CuPy
    kernels on that stream (no synchronisation in between), and passes the stream as a CuPy
    stream, a raw handle or the current stream."""
    comms = gpus.get(nranks)
    count = 100_003
    calls = 12
    base = np.arange(count, dtype=np.float32) % 97

    # Everything a rank thread allocates, it allocates before the barrier; results are read
    # after a synchronisation of the rank's own stream. (A copy to pageable host memory that
    # waits for a kernel can hold a driver lock another thread's cudaMalloc needs, and that
    # thread's rank is what the kernel waits for.)
    _ = cp.asarray(base) * 2 + 1  # CuPy's elementwise kernels, compiled here once
    cp.cuda.Device().synchronize()
    ready = threading.Barrier(nranks, timeout=60)  # a rank that failed early breaks it, not hangs it

    def body(c: Any) -> list[np.ndarray]:
        s = cp.cuda.Stream(non_blocking=True)
        forms = [s, s.ptr, None]
        outs = []
        with s:
            xs = [cp.empty(count, cp.float32) for _ in range(calls)]
            rs = [cp.empty(count * nranks, cp.float32) for _ in range(calls)]
            doubled = [cp.empty(count, cp.float32) for _ in range(calls)]
            src = cp.asarray(base)
            s.synchronize()
            ready.wait()
            for i in range(calls):
                cp.multiply(src, c.rank + 1, out=xs[i])  # CuPy kernels on s, not waited for
                cp.add(xs[i], i, out=xs[i])
                form = forms[(c.rank + i) % 3]
                c.allreduce(xs[i], stream=form)
                c.allgather(xs[i][:count], rs[i], stream=form)
                cp.multiply(xs[i], 2, out=doubled[i])  # a kernel after the collective
            s.synchronize()
            for i in range(calls):
                outs.append(cp.asnumpy(doubled[i]))
                outs.append(cp.asnumpy(rs[i]))
        return outs

    total = nranks * (nranks + 1) // 2
    for outs in run_ranks(comms, body, timeout=120):
        for i in range(calls):
            reduced = base * total + nranks * i
            np.testing.assert_array_equal(outs[2 * i], reduced * 2)
            np.testing.assert_array_equal(outs[2 * i + 1], np.tile(reduced, nranks))


def test_torch_cuda_tensors(gpus: GpuPool, torch_cuda: Any) -> None:
    """PyTorch CUDA tensors of several types, on the current stream and on a torch stream."""
    torch = torch_cuda
    comms = gpus.get(4)
    lib = Lib("torch")
    for dtype, op in [("bfloat16", "sum"), ("float16", "max"), ("float32", "avg"), ("int32", "prod")]:
        for coll in ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter"):
            for count in (1, 1009):
                check_group(comms, coll, dtype, op, count, in_place=False, lib=lib)
        check_group(comms, "allreduce", dtype, op, 1009, in_place=True, lib=lib)
    s = torch.cuda.Stream()
    xs = [torch.full((4099,), float(r), device=DEVICE) for r in range(4)]
    outs = [torch.empty(4 * 4099, device=DEVICE) for _ in range(4)]
    torch.cuda.current_stream().synchronize()
    with torch.cuda.stream(s):
        with minincl.group():
            for c in comms:
                c.allgather(xs[c.rank], outs[c.rank], stream=s)
        with minincl.group():
            for c in comms:
                c.allreduce(xs[c.rank])  # the current stream: s
    s.synchronize()
    for r in range(4):
        np.testing.assert_array_equal(outs[r].cpu().numpy(), np.repeat(np.arange(4, dtype=np.float32), 4099))
        np.testing.assert_array_equal(xs[r].cpu().numpy(), np.full(4099, 6.0, np.float32))


def test_stats_count_pointer_steps_and_direct_writes(gpus: GpuPool, cp: Any) -> None:
    """Ranks of one process on one GPU read and write each other's buffers; stats() reads the
    counters from the device's copy of the channels."""
    comms = gpus.get(2, "ring", "simple")
    before = [c.stats() for c in comms]
    assert [s["readable_peers"] for s in before] == [1, 1]
    xs = [cp.full(1 << 20, r + 1, cp.float32) for r in range(2)]
    with minincl.group():
        for c in comms:
            c.allreduce(xs[c.rank])
    cp.cuda.runtime.deviceSynchronize()
    after = [c.stats() for c in comms]
    for b, a in zip(before, after):
        assert a["pointer_steps"] + a["direct_writes"] > b["pointer_steps"] + b["direct_writes"], (b, a)
    for x in xs:
        np.testing.assert_array_equal(cp.asnumpy(x), np.full(1 << 20, 3, np.float32))


def test_new_result_arrays_are_on_the_gpu(gpus: GpuPool, cp: Any) -> None:
    """allgather / reduce_scatter without recv return a new array of the caller's kind."""
    comms = gpus.get(2)
    xs = [cp.full((2, 3), r, cp.int32) for r in range(2)]
    with minincl.group():
        gathered = [c.allgather(xs[c.rank]) for c in comms]
    with minincl.group():
        scattered = [c.reduce_scatter(cp.ones((4, 2), cp.float32)) for c in comms]
    for g, s in zip(gathered, scattered):
        assert isinstance(g, cp.ndarray) and g.shape == (4, 3) and g.dtype == cp.int32
        np.testing.assert_array_equal(cp.asnumpy(g)[:, 0], [0, 0, 1, 1])
        assert isinstance(s, cp.ndarray) and s.shape == (2, 2)
        np.testing.assert_array_equal(cp.asnumpy(s), np.full((2, 2), 2.0, np.float32))


def captured(stream: Any, record: Callable[[], None], mode: int | None = None) -> Any:
    """The CUDA graph of what `record()` queues on the CuPy `stream`, captured in `mode` (None:
    CuPy's default, relaxed). A capture that fails is ended before its error is raised."""
    if mode is None:
        stream.begin_capture()
    else:
        stream.begin_capture(mode=mode)
    try:
        record()
    except BaseException:
        with contextlib.suppress(Exception):  # end the broken capture; report the first error
            stream.end_capture()
        raise
    return stream.end_capture()


@pytest.mark.parametrize("nranks", [2, 4])
def test_cuda_graph_capture_and_replay(gpus: GpuPool, cp: Any, nranks: int) -> None:
    """Collectives of every rank captured into one graph; replayed three times with new inputs."""
    comms = gpus.get(nranks)
    n, count = nranks, 1009
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        send = [cp.zeros(count, cp.float32) for _ in range(n)]
        summed = [cp.zeros(count, cp.float32) for _ in range(n)]
        gathered = [cp.zeros(count * n, cp.float32) for _ in range(n)]
        peak = [cp.zeros(count, cp.int32) for _ in range(n)]
        ints = [cp.zeros(count, cp.int32) for _ in range(n)]
        s.synchronize()

        def record() -> None:
            with minincl.group():
                for c in comms:
                    c.allreduce(send[c.rank], summed[c.rank])  # the current stream: s
                    c.allgather(send[c.rank], gathered[c.rank], stream=s)
                    c.allreduce(ints[c.rank], peak[c.rank], op="max", stream=s.ptr)

        graph = captured(s, record)
    for replay in range(3):
        inputs = inputs_for(n, count, "float32", "sum", seed=replay)
        host = [(x.astype(np.float32), (x * (replay + 1)).astype(np.int32)) for x in inputs]
        for r in range(n):
            send[r].set(host[r][0], stream=s)
            ints[r].set(host[r][1], stream=s)
        graph.launch(stream=s)
        s.synchronize()
        want_sum = reduce_ref(inputs, "sum", "float32")
        want_max = np.stack(inputs).max(0) * (replay + 1)
        for r in range(n):
            np.testing.assert_array_equal(cp.asnumpy(summed[r]), want_sum, err_msg=f"replay {replay} rank {r}")
            np.testing.assert_array_equal(cp.asnumpy(gathered[r]), np.concatenate(inputs).astype(np.float32))
            np.testing.assert_array_equal(cp.asnumpy(peak[r]), want_max.astype(np.int32))


def ipc_worker(comm: minincl.Communicator, counts: list[int]) -> int:
    """One rank process of test_two_processes (launch imports it from here):
    every collective with CuPy on this process's own stream, checked against NumPy here."""
    import cupy as cp

    device = int(comm.device.split(":")[1]) if ":" in comm.device else 0
    n, r = comm.nranks, comm.rank
    checks = 0
    with cp.cuda.Device(device):
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            for count in counts:
                for dtype, op in (("float32", "sum"), ("int32", "max"), ("float16", "sum"), ("uint8", "prod")):
                    xs = inputs_for(n, count, dtype, op, seed=count % 11)
                    whole = inputs_for(n, count * n, dtype, op, seed=count % 7)
                    reduced = reduce_ref(xs, op, dtype)
                    mine = cp.asarray(xs[r].astype(dtype))
                    out = cp.full(count, 99, dtype)
                    comm.allreduce(mine, out, op=op)
                    np.testing.assert_array_equal(cp.asnumpy(out), reduced)
                    comm.allreduce(mine, op=op)
                    np.testing.assert_array_equal(cp.asnumpy(mine), reduced)
                    b = cp.asarray(xs[r].astype(dtype))
                    comm.broadcast(b, root=n - 1)
                    np.testing.assert_array_equal(cp.asnumpy(b), xs[n - 1].astype(dtype))
                    red = cp.full(count, 99, dtype)
                    comm.reduce(cp.asarray(xs[r].astype(dtype)), red, op=op, root=1 % n)
                    want = reduced if r == 1 % n else np.full(count, 99, dtype)
                    np.testing.assert_array_equal(cp.asnumpy(red), want)
                    g = cp.zeros(count * n, dtype)
                    comm.allgather(cp.asarray(xs[r].astype(dtype)), g, stream=s)
                    np.testing.assert_array_equal(cp.asnumpy(g), np.concatenate(xs).astype(dtype))
                    rs = cp.zeros(count, dtype)
                    comm.reduce_scatter(cp.asarray(whole[r].astype(dtype)), rs, op=op, stream=s.ptr)
                    want_rs = reduce_ref(whole, op, dtype)[r * count : (r + 1) * count]
                    np.testing.assert_array_equal(cp.asnumpy(rs), want_rs)
                    checks += 6
            s.synchronize()
    return checks


@pytest.mark.parametrize("transport", ["ipc", "host"])
def test_two_processes(monkeypatch: pytest.MonkeyPatch, transport: str) -> None:
    """Two rank processes on the GPU(s), their FIFOs in device memory reached through CUDA
    IPC, or in pinned host memory (the fallback when IPC is unavailable), forced through
    MININCL_GPU_TRANSPORT. On one GPU without MPS the two contexts are time-sliced, so the
    counts stay small."""
    _cupy()
    monkeypatch.setenv("MININCL_GPU_TRANSPORT", transport)  # the spawned ranks inherit it
    counts = [0, 1, 1009, 65537] if transport == "ipc" else [1, 1009]
    results = minincl.launch(ipc_worker, 2, counts, device="cuda", timeout=180)
    assert results == [results[0]] * 2 and results[0] == 6 * 4 * len(counts)


def test_mismatched_send_recv_is_an_error(cp: Any) -> None:
    """Rank 1 expects more than rank 0 sends: rank 1's kernel finds it at the first step and
    stops; the monitor turns the kernel's record into the communicator's error."""
    comms = minincl.Communicator.init_all(2, device=DEVICE)
    try:
        a, b = cp.ones(8, cp.float32), cp.zeros(9, cp.float32)
        with minincl.group():
            comms[0].send(a, 1)
            comms[1].recv(b, 0)
        cp.cuda.Device().synchronize()  # both kernels end: rank 0's step fitted in the FIFO
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                comms[1].allreduce(cp.ones(0, cp.float32))  # launches nothing; raises once failed
            except minincl.InvalidUsage as e:
                assert "mismatched send/recv" in str(e), str(e)
                break
            time.sleep(0.05)
        else:
            pytest.fail("rank 1 never reported the mismatched recv")
    finally:
        for c in comms:
            c.abort()


def test_abort_stops_a_spinning_kernel(cp: Any) -> None:
    """Rank 0 enqueues an allreduce that rank 1 never joins; abort() from another thread ends
    the spinning kernel, its stream drains, and later calls raise an error that says so."""
    comms = minincl.Communicator.init_all(2, device=DEVICE)
    c0 = comms[0]
    try:
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            x = cp.ones(1 << 20, cp.float32)
        c0.allreduce(x, stream=s)  # returns at once; the kernel waits for rank 1
        drained = threading.Event()

        def drain() -> None:
            s.synchronize()
            drained.set()

        waiter = threading.Thread(target=drain, daemon=True)
        waiter.start()
        time.sleep(0.3)
        assert not drained.is_set(), "the allreduce finished without rank 1"
        t0 = time.monotonic()
        aborter = threading.Thread(target=c0.abort)
        aborter.start()
        aborter.join(10)
        waiter.join(10)
        assert drained.is_set(), "abort() did not stop the kernel: its stream never drained"
        assert time.monotonic() - t0 < 10
        # Aborted, or the binding's "destroyed (or aborted)" InvalidUsage once abort() closed it.
        with pytest.raises((minincl.Aborted, minincl.InvalidUsage), match="(?i)abort"):
            c0.allreduce(cp.ones(4, cp.float32), stream=s)
        with s:  # the stream is usable again
            y = cp.arange(5, dtype=cp.float32) * 2
        s.synchronize()
        np.testing.assert_array_equal(cp.asnumpy(y), np.arange(5, dtype=np.float32) * 2)
    finally:
        for c in comms:
            c.destroy()


def test_call_timeout_fails_a_kernel_a_peer_never_joins(cp: Any) -> None:
    """Rank 0 queues an allreduce that rank 1 never makes, with a 0.5 s call timeout: its
    monitor fails the communicator once the kernel has waited that long after it was queued
    (the abort word stops the kernel, so the stream drains), and the next call raises Timeout
    naming the kernel's call and how far each rank got."""
    comms = minincl.Communicator.init_all(2, device=DEVICE)
    c0 = comms[0]
    try:
        assert c0.call_timeout == 0.0  # (no limit by default)
        c0.call_timeout = 0.5
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            x = cp.ones(1000, cp.float32)
        queued = time.monotonic()
        c0.allreduce(x, stream=s)  # returns at once; the kernel waits for rank 1
        s.synchronize()  # ends when the timeout stopped the kernel
        waited = time.monotonic() - queued
        assert 0.45 <= waited < 30, waited
        with pytest.raises(minincl.Timeout) as info:
            c0.allreduce(cp.ones(4, cp.float32), stream=s)
        message = str(info.value)
        assert (
            "call timeout: rank 0's kernel for collective call 1 (allreduce(count=1000, float32, sum)) "
            "has not finished 0.5 s after it was queued" in message
        ), message
        assert "rank 0: 1 collective call(s) made" in message and "rank 1: 0 collective call(s) made" in message, (
            message
        )
    finally:
        for c in comms:
            c.destroy()


def test_call_timeout_lets_finished_kernels_and_graphs_be(cp: Any) -> None:
    """With a call timeout set, hundreds of launches that finish in time (their events reused)
    and a captured graph's replays (not watched) run to the right values, with no error."""
    comms = minincl.Communicator.init_all(2, device=DEVICE)
    try:
        for c in comms:
            c.call_timeout = 30
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            xs = [cp.zeros(257, cp.float32) for _ in comms]
            for i in range(300):  # more than the watch holds at once (256)
                with minincl.group():
                    for c in comms:
                        xs[c.rank].fill(c.rank + i)
                        c.allreduce(xs[c.rank])
            s.synchronize()
            for x in xs:
                np.testing.assert_array_equal(cp.asnumpy(x), np.full(257, 2 * 299 + 1, np.float32))

            def record() -> None:
                with minincl.group():
                    for c in comms:
                        c.allreduce(xs[c.rank])

            graph = captured(s, record)
            for _ in range(3):
                graph.launch(stream=s)
            s.synchronize()
        for x in xs:  # each replay doubles the sum
            np.testing.assert_array_equal(cp.asnumpy(x), np.full(257, (2 * 299 + 1) * 8, np.float32))
        time.sleep(0.05)
        comms[0].allreduce(cp.zeros(0, cp.float32))  # launches nothing; raises if the comm failed
    finally:
        for c in comms:
            c.destroy()


def two_ranks_filled(cp: Any, count: int, scale: int) -> list[Any]:
    """Rank r's array: count float32 elements of scale * (r + 1), for ranks 0 and 1."""
    return [cp.full(count, scale * (r + 1), cp.float32) for r in range(2)]


def test_global_mode_capture_beside_a_watched_kernel(cp: Any) -> None:
    """A capture in CUDA's global mode (torch.cuda.graph's default; CuPy's is relaxed) while
    the monitor watches a queued kernel (call timeout set, rank 1 not called yet) and queries
    its event every tick: the monitor's thread is relaxed about captures, so the capture ends
    well. Calls of both ranks inside it are captured, and the graph replays to the sums."""
    comms = minincl.Communicator.init_all(2, device=DEVICE)
    c0, c1 = comms
    try:
        for c in comms:
            c.call_timeout = 60
        waiting = [cp.cuda.Stream(non_blocking=True) for _ in comms]
        capturing = cp.cuda.Stream(non_blocking=True)
        count = 1000  # (every call the same: the ranks make them in different orders)
        with capturing:
            xs = two_ranks_filled(cp, count, 1)
            ys = two_ranks_filled(cp, count, 10)
        capturing.synchronize()
        c0.allreduce(xs[0], stream=waiting[0])  # queued; waits for rank 1, watched meanwhile
        time.sleep(0.05)

        def record() -> None:
            with minincl.group():
                for c in comms:
                    c.allreduce(ys[c.rank], stream=capturing)
            time.sleep(0.2)  # ~20 monitor ticks, each querying the waiting kernel's event

        graph = captured(capturing, record, mode=cp.cuda.runtime.streamCaptureModeGlobal)
        c1.allreduce(xs[1], stream=waiting[1])
        for s in waiting:
            s.synchronize()
        for _ in range(2):
            graph.launch(stream=capturing)
        capturing.synchronize()
        for r in range(2):
            np.testing.assert_array_equal(cp.asnumpy(xs[r]), np.full(count, 3, np.float32))
            np.testing.assert_array_equal(cp.asnumpy(ys[r]), np.full(count, 60, np.float32))
        comms[0].allreduce(cp.zeros(0, cp.float32))  # launches nothing; raises if the comm failed
    finally:
        for c in comms:
            c.destroy()


def test_global_mode_capture_beside_calls_on_another_thread(cp: Any) -> None:
    """A capture in CUDA's global mode on this thread while another thread makes calls on a
    communicator whose call timeout is set (as the torch backend's always is): each launch is
    watched, and the calling thread queries the earlier launches' events as it records the
    next (LaunchWatch). It queries in relaxed mode, so the capture ends well and its graph
    replays; every call of the other thread sums right."""
    comms = minincl.Communicator.init_all(2, device=DEVICE)
    try:
        for c in comms:
            c.call_timeout = 60
        capturing = cp.cuda.Stream(non_blocking=True)
        streams = [cp.cuda.Stream(non_blocking=True) for _ in comms]
        with capturing:
            z = cp.ones(1000, cp.float32)
        ones = [cp.ones(4096, cp.float32) for _ in comms]
        sums = [cp.zeros(4096, cp.float32) for _ in comms]
        cp.cuda.Device().synchronize()  # (nothing allocates once the capture began)
        calling, stop = threading.Event(), threading.Event()
        calls = [0]
        failed: list[BaseException] = []

        def call_on() -> None:
            try:
                while not stop.is_set():
                    with minincl.group():
                        for c in comms:
                            c.allreduce(ones[c.rank], sums[c.rank], stream=streams[c.rank])
                    calls[0] += 1
                    calling.set()
                for s in streams:
                    s.synchronize()
            except BaseException as e:  # noqa: BLE001 - raised below
                failed.append(e)
                calling.set()

        caller = threading.Thread(target=call_on)
        caller.start()
        try:
            assert calling.wait(30)

            during = [0, 0]  # the other thread's call count as the capture began and ended

            def record() -> None:
                during[0] = calls[0]
                with capturing:
                    cp.multiply(z, 3, out=z)
                time.sleep(0.2)  # the other thread's calls go on meanwhile
                during[1] = calls[0]

            graph = captured(capturing, record, mode=cp.cuda.runtime.streamCaptureModeGlobal)
        finally:
            stop.set()
            caller.join()
        assert not failed, failed
        assert during[1] > during[0], during  # (calls made while it captured)
        graph.launch(stream=capturing)
        capturing.synchronize()
        np.testing.assert_array_equal(cp.asnumpy(z), np.full(1000, 3, np.float32))
        for r in range(2):
            np.testing.assert_array_equal(cp.asnumpy(sums[r]), np.full(4096, 2, np.float32))
    finally:
        for c in comms:
            c.destroy()


def test_a_capture_between_launches_keeps_them_in_order(cp: Any) -> None:
    """Rank 0 queues a call on one stream (rank 1 not called yet), a graph captures a call of
    both ranks on another, then rank 0 queues a call on a third: that one still waits for the
    first (both run on rank 0's channels), as if no capture had come between."""
    comms = minincl.Communicator.init_all(2, device=DEVICE)
    c0, c1 = comms
    try:
        first = [cp.cuda.Stream(non_blocking=True) for _ in comms]
        third = [cp.cuda.Stream(non_blocking=True) for _ in comms]
        capturing = cp.cuda.Stream(non_blocking=True)
        count = 4099  # (every call the same: the ranks make them in different orders)
        with capturing:
            xs = two_ranks_filled(cp, count, 1)
            ys = two_ranks_filled(cp, count, 10)
            gs = two_ranks_filled(cp, count, 100)
        capturing.synchronize()
        c0.allreduce(xs[0], stream=first[0])

        def record() -> None:
            with minincl.group():
                for c in comms:
                    c.allreduce(gs[c.rank], stream=capturing)

        graph = captured(capturing, record)
        c0.allreduce(ys[0], stream=third[0])
        time.sleep(0.05)
        c1.allreduce(xs[1], stream=first[1])
        c1.allreduce(ys[1], stream=third[1])
        for s in first + third:
            s.synchronize()
        graph.launch(stream=capturing)
        capturing.synchronize()
        for r in range(2):
            np.testing.assert_array_equal(cp.asnumpy(xs[r]), np.full(count, 3, np.float32))
            np.testing.assert_array_equal(cp.asnumpy(ys[r]), np.full(count, 30, np.float32))
            np.testing.assert_array_equal(cp.asnumpy(gs[r]), np.full(count, 300, np.float32))
    finally:
        for c in comms:
            c.destroy()


def test_c_api_group_init_of_ranks_on_one_gpu(cp: Any) -> None:
    """mnclCommInitRankDevice of both ranks inside one group, from one thread (the group's end
    makes them together); a grouped allreduce on a CuPy stream gives the sum; finalize waits
    for it."""
    from test_c_api import UniqueId, open_lib

    lib = open_lib()
    uid = UniqueId()
    assert lib.mnclGetUniqueId(ctypes.byref(uid)) == 0
    comms = [ctypes.c_void_p() for _ in range(2)]
    try:
        assert lib.mnclGroupStart() == 0
        for r, c in enumerate(comms):
            assert lib.mnclCommInitRankDevice(ctypes.byref(c), 2, uid, r, int(DEVICE[5:])) == 0
        assert lib.mnclGroupEnd() == 0, lib.mnclGetLastError(None)
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            xs = [cp.full(1000, r + 1, cp.float32) for r in range(2)]
        assert lib.mnclGroupStart() == 0
        for x, c in zip(xs, comms):
            p = ctypes.c_void_p(x.data.ptr)
            assert lib.mnclAllReduce(p, p, ctypes.c_size_t(1000), 7, 0, c, ctypes.c_void_p(s.ptr)) == 0
        assert lib.mnclGroupEnd() == 0, lib.mnclGetLastError(None)
        for c in comms:
            assert lib.mnclCommFinalize(c) == 0, lib.mnclGetLastError(c)
        s.synchronize()
        for x in xs:
            np.testing.assert_array_equal(cp.asnumpy(x), np.full(1000, 3, np.float32))
    finally:
        for c in comms:
            if c:
                lib.mnclCommDestroy(c)


@pytest.mark.parametrize(("nranks", "count"), [(2, BIG), (8, 300_007)])
def test_alltoall_on_every_channel(monkeypatch: pytest.MonkeyPatch, cp: Any, nranks: int, count: int) -> None:
    """Without MININCL_NCHANNELS a rank gets up to 32 channels and a message one per 4 slots
    of it, while one launch holds 56 channel ops: a message takes no more channels than let
    an alltoall's send and receive with every peer fit (these were refused before)."""
    monkeypatch.delenv("MININCL_NCHANNELS", raising=False)
    comms = minincl.Communicator.init_all(nranks, device=DEVICE)
    try:
        check_alltoall(comms, cp, count)
    finally:
        for c in comms:
            c.destroy()
