"""Tensor plumbing for the torch.distributed backend: dtypes, reduction ops, staging.

minincl reads PyTorch tensors directly, but only contiguous ones of its twelve element
types. Staging hands it a contiguous, detached tensor (a copy when needed) and copies
results back into the caller's tensor afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import torch
from torch.distributed import ReduceOp

from ._core import PreMulSum

REDUCIBLE_DTYPES = frozenset(
    {
        torch.int8,
        torch.uint8,
        torch.int32,
        torch.uint32,  # (torch itself barely computes on these two; minincl reduces them)
        torch.int64,
        torch.uint64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.float8_e4m3fn,  # 8-bit floats reduce as NCCL's do: in float, rounded and saturated
        torch.float8_e5m2,
    }
)

# By ReduceOp.RedOpType's value: a dict lookup on the enum itself took ~0.4 us (its hash and
# equality are Python-level), comparing ReduceOps one by one ~3 us.
_OPS = {
    ReduceOp.SUM.value: "sum",
    ReduceOp.PRODUCT.value: "prod",
    ReduceOp.MAX.value: "max",
    ReduceOp.MIN.value: "min",
    ReduceOp.AVG.value: "avg",
    ReduceOp.BAND.value: "band",
    ReduceOp.BOR.value: "bor",
    ReduceOp.BXOR.value: "bxor",
}
_BITWISE = ("band", "bor", "bxor")
# On booleans, as NCCL does: "any" and "all" through the byte values 0 and 1 (on which the
# bitwise ops are the logical ones).
_BOOL_OPS = {"sum": "max", "prod": "min", "max": "max", "min": "min", "band": "band", "bor": "bor", "bxor": "bxor"}


Op = Union[str, PreMulSum]  # what minincl's reducing calls take as op


def _named(kind: object) -> str | None:
    """minincl's name for a ReduceOp.RedOpType that needs nothing but its name."""
    return _OPS.get(kind.value) if isinstance(kind, ReduceOp.RedOpType) else None


def op_name(op: object, call: str) -> Op:
    """torch's ReduceOp -> minincl's op; a clear NotImplementedError for the rest."""
    kind = getattr(op, "op", op)  # (a ReduceOp holds its RedOpType)
    name = _named(kind)
    if name is not None:
        return name
    if kind == ReduceOp.PREMUL_SUM:  # dist._make_nccl_premul_sum(factor)
        factor = getattr(op, "factor", None)
        if isinstance(factor, (int, float, torch.Tensor)):
            return PreMulSum(factor)  # (a tensor: see reducible)
    label = str(kind).split(".")[-1]
    raise NotImplementedError(
        f"minincl backend: {call} with ReduceOp.{label} is not supported; "
        "use SUM, PRODUCT, MAX, MIN, AVG, BAND, BOR, BXOR or PREMUL_SUM (dist._make_nccl_premul_sum)"
    )


def plain_op(op: Any, dtype: torch.dtype) -> str | None:
    """The name of `op` where minincl reduces `dtype` with it as it is (none of reducible()'s
    conversions or refusals apply); None for everything else (op_name and reducible say
    what to do)."""
    name = _named(getattr(op, "op", None))
    if name is None or dtype not in REDUCIBLE_DTYPES or (name in _BITWISE and dtype.is_floating_point):
        return None
    return name


def reducible(t: torch.Tensor, op: Op, call: str) -> tuple[torch.Tensor, Op]:
    """The tensor and op minincl reduces; booleans become bytes with any/all."""
    if t.dtype == torch.bool:
        if not isinstance(op, str) or op not in _BOOL_OPS:
            raise NotImplementedError(f"minincl backend: {call} with op {op} on bool tensors")
        return t.view(torch.uint8), _BOOL_OPS[op]
    if op in _BITWISE and (t.dtype.is_floating_point or t.dtype.is_complex):
        raise TypeError(
            f"minincl backend: {call} with ReduceOp.{str(op).upper()} needs integer or bool tensors, not {t.dtype}"
        )
    if t.dtype.is_complex:
        t = complex_as_real(t, op, call)
    if t.dtype not in REDUCIBLE_DTYPES:
        raise TypeError(
            f"minincl backend: {call} cannot reduce {t.dtype} tensors; supported: int8, uint8, "
            "int32, uint32, int64, uint64, float16, bfloat16, float32, float64, float8_e4m3fn, float8_e5m2, bool, "
            "and complex64, complex128 with SUM, AVG or PREMUL_SUM (a real factor)"
        )
    if isinstance(op, PreMulSum) and isinstance(op.scalar, torch.Tensor):
        # A factor tensor of the data's type and device is read where it lies when the
        # operation runs; any other becomes a number (.item() waits for a CUDA tensor's stream).
        f = op.scalar
        same = f.dtype == t.dtype and f.device == t.device and f.numel() == 1
        op = PreMulSum(f.reshape(1) if same else f.item())
    return t, op


