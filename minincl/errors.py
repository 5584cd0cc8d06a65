"""Exceptions raised by minincl. Every message says what was wrong and what to do."""


class Error(RuntimeError):
    """Base class of every minincl error."""


class InvalidArgument(Error, ValueError):
    """A call got an argument it cannot use (wrong type, size, root, peer, ...)."""


class InvalidUsage(Error):
    """A call that is not allowed in the current state (destroyed communicator, mismatched
    calls across ranks, ...)."""


class SystemError(Error):
    """A call to the operating system failed."""


class RemoteError(Error):
    """A peer failed, was aborted, or went away."""


class Timeout(Error, TimeoutError):
    """A peer did not answer in time (MININCL_TIMEOUT, or MININCL_BOOTSTRAP_TIMEOUT at init), or
    a call lasted longer than its communicator's ``call_timeout`` (its peers alive but elsewhere)."""


class Aborted(Error):
    """The communicator was aborted while the call was running."""


__all__ = ["Aborted", "Error", "InvalidArgument", "InvalidUsage", "RemoteError", "SystemError", "Timeout"]
