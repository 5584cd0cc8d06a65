"""Works and lanes for the torch.distributed backend (see minincl.torch).

A *lane* runs one communicator's operations in the order they were issued, which is the order
every rank must use. On the CPU a lane is a worker thread, so ``async_op=True`` really
overlaps with the caller (minincl releases the GIL while it moves data). On a GPU, minincl
already queues work on the caller's current CUDA stream and returns at once, so the lane
runs the job inline, in the caller's thread (the stream is thread-local in PyTorch). A CPU
call made without ``async_op`` also runs in the caller's thread when nothing is queued before
it: torch waits on it at once, and the hand-off to the worker and back cost ~40 us.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from . import errors
from ._torch_compile import outside_compiled_code
from ._torch_errors import Timeout, as_backend_error

Job = Callable[[], None]


# Guards the event and future each work makes only when needed: making them for every call
# cost ~5 us of an 8-byte all_reduce's ~25 (a threading.Event alone ~3.5 us).
_LAZY = threading.Lock()


@outside_compiled_code
class MinincclWork(dist._Work):
    """What an operation of the minincl process group returns.

    ``wait()`` blocks until the operation ran and re-raises its error (a ``minincl.RemoteError``
    when a peer died, ...; each also a ``torch.distributed.DistBackendError``, as NCCL raises);
    a GPU op is done when its kernels are queued, and ``wait()`` orders the caller's current
    stream after them, as NCCL's does.
    ``get_future()`` gives the ``torch.futures.Future`` that DDP chains its callbacks on; its
    value is the list of output tensors, as with gloo and NCCL, and an error fails it as theirs
    do (``wait()`` on it raises ``RuntimeError`` naming the error). A future asked for before
    the operation ended is completed by a job queued on the work's lane then: its callbacks,
    which may make calls (as PowerSGD's DDP hook does), run after every call made before
    ``get_future()``, on every rank, as they do where the operation had ended by then (they
    ran right after the operation, ahead of calls made in between, on the ranks where it had
    not: the ranks then paired their calls wrongly).
    ``start`` is called before anything waits on the work, each time: it starts the deferred
    point-to-point ops (this one's, and those the waiting thread posted since on any group);
    its argument is the work when a ``wait()`` without a time limit calls it, which waits on
    the work at once (so its ops may run on the waiting thread), else None.
    """

    def __init__(
        self,
        outputs: list[torch.Tensor],
        start: Callable[[MinincclWork | None], None] | None = None,
        devices: list[torch.device] | None = None,
        ranks_note: Callable[[], str] | None = None,
        stream: torch.cuda.Stream | None = None,
    ) -> None:
        super().__init__()
        self._outputs = outputs
        self._stream = stream  # a GPU op: the stream its kernels are queued on
        self._start = start
        self._ranks_note = ranks_note  # what an error adds: which global ranks the group's are
        # A CUDA future records an event on the current stream when completed, so that
        # whoever uses the value later waits for the GPU work, not just for the host.
        self._devices = devices
        self._done = False
        self._error: BaseException | None = None
        self._event: threading.Event | None = None  # made by a wait() that comes before the end
        self._future: torch.futures.Future[Any] | None = None  # made by get_future(): the outcome comes in here
        self._given: torch.futures.Future[Any] | None = None  # and goes out through this one (see get_future)
        self._source: list[int] = []  # a receive from any source: the rank it received from
        self._lane: Lane | None = None  # where its job was queued (see get_future)
        self._completing = False  # a job on the lane completes the future (get_future)

    def _ensure_started(self, waited: bool = False) -> None:
        """Starts the deferred ops, every time: a send posted after an earlier wait, poll or
        get_future on this work must start before the next wait on it (its receiver may need
        it first)."""
        if self._start is not None:
            self._start(self if waited else None)

    def _finish(self, error: BaseException | None) -> None:
        if error is not None:
            error = as_backend_error(error, self._ranks_note() if self._ranks_note else "")
        with _LAZY:
            if self._done:  # (a QueuedWork's outcome may reach it twice: its waiter, its lane)
                return
            self._error = error
            self._done = True
            # (The outcome's future lets go of the work once completed: the error it holds
            # leads back here through its traceback, a cycle the collector cannot see into.)
            event, future = self._event, None
            if not self._completing:  # (else the lane's job completes it: get_future)
                future, self._future = self._future, None
        if future is not None:
            self._complete(future)
        if event is not None:
            event.set()

    def _complete(self, future: torch.futures.Future[Any]) -> None:
        if self._error is None:
            future.set_result(self._outputs)
        else:
            future.set_exception(self._error)

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        # torch passes timedelta(0) for "no timeout"; minincl's own timeouts and its
        # peer-death detection keep a wait without a limit from hanging forever.
        seconds = seconds or None
        self._ensure_started(waited=seconds is None)  # (with a limit, the ops must run elsewhere)
        if not self._done and not self._ended_within(seconds):
            raise Timeout(f"minincl process group: the operation did not finish within {seconds} s")
        if self._error is not None:
            raise self._error
        if self._stream is not None:
            # The host only queued the GPU op: as NCCL's wait(), order the caller's current
            # stream after it (the op may have been issued under another stream).
            current = torch.cuda.current_stream(self._stream.device)
            if current != self._stream:
                current.wait_stream(self._stream)
        return True

    def _ended_within(self, seconds: float | None) -> bool:
        """Waits for the end, up to `seconds` (None: as long as it takes); whether it came."""
        with _LAZY:
            if not self._done and self._event is None:
                self._event = threading.Event()
            event = None if self._done else self._event
        return event is None or event.wait(seconds)

    def is_completed(self) -> bool:
        self._ensure_started()
        return self._done

    def is_success(self) -> bool:
        return self._done and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def get_future(self) -> torch.futures.Future[Any]:
        """The future given out is chained on the one the outcome completes. Future.set_exception
        completes a future *successfully*, with the exception as its value, where C++ looks:
        DDP's reducer took that value for the output tensors and crashed (SIGSEGV) when a peer
        died. An exception in a `then` callback fails the chained future itself, as gloo's
        and NCCL's errors fail theirs."""
        self._ensure_started()
        completed_here: torch.futures.Future[Any] | None = None
        completing_lane: Lane | None = None
        with _LAZY:
            if self._given is None:
                future: torch.futures.Future[Any] = torch.futures.Future(
                    devices=[*self._devices] if self._devices else None
                )
                self._given = future.then(_outputs_or_raise)
                if self._done:
                    completed_here = future
                else:
                    self._future = future  # (_finish, or the lane's job, completes it)
                    # (Not from the lane's own thread: the work's job may be queued behind
                    # the one running there, and would wait for the completion queued here.)
                    if self._lane is not None and not self._lane._on_worker():
                        completing_lane, self._completing = self._lane, True
            given = self._given
        if completed_here is not None:
            self._complete(completed_here)
        if completing_lane is not None:
            completing_lane.submit(self._complete_future, [])
        return given

    def _await_end(self) -> None:
        """Waits for the operation to end (before the lane's job completes the future: the
        work's own job came before it on the lane)."""
        self._ended_within(None)

    def _complete_future(self) -> None:
        """The lane's job that completes the future get_future() gave out."""
        self._await_end()
        with _LAZY:
            future, self._future = self._future, None
        if future is not None:
            self._complete(future)

    def _source_rank(self) -> int:
        """The rank a receive from any source received from (torch's dist.recv(src=None))."""
        self.wait()
        if not self._source:
            raise RuntimeError("minincl backend: _source_rank() is for a receive from any source")
        return self._source[0]

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._outputs

    def synchronize(self) -> None:
        self.wait()


@outside_compiled_code
class QueuedWork(MinincclWork):
    """A work queued on minincl's own ``async_op=True`` worker (a C++ thread of the
    communicator, which runs calls in program order without the GIL) instead of a lane's
    Python thread: an 8-byte ``all_reduce(async_op=True).wait()`` costs ~25 us there, ~60
    through a lane (bench/RESULTS.md, forty-eighth session). ``handle``: minincl's Work.
    Waits and polls go straight to the handle; a future asked for before the end is completed
    by a job on the lane, as any work's (jobs queued after it on the lane wait for the call
    anyway, as minincl runs a call only after the async_op calls before it)."""

    def __init__(
        self,
        outputs: list[torch.Tensor],
        handle: Any,
        lane: Lane,
        start: Callable[[MinincclWork | None], None],
        ranks_note: Callable[[], str] | None = None,
    ) -> None:
        super().__init__(outputs, start, ranks_note=ranks_note)
        self._handle = handle
        self._lane = lane

    def _settle(self, seconds: float | None) -> bool:
        """Takes the handle's outcome, waiting up to `seconds` (None: as long as it takes);
        whether the operation ended."""
        if seconds is not None and not self._handle.is_completed():
            with contextlib.suppress(errors.Error):  # (the operation's own error comes below)
                self._handle.wait(seconds)
            if not self._handle.is_completed():
                return False
        try:
            self._handle.wait()
        except Exception as e:  # noqa: BLE001 - kept for whoever waits on the work
            self._finish(e)
        else:
            self._finish(None)
        return True

    def _ended_within(self, seconds: float | None) -> bool:
        return self._settle(seconds)

    def is_completed(self) -> bool:
        self._ensure_started()
        if not self._done and self._handle.is_completed():
            self._settle(None)
        return self._done

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        self.is_completed()
        return self._error


def _outputs_or_raise(outcome: torch.futures.Future[Any]) -> Any:
    return outcome.wait()  # (raises the error set_exception gave it)


def _run(job: Job, works: list[MinincclWork]) -> None:
    error: BaseException | None = None
    try:
        job()
    except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the works
        error = e
    # (Out of the except block: an error a future's callback raises while the works finish
    # would otherwise carry this one as its context.)
    for w in works:
        w._finish(error)


@outside_compiled_code
class Lane:
    """Runs jobs one at a time in submission order: on a worker thread, or inline.

    A job whose caller waits for it at once (``run_now``) runs on the caller's thread when no
    job is queued or running: the hand-off to the worker and back costs two thread wake-ups.
    """

    def __init__(self, name: str, inline: bool) -> None:
        self._name = name
        self._inline = inline
        self._jobs: queue.SimpleQueue[tuple[Job, list[MinincclWork]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._worker: threading.Thread | None = None  # the thread, kept after close (_on_worker)
        self._closed = False
        self._lock = threading.Lock()
        self._unfinished = 0  # jobs submitted or running, not yet done
        self._running = threading.Lock()  # held while a job runs, by whichever thread runs it

    def submit(self, job: Job, works: list[MinincclWork]) -> None:
        if self._inline or self._closed or self._on_worker():
            _run(job, works)  # (closed: a job made as the group shuts down, by a callback say)
            return
        with self._lock:
            self._unfinished += 1
            if self._thread is None:
                self._thread = self._worker = threading.Thread(target=self._loop, name=self._name, daemon=True)
                try:
                    self._thread.start()
                except RuntimeError as e:  # (a limit on threads: no thread would ever run the jobs queued)
                    self._thread = self._worker = None
                    self._unfinished -= 1
                    why = f"could not start the thread of {self._name} ({e}): is a limit on threads reached?"
                    raise errors.SystemError(why) from e
        self._jobs.put((job, works))

    def run_now(self, job: Job, works: list[MinincclWork]) -> None:
        """Runs the job on this thread if the lane is idle, else queues it behind the others."""
        if self._on_worker():
            _run(job, works)
            return
        with self._lock:
            idle = self._inline or self._unfinished == 0
            if idle:
                self._unfinished += 1  # (a job another thread submits now queues behind this one)
        if not idle:
            self.submit(job, works)
            return
        self._run_counted(job, works)

    def queue(self, start: Callable[[], Any]) -> Any | None:
        """Calls `start`, which queues an operation on minincl's own async_op worker, if no
        job is queued or running here (QueuedWork), and returns what it returns; else None,
        and the caller takes the lane. (Under the lock: a job another thread submits, or runs
        now, comes after it, and minincl runs that job's calls after the queued one.)"""
        with self._lock:
            if self._inline or self._closed or self._unfinished:
                return None
            return start()

    def _on_worker(self) -> bool:
        """A job issued by a Future callback that completing a job ran on the worker (as
        PowerSGD's DDP hook issues its next all_reduce): queued, it would wait for the worker,
        which waits in the callback. It runs at once, before the jobs queued behind the one
        that completed (where every rank's worker runs it)."""
        return self._worker is not None and threading.current_thread() is self._worker

    def _run_counted(self, job: Job, works: list[MinincclWork]) -> None:
        with self._running:
            _run(job, works)
        with self._lock:
            self._unfinished -= 1

    def _loop(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            self._run_counted(*item)

    def close(self) -> None:
        """Lets queued jobs finish, then stops the thread. Jobs given to it afterwards (or
        meanwhile from outside its thread: a callback a finishing job ran, say) run inline."""
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            thread.join()
