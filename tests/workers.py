"""Rank functions for tests that run ranks as processes (minincl.launch pickles them by name)."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import minincl


def run_ranks(comms: list[Any], fn: Callable[[Any], Any], timeout: float = 60.0) -> list[Any]:
    """Runs fn(comm) for every rank on its own thread; returns results in rank order and
    re-raises the first exception (by rank)."""
    results: list[Any] = [None] * len(comms)
    errors: list[BaseException | None] = [None] * len(comms)

    def body(i: int) -> None:
        try:
            results[i] = fn(comms[i])
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            errors[i] = e

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(len(comms))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        if t.is_alive():
            raise TimeoutError(f"a rank did not finish within {timeout} s")
    for e in errors:
        if e is not None:
            raise e
    return results


def all_collectives(comm: minincl.Communicator, counts: list[int]) -> int:
    """Every collective, a few types, checked against NumPy on this rank; returns checks done."""
    n, r = comm.nranks, comm.rank
    checks = 0
    for count in counts:
        for dtype in (np.float32, np.int64, np.float16, np.uint8):
            inputs = [((np.arange(count) + q * 3) % 5).astype(dtype) for q in range(n)]
            x = inputs[r].copy()
            comm.allreduce(x)
            np.testing.assert_array_equal(x, np.add.reduce(np.stack(inputs), axis=0, dtype=dtype))
            y = inputs[r].copy()
            comm.allreduce(y, op="max")
            np.testing.assert_array_equal(y, np.stack(inputs).max(0))
            b = inputs[r].copy()
            comm.broadcast(b, root=n - 1)
            np.testing.assert_array_equal(b, inputs[n - 1])
            red = inputs[r].copy()
            comm.reduce(red, root=1 % n)
            if r == 1 % n:
                np.testing.assert_array_equal(red, np.add.reduce(np.stack(inputs), axis=0, dtype=dtype))
            g = comm.allgather(inputs[r])
            np.testing.assert_array_equal(g, np.concatenate(inputs))
            big = [np.tile(v, n) for v in inputs]
            rs = comm.reduce_scatter(big[r])
            np.testing.assert_array_equal(rs, np.add.reduce(np.stack(inputs), axis=0, dtype=dtype))
            a2a = comm.alltoall(big[r])
            np.testing.assert_array_equal(a2a, np.concatenate([inputs[q] for q in range(n)]))
            gathered = comm.gather(inputs[r], root=n - 1)
            if r == n - 1:
                np.testing.assert_array_equal(gathered, np.concatenate(inputs))
            blocks = np.concatenate([inputs[q] * 2 for q in range(n)])
            part = comm.scatter(blocks if r == 1 % n else None, np.empty_like(inputs[r]), root=1 % n)
            np.testing.assert_array_equal(part, inputs[r] * 2)
            checks += 9
    with minincl.group():
        out = np.zeros(1000, np.float64)
        comm.send(np.full(1000, r, np.float64), (r + 1) % n)
        comm.recv(out, (r - 1) % n)
    np.testing.assert_array_equal(out, np.full(1000, (r - 1) % n))
    comm.barrier()
    return checks + 1


def bitwise_collectives(comm: minincl.Communicator, counts: list[int]) -> int:
    """band, bor and bxor on random bits, allreduce / reduce / reduce_scatter, against NumPy."""
    n, r = comm.nranks, comm.rank
    checks = 0
    for count in counts:
        for (op, fold), dtype in zip(
            (("band", np.bitwise_and), ("bor", np.bitwise_or), ("bxor", np.bitwise_xor)), (np.int8, np.uint32, np.int64)
        ):
            size = count * n * np.dtype(dtype).itemsize
            inputs = [
                np.random.default_rng(q + 10 * count).integers(0, 256, size, np.uint8).view(dtype) for q in range(n)
            ]
            want = fold.reduce(np.stack(inputs), axis=0)
            x = inputs[r].copy()
            comm.allreduce(x, op=op)
            np.testing.assert_array_equal(x, want)
            red = comm.reduce(inputs[r], np.zeros_like(x), op=op, root=n - 1)
            if r == n - 1:
                np.testing.assert_array_equal(red, want)
            rs = comm.reduce_scatter(inputs[r], op=op)
            np.testing.assert_array_equal(rs, want.reshape(n, -1)[r])
            checks += 3
    return checks


def _output(count: int, dtype: Any, shift: str) -> np.ndarray:
    """Zeros 16-byte aligned (""), a view one element in, or one byte in (off the type's
    alignment: a view of bytes, which NumPy allows)."""
    size = np.dtype(dtype).itemsize
    skip = {"": 0, "element": size, "byte": 1}[shift]
    return np.zeros(count * size + skip, np.uint8)[skip:].view(dtype)


def unaligned_outputs_and_avg(comm: minincl.Communicator, counts: list[int]) -> int:
    """Out-of-place results into arrays 16-byte aligned and not (a view one element or one
    byte in), and avg (an integer's division runs on the reduced value), checked against NumPy."""
    n, r = comm.nranks, comm.rank
    checks = 0
    for count in counts:
        for dtype in (np.float32, np.float64, np.int32, np.float16):
            inputs = [((np.arange(count) * (q + 1)) % 7).astype(dtype) for q in range(n)]
            total = np.add.reduce(np.stack(inputs), axis=0, dtype=dtype)
            for shift in ("", "element", "byte"):  # (streamed lines of a byte view crashed)
                out = _output(count, dtype, shift)
                comm.allreduce(inputs[r], out)
                np.testing.assert_array_equal(out, total)
                gathered = _output(count * n, dtype, shift)
                comm.allgather(inputs[r], gathered)
                np.testing.assert_array_equal(gathered, np.concatenate(inputs))
                bcast = _output(count, dtype, shift)
                comm.broadcast(inputs[r], bcast, root=n - 1)
                np.testing.assert_array_equal(bcast, inputs[n - 1])
                checks += 3
            avg = np.zeros(count, dtype)
            comm.allreduce(inputs[r], avg, op="avg")
            if dtype == np.int32:  # (the sum, then C's division: exact)
                np.testing.assert_array_equal(avg, total // n)
            else:
                assert_float_avg(avg, inputs, dtype)
            checks += 1
    return checks


def run_on_threads(nranks: int, fn: Callable[[Any], Any]) -> list[Any]:
    """run_ranks on `nranks` new ranks as threads of this process, destroyed afterwards."""
    comms = minincl.Communicator.init_all(nranks)
    try:
        return run_ranks(comms, fn)
    finally:
        for c in comms:
            c.destroy()


def thread_ranks(_launched: minincl.Communicator, nranks: int, counts: list[int]) -> list[int]:
    """`nranks` ranks as threads of this one process (pointer steps, direct writes), each
    running unaligned_outputs_and_avg (the launcher's own 1-rank communicator is unused)."""
    return run_on_threads(nranks, lambda c: unaligned_outputs_and_avg(c, counts))


def mismatched_allgathers_on_threads(_launched: minincl.Communicator, rounds: int) -> list[list[str]]:
    """Rounds of 3 ranks as threads of this process allgathering 1 Mi elements, rank 0 of
    int8 and the others of float16: the error each rank raised, per round. Ranks 1 and 2
    match each other, so rank 2 reads rank 1's pointer steps, from buffers rank 1 frees once
    its call (which rank 0 failed) returns. (Slots of the default 128 KiB: the tests' 16 KiB
    ones are below the size of a pointer step.)"""
    os.environ["MININCL_SIMPLE_SLOT_BYTES"] = "128K"

    def body(c: minincl.Communicator) -> str:
        try:
            c.allgather(np.ones(1 << 20, np.int8 if c.rank == 0 else np.float16))
        except minincl.Error as e:
            return f"{type(e).__name__}: {e}"
        return "ok"

    return [run_on_threads(3, body) for _ in range(rounds)]


# (collective, count, dtype, root, op) of one rank's call in random_mismatched_calls.
FUZZ_CALLS = (
    "allreduce",
    "broadcast",
    "reduce",
    "allgather",
    "reduce_scatter",
    "alltoall",
    "gather",
    "scatter",
    "barrier",
    "ring",
)
FUZZ_COUNTS = (0, 1, 7, 1000, 16384, 100003, 1 << 20)


def fuzz_call(comm: minincl.Communicator, kind: str, count: int, dtype: str, root: int, op: str) -> None:
    n = comm.nranks
    x = np.ones(count * (n if kind in ("reduce_scatter", "alltoall", "scatter") else 1), dtype)
    if kind in ("allreduce", "reduce_scatter"):
        getattr(comm, kind)(x, op=op)
    elif kind == "reduce":
        comm.reduce(x, root=root, op=op)
    elif kind in ("broadcast", "gather", "scatter"):
        getattr(comm, kind)(x, root=root)
    elif kind in ("allgather", "alltoall"):
        getattr(comm, kind)(x)
    elif kind == "barrier":
        comm.barrier()
    elif kind == "ring":  # each rank sends to the next and receives from the one before
        with minincl.group():
            comm.send(x, (comm.rank + 1) % n)
            comm.recv(np.empty_like(x), (comm.rank - 1) % n)
    elif kind == "send":
        comm.send(x, (comm.rank + 1) % n)
    else:  # recv
        comm.recv(x, (comm.rank - 1) % n)


def logged_alike(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Whether two ranks' calls (fuzz_call's arguments) are the same call as the call log
    compares them: the root only where there is one, the op only where values are reduced."""
    if a[0] != b[0]:
        return False
    if a[0] == "barrier":
        return True
    rooted, reduced = (
        a[0] in ("broadcast", "reduce", "gather", "scatter"),
        a[0] in ("allreduce", "reduce", "reduce_scatter"),
    )
    return a[1:3] == b[1:3] and (not rooted or a[3] == b[3]) and (not reduced or a[4] == b[4])


def random_mismatched_calls(_launched: minincl.Communicator, nranks: int, cases: int, seed: int) -> list[str]:
    """`cases` random collective calls on `nranks` ranks as threads of this process, one
    rank's call differing in one field (or not, where the draw repeats it), then an
    allreduce on every rank. A line per case where something went wrong: a rank that did not
    end within 30 s (a hang), calls that differ but that no rank ever raised on, or calls
    alike where a rank raised. (A crash ends this process.) Slots of the default 128 KiB,
    where the tests' 16 KiB are below a pointer step's size."""
    os.environ["MININCL_SIMPLE_SLOT_BYTES"] = "128K"
    rng = random.Random(seed)
    problems: list[str] = []
    comms = minincl.Communicator.init_all(nranks)

    def run(plan: list[tuple[Any, ...]]) -> list[str]:
        def body(c: minincl.Communicator) -> str:
            try:
                fuzz_call(c, *plan[c.rank])
                c.allreduce(np.ones(3, np.float32))
            except minincl.Error as e:
                return f"{type(e).__name__}: {e}"
            return "ok"

        return run_ranks(comms, body, timeout=30)

    for _ in range(cases):
        base = (
            rng.choice(FUZZ_CALLS),
            rng.choice(FUZZ_COUNTS),
            rng.choice(["float32", "int32", "float16"]),
            rng.randrange(nranks),
            rng.choice(["sum", "max"]),
        )
        odd, field = rng.randrange(nranks), rng.randrange(5)
        other = (
            rng.choice((*FUZZ_CALLS, "send", "recv")),
            rng.choice(FUZZ_COUNTS),
            "int8",
            rng.randrange(nranks),
            "min",
        )
        changed = tuple(other[i] if i == field else base[i] for i in range(5))
        plan = [changed if r == odd else base for r in range(nranks)]
        alike = logged_alike(base, changed)
        try:
            results = run(plan)
            if not alike and all(r == "ok" for r in results):
                # Calls that move nothing (a count-0 alltoall, gather or scatter; a count-0
                # collective checks its peers' logs) end before the monitors compare them:
                # the next call fails instead.
                time.sleep(0.05)
                results = run([("barrier", 0, "float32", 0, "sum")] * nranks)
        except TimeoutError:
            return [*problems, f"hang: {plan}"]  # (its threads still run: nothing can be destroyed)
        if alike != all(r == "ok" for r in results):
            problems.append(f"{'alike' if alike else 'different'} calls {plan}: {results}")
        if any(r != "ok" for r in results):
            for c in comms:
                c.destroy()
            comms = minincl.Communicator.init_all(nranks)
    for c in comms:
        c.destroy()
    return problems


def collectives_with_stats(comm: minincl.Communicator, counts: list[int]) -> tuple[int, dict[str, int]]:
    return all_collectives(comm, counts), comm.stats()


def die_mid_run(comm: minincl.Communicator, victim: int, flags: str) -> str:
    """The victim kills itself between collectives; the others are inside the next one.
    It dies only once every other rank has left the warm-up (a file each in `flags`): a
    rank still finishing its last warm-up collective would otherwise fail there, rightly,
    since a dead peer stops every collective in flight."""
    return stop_mid_run(comm, victim, flags, signal.SIGKILL, 1 << 16, 1000)


def shm_segments() -> list[str]:
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith("minincl-"))


def report_segments(comm: minincl.Communicator) -> list[str]:
    comm.barrier()
    return shm_segments()


def affinity_after_init(comm: minincl.Communicator) -> list[int]:
    return sorted(os.sched_getaffinity(0))


def channels_after_init(comm: minincl.Communicator) -> int:
    return comm.stats()["channels"]


def small_steps_shortcuts(comm: minincl.Communicator, in_window: bool) -> tuple[int, int]:
    """16 KiB allreduces (8 KiB steps on 2 ranks) and a 16 KiB exchange with the partner, on
    arrays in the window or plain ones, checked against NumPy. Returns the pointer steps sent
    and the direct writes made. (Several allreduces: a rank's first step may find its peer
    not yet started, and the exchange's steps only sometimes go as pointers.)"""
    n, r, count = comm.nranks, comm.rank, 4096

    def array(values: np.ndarray) -> np.ndarray:
        a = comm.empty(values.shape, values.dtype) if in_window else np.empty_like(values)
        a[...] = values
        return a

    xs = [np.arange(count, dtype=np.float32) * (q + 2) for q in range(n)]
    send, out = array(xs[r]), array(np.zeros(count, np.float32))
    for _ in range(8):
        out[...] = 0
        comm.allreduce(send, out)
        np.testing.assert_array_equal(out, np.sum(xs, axis=0))
    got = array(np.zeros(count, np.float32))
    comm.sendrecv(send, got, r ^ 1)
    np.testing.assert_array_equal(got, xs[r ^ 1])
    stats = comm.stats()
    return int(stats["pointer_steps"]), int(stats["direct_writes"])


def window_collectives(comm: minincl.Communicator, counts: list[int]) -> tuple[int, int, int]:
    """Every collective on arrays from comm.empty (the window peers map), checked against
    NumPy; also with only one side in the window. Returns (checks, pointer steps sent,
    direct writes made)."""
    n, r = comm.nranks, comm.rank
    checks = 0

    def win(a: np.ndarray) -> np.ndarray:
        w = comm.empty(a.shape, a.dtype)
        w[...] = a
        return w

    for count in counts:
        for dtype in (np.float32, np.int32):
            xs = [((np.arange(count) * (q + 3) + q) % 11).astype(dtype) for q in range(n)]
            total = np.sum(xs, axis=0, dtype=dtype)
            send, out = win(xs[r]), comm.empty(count, dtype)
            comm.allreduce(send, out)
            np.testing.assert_array_equal(out, total)
            comm.allreduce(send, np.zeros(count, dtype))  # the output outside the window
            comm.allreduce(send)  # in place
            np.testing.assert_array_equal(send, total)
            b = win(xs[r])
            comm.broadcast(b, root=n - 1)
            np.testing.assert_array_equal(b, xs[n - 1])
            red = comm.empty(count, dtype)
            red[...] = 7
            comm.reduce(win(xs[r]), red, op="max", root=0)
            np.testing.assert_array_equal(red, np.max(xs, axis=0) if r == 0 else np.full(count, 7, dtype))
            g = comm.empty(count * n, dtype)
            comm.allgather(win(xs[r]), g)
            np.testing.assert_array_equal(g, np.concatenate(xs))
            whole = [np.tile(x, n) + q for q, x in enumerate(xs)]
            rs = comm.empty(count, dtype)
            comm.reduce_scatter(win(whole[r]), rs)
            np.testing.assert_array_equal(rs, np.sum(whole, axis=0, dtype=dtype)[r * count : (r + 1) * count])
            checks += 6
    stats = comm.stats()
    return checks, int(stats["pointer_steps"]), int(stats["direct_writes"])


def window_errors(comm: minincl.Communicator) -> list[str]:
    """What a full window and a freed array do; the array outlives its communicator."""
    out = []
    big = comm.empty(3 << 20, np.uint8)  # most of a 4 MiB window
    try:
        comm.empty(2 << 20, np.uint8)
    except minincl.InvalidUsage as e:
        out.append(str(e))
    del big  # its space comes back
    again = comm.empty(3 << 20, np.uint8)
    again[:] = 5
    comm.barrier()
    comm.destroy()
    out.append(str(int(again.sum())))  # still mapped after destroy
    return out


def broadcast_from_its_own_root_then_destroy(comm: minincl.Communicator) -> list[float]:
    x = np.full(3, comm.rank, np.float32)
    comm.broadcast(x, root=comm.rank)  # (every rank a different root: each keeps its own)
    comm.destroy()
    return x.tolist()


def windows_of_splits(comm: minincl.Communicator) -> list[tuple[int, int]]:
    """This communicator's window size and pointer steps into its window (see
    small_steps_shortcuts), then the same for one split from it and one shrunk from it."""
    split = comm.split(0, key=-comm.rank)  # (ranks in the other order)
    shrunk = comm.shrink([])
    assert split is not None
    out = [(c.window_bytes, small_steps_shortcuts(c, True)[0]) for c in (comm, split, shrunk)]
    split.destroy()
    shrunk.destroy()
    assert split.window_bytes == out[1][0]  # (still readable, as rank is)
    return out


def empty_without_a_window(comm: minincl.Communicator) -> str:
    try:
        comm.empty(8, np.float32)
    except minincl.Error as e:
        return f"{type(e).__name__}: {e}"
    return "an array"


def _float_type(dtype: Any) -> Any:
    """dtype as a NumPy float type; "bfloat16" and the 8-bit floats as ml_dtypes' types."""
    if str(dtype) in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, str(dtype)))
    return np.dtype(dtype)


def assert_float_avg(got: Any, inputs: list[np.ndarray], dtype: Any) -> None:
    """A float avg as NCCL computes it (and minincl): each rank's input times 1/n rounded to
    the type, each product rounded to the type, then summed. The sum's order is the
    algorithm's, and each partial sum rounds: allowed half an ulp of the sum of |terms| per
    rank, against the exact sum of the rounded terms."""
    import ml_dtypes

    t = _float_type(dtype)
    n = len(inputs)
    # (In float, below float64: the 16- and 8-bit types' arithmetic, and their rounding from a double.)
    via = np.float64 if t == np.float64 else np.float32
    scale = np.float64(1.0 / n).astype(via).astype(t).astype(np.float64)
    terms = np.stack([(np.asarray(x, np.float64) * scale).astype(via).astype(t) for x in inputs])
    exact = terms.astype(np.float64).sum(0)
    tol = n * 2.0 ** -(ml_dtypes.finfo(t).nmant + 1) * np.abs(terms.astype(np.float64)).sum(0)
    g = np.asarray(got, np.float64).reshape(-1)
    bad = ~(np.abs(g - exact.reshape(-1)) <= tol.reshape(-1))
    assert not bad.any(), (
        f"{dtype} avg of {n} ranks: {int(bad.sum())} of {g.size} wrong; first at {int(np.argmax(bad))}: "
        f"{g[bad][0]} (want {exact.reshape(-1)[bad][0]} within {tol.reshape(-1)[bad][0]:.3g})"
    )


def kernel_copies_with_stats(comm: minincl.Communicator, counts: list[int]) -> tuple[int, dict[str, int]]:
    """The collectives whose steps may go by kernel copies between processes: broadcasts from
    every root and allgathers (in place and not), allreduces (in place and not; avg scales
    each input where it is read, a peer's too) and reduce_scatters (in place and
    not), checked against NumPy; returns the checks done and this rank's counters."""
    n, r = comm.nranks, comm.rank
    checks = 0
    for count in counts:
        for dtype in (np.float32, np.uint8, np.float64, np.float16):
            inputs = [((np.arange(count) * (q + 3) + q) % 251).astype(dtype) for q in range(n)]
            total = np.add.reduce(np.stack(inputs), axis=0, dtype=dtype)
            x = inputs[r].copy()
            comm.allreduce(x)
            np.testing.assert_array_equal(x, total)
            out = np.full(count, 7, dtype)
            if dtype == np.uint8:
                comm.allreduce(inputs[r], out, op="max")
                np.testing.assert_array_equal(out, np.stack(inputs).max(0))
            else:
                comm.allreduce(inputs[r], out, op="avg")
                assert_float_avg(out, inputs, dtype)
            checks += 2
            for root in range(n):
                b = inputs[r].copy()
                comm.broadcast(b, root=root)
                np.testing.assert_array_equal(b, inputs[root])
                out = np.full(count, 7, dtype)
                comm.broadcast(inputs[r], out, root=root)
                np.testing.assert_array_equal(out, inputs[root])
            np.testing.assert_array_equal(comm.allgather(inputs[r]), np.concatenate(inputs))
            whole = np.zeros(count * n, dtype)
            whole[r * count : (r + 1) * count] = inputs[r]
            comm.allgather(whole[r * count : (r + 1) * count], whole)
            np.testing.assert_array_equal(whole, np.concatenate(inputs))
            blocks = [np.concatenate([x, x[::-1]] * n)[: count * n] for x in inputs]
            mine = np.add.reduce(np.stack(blocks), axis=0, dtype=dtype)[r * count : (r + 1) * count]
            np.testing.assert_array_equal(comm.reduce_scatter(blocks[r], np.full(count, 7, dtype)), mine)
            inplace = blocks[r].copy()
            comm.reduce_scatter(inplace, inplace[r * count : (r + 1) * count])
            np.testing.assert_array_equal(inplace[r * count : (r + 1) * count], mine)
            checks += 2 * n + 4
    return checks, comm.stats()


def returns_a_lock(comm: minincl.Communicator) -> Any:
    return threading.Lock()  # (cannot be pickled)


def rank0_fails_the_others_hang(comm: minincl.Communicator) -> None:
    if comm.rank == 0:
        raise ValueError("rank 0 gives up")
    time.sleep(120)  # (in its own code: no call of minincl's would notice rank 0 leave)


def rank0_sleeps(comm: minincl.Communicator, seconds: float) -> int:
    if comm.rank == 0:
        time.sleep(seconds)
    return comm.rank


def late_rank(comm: minincl.Communicator, case: str, timeout: float, late: float) -> str:
    """Every rank sets a call timeout; rank 1 spends `late` seconds outside any call while
    the others start the next one: an allreduce ("collective") or, for rank 0, a receive
    from rank 1 ("recv"). The error each rank raised, or "ok" after checking the values."""
    comm.call_timeout = timeout
    x = np.full(1000, comm.rank + 1, np.float32)
    try:
        comm.allreduce(x)
        if comm.rank == 1:
            time.sleep(late)
        if case == "recv" and comm.rank in (0, 1):
            got = np.zeros(10, np.float32)
            comm.send(got + 1, 1 - comm.rank)
            comm.recv(got, 1 - comm.rank)
        comm.allreduce(x)
        comm.barrier()
    except minincl.Error as e:
        return f"{type(e).__name__}: {e}"
    np.testing.assert_array_equal(x, np.full(1000, comm.nranks * (comm.nranks + 1) / 2 * comm.nranks, np.float32))
    return "ok"


def exchange_held_up_inside(comm: minincl.Communicator, held: float) -> str:
    """A ring exchange, then a barrier. Rank 0 enters the exchange first and waits there for
    its late peers; a signal handler, which its long wait runs, then keeps it from running for
    `held` seconds (as a stop or a debugger would), while the peers post their halves, end
    their exchanges and enter the barrier. The error each rank raised, or "ok"."""
    x = np.full(1024, comm.rank, np.int32)
    y = np.zeros_like(x)
    comm.barrier()
    if comm.rank == 0:
        signal.signal(signal.SIGALRM, lambda *_: time.sleep(held))
        signal.setitimer(signal.ITIMER_REAL, 0.1)
    else:
        time.sleep(0.5)
    try:
        comm.sendrecv(x, y, (comm.rank + 1) % comm.nranks, (comm.rank - 1) % comm.nranks)
        comm.barrier()
    except minincl.Error as e:
        return f"{type(e).__name__}: {e}"
    np.testing.assert_array_equal(y, np.full(1024, (comm.rank - 1) % comm.nranks, np.int32))
    return "ok"


def recv_behind_an_allreduce(comm: minincl.Communicator, receiver: int) -> str:
    """Rank `receiver` receives from rank 0, which never sends: every other rank is inside an
    allreduce. The error each rank raised, or "ok"."""
    comm.call_timeout = 60  # (a deadlock the checks miss ends here, as a Timeout)
    try:
        if comm.rank == receiver:
            comm.recv(np.zeros(4, np.float32), 0)
        else:
            comm.allreduce(np.ones(4, np.float32))
    except minincl.Error as e:
        return f"{type(e).__name__}: {e}"
    return "ok"


def different_calls(comm: minincl.Communicator, case: str) -> str:
    """Rank 0 (rank 1 for "send" and "recv") makes another call than the others, one whose
    steps never meet theirs in a FIFO (it takes another protocol or algorithm, or sends and
    receives instead): the error each rank raised, or "ok"."""
    comm.allreduce(np.ones(100, np.float32))
    try:
        if case == "dtype":  # 4000 bytes against 1000: the tuner picks differently
            dt = np.float32 if comm.rank == 0 else np.int8
            comm.allgather(np.ones(1000, dt), np.zeros(1000 * comm.nranks, dt))
        elif case == "send":  # rank 1 sends what rank 0 never receives, then both meet in a barrier
            if comm.rank == 1:
                comm.send(np.ones(1000, np.float16), 0)
        elif case == "recv":  # rank 1 waits for a send that rank 0 makes only after its allreduce
            if comm.rank == 1:
                comm.recv(np.zeros(5000, np.float32), 0)
            else:
                comm.allreduce(np.ones(5000, np.float32))
        elif comm.rank == 0:
            comm.alltoall(np.ones(3 * comm.nranks, np.float32), np.zeros(3 * comm.nranks, np.float32))
        else:
            comm.allreduce(np.ones(3 * comm.nranks, np.float32))
        comm.barrier()
        if case == "send":  # (where the barrier got through: the monitors' next look finds it)
            time.sleep(0.1)
            comm.barrier()
    except minincl.Error as e:
        return f"{type(e).__name__}: {e}"
    return "ok"


def p2p_ring(comm: minincl.Communicator, case: str) -> str:
    """Each rank sends to the next rank and receives from the one before, in an order given
    by `case`. "recv first", "long send first", "grouped sends first", "two sends first" and
    "nine short sends first" wait in a cycle (the send does not fit in the channels'
    connections, nor two of 96 KiB on the one channel each takes, with the 16 KiB slots of
    conftest.py, nor nine of 4 KB, a slot each of the 8 a connection has). "short send
    first" (each waits 1.5 s before its receive), "eight short sends first" (they fill the
    connection) and "chain" (rank 0 sends only after 1.5 s outside any call, then receives;
    the others receive first, in a chain behind it) end. The error each rank raised, or "ok"
    after checking what it received."""
    n, r = comm.nranks, comm.rank
    count = 8 << 20 if case == "long send first" else 1000
    out = np.full(count, r + 1, np.float32)
    got = np.zeros(count, np.float32)
    try:
        if case in ("nine short sends first", "eight short sends first", "two sends first"):
            times = {"nine short sends first": 9, "eight short sends first": 8, "two sends first": 2}[case]
            if case == "two sends first":
                out, got = np.full(24576, r + 1, np.float32), np.zeros(24576, np.float32)  # 96 KiB: 6 slots each
            for _ in range(times):  # (one call each)
                comm.send(out, (r + 1) % n)
            for _ in range(times):
                got[:] = 0
                comm.recv(got, (r - 1) % n)
        elif case == "recv first" or (case == "chain" and r != 0):
            comm.recv(got, (r - 1) % n)
            comm.send(out, (r + 1) % n)
        elif case == "chain":
            time.sleep(1.5)
            comm.send(out, (r + 1) % n)
            comm.recv(got, (r - 1) % n)
        elif case == "grouped sends first":
            half = np.full(24576, r + 1, np.float32)  # 96 KiB: it fits alone (8 slots), not twice
            with minincl.group():
                comm.send(half, (r + 1) % n)
                comm.send(half, (r + 1) % n)
            comm.recv(got, (r - 1) % n)
        else:
            comm.send(out, (r + 1) % n)
            if case == "short send first":
                time.sleep(1.5)
            comm.recv(got, (r - 1) % n)
    except minincl.Error as e:
        return f"{type(e).__name__}: {e}"
    np.testing.assert_array_equal(got, np.full(got.size, (r - 1) % n + 1, np.float32))
    return "ok"


def exchange_against_barrier(comm: minincl.Communicator) -> str:
    """Ranks 0 and 1 send 4 MiB to the next rank and receive from the one before, in one
    group; rank 2 calls barrier instead. Rank 0 waits for rank 2 to send, rank 1 for it to
    receive, and rank 2 for both to make the barrier: the error each raised ("ok" if none)."""
    n, r = comm.nranks, comm.rank
    try:
        if r == 2:
            comm.barrier()
        else:
            with minincl.group():
                comm.send(np.ones(1 << 20, np.float32), (r + 1) % n)
                comm.recv(np.empty(1 << 20, np.float32), (r - 1) % n)
    except minincl.Error as e:
        return f"{type(e).__name__}: {e}"
    return "ok"


def mismatched_broadcast(comm: minincl.Communicator) -> tuple[str, bool]:
    """Rank 0 broadcasts 200,000 floats in place, the others 100,000: returns the error and
    whether this rank's buffer is still as it was."""
    x = np.full(200_000 if comm.rank == 0 else 100_000, comm.rank, np.float32)
    try:
        comm.broadcast(x, root=0)
    except minincl.Error as e:
        return f"{type(e).__name__}: {e}", bool((x == comm.rank).all())
    return "ok", bool((x == comm.rank).all())


def allreduce_with_stats(comm: minincl.Communicator, count: int, in_place: bool) -> tuple[bool, dict[str, int]]:
    x = np.arange(count, dtype=np.float64) * (comm.rank + 1)
    out = comm.allreduce(x) if in_place else comm.allreduce(x, np.full(count, -1.0))
    expected = np.arange(count, dtype=np.float64) * sum(q + 1 for q in range(comm.nranks))
    return bool((out == expected).all()), comm.stats()


def p2p_patterns(n: int, count: int, dtype: Any) -> list[np.ndarray]:
    return [((np.arange(count) * (q + 5) + 3 * q) % 241).astype(dtype) for q in range(n)]


def p2p_patterns_checked(comm: minincl.Communicator, counts: list[int]) -> int:
    """For each count (float32): an alltoall, then a ring in one group (two sends to the next
    rank, two receives from the one before, in that order) and a send to self; each result
    checked against the patterns. Returns how many counts were checked."""
    n, r = comm.nranks, comm.rank
    for count in counts:
        blocks = [p2p_patterns(n * n, count, np.float32)[r * n + q] for q in range(n)]
        got = comm.alltoall(np.concatenate(blocks))
        want = np.concatenate([p2p_patterns(n * n, count, np.float32)[q * n + r] for q in range(n)])
        np.testing.assert_array_equal(got, want, err_msg=f"alltoall, count {count}")
        mine = p2p_patterns(n, count, np.float32)
        first, second, own = (np.full(count, -1, np.float32) for _ in range(3))
        with minincl.group():
            comm.send(mine[r], (r + 1) % n)
            comm.send(mine[r] * 2, (r + 1) % n)
            comm.recv(first, (r - 1) % n)
            comm.recv(second, (r - 1) % n)
            comm.send(mine[r], r)
            comm.recv(own, r)
        np.testing.assert_array_equal(first, mine[(r - 1) % n], err_msg=f"ring, count {count}")
        np.testing.assert_array_equal(second, mine[(r - 1) % n] * 2, err_msg=f"ring, count {count}")
        np.testing.assert_array_equal(own, mine[r], err_msg=f"self, count {count}")
    return len(counts)


def exchanges_with_stats(
    comm: minincl.Communicator, counts: list[int], window: bool = False
) -> tuple[int, dict[str, int]]:
    """Grouped sends and receives, where sends may go as pointer steps (the group receives
    too): a ring (each rank sends right and receives from the left), and two messages each
    way between partners, which must arrive in order. Checked against NumPy; returns the
    checks done and this rank's counters. With `window`, the sent arrays live in the
    communicator's window."""
    n, r = comm.nranks, comm.rank
    right, left, partner = (r + 1) % n, (r - 1) % n, r ^ 1 if (r ^ 1) < n else r
    checks = 0
    for count in counts:
        for dtype in (np.float32, np.uint8, np.float64):
            inputs = p2p_patterns(n, count, dtype)
            mine = inputs[r]
            if window:
                mine = comm.empty(count, dtype)
                mine[:] = inputs[r]
            out = np.full(count, 7, dtype)
            with minincl.group():
                comm.send(mine, right)
                comm.recv(out, left)
            np.testing.assert_array_equal(out, inputs[left])
            out[:] = 7
            assert comm.sendrecv(mine, out, right, recv_peer=left) is out  # the same ring, one call
            np.testing.assert_array_equal(out, inputs[left])
            first, second = np.full(count, 7, dtype), np.full(count, 7, dtype)
            doubled = (inputs[r] * 2).astype(dtype)
            with minincl.group():
                comm.send(mine, partner)
                comm.send(doubled, partner)
                comm.recv(first, partner)
                comm.recv(second, partner)
            np.testing.assert_array_equal(first, inputs[partner])
            np.testing.assert_array_equal(second, (inputs[partner] * 2).astype(dtype))
            checks += 3
    return checks, comm.stats()


def send_done_before_receiver_starts(
    comm: minincl.Communicator, count: int, flag: str, two_sends: bool = False
) -> tuple[bool, dict[str, int]]:
    """3 ranks. Rank 0 sends to rank 1 in a group that also receives from rank 2, so its steps
    go as pointer steps; rank 1 starts its recv only once rank 0's group has returned (rank 0
    touches `flag`). The send must complete without its receiver, as a FIFO send does (the
    message fits in the FIFO): True if it did and rank 1 got the data. With `two_sends`, the
    group also sends to rank 2, which likewise receives only after the flag."""
    values = (np.arange(count) % 1000).astype(np.float32)
    if comm.rank == 0:
        got = np.zeros(count, np.float32)
        with minincl.group():
            comm.send(values, 1)
            if two_sends:
                comm.send(values * 3, 2)
            comm.recv(got, 2)
        open(flag, "w").close()
        return bool((got == values * 2).all()), comm.stats()
    if comm.rank == 2:
        comm.send(values * 2, 0)
        if not two_sends:
            return True, comm.stats()
    deadline = time.monotonic() + 20
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.01)
    started_after = os.path.exists(flag)
    out = np.zeros(count, np.float32)
    comm.recv(out, 0)  # (even if rank 0 never returned: it would wait for this)
    want = values * 3 if comm.rank == 2 else values
    return started_after and bool((out == want).all()), comm.stats()


