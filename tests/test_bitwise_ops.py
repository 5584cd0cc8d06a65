"""Bitwise reductions (band, bor, bxor) over the six integer types, against NumPy.

Every reducing collective, out of place and in place, at rank counts 1-8 as threads, under
every algorithm x protocol, and between processes (where receivers read senders' inputs
through the kernel). Inputs are random bits in every byte. Floats are refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import workers
from conftest import (
    ALGOS,
    BITWISE,
    INTEGER_TYPES,
    assert_same,
    counts_for,
    empty,
    forced_env,
    make,
    rank_values,
    reduce_ref,
    run_ranks,
)

import minincl

REDUCING = ["allreduce", "reduce", "reduce_scatter"]


def check(comms: list[Any], coll: str, dtype: str, op: str, count: int) -> None:
    """One call out of place and one in place on every rank; inputs left untouched."""
    n = len(comms)
    root = (count + 1) % n
    block = count * n if coll == "reduce_scatter" else count
    inputs = [rank_values(r, block, dtype, op, seed=count + 17 * n) for r in range(n)]
    want = reduce_ref(inputs, op, dtype)

    def body(c: Any) -> tuple[Any, Any, Any]:
        send, out, inplace = make(inputs[c.rank], dtype), empty(count, dtype), make(inputs[c.rank], dtype)
        if coll == "allreduce":
            c.allreduce(send, out, op=op)
            c.allreduce(inplace, op=op)
        elif coll == "reduce":
            c.reduce(send, out, op=op, root=root)
            c.reduce(inplace, op=op, root=root)
        else:
            c.reduce_scatter(send, out, op=op)
            c.reduce_scatter(inplace, inplace[c.rank * count : (c.rank + 1) * count], op=op)
        return send, out, inplace

    for r, (send, out, inplace) in enumerate(run_ranks(comms, body)):
        assert_same(send, inputs[r], dtype)
        if coll == "reduce_scatter":
            mine = want[r * count : (r + 1) * count]
            assert_same(out, mine, dtype, op)
            assert_same(inplace[r * count : (r + 1) * count], mine, dtype, op)
        elif coll == "allreduce" or r == root:
            assert_same(out, want, dtype, op)
            assert_same(inplace, want, dtype, op)


@pytest.mark.parametrize("op", list(BITWISE))
@pytest.mark.parametrize("nranks", [1, 2, 3, 5, 8])
def test_every_integer_type_and_reducing_collective(comms_of: Any, nranks: int, op: str) -> None:
    comms = comms_of(nranks)
    for dtype in INTEGER_TYPES:
        for count in counts_for(dtype):
            for coll in REDUCING:
                check(comms, coll, dtype, op, count)


@pytest.mark.parametrize("proto", ["simple", "ll", "ll128"])
@pytest.mark.parametrize("algo", list(ALGOS))
def test_every_algorithm_and_protocol(algo: str, proto: str) -> None:
    with forced_env(algo, proto):
        comms = minincl.Communicator.init_all(3)
    try:
        for coll in (c for c in REDUCING if c in ALGOS[algo]):
            for op, dtype in (("band", "uint8"), ("bor", "int32"), ("bxor", "int64")):
                for count in counts_for(dtype):
                    check(comms, coll, dtype, op, count)
    finally:
        for c in comms:
            c.destroy()


def test_between_processes() -> None:
    """3 processes: steps through shared memory, and receivers reading senders' inputs."""
    checks = minincl.launch(workers.bitwise_collectives, 3, [0, 1, 13, 300_007])
    assert checks == [3 * 3 * 4] * 3


@pytest.mark.parametrize("op", list(BITWISE))
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_floats_are_refused(comms_of: Any, op: str, dtype: str) -> None:
    (comm,) = comms_of(1)
    with pytest.raises(minincl.InvalidArgument, match=f"{op} combines integers bit by bit; the data is {dtype}"):
        comm.allreduce(np.ones(4, dtype), op=op)


def test_an_unknown_op_lists_the_bitwise_ones(comms_of: Any) -> None:
    (comm,) = comms_of(1)
    with pytest.raises(minincl.InvalidArgument, match="sum, prod, max, min, avg, band, bor, bxor"):
        comm.allreduce(np.ones(4, np.int32), op="land")


def test_ranks_calling_different_bitwise_ops_is_a_clear_error() -> None:
    comms = minincl.Communicator.init_all(2)  # (its own: a mismatch leaves them failed)

    def body(c: Any) -> str:
        try:
            c.allreduce(np.ones(64, np.int32), op="band" if c.rank == 0 else "bor")
        except minincl.Error as e:
            return str(e)
        return "no error"

    try:
        messages = run_ranks(comms, body)
    finally:
        for c in comms:
            c.destroy()
    assert any("allreduce(count=64, int32, band" in m and "allreduce(count=64, int32, bor" in m for m in messages), (
        messages
    )


C_OPS = {"band": 0x7FFFFFF0, "bor": 0x7FFFFFF1, "bxor": 0x7FFFFFF2}  # mnclBand, mnclBor, mnclBxor
C_TYPES = {"int8": 0, "uint32": 3, "int64": 4}  # mnclInt8, mnclUint32, mnclInt64


@pytest.mark.parametrize("op", list(BITWISE))
def test_c_api_ops(op: str) -> None:
    """mnclBand / mnclBor / mnclBxor through the C API (3 ranks, 1001 elements); a float type
    is refused."""
    from test_premul_sum import CApi

    api = CApi()
    comms = api.comms(3)
    try:
        for dtype, code in C_TYPES.items():
            inputs = [rank_values(r, 1001, dtype, op, seed=5) for r in range(3)]
            outs = [np.zeros(1001, dtype) for _ in range(3)]
            run_ranks([0, 1, 2], lambda r: api.check(api.allreduce(comms[r], inputs[r], outs[r], code, C_OPS[op])))
            want = reduce_ref(inputs, op, dtype)
            for o in outs:
                assert_same(o, want, dtype, op)
        x = np.ones(4, np.float32)
        assert f"{op} combines integers bit by bit" in api.error(api.allreduce(comms[0], x, x.copy(), 7, C_OPS[op]))
    finally:
        for c in comms:
            api.lib.mnclCommDestroy(c)