def complex_as_real(t: torch.Tensor, op: Op, call: str) -> torch.Tensor:
    """A complex tensor as its real and imaginary parts, which SUM, AVG and a real PREMUL_SUM
    reduce one by one (as torch's all_reduce does for every backend); the other ops do not
    act on complex numbers part by part."""
    factor = op.scalar if isinstance(op, PreMulSum) else None
    complex_factor = isinstance(factor, complex) or (isinstance(factor, torch.Tensor) and factor.is_complex())
    real_factor = isinstance(op, PreMulSum) and not complex_factor
    if op not in ("sum", "avg") and not real_factor:
        label = "PREMUL_SUM with a complex factor" if isinstance(op, PreMulSum) else f"ReduceOp.{str(op).upper()}"
        raise TypeError(
            f"minincl backend: {call} with {label} on {t.dtype} tensors: complex numbers reduce with SUM, AVG "
            "or PREMUL_SUM by a real factor"
        )
    return torch.view_as_real(t)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 1 else t.reshape(-1)  # (a reshape costs ~0.7 us of an 8-byte call)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat byte view: copy-only collectives then move any element type. (Every path of a
    call must move the same bytes in the same type on every rank, whichever path each rank
    takes: a rank's typed call would not match another's bytes.)"""
    flat = _flat(t)
    if flat.numel() == 0:  # (an empty tensor may have stride 0, torch.from_numpy's, which view() refuses)
        return flat.new_empty(0, dtype=torch.uint8)
    return flat.view(torch.uint8)


@dataclass
class Staged:
    """``buf`` is what minincl reads and writes: contiguous and detached.

    ``origin`` is the caller's tensor when ``buf`` is a copy of it, so that results can
    be copied back (only for tensors that receive data). ``refusal``: why they cannot be (its
    elements share memory), raised once the call has run, so that the other ranks' call
    still meets this one's and the group stays in step (as gloo's does).
    """

    buf: torch.Tensor
    origin: torch.Tensor | None = None
    refusal: str | None = None

    def finish(self) -> None:
        if self.refusal is not None:
            raise ValueError(self.refusal)
        if self.origin is not None:
            self.origin.copy_(self.buf)


def stage(t: torch.Tensor, receives: bool = True) -> Staged:
    if t.layout != torch.strided:
        raise TypeError(
            f"minincl backend: a {t.layout} tensor; minincl's calls take dense (strided) tensors: "
            "convert it (.to_dense()); all_reduce also takes sparse COO tensors"
        )
    d = t.detach()  # minincl refuses to write behind autograd's back; a detached alias is fine
    if d.is_neg():  # (a negated view's memory holds the negations: stage the values themselves)
        return Staged(d.resolve_neg().contiguous(), d if receives else None)
    if d.is_contiguous():
        return Staged(d)
    if receives and (refusal := overlap_refusal(d)) is not None:
        return Staged(d.contiguous(), d, refusal)
    return Staged(d.contiguous(), d if receives else None)


def overlap_refusal(out: torch.Tensor) -> str | None:
    """Why results cannot be written into `out` (its elements share memory), or None."""
    if torch._debug_has_internal_overlap(out) != 1:  # (1: some elements share memory)
        return None
    return (
        f"minincl backend: an output tensor (shape {tuple(out.shape)}, strides {out.stride()}) whose elements "
        "share memory, as an expand()ed one's do: the results would overwrite each other, so this rank's "
        "were not written (the call ran, and the other ranks have theirs); give a tensor with memory of its "
        "own (.clone())"
    )


def finish_all(staged: list[Staged]) -> None:
    for s in staged:
        s.finish()