def repeated_exchanges(comm: minincl.Communicator, count: int, calls: int) -> tuple[int, int, dict[str, int]]:
    """`calls` exchanges of `count` float32 with the partner rank (sendrecv), back to back;
    each checked against NumPy. Returns the checks, the pointer steps this rank posted
    meanwhile, and its counters."""
    peer = comm.rank ^ 1
    before = comm.stats()["pointer_steps"]
    checks = 0
    for i in range(calls):
        mine = np.arange(count, dtype=np.float32) + (comm.rank * 1000 + i)
        out = np.full(count, -1, np.float32)
        comm.sendrecv(mine, out, peer)
        np.testing.assert_array_equal(out, np.arange(count, dtype=np.float32) + (peer * 1000 + i))
        checks += 1
    stats = comm.stats()
    return checks, stats["pointer_steps"] - before, stats


def one_way_sends_with_stats(
    comm: minincl.Communicator, counts: list[int], window: bool = False
) -> tuple[int, dict[str, int]]:
    """Rank 0 sends, rank 1 receives, each call alone (the sender has nothing to receive),
    for several types; the receiver checks against NumPy. Returns the checks and counters.
    With `window`, both arrays live in the communicator's window."""
    checks = 0
    for count in counts:
        for dtype in (np.float32, np.uint8, np.float64):
            values = p2p_patterns(2, count, dtype)[1]
            buf = comm.empty(count, dtype) if window else np.empty(count, dtype)
            if comm.rank == 0:
                buf[:] = values
                comm.send(buf, 1)
            else:
                buf[:] = 7
                comm.recv(buf, 0)
                np.testing.assert_array_equal(buf, values)
            checks += 1
    return checks, comm.stats()


