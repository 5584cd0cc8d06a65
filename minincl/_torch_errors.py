"""minincl's errors, as the torch backend raises them: each is also a
``torch.distributed.DistBackendError``, what code written for NCCL catches when a collective
fails (a dead peer, a timeout, an abort), while ``except minincl.Timeout`` still works.
Argument errors stay as they are (``minincl.InvalidArgument`` is a ``ValueError``)."""

from __future__ import annotations

import re

import torch.distributed as dist

from . import errors


class Error(errors.Error, dist.DistBackendError):
    """A minincl.Error raised by the torch backend."""


class InvalidUsage(errors.InvalidUsage, dist.DistBackendError):
    """A minincl.InvalidUsage raised by the torch backend (mismatched calls across ranks, ...)."""


class SystemError(errors.SystemError, dist.DistBackendError):
    """A minincl.SystemError raised by the torch backend."""


class RemoteError(errors.RemoteError, dist.DistBackendError):
    """A minincl.RemoteError raised by the torch backend."""


class Timeout(errors.Timeout, dist.DistBackendError):
    """A minincl.Timeout raised by the torch backend."""


class Aborted(errors.Aborted, dist.DistBackendError):
    """A minincl.Aborted raised by the torch backend."""


_AS_BACKEND_ERROR: dict[type[BaseException], type[BaseException]] = {
    errors.Error: Error,
    errors.InvalidUsage: InvalidUsage,
    errors.SystemError: SystemError,
    errors.RemoteError: RemoteError,
    errors.Timeout: Timeout,
    errors.Aborted: Aborted,
}


# Advice in minincl's messages that a torch program follows in torch's terms.
_IN_TORCH_TERMS = {
    "(sendrecv, or one minincl.group())": "(dist.batch_isend_irecv, or isend and irecv before either wait)",
}


# Calls whose tensors the backend passes as bytes (one path for every dtype): minincl's
# messages about them count bytes, which a torch program did not write. (A sparse all_reduce
# gathers int64 indices: those counts are elements.)
_CALLS_OF_BYTES = re.compile(r"(broadcast|allgather|alltoall)\(count=\d+, uint8")
_BYTES_NOTE = (
    " [the torch backend passes broadcast, all_gather and all_to_all tensors as bytes: these counts are bytes]"
)


# Sends and receives go as bytes too (they pair by bytes): their sizes, said in bytes alone.
_BYTES_AS_UINT8 = re.compile(r"(\d+) uint8 \(\1 bytes\)")


def _in_torch_terms(args: tuple[object, ...], note: str) -> tuple[object, ...]:
    if not args or not isinstance(args[0], str):
        return args
    message = args[0]
    for minincls, torchs in _IN_TORCH_TERMS.items():
        message = message.replace(minincls, torchs)
    if "mismatched calls" in message and _CALLS_OF_BYTES.search(message):
        message += _BYTES_NOTE
    if "mismatched send/recv" in message:
        message = _BYTES_AS_UINT8.sub(r"\1 bytes", message)
    return (message + note, *args[1:])


def global_ranks_note(group_ranks: list[int]) -> str:
    """What to add to the messages of a group whose ranks are not the global ones: minincl
    names a communicator's own ranks, and a subgroup's rank 1 may be global rank 3."""
    if group_ranks == list(range(len(group_ranks))):
        return ""
    n, shown = len(group_ranks), min(len(group_ranks), 16)
    which = f"0-{shown - 1}" + (f" (of {n})" if n > shown else "")
    globals_ = ", ".join(map(str, group_ranks[:shown]))
    return f" [rank numbers here are this process group's: its ranks {which} are global ranks {globals_}]"


def as_backend_error(error: BaseException, note: str = "") -> BaseException:
    """`error` as its DistBackendError flavour, with the same message (its advice in torch's
    terms, `note` after it) and traceback (anything else, returned as it is)."""
    flavour = _AS_BACKEND_ERROR.get(type(error))
    if flavour is None:
        return error
    same = flavour(*_in_torch_terms(error.args, note))
    same.__cause__, same.__context__ = error.__cause__, error.__context__
    return same.with_traceback(error.__traceback__)
