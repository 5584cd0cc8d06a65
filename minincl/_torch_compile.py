"""Keeps torch.compile's dynamo out of the backend's own Python code.

torch 2.13 lets compiled code see a ``ProcessGroup`` only as an opaque object with a few
members (``size``, ``rank``, ``group_name``, ...). Where dynamo runs a collective it cannot
turn into a functional one, it graph-breaks and runs the call: for gloo's and NCCL's groups,
C++ code; for this Python group, a Python frame, which dynamo then tries to compile, and its
first look at ``self._comms`` was a hard error (``UnsafeScriptObjectError``) instead of a
graph break. So ``torch.compile(DDP(model))`` failed on its first forward (DDP's C++ reducer
broadcasts from there), and so did a compiled function calling ``dist.broadcast``,
``dist.barrier``, a send or any ``async_op=True`` call.

Each function of the backend's classes is marked for dynamo to skip, with the frames it
calls: through the code object's execution strategy, which costs nothing per call and
imports nothing (torch.compiler.disable wraps each call, ~0.4 us, and imports dynamo,
~0.9 s), or, where a torch lacks it, through torch.compiler.disable.
"""

from __future__ import annotations

import inspect
from typing import Any, TypeVar

import torch

Class = TypeVar("Class", bound=type)


def _skip_strategy() -> Any | None:
    """A code execution strategy that skips a frame and every frame it calls; None if this
    torch has no such thing."""
    try:
        from torch._C._dynamo import eval_frame

        action = eval_frame._FrameAction.SKIP
        return eval_frame.set_code_exec_strategy, eval_frame._FrameExecStrategy(action, action)
    except (ImportError, AttributeError, TypeError):
        return None


_SKIP = _skip_strategy()


def outside_compiled_code(cls: Class) -> Class:
    """Marks every function defined in `cls` (methods, and the functions of its static and
    class methods) for dynamo to skip, with what they call."""
    for name, member in list(vars(cls).items()):
        fn = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
        if not inspect.isfunction(fn) or fn.__module__ != cls.__module__:
            continue  # (a decorator's wrapper is shared by every function it wraps, elsewhere too)
        if _SKIP is not None:
            set_strategy, strategy = _SKIP
            set_strategy(fn.__code__, strategy)
        elif not isinstance(member, (staticmethod, classmethod)):
            setattr(cls, name, torch.compiler.disable(fn, recursive=True))
    return cls