def mismatched_exchange(comm: minincl.Communicator, count: int) -> tuple[str, bool]:
    """An exchange where rank 1 expects one element more than rank 0 sends (rank 0's receive
    matches): returns this rank's error ("ok" if none) and whether its receive buffer was
    left as it was or got the right data."""
    peer = comm.rank ^ 1
    send = np.full(count, comm.rank + 1, np.float32)
    out = np.zeros(count + comm.rank, np.float32)
    try:
        with minincl.group():
            comm.send(send, peer)
            comm.recv(out, peer)
    except minincl.Error as e:
        return f"{type(e).__name__}: {e}", bool((out == 0).all())
    return "ok", bool((out == peer + 1).all())


def premul_sums(comm: minincl.Communicator, counts: list[int], window: bool) -> int:
    """Pre-multiplied sums (each rank's own scalar) of allreduce (in place and not), reduce and
    reduce_scatter between rank processes, where receivers may read a sender's input straight
    from its memory (kernel copies, or its window when `window`) and must scale it by the
    sender's scalar. Checked against NumPy; returns the checks done."""
    n, r = comm.nranks, comm.rank
    checks = 0

    def buf(a: np.ndarray) -> np.ndarray:
        if not window:
            return a.copy()
        w = comm.empty(a.shape, a.dtype)
        w[...] = a
        return w

    for count in counts:
        for dtype in (np.float32, np.float16, np.int32):
            given: list[Any] = [1, -2, 3, 5] if dtype == np.int32 else [0.5, -2.0, 1.5, 3.0]
            s = [dtype(v) for v in given]
            rank_op = minincl.PreMulSum(given[r])
            xs = [((np.arange(count * n) * (q + 3) + q) % 7 - 3).astype(dtype) for q in range(n)]
            total = np.add.reduce(np.stack([s[q] * xs[q] for q in range(n)]), axis=0, dtype=dtype)
            out = buf(np.full(count, 7, dtype))
            comm.allreduce(buf(xs[r][:count]), out, op=rank_op)
            np.testing.assert_array_equal(out, total[:count])
            x = buf(xs[r][:count])
            comm.allreduce(x, op=rank_op)
            np.testing.assert_array_equal(x, total[:count])
            red = buf(np.full(count, 7, dtype))
            comm.reduce(buf(xs[r][:count]), red, op=rank_op, root=n - 1)
            np.testing.assert_array_equal(red, total[:count] if r == n - 1 else np.full(count, 7, dtype))
            rs = buf(np.full(count, 7, dtype))
            comm.reduce_scatter(buf(xs[r]), rs, op=rank_op)
            np.testing.assert_array_equal(rs, total[r * count : (r + 1) * count])
            checks += 4
    return checks


