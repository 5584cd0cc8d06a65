"""Shared test helpers: ranks as threads of this process, NumPy references."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

# Small FIFO slots and two channels, so modest counts already cross slot and channel
# boundaries (set before any communicator exists; the C++ side reads them at init).
os.environ.setdefault("MININCL_SIMPLE_SLOT_BYTES", "16K")
os.environ.setdefault("MININCL_LL_SLOT_LINES", "64")
os.environ.setdefault("MININCL_LL128_SLOT_LINES", "16")
os.environ.setdefault("MININCL_NCHANNELS", "2")

from workers import run_ranks  # noqa: F401 - shared with the rank processes' functions

import minincl

try:
    import torch
except ImportError:  # pragma: no cover - CI installs torch
    torch = None


@pytest.fixture(autouse=True)
def no_group_left_open() -> Iterator[None]:
    """A test that leaves a group open on this thread turns every later call on it into a
    recorded one (one such failure once failed 27 tests after it): end it, and fail the test
    that left it."""
    yield
    depth = minincl._core._group_depth()
    for _ in range(depth):
        with contextlib.suppress(minincl.Error):
            minincl._core.group_end()
    if depth:
        pytest.fail(f"the test left {depth} group(s) open on this thread")


SLOT_BYTES = 16 * 1024
NCHANNELS = 2

DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64"]
OPS = ["sum", "prod", "max", "min", "avg"]
# The collectives each algorithm implements, and the protocols every one runs under.
ALGOS = {
    "ring": ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter"],
    "tree": ["allreduce", "broadcast", "reduce"],
    "direct": ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter"],
}
PROTOS = ["simple", "ll", "ll128"]
INTEGER_TYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64"]
BITWISE = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}  # integers only
# All ten types, each with an op that exercises it.
TYPES_OPS = [
    ("int8", "sum"),
    ("uint8", "prod"),
    ("int32", "avg"),
    ("uint32", "min"),
    ("int64", "bxor"),
    ("uint64", "max"),
    ("float16", "max"),
    ("bfloat16", "sum"),
    ("float32", "avg"),
    ("float64", "sum"),
]


@contextlib.contextmanager
def env_as(values: dict[str, str | None]) -> Iterator[None]:
    """These environment variables as given (None: unset) inside the block, as they were
    afterwards (the C++ side reads its settings when a communicator is made)."""
    saved = {k: os.environ.get(k) for k in values}

    def put(vals: dict[str, str | None]) -> None:
        for k, v in vals.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    put(values)
    try:
        yield
    finally:
        put(saved)


def forced_env(algo: str | None, proto: str | None) -> contextlib.AbstractContextManager[None]:
    """MININCL_ALGO / MININCL_PROTO as given (None: unset) while communicators are made."""
    return env_as({"MININCL_ALGO": algo, "MININCL_PROTO": proto})


class CommPool:
    """One group of thread-ranks per size, reused across tests; rebuilt after a failure."""

    def __init__(self) -> None:
        self._groups: dict[int, list[minincl.Communicator]] = {}

    def get(self, nranks: int) -> list[minincl.Communicator]:
        group = self._groups.get(nranks)
        if group is None or any(c.destroyed for c in group):
            group = minincl.Communicator.init_all(nranks)
            self._groups[nranks] = group
        return group

    def discard(self, nranks: int) -> None:
        for c in self._groups.pop(nranks, []):
            c.destroy()

    def close(self) -> None:
        for n in list(self._groups):
            self.discard(n)


@pytest.fixture(scope="session")
def pool() -> Any:
    p = CommPool()
    yield p
    p.close()


_CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Notes on the test item whether its body failed (comms_of reads it)."""
    report = yield
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    return report


@pytest.fixture
def comms_of(pool: CommPool, request: pytest.FixtureRequest) -> Any:
    """comms_of(n) -> n thread-rank communicators; discarded if the test fails."""
    used: list[int] = []

    def get(n: int) -> list[minincl.Communicator]:
        used.append(n)
        return pool.get(n)

    yield get
    # A failed test may leave its group failed (a peer's error stored) or destroyed: the next
    # test gets a new one.
    failed = request.node.stash.get(_CALL_FAILED, True)
    for n in used:
        group = pool._groups.get(n)
        if group is not None and (failed or any(c.destroyed for c in group)):
            pool.discard(n)


# ---- arrays of every type; bfloat16 through PyTorch (NumPy has none) ----


