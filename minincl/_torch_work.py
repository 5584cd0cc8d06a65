"""Works and lanes for the torch.distributed backend (see minincl.torch).

A *lane* runs one communicator's operations in the order they were issued, which is the order
every rank must use. On the CPU a lane is a worker thread, so ``async_op=True`` really
overlaps with the caller (minincl releases the GIL while it moves data). On a GPU, minincl
already queues work on the caller's current CUDA stream and returns at once, so the lane
runs the job inline, in the caller's thread (the stream is thread-local in PyTorch).
"""

from __future__ import annotations

import queue
import threading
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from .errors import Timeout

Job = Callable[[], None]


class MinincclWork(dist._Work):  # type: ignore[misc, name-defined]
    """What an operation of the minincl process group returns.

    ``wait()`` blocks until the operation ran and re-raises its error (a ``minincl.RemoteError``
    when a peer died, ...). ``get_future()`` gives the ``torch.futures.Future`` that DDP chains
    its callbacks on; its value is the list of output tensors, as with gloo and NCCL.
    ``start`` (for deferred point-to-point ops) is called before anything waits on the work.
    """

    def __init__(
        self,
        outputs: list[torch.Tensor],
        start: Callable[[], None] | None = None,
        devices: list[torch.device] | None = None,
    ) -> None:
        super().__init__()
        self._outputs = outputs
        self._start = start
        self._done = threading.Event()
        self._error: BaseException | None = None
        # A CUDA future records an event on the current stream when completed, so that
        # whoever uses the value later waits for the GPU work, not just for the host.
        self._future: torch.futures.Future[Any] = torch.futures.Future(devices=devices or None)

    def _ensure_started(self) -> None:
        start, self._start = self._start, None
        if start is not None:
            start()

    def _finish(self, error: BaseException | None) -> None:
        self._error = error
        if error is None:
            self._future.set_result(self._outputs)
        else:
            self._future.set_exception(error)
        self._done.set()

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        self._ensure_started()
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        # torch passes timedelta(0) for "no timeout"; minincl's own timeouts and its
        # peer-death detection keep a wait without a limit from hanging forever.
        if not self._done.wait(seconds if seconds else None):
            raise Timeout(f"minincl process group: the operation did not finish within {seconds} s")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        self._ensure_started()
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def get_future(self) -> torch.futures.Future[Any]:
        self._ensure_started()
        return self._future

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._outputs

    def synchronize(self) -> None:
        self.wait()


def _run(job: Job, works: list[MinincclWork]) -> None:
    try:
        job()
    except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the works
        for w in works:
            w._finish(e)
        return
    for w in works:
        w._finish(None)


class Lane:
    """Runs jobs one at a time in submission order: on a worker thread, or inline."""

    def __init__(self, name: str, inline: bool) -> None:
        self._name = name
        self._inline = inline
        self._jobs: queue.SimpleQueue[tuple[Job, list[MinincclWork]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, job: Job, works: list[MinincclWork]) -> None:
        if self._inline:
            _run(job, works)
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
        self._jobs.put((job, works))

    def _loop(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            _run(*item)

    def close(self) -> None:
        """Lets queued jobs finish, then stops the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            thread.join()