def float8_sums(comm: minincl.Communicator, counts: list[int]) -> int:
    """Sums and pre-multiplied sums of PyTorch's 8-bit float tensors between rank processes
    (allreduce out of place and in place, reduce_scatter). Inputs -1, 0, 1 and small scalars:
    every partial result is exact, so the reference is NumPy's sum. Returns the checks done."""
    import torch

    n, r = comm.nranks, comm.rank
    scalars = [1.0, -1.0, 2.0, 1.0][:n]
    checks = 0
    for count in counts:
        for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            xs = [((np.arange(count * n) * (q + 2) + q) % 3 - 1).astype(np.float32) for q in range(n)]
            total = np.sum(xs, axis=0)
            scaled = np.sum([s * x for s, x in zip(scalars, xs)], axis=0)
            mine = torch.from_numpy(xs[r]).to(dtype)
            out = torch.zeros(count, dtype=dtype)
            comm.allreduce(mine[:count].clone(), out)
            np.testing.assert_array_equal(out.float().numpy(), total[:count])
            x = mine[:count].clone()
            comm.allreduce(x, op=minincl.PreMulSum(scalars[r]))
            np.testing.assert_array_equal(x.float().numpy(), scaled[:count])
            rs = torch.zeros(count, dtype=dtype)
            comm.reduce_scatter(mine, rs, op=minincl.PreMulSum(scalars[r]))
            np.testing.assert_array_equal(rs.float().numpy(), scaled[r * count : (r + 1) * count])
            checks += 3
    return checks


