"""The short forms of torch's ProcessGroup methods, turned into their full forms.

torch calls a backend as ``pg.allreduce(tensors, opts)``: lists of tensors and an options
object. Its C++ ProcessGroup also offers Python overloads with a single tensor and loose
arguments, ``pg.allreduce(tensor, op)`` or ``pg.broadcast(tensor, root)``, and torch itself
uses one: DDP's joined rank (``Join`` with ``find_unused_parameters``) calls
``process_group.allreduce(tensor)``. A process group written in Python replaces every overload
of a method with its one method, so each method of ProcessGroupMinincl passes what it got
through here. A per-call ``timeout`` of the short forms is accepted and not used: the group's
timeout (``init_process_group(timeout=)``) applies to every call.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

_LOOSE = (int, timedelta, ReduceOp, ReduceOp.RedOpType)  # (what stands where options would)


def listed(tensors: Any) -> list[torch.Tensor]:
    """A tensor list, from a list or a single tensor."""
    return [tensors] if isinstance(tensors, torch.Tensor) else tensors


def one_each(many: Any, one: Any) -> tuple[Any, Any]:
    """(`many`, `one`) each in a list of one entry where `one` is a single tensor: the short
    forms of allgather and gather (a list of outputs, one input) and of scatter and
    reduce_scatter (a list of inputs, one output)."""
    return ([many], [one]) if isinstance(one, torch.Tensor) else (many, one)


def options(given: Any, make: Callable[[], Any], **fields: Any) -> Any:
    """`given` if it is an options object, else a new one with those of `fields` that are set."""
    if given is not None and not isinstance(given, _LOOSE):
        return given
    opts = make()
    for name, value in fields.items():
        if value is not None:
            setattr(opts, name, value)
    return opts


def reduce_op(given: Any, op: Any) -> Any:
    """The reduction a short form names: positionally where options would be, or as ``op=``."""
    return given if isinstance(given, (ReduceOp, ReduceOp.RedOpType)) else op


def root_rank(given: Any, root: int | None) -> int | None:
    """The root a short form names: positionally where options would be, or as ``root=``."""
    return given if isinstance(given, int) and not isinstance(given, bool) else root


def allreduce(tensors: Any, opts: Any, op: Any) -> tuple[list[torch.Tensor], Any]:
    return listed(tensors), options(opts, dist.AllreduceOptions, reduceOp=reduce_op(opts, op))


def broadcast(tensors: Any, opts: Any, root: int | None) -> tuple[list[torch.Tensor], Any]:
    return listed(tensors), options(opts, dist.BroadcastOptions, rootRank=root_rank(opts, root))


def reduce(tensors: Any, opts: Any, op: Any, root: int | None) -> tuple[list[torch.Tensor], Any]:
    """``pg.reduce(tensor, root, op)``: the root stands where options would, the op after it."""
    return listed(tensors), options(opts, dist.ReduceOptions, rootRank=root_rank(opts, root), reduceOp=op)


def rooted(opts: Any, root: int | None, make: Callable[[], Any]) -> Any:
    """gather's and scatter's options."""
    return options(opts, make, rootRank=root_rank(opts, root))