def needs(dtype: str) -> None:
    if dtype == "bfloat16" and torch is None:
        pytest.skip("bfloat16 arrays need PyTorch")


def make(values: np.ndarray, dtype: str) -> Any:
    """An array of `dtype` holding `values` (small integers, exact in every type)."""
    if dtype == "bfloat16":
        assert torch is not None
        return torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16)
    return values.astype(dtype)


def empty(count: int, dtype: str) -> Any:
    if dtype == "bfloat16":
        assert torch is not None
        return torch.full((count,), -7.0, dtype=torch.bfloat16)
    return np.full(count, 99, dtype=dtype)


def as_numpy(a: Any) -> np.ndarray:
    if torch is not None and isinstance(a, torch.Tensor):
        return a.to(torch.float32).numpy() if a.dtype == torch.bfloat16 else a.numpy()
    return np.asarray(a)


def ref_dtype(dtype: str) -> Any:
    return np.float32 if dtype == "bfloat16" else np.dtype(dtype)


def rank_values(rank: int, count: int, dtype: str, op: str, seed: int = 0) -> np.ndarray:
    """Inputs whose reductions are exact in every type: small integers; for prod, powers of
    two and signs only; for bitwise ops, random bits in every byte (of the type itself)."""
    rng = np.random.default_rng(1000 * seed + rank)
    if op in BITWISE:
        return rng.integers(0, 256, size=count * np.dtype(dtype).itemsize, dtype=np.uint8).view(dtype)
    unsigned = dtype.startswith("uint")
    if op == "prod":
        choices = np.array([1, 2, 1] if unsigned else [1, 2, -1])
    else:
        choices = np.arange(0, 4) if unsigned else np.arange(-3, 4)
    return rng.choice(choices, size=count).astype(np.int64)


def reduce_ref(inputs: list[np.ndarray], op: str, dtype: str) -> np.ndarray:
    """NumPy's answer, in the type's own arithmetic (integers wrap), an integer avg truncating
    as C does; a float avg summed exactly (its partial sums round: see assert_same)."""
    n = len(inputs)
    rd = ref_dtype(dtype)
    stack = np.stack([x.astype(rd) for x in inputs])
    if op in BITWISE:
        return BITWISE[op].reduce(stack, axis=0)
    if op == "sum":
        return np.add.reduce(stack, axis=0, dtype=rd)
    if op == "prod":
        return np.multiply.reduce(stack, axis=0, dtype=rd)
    if op == "max":
        return stack.max(axis=0)
    if op == "min":
        return stack.min(axis=0)
    if not np.issubdtype(rd, np.integer):  # each input times 1/n rounded to the type, then summed (as NCCL)
        terms = stack * np.dtype(rd).type(1.0 / n)
        return np.add.reduce(terms.astype(np.float64), axis=0).astype(rd)
    total = np.add.reduce(stack, axis=0, dtype=rd)
    wide = total.astype(np.int64) if np.issubdtype(rd, np.signedinteger) else total.astype(np.uint64)
    q = np.abs(wide.astype(np.float64)) // n * np.sign(wide.astype(np.float64))
    return q.astype(rd)


def assert_same(got: Any, want: np.ndarray, dtype: str, op: str = "sum") -> None:
    g = as_numpy(got).reshape(-1)
    w = np.asarray(want).reshape(-1)
    assert g.shape == w.shape, f"shape {g.shape} != {w.shape}"
    if op == "avg" and dtype in ("float16", "bfloat16", "float32", "float64"):
        rtol = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-6, "float64": 1e-12}[dtype]
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=rtol)
    else:
        np.testing.assert_array_equal(g, w.astype(g.dtype))


def counts_for(dtype: str) -> list[int]:
    """0, 1, 7, and a prime count above one FIFO slot times the channel count."""
    item = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
    above = SLOT_BYTES * NCHANNELS // item
    prime = next(p for p in range(above + 1, above + 1000) if all(p % d for d in range(2, int(p**0.5) + 1)))
    return [0, 1, 7, prime]


def skip_without_cross_memory_attach(results: list[tuple[Any, dict[str, int]]], nranks: int) -> None:
    """Skips a test of rank processes (results: (anything, stats()) per rank) where this
    kernel keeps sibling processes from reading each other's memory."""
    if any(stats["readable_peers"] != nranks - 1 for _, stats in results):
        pytest.skip("this kernel does not let sibling processes read each other's memory (cross-memory attach)")