def rank_with_env(
    fn: Callable[..., Any], nranks: int, rank: int, uid: bytes, env: dict[str, str], args: tuple[Any, ...], queue: Any
) -> None:
    """A rank process whose environment differs from its siblings' (its own MININCL_HOSTID:
    a rank posing as another host), running fn(comm, *args); (rank, ok, result) to `queue`."""
    os.environ.update(env)
    try:
        with minincl.Communicator(nranks, uid, rank, device="cpu") as comm:
            queue.put((rank, True, fn(comm, *args)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        queue.put((rank, False, f"{type(e).__name__}: {e}"))


def network_peers(comm: minincl.Communicator) -> int:
    return comm.stats()["network_peers"]


def topology_and_collectives(comm: minincl.Communicator, counts: list[int]) -> tuple[Any, int]:
    """The communicator's ring plan (as a dict), and all_collectives' checks after it."""
    return dataclasses.asdict(comm.topology()), all_collectives(comm, counts)


def tree_collectives(comm: minincl.Communicator, counts: list[int]) -> int:
    """allreduce, and broadcast and reduce from every root, in place and not, against NumPy
    (run with MININCL_ALGO=tree); returns checks done."""
    n, r = comm.nranks, comm.rank
    checks = 0
    for count in counts:
        for dtype in (np.float32, np.int32):
            inputs = [((np.arange(count) * (q + 1) + q) % 7).astype(dtype) for q in range(n)]
            total = np.add.reduce(np.stack(inputs), axis=0, dtype=dtype)
            x = inputs[r].copy()
            comm.allreduce(x)
            np.testing.assert_array_equal(x, total)
            np.testing.assert_array_equal(comm.allreduce(inputs[r], np.zeros_like(x)), total)
            for root in range(n):
                b = inputs[r].copy()
                comm.broadcast(b, root=root)
                np.testing.assert_array_equal(b, inputs[root])
                red = np.zeros_like(x)
                comm.reduce(inputs[r], red, root=root)
                if r == root:
                    np.testing.assert_array_equal(red, total)
                checks += 2
            checks += 2
    return checks


def stop_mid_run(
    comm: minincl.Communicator, victim: int, flags: str, sig: int, elems: int = 1 << 12, calls: int = 100000
) -> str:
    """As die_mid_run, with the signal the victim sends itself (SIGKILL: it vanishes; SIGSTOP:
    it hangs, and only its missing heartbeat can tell), and allreduces of `elems` floats."""
    x = np.ones(elems, np.float32)
    for _ in range(3):
        comm.allreduce(x)
    if comm.rank == victim:
        deadline = time.monotonic() + 30
        while len(os.listdir(flags)) < comm.nranks - 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        with open(flags + ".victim", "w") as f:  # (a survivor may kill it: see shrink_after_a_death)
            f.write(str(os.getpid()))
        os.kill(os.getpid(), sig)
        time.sleep(60)  # (stopped, not killed: the parent kills it)
    open(os.path.join(flags, str(comm.rank)), "w").close()
    t0 = time.monotonic()
    try:
        for _ in range(calls):
            comm.allreduce(x)
    except minincl.Error as e:
        return f"{type(e).__name__} after {time.monotonic() - t0:.2f}s: {e}"
    return "no error"


def freeze_then_resume(comm: minincl.Communicator, victim: int, flags: str, elems: int = 1 << 12) -> str:
    """The victim stops itself (SIGSTOP) between calls; the others' calls time out, they
    destroy their communicators, and the last of them to do so resumes the victim (SIGCONT),
    whose next calls must then fail naming why. Returns how this rank's calls ended."""
    x = np.ones(elems, np.float32)
    for _ in range(3):
        comm.allreduce(x)
    # The victim stops only once every other rank's calls have ended: a call can end on the
    # victim before its proxy thread has sent the last step (over TCP), and a victim stopped
    # then would hang that call on the others, not the next one.
    ended = flags + ".ended"
    os.makedirs(ended, exist_ok=True)
    if comm.rank == victim:
        deadline = time.monotonic() + 30
        while len(os.listdir(ended)) < comm.nranks - 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        with open(os.path.join(flags, "victim"), "w") as f:
            f.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        open(os.path.join(ended, str(comm.rank)), "w").close()
    t0 = time.monotonic()
    try:
        for _ in range(100000):
            comm.allreduce(x)
    except minincl.Error as e:
        story = f"{type(e).__name__} after {time.monotonic() - t0:.2f}s: {e}"
    else:
        story = "no error"
    if comm.rank != victim:
        comm.destroy()
        open(os.path.join(flags, str(comm.rank)), "w").close()
        if len(os.listdir(flags)) == comm.nranks:  # (the victim's file and every survivor's)
            with open(os.path.join(flags, "victim")) as f:
                os.kill(int(f.read()), signal.SIGCONT)
    return story


def leave_early(comm: minincl.Communicator, case: str) -> str:
    """After one allreduce, rank 1 destroys its communicator, and rank 0 waits on it: in an
    allreduce ("collective"), a receive from it ("recv"), or a send to it longer than their
    connections hold ("long send"); the other ranks make the allreduce too, or no call. How
    each rank's call ended."""
    x = np.ones(16, np.float32)
    comm.allreduce(x)
    if comm.rank == 1:
        comm.destroy()
        return "left"
    if comm.rank > 1 and case != "collective":
        return "no call"
    try:
        if case == "collective":
            comm.allreduce(x)
        elif case == "recv":
            comm.recv(np.empty(7, np.float32), 1)
        else:
            comm.send(np.ones(4 << 20, np.float32), 1)
    except minincl.Error as e:
        return f"{type(e).__name__}: {e}"
    return "ok"


def abort_mid_calls(_launched: minincl.Communicator, kind: str, reps: int, seed: int) -> dict[str, int]:
    """`reps` times: 2 ranks as threads loop `kind` calls (barrier, allreduce, or a grouped
    send and recv), and this thread aborts rank 0 at a random moment. How the ranks' loops
    ended, counted ("Aborted/RemoteError": rank 0 raised Aborted, rank 1 RemoteError); "hang"
    if a loop did not end within 30 s. (A crash ends this process.)"""
    rng = random.Random(seed)
    outcomes: dict[str, int] = {}
    for _ in range(reps):
        comms = minincl.Communicator.init_all(2)
        ended = ["hang", "hang"]

        def loop(c: minincl.Communicator) -> None:
            x, y = np.ones(64, np.float32), np.empty(64, np.float32)
            try:
                while True:
                    if kind == "barrier":
                        c.barrier()
                    elif kind == "allreduce":
                        c.allreduce(x)
                    else:
                        with minincl.group():
                            c.send(x, 1 - c.rank)
                            c.recv(y, 1 - c.rank)
            except minincl.Error as e:
                ended[c.rank] = type(e).__name__

        threads = [threading.Thread(target=loop, args=(c,), daemon=True) for c in comms]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0.0005, 0.01))
        comms[0].abort()
        for t in threads:
            t.join(30)
        key = "/".join(ended)
        outcomes[key] = outcomes.get(key, 0) + 1
        if "hang" in key:
            break  # (its threads still run: nothing can be destroyed)
        comms[1].destroy()
    return outcomes


def c_api_abort_mid_call(_launched: minincl.Communicator, grouped: bool, reps: int, seed: int) -> list[int]:
    """The C API through ctypes (which lets go of the GIL): `reps` times, a thread calls an
    allreduce (or a group of a send and a receive) on rank 0 of 2 that rank 1 never joins,
    and this thread, a watchdog, calls mnclCommAbort at a random moment once the call has
    begun (the group: once its calls are recorded, which holds the communicator). What each
    call returned. (A crash ends this process.) Unlike a Python communicator, a C handle is
    gone once aborted: a thread that had not yet entered its call would use freed memory,
    hence the wait for the call to begin."""
    lib = ctypes.CDLL(minincl._c_library.library_path())
    rng = random.Random(seed)
    float32, n = 7, 1 << 16
    results: list[int] = []
    for _ in range(reps):
        arr = (ctypes.c_void_p * 2)()
        assert lib.mnclCommInitAll(arr, 2, None) == 0
        comm = ctypes.c_void_p(arr[0])
        x, y = np.ones(n, np.float32), np.empty(n, np.float32)
        xp, yp = x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p)
        entering = threading.Event()
        got: list[int] = []

        def call() -> None:
            if not grouped:
                entering.set()  # (this thread keeps the GIL until ctypes enters the call)
                got.append(lib.mnclAllReduce(xp, xp, ctypes.c_size_t(n), float32, 0, comm, None))
                return
            lib.mnclGroupStart()
            lib.mnclSend(xp, ctypes.c_size_t(n), float32, 1, comm, None)
            lib.mnclRecv(yp, ctypes.c_size_t(n), float32, 1, comm, None)
            entering.set()
            got.append(lib.mnclGroupEnd())

        t = threading.Thread(target=call, daemon=True)
        t.start()
        entering.wait(30)
        time.sleep(rng.uniform(0.002, 0.01) if not grouped else rng.uniform(0.0, 0.003))
        lib.mnclCommAbort(comm)
        t.join(30)
        results.append(got[0] if got else -1)  # -1: still inside its call
        if t.is_alive():
            break
        lib.mnclCommDestroy(ctypes.c_void_p(arr[1]))
    return results


# ---- random call sequences (test_call_sequences.py) ----

SEQUENCE_DTYPES = ["int8", "uint8", "int32", "int64", "float16", "float32", "float64"]
SEQUENCE_COUNTS = [0, 1, 3, 31, 1000, 4097, 65537, 300001]
SEQUENCE_CALLS = ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall", "ring_exchange"]


def sequence_values(seed: int, rank: int, n: int, dtype: str, op: str) -> np.ndarray:
    """Small integers, so that every type and op has an exact result."""
    rng = np.random.default_rng(seed * 1009 + rank)
    if op == "prod":
        return rng.choice([1, 1, 2] if dtype.startswith("u") else [1, -1, 2], n).astype(dtype)
    lo = 0 if dtype.startswith("u") else -3
    return rng.integers(lo, 4, n).astype(dtype)


def sequence_reduce(arrays: list[np.ndarray], op: str) -> np.ndarray:
    stacked = np.stack(arrays)
    out = {"sum": stacked.sum(0), "prod": stacked.prod(0), "max": stacked.max(0), "min": stacked.min(0)}[op]
    return out.astype(arrays[0].dtype)


def call_sequence(comm: minincl.Communicator, seed: int, steps: int, windows: bool) -> list[str]:
    """`steps` calls drawn from `seed` (the same on every rank): collective, type, count, op,
    root, in place or not, buffers from the window or not. Returns the calls whose result
    (or input, where it must stay unchanged) differs from NumPy's."""
    rng = random.Random(seed)
    n, me = comm.nranks, comm.rank
    wrong: list[str] = []

    def buf(count: int, dtype: str, window: bool, values: np.ndarray | None = None) -> np.ndarray:
        b = comm.empty(count, dtype) if window else np.empty(count, dtype)
        b[:] = 0 if values is None else values
        return b

    def check(what: str, got: np.ndarray, want: np.ndarray) -> None:
        if not np.array_equal(got, want):
            wrong.append(what)

    for step in range(steps):
        call, dtype, count = rng.choice(SEQUENCE_CALLS), rng.choice(SEQUENCE_DTYPES), rng.choice(SEQUENCE_COUNTS)
        op, root = rng.choice(["sum", "prod", "max", "min"]), rng.randrange(n)
        in_place, window = rng.random() < 0.4, windows and rng.random() < 0.4
        what = f"step {step}: {call} of {count} {dtype} ({op}, root {root}, in place {in_place}, window {window})"
        blocks = n if call in ("reduce_scatter", "alltoall") else 1
        inputs = [sequence_values(seed * 100 + step, r, count * blocks, dtype, op) for r in range(n)]
        mine = inputs[me]
        if call == "allreduce":
            send = buf(count, dtype, window, mine)
            out = send if in_place else buf(count, dtype, window)
            comm.allreduce(send, None if in_place else out, op=op)
            check(what, out, sequence_reduce(inputs, op))
        elif call == "broadcast":
            send = buf(count, dtype, window, mine)
            out = send if in_place else buf(count, dtype, window)
            comm.broadcast(send, None if in_place else out, root=root)
            check(what, out, inputs[root])
        elif call == "reduce":
            send = buf(count, dtype, window, mine)
            out = send if in_place else buf(count, dtype, window)
            comm.reduce(send, None if in_place else out, op=op, root=root)
            if me == root:
                check(what, out, sequence_reduce(inputs, op))
        elif call == "allgather":
            out = buf(count * n, dtype, window)
            part = out[me * count : (me + 1) * count]
            if in_place:
                part[:] = mine
            comm.allgather(part if in_place else buf(count, dtype, window, mine), out)
            check(what, out, np.concatenate(inputs))
        elif call == "reduce_scatter":
            send = buf(count * n, dtype, window, mine)
            out = send[me * count : (me + 1) * count] if in_place else buf(count, dtype, window)
            comm.reduce_scatter(send, out, op=op)
            check(what, out, sequence_reduce([x[me * count : (me + 1) * count] for x in inputs], op))
        elif call == "alltoall":
            send = buf(count * n, dtype, window, mine)
            out = buf(count * n, dtype, window)
            comm.alltoall(send, out)
            check(what, out, np.concatenate([x[me * count : (me + 1) * count] for x in inputs]))
            check(what + " (input)", send, mine)
        else:  # each rank sends to the next and receives from the one before, as one group
            send, out = buf(count, dtype, window, mine), buf(count, dtype, window)
            with minincl.group():
                comm.send(send, (me + 1) % n)
                comm.recv(out, (me - 1) % n)
            check(what, out, inputs[(me - 1) % n])
    return wrong


def shrink_with_a_wrong_list_first(
    comm: minincl.Communicator, victim: int, flags: str, first: dict[int, list[int]], sig: int = signal.SIGKILL
) -> tuple[str, int, int, list[float]]:
    """The victim kills (or stops) itself between calls; each survivor first shrinks with its
    list in `first` (one keeps the victim, or the lists differ), then with [victim]: (how the
    first try ended, and how long it took; the new communicator's rank, size and allreduce)."""
    stop_mid_run(comm, victim, flags, sig, 1 << 10, 100000)
    deadline = time.monotonic() + 2  # (the victim's loss seen here too, not only through a peer)
    while victim not in comm.lost_ranks() and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    try:
        comm.shrink(first[comm.rank]).destroy()
        ended = "shrunk"
    except minincl.Error as e:
        ended = f"{type(e).__name__} after {time.monotonic() - t0:.1f} s: {e}"
    with comm.shrink([victim]) as new:
        x = np.full(3, comm.rank + 1, np.float32)
        new.allreduce(x)
    comm.destroy()
    if sig == signal.SIGSTOP and new.rank == 0:
        kill_stopped_victim(flags)
    return ended, new.rank, new.nranks, x.tolist()


def shrink_after_an_abort(comm: minincl.Communicator, victim: int) -> Any:
    """The victim aborts its communicator and lives on (a moment: long enough for the others
    to look); the others' allreduce fails, they wait (2 s at most) until lost_ranks() names
    the victim, and shrink with that list: (how their call ended, the lost ranks, the new
    communicator's rank, size and allreduce)."""
    if comm.rank == victim:
        comm.abort()
        time.sleep(3)
        return "aborted"
    try:
        comm.allreduce(np.ones(4, np.float32))
        ended = "returned"
    except minincl.Error as e:
        ended = type(e).__name__
    lost, deadline = comm.lost_ranks(), time.monotonic() + 2
    while victim not in lost and time.monotonic() < deadline:
        time.sleep(0.01)
        lost = comm.lost_ranks()
    with comm.shrink(lost) as new:
        x = np.full(3, comm.rank + 1, np.float32)
        new.allreduce(x)
    comm.destroy()
    return ended, lost, new.rank, new.nranks, x.tolist()


def shrink_after_a_death(
    comm: minincl.Communicator, victim: int, flags: str, sig: int = signal.SIGKILL
) -> tuple[str, list[int], int, int, list[float], Any]:
    """The victim kills (or stops) itself between calls; the others' calls fail, and they
    shrink away the ranks lost_ranks() lists: (how their calls ended, those ranks, new rank,
    new size, an allreduce and an allgather on the new communicator). A killed victim's loss
    may reach a rank through another survivor's failure before its own sight of it (over
    TCP): allow a second. A stopped victim is killed by the lowest survivor once it is done."""
    ended = stop_mid_run(comm, victim, flags, sig, 1 << 10, 100000)
    lost, deadline = comm.lost_ranks(), time.monotonic() + 1
    while victim not in lost and time.monotonic() < deadline:
        time.sleep(0.01)
        lost = comm.lost_ranks()
    with comm.shrink(lost) as new:
        x = np.full(3, comm.rank + 1, np.float32)
        new.allreduce(x)
        ranks = new.allgather(np.array([comm.rank], np.int64))
        new.barrier()
    comm.destroy()
    if sig == signal.SIGSTOP and new.rank == 0:
        kill_stopped_victim(flags)
    return ended.split(" ")[0], lost, new.rank, new.nranks, x.tolist(), ranks.tolist()


def kill_stopped_victim(flags: str) -> None:
    """Ends stop_mid_run's victim, stopped (SIGSTOP): its launcher would wait for its timeout."""
    with open(flags + ".victim") as f:
        os.kill(int(f.read()), signal.SIGKILL)


def dies_after_the_rendezvous(comm: minincl.Communicator, how: str) -> str:
    """Rank 2 takes part in a split's (or shrink's) rendezvous on the parent, then dies
    before it joins the new group; the others make the whole call. What they raised, and
    how long it took."""
    comm.allreduce(np.ones(4, np.float32))
    start = time.monotonic()
    try:
        if comm.rank == 2:
            comm._split_info(0, 0) if how == "split" else comm._shrink_info([])
            os._exit(0)  # (as a crash would: no destroy)
        comm.split(0) if how == "split" else comm.shrink([])
        return "made"
    except minincl.Error as e:
        return f"{type(e).__name__} after {time.monotonic() - start:.1f} s: {e}"


def stops_after_the_rendezvous(comm: minincl.Communicator, how: str) -> str:
    """As dies_after_the_rendezvous, but rank 2 stops (SIGSTOP): alive, never joining."""
    comm.allreduce(np.ones(4, np.float32))
    start = time.monotonic()
    try:
        if comm.rank == 2:
            comm._split_info(0, 0) if how == "split" else comm._shrink_info([])
            os.kill(os.getpid(), signal.SIGSTOP)
        comm.split(0) if how == "split" else comm.shrink([])
        return "made"
    except minincl.Error as e:
        return f"{type(e).__name__} after {time.monotonic() - start:.1f} s: {e}"


def aborts_while_a_member_is_late(comm: minincl.Communicator, how: str) -> str:
    """Rank 2 takes part in a split's (or shrink's) rendezvous, then comes to the new group's
    init 6 s late; rank 0 aborts its communicator from another thread 1 s into its split."""
    comm.allreduce(np.ones(4, np.float32))
    start = time.monotonic()
    try:
        if comm.rank == 2:
            comm._split_info(0, 0) if how == "split" else comm._shrink_info([])
            time.sleep(6)
            return "late"
        if comm.rank == 0:
            threading.Timer(1.0, comm.abort).start()
        comm.split(0) if how == "split" else comm.shrink([])
        return "made"
    except minincl.Error as e:
        return f"{type(e).__name__} after {time.monotonic() - start:.1f} s: {e}"


def root_host_dies_in_the_new_init(comm: minincl.Communicator) -> str:
    """Rank 0, the lowest member, makes the split's unique id (its process hosts the new
    group's bootstrap root), then is killed while the others wait at that root for its
    hello. What the others raised."""
    comm.allreduce(np.ones(4, np.float32))
    try:
        if comm.rank == 0:
            comm._split_info(0, 0)
            time.sleep(0.3)  # (the others connect and say hello meanwhile)
            os.kill(os.getpid(), signal.SIGKILL)
        comm.split(0)
        return "made"
    except minincl.Error as e:
        return f"{type(e).__name__}: {e}"


def launches_again(comm: minincl.Communicator) -> Any:
    return minincl.launch(rank0_sleeps, 2, 0.0)


def allreduces_in_one_group(first: Any, first_buf: Any, second: Any, second_buf: Any) -> str:
    """A group of an allreduce on each of two communicators; how it ended ("no error", or the
    error's class and message)."""
    try:
        with minincl.group():
            first.allreduce(first_buf)
            second.allreduce(second_buf)
    except minincl.Error as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def group_with_a_mismatch_on_one_communicator(comm: minincl.Communicator, delays_ms: list[int]) -> list[str]:
    """Per delay: a group of an allreduce on A (counts that differ: a mismatch) and one on B
    (healthy), rank 1 coming `delay` ms after rank 0; then one more allreduce on B. What each
    B call gave, and how the group ended."""
    said = []
    for delay in delays_ms:
        a, b = comm.split(0, comm.rank), comm.split(0, comm.rank)
        assert a is not None and b is not None
        b.call_timeout = 20
        in_group = np.full(1000, comm.rank + 1, np.float32)
        if comm.rank == 1:
            time.sleep(delay / 1000)
        ended = allreduces_in_one_group(a, np.ones(100 * (comm.rank + 1), np.float32), b, in_group).split(":")[0]
        after = np.full(1000, 10.0 * (comm.rank + 1), np.float32)
        b.allreduce(after)
        said.append(f"{delay} ms: group {ended}, B {in_group[0]} then {after[0]}")
        a.destroy()
        b.destroy()
    return said


def group_after_a_communicator_failed(comm: minincl.Communicator, cause: str) -> list[str]:
    """A group {A.allreduce, B.allreduce} where A failed just before: rank 1 aborted it (or a
    broadcast with different roots failed it), rank 1 comes 50 ms after rank 0, which may not
    know yet. Then B.allreduce twice. B's results, and how the group ended."""
    a, b = comm.split(0, comm.rank), comm.split(0, comm.rank)
    assert a is not None and b is not None
    b.call_timeout = 20
    x = np.full(1000, comm.rank + 1, np.float32)
    if cause == "abort" and comm.rank == 1:
        a.abort()
    elif cause == "roots":
        with contextlib.suppress(minincl.Error):
            a.broadcast(np.ones(10, np.float32), root=comm.rank)
    if comm.rank == 1:
        time.sleep(0.05)
    ended = allreduces_in_one_group(a, np.ones(10, np.float32), b, x).split(":")[0]
    after = [np.full(1000, 10.0 * (comm.rank + 1) * k, np.float32) for k in (1, 2)]
    for y in after:
        b.allreduce(y)
    a.destroy()
    b.destroy()
    return [ended, float(x[0]), *(float(y[0]) for y in after)]


def group_whose_other_communicator_is_busy_on_another_thread(comm: minincl.Communicator) -> list[str | float]:
    """Rank 0 ends a group {A.allreduce, B.allreduce} while another of its threads waits in a
    receive on B (two threads on B: B fails); rank 1 makes the same group. A was used right.
    A's results in the group and after, and how the group ended."""
    a, b = comm.split(0, comm.rank), comm.split(0, comm.rank)
    assert a is not None and b is not None
    x = np.full(1000, comm.rank + 1, np.float32)
    other = None

    def receive_on_b() -> None:
        with contextlib.suppress(minincl.Error):  # (B fails: two threads on it)
            b.recv(np.zeros(4, np.float32), 1)

    if comm.rank == 0:
        other = threading.Thread(target=receive_on_b)
        other.start()
        time.sleep(0.2)  # (inside its receive by now)
    ended = allreduces_in_one_group(a, x, b, np.ones(10, np.float32)).split(":")[0]
    if other is not None:
        other.join(30)
    after = np.full(1000, 10.0 * (comm.rank + 1), np.float32)
    a.allreduce(after)
    a.destroy()
    b.destroy()
    return [ended, float(x[0]), float(after[0])]


def group_after_a_queued_call_failed_its_communicator(comm: minincl.Communicator, rounds: int) -> list[str]:
    """Per round: an async_op allreduce on A whose counts differ (it fails A), then a group
    {A.allreduce, B.allreduce}, B's call timeout 2 s (below MININCL_TIMEOUT's 5). B's result
    in the group and how the group ended."""
    said = []
    for _ in range(rounds):
        a, b = comm.split(0, comm.rank), comm.split(0, comm.rank)
        assert a is not None and b is not None
        b.call_timeout = 2
        queued = a.allreduce(np.ones(10 + comm.rank, np.float32), async_op=True)
        x = np.full(1000, comm.rank + 1, np.float32)
        ended = allreduces_in_one_group(a, np.ones(8, np.float32), b, x)
        with contextlib.suppress(minincl.Error):
            queued.wait()
        said.append(f"B {x[0]}, {'timeout' if 'call timeout' in ended else 'no timeout'}")
        a.destroy()
        b.destroy()
    return said


def read_only_mapping(values: np.ndarray, directory: str) -> np.ndarray:
    """`values` in pages the process may only read (a file mapped read-only): a write there
    kills the process (SIGSEGV), and a kernel copy into it fails (EFAULT)."""
    import mmap
    import tempfile

    with tempfile.NamedTemporaryFile(dir=directory) as f:
        f.write(values.tobytes())
        f.flush()
        pages = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(pages, values.dtype)


def in_place_roots_read_only(
    comm: minincl.Communicator, paths: list[tuple[str, str]], counts: list[int], directory: str
) -> list[str]:
    """read_only_in_place_roots under each (algorithm, protocol), on a split made with it."""
    wrong = []
    for algo, proto in paths:
        os.environ["MININCL_ALGO"], os.environ["MININCL_PROTO"] = algo, proto
        sub = comm.split(0)
        wrong += [f"{algo}/{proto} {w}" for w in read_only_in_place_roots(sub, counts, directory)]
        sub.destroy()
    return wrong


def read_only_in_place_roots(comm: minincl.Communicator, counts: list[int], directory: str) -> list[str]:
    """In-place broadcast from a root whose buffer is read-only memory, and in-place reduce
    where the non-roots' are (nothing is written there); what was wrong, if anything."""
    wrong = []
    total = comm.nranks * (comm.nranks + 1) // 2
    for n in counts:
        for root in range(comm.nranks):
            data = np.arange(n, dtype=np.float32) + root
            buf = read_only_mapping(data, directory) if comm.rank == root else np.zeros(n, np.float32)
            comm.broadcast(buf, root=root)
            if not np.array_equal(buf, data):
                wrong.append(f"broadcast n={n} root={root}")
            mine = np.full(n, comm.rank + 1, np.float32)
            buf = mine.copy() if comm.rank == root else read_only_mapping(mine, directory)
            comm.reduce(buf, root=root)
            want = np.full(n, total, np.float32) if comm.rank == root else mine
            if not np.array_equal(buf, want):
                wrong.append(f"reduce n={n} root={root}")
    return wrong


def window_arrays_past_dev_shm(comm: minincl.Communicator, big: int, small: int) -> list[str]:
    """An array bigger than /dev/shm holds, then a small one (in a window that could take both)."""
    said = []
    try:
        comm.empty(big, np.uint8)
        said.append("made")
    except minincl.Error as e:
        said.append(f"{type(e).__name__}: {e}")
    a = comm.empty(small, np.uint8)
    a[:] = 1
    comm.allreduce(a)
    said.append(f"small: {a.min()}..{a.max()}")
    return said


def receive_long_after_the_sender_left(comm: minincl.Communicator, idle: float, late: float) -> str:
    """Rank 0 sends 4 KiB to rank 1 (the FIFO holds it: the send ends at once) and destroys its
    communicator; rank 1, `idle` s later, receives it and rank 2's in one group; rank 2 sends
    `late` s after that. How rank 1's group ended."""
    x = np.full(1024, comm.rank + 1, np.float32)
    comm.barrier()
    if comm.rank == 0:
        comm.send(x, 1)
        comm.destroy()
        return "left"
    time.sleep(idle + (late if comm.rank == 2 else 0))
    if comm.rank == 2:
        comm.send(x, 1)
        return "sent"
    a, b = np.zeros(1024, np.float32), np.zeros(1024, np.float32)
    try:
        with minincl.group():
            comm.recv(a, 0)
            comm.recv(b, 2)
    except minincl.Error as e:
        return f"{type(e).__name__}: {e}"
    return "ok" if (a == 1).all() and (b == 3).all() else f"wrong: {a[:2]} {b[:2]}"


def destroy_beside_a_stopped_peer(comm: minincl.Communicator) -> float:
    """Rank 1 stops (SIGSTOP, a hung process) after a barrier; rank 0's sends to it return at
    once, its proxy still holding some of them to send, and it destroys its communicator. How
    long rank 0's destroy took."""
    comm.barrier()
    if comm.rank == 1:
        time.sleep(0.5)  # (its proxy delivers the barrier first)
        os.kill(os.getpid(), signal.SIGSTOP)
        return 0.0
    time.sleep(0.8)
    x = np.ones(16 << 10, np.float32)
    t = time.monotonic()
    for k in range(5):  # (320 KiB: more than the sockets hold, as much as the proxy's FIFOs take)
        try:
            comm.send(x, 1)
        except minincl.Error as e:
            raise RuntimeError(f"send {k} after {time.monotonic() - t:.2f} s: {e}") from e
    start = time.monotonic()
    comm.destroy()
    return time.monotonic() - start


def receive_beside_a_rank_that_left(comm: minincl.Communicator, late: float) -> str:
    """Rank 2 destroys its communicator; rank 0 receives from rank 1, which sends `late` s
    later: rank 2 has no part in it. How rank 0's receive ended."""
    comm.barrier()
    if comm.rank == 2:
        comm.destroy()
        return "left"
    x = np.full(1024, comm.rank + 1, np.float32)
    if comm.rank == 1:
        time.sleep(late)
        comm.send(x, 0)
        return "sent"
    try:
        comm.recv(x, 1)
    except minincl.Error as e:
        return f"{type(e).__name__}: {e}"
    return "ok" if (x == 2).all() else f"wrong: {x[:2]}"


def allreduces_past_dev_shm(comm: minincl.Communicator, counts: list[int]) -> list[str]:
    """Float32 allreduces of `counts` in turn (their sums checked), until one fails: what each did."""
    said = []
    for count in counts:
        x = np.full(count, comm.rank + 1, np.float32)
        try:
            comm.allreduce(x)
        except minincl.Error as e:
            said.append(f"{type(e).__name__}: {e}")
            break
        want = comm.nranks * (comm.nranks + 1) / 2
        said.append(f"{count}: {'right' if (x == want).all() else 'WRONG'}")
    return said


def sigbus_not_from_minincl(comm: minincl.Communicator, how: str) -> str:
    """Rank 0 gets a SIGBUS minincl has nothing to do with: sent by kill, or from a file mapping
    whose file was cut short. minincl's handler must let it kill the process."""
    comm.barrier()
    if comm.rank == 0:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGBUS)
        else:
            import mmap
            import tempfile

            with tempfile.TemporaryFile() as f:
                f.truncate(mmap.PAGESIZE)
                page = mmap.mmap(f.fileno(), mmap.PAGESIZE)
                f.truncate(0)
                page[0] = 1  # (past the file's end now: SIGBUS)
        time.sleep(5)
    return "lived"


def as_hosts(fn: Callable[..., Any], hosts: str, *args: Any, timeout: float = 90) -> list[Any]:
    """fn(comm, *args) in a process per letter of `hosts`, each with that letter as its
    MININCL_HOSTID ("AABB": ranks 0 and 1 pose as one host, 2 and 3 as another); each rank's
    result, its error as a string, or "died" (no result: it exited), in rank order."""
    import multiprocessing as mp
    import queue

    ctx = mp.get_context("spawn")
    uid, results = minincl.get_unique_id(), ctx.Queue()
    procs = [
        ctx.Process(target=rank_with_env, args=(fn, len(hosts), r, uid, {"MININCL_HOSTID": h}, args, results))
        for r, h in enumerate(hosts)
    ]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    while len(got) < len(procs) and time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            rank, _, value = results.get(timeout=0.1)
            got[rank] = value
            continue
        if all(not p.is_alive() for p in procs) and results.empty():
            break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()
    return [got.get(r, "died") for r in range(len(hosts))]


def rank_processes_are_not_others(comm: minincl.Communicator, marks: str, spinner: int) -> dict[str, bool]:
    """Rank 1 spins (runnable) until rank 0 says it is done looking at /proc. Rank 0 asks
    MININCL_BUSY_CORES=auto's test who else is runnable: while a communicator holds rank 1
    (two here, then the split gone), and after the last goes. What it saw, by pid."""
    ready, done = Path(marks) / "spinning", Path(marks) / "done"
    pids = np.zeros(2, np.int64)
    comm.allgather(np.array([os.getpid()], np.int64), pids)
    peer = int(pids[1])
    split = comm.split(0)
    if comm.rank == 1:
        ready.touch()
        while not done.exists():
            pass
        return {}
    while not ready.exists():
        time.sleep(0.01)

    def seen() -> set[int]:
        return {pid for pid, _ in minincl._core._runnable_threads_of_others()}

    with_two, peer_state = seen(), Path(f"/proc/{peer}/stat").read_text().rsplit(")", 1)[1].split()[0]
    split.destroy()
    with_one = seen()
    comm.destroy()
    after, spinning = seen(), Path(f"/proc/{peer}/stat").read_text().rsplit(")", 1)[1].split()[0] == "R"
    done.touch()
    return {
        "peer runnable": peer_state == "R" and spinning,
        "peer seen with two communicators": peer in with_two,
        "peer seen with one": peer in with_one,
        "peer seen after destroy": peer in after,
        "this process seen": os.getpid() in with_two | with_one | after,
        "spinner seen": spinner in with_two and spinner in with_one and spinner in after,
    }


def sleep_spells_on_one_cpu(comm: minincl.Communicator, cpu: int, compute: bool, seconds: float) -> int:
    """Every thread of this rank on `cpu` (with a computing thread of its own if `compute`),
    allreduces checked against the sum for `seconds`; then the times a wait of this process
    began a second of sleeping instead of yielding (MININCL_BUSY_CORES)."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # (a thread that ended meanwhile)
            os.sched_setaffinity(int(tid), {cpu})
    stop = threading.Event()

    def computing() -> None:
        a = np.ones((200, 200))
        while not stop.is_set():
            a = a @ a / 200  # (NumPy lets go of the GIL: this thread keeps the core)

    worker = threading.Thread(target=computing)
    if compute:
        worker.start()
    x = np.zeros((1 << 18) + 1, np.float32)  # (the last element: rank 0's time is up)
    try:
        end = time.monotonic() + seconds
        while True:
            x[:-1] = comm.rank + 1
            x[-1] = comm.rank == 0 and time.monotonic() > end
            comm.allreduce(x)
            assert (x[:-1] == comm.nranks * (comm.nranks + 1) / 2).all()
            if x[-1]:
                break
    finally:
        stop.set()
        if compute:
            worker.join()
    return int(minincl._core._busy_cores_stats()["sleep_spells"])


def send_recv_on_one_cpu(comm: minincl.Communicator, cpu: int, seconds: float) -> dict[str, int]:
    """Every thread of this rank on `cpu`, 2 ranks passing a 1 KiB message back and forth
    (rank 0 sends, then receives it back plus one) for `seconds`; then this process's sleeps
    on doorbells (MININCL_BUSY_CORES) and the message's rounds."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # (a thread that ended meanwhile)
            os.sched_setaffinity(int(tid), {cpu})
    x = np.zeros(256, np.float32)  # (x[-1]: rank 0's time is up)
    peer, rounds = 1 - comm.rank, 0
    end = time.monotonic() + seconds
    while True:
        if comm.rank == 0:
            x[:-1] = rounds
            x[-1] = time.monotonic() > end
            comm.send(x, peer)
            comm.recv(x, peer)
            assert (x[:-1] == rounds + 1).all()
        else:
            comm.recv(x, peer)
            assert (x[:-1] == rounds).all()
            x[:-1] += 1
            comm.send(x, peer)
        rounds += 1
        if x[-1]:
            break
    stats = minincl._core._busy_cores_stats()
    return {"rounds": rounds, "sleeps": int(stats["doorbell_sleeps"]), "wakes": int(stats["doorbell_wakes"])}


def split_beside_a_rank_that_destroys(comm: minincl.Communicator) -> str:
    """Rank 3 destroys its communicator (and stays alive) while the others split it: what
    each of them raised, or "made"."""
    comm.barrier()
    if comm.rank == 3:
        comm.destroy()
        time.sleep(3)  # (alive: the others must not hear of it by its exit)
        return "destroyed"
    try:
        comm.split(comm.rank % 2)
        said = "made"
    except minincl.Error as e:
        said = f"{type(e).__name__}: {e}"
    time.sleep(3)  # (alive: a rank's exit must not tell the next one)
    return said


def receives_moving_on_beside_a_rank_that_left(
    comm: minincl.Communicator, pieces: int, gap: float, late: float = 0.0
) -> str:
    """Rank 2 sends rank 0 one message and destroys its communicator; rank 1, `late` s later,
    sends `pieces` messages `gap` s apart; rank 0 receives them all in one group: how that
    group ended."""
    if comm.rank == 2:
        comm.send(np.full(4, 2.0, np.float32), 0)
        comm.destroy()
        return "left"
    if comm.rank == 1:
        time.sleep(late)
        for k in range(pieces):
            comm.send(np.full(4, k, np.float32), 0)
            time.sleep(gap)
        return "sent"
    got = [np.zeros(4, np.float32) for _ in range(pieces + 1)]
    try:
        with minincl.group():
            comm.recv(got[0], 2)
            for k in range(pieces):
                comm.recv(got[k + 1], 1)
    except minincl.Error as e:
        return f"{type(e).__name__}: {e}"
    right = (got[0] == 2).all() and all((got[k + 1] == k).all() for k in range(pieces))
    return "ok" if right else "wrong"
