"""`minincl bench`: the nccl-tests table, measured on ranks spawned on this machine."""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ._comm import Communicator, group, launch
from ._core import PreMulSum

COLLECTIVES = [
    "allreduce",
    "broadcast",
    "reduce",
    "allgather",
    "reduce_scatter",
    "alltoall",
    "gather",
    "scatter",
    "sendrecv",
]
# The collectives whose size (nccl-tests' column) is nranks blocks of `count` elements, those
# with a root, and those whose output only the root gets (the check skips the others).
BLOCKED = ("allgather", "reduce_scatter", "alltoall", "gather", "scatter")
ROOTED = ("broadcast", "reduce", "gather", "scatter")
TO_ROOT = ("reduce", "gather")
REDUCING = ("allreduce", "reduce", "reduce_scatter")
# Made of sends and receives (as NCCL makes them): no algorithm or protocol to choose.
OF_SENDS = ("alltoall", "gather", "scatter", "sendrecv")
DTYPES = {
    "int8": np.int8,
    "uint8": np.uint8,
    "int32": np.int32,
    "uint32": np.uint32,
    "int64": np.int64,
    "uint64": np.uint64,
    "float16": np.float16,
    "float32": np.float32,
    "float64": np.float64,
}
# Floats NumPy lacks, as ml_dtypes' NumPy types (what JAX uses; pip install ml_dtypes).
NARROW_FLOATS = ["bfloat16", "float8_e4m3fn", "float8_e5m2"]
OPS = ["sum", "prod", "max", "min", "avg", "premulsum", "band", "bor", "bxor"]  # premulsum: rank r scales by r % 2 + 1
BITWISE = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}  # integer types only


def numpy_dtype(name: str) -> Any:
    """The NumPy type of a --dtype name (ml_dtypes' for bfloat16 and the 8-bit floats)."""
    if name not in NARROW_FLOATS:
        return DTYPES[name]
    try:
        import ml_dtypes
    except ImportError:
        raise SystemExit(f"--dtype {name} needs ml_dtypes (pip install ml_dtypes)") from None
    return getattr(ml_dtypes, name)


def _tolerance(dtype: Any, nranks: int, op: str) -> float:
    """Relative error a check allows: half an ulp per step of a reduction (the reference rounds
    once) for the floats narrower than float16, which round at every step, and for any float
    avg, whose inputs are each scaled by 1/nranks rounded to the type, as NCCL's are (exact
    when nranks is a power of two). Otherwise none."""
    name = np.dtype(dtype).name
    bits = {"bfloat16": 8, "float8_e4m3fn": 4, "float8_e5m2": 3}.get(name)
    if bits is None and op == "avg" and nranks & (nranks - 1):
        bits = {"float16": 11, "float32": 24, "float64": 53}.get(name)
    return 0.0 if bits is None else nranks * 2.0**-bits


def _count_wrong(got: np.ndarray, want: np.ndarray, tol: float) -> int:
    """Elements of got farther than tol (relative) from want; a NaN is wrong."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    return int(np.count_nonzero(~(np.abs(g - w) <= tol * np.abs(w))))


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _size_option(text: str) -> str:
    """-b / -e: a size such as 8, 1K or 4M (kept as text; parse_size reads it)."""
    try:
        if parse_size(text) < 0:
            raise ValueError
    except (ValueError, OverflowError):  # (OverflowError: "infK", "1e400K")
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 8, 1K or 4M") from None
    return text


def _at_least(low: float, kind: type = int) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):  # ("inf", "1e400" and "nan" parse as floats)
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if value < low:
            raise argparse.ArgumentTypeError(f"{text} is below {low}")
        return value

    return parse


def bus_factor(coll: str, n: int) -> float:
    """nccl-tests' bus bandwidth factors: what each rank's links carry relative to the size."""
    if coll == "allreduce":
        return 2 * (n - 1) / n
    if coll in BLOCKED:
        return (n - 1) / n
    return 1.0


@dataclass
class Config:
    coll: str
    min_bytes: int
    max_bytes: int
    factor: float
    iters: int
    warmup: int
    dtype: str
    op: str
    root: int
    check: bool
    window: bool = False


def _smallest_row(cfg: Config, n: int) -> int:
    """The smallest size with an element for every rank (a whole block each, where blocked)."""
    return np.dtype(numpy_dtype(cfg.dtype)).itemsize * (n if cfg.coll in BLOCKED else 1)


def sizes(cfg: Config, n: int) -> list[int]:
    """-b, -e and -f's sizes, each rounded down to whole elements per rank (as its row
    reports it) and each once, less those too small for one element per rank (they would
    repeat the 0-byte row); -b 0 itself is a row, the cost of a call that moves nothing."""
    unit = _smallest_row(cfg, n)
    out: list[int] = []
    s = cfg.min_bytes
    while s <= cfg.max_bytes:
        rounded = s - s % unit
        if (s == 0 or rounded > 0) and (not out or rounded != out[-1]):
            out.append(rounded)
        nxt = int(s * cfg.factor)
        s = nxt if nxt > s else s + 1
    return out


def _pattern(rank: int, count: int, dtype: Any) -> np.ndarray:
    # Small integers: exact in every type, so sums and products check exactly.
    return ((np.arange(count, dtype=np.int64) * 7 + rank * 3) % 5 + 1).astype(dtype)


def _expected(cfg: Config, comm: Communicator, count: int, dtype: Any) -> np.ndarray:
    n, r = comm.nranks, comm.rank
    if cfg.coll in ("allreduce", "reduce", "reduce_scatter"):
        total = count * n if cfg.coll == "reduce_scatter" else count
        if cfg.op in BITWISE:
            red = BITWISE[cfg.op].reduce(np.stack([_pattern(q, total, dtype) for q in range(n)]), axis=0)
            return red[r * count : (r + 1) * count] if cfg.coll == "reduce_scatter" else red
        inputs = np.stack([_pattern(q, total, np.float64) for q in range(n)])
        red = {
            "sum": inputs.sum(0),
            "prod": inputs.prod(0),
            "max": inputs.max(0),
            "min": inputs.min(0),
            "avg": inputs.sum(0),
            "premulsum": sum((q % 2 + 1) * inputs[q] for q in range(n)),
        }[cfg.op]
        if np.issubdtype(dtype, np.integer):
            red = red.astype(np.int64).astype(dtype)  # wraps as the type does
            if cfg.op == "avg":
                red = (red.astype(np.int64) // n).astype(dtype) if np.all(red >= 0) else red
        elif cfg.op == "avg":
            red = red / n
        if np.dtype(dtype).name.startswith("float8"):  # minincl saturates them (NumPy's cast gives NaN)
            import ml_dtypes

            top = float(ml_dtypes.finfo(dtype).max)
            red = np.clip(red, -top, top)
        red = np.asarray(red).astype(dtype)
        return red[r * count : (r + 1) * count] if cfg.coll == "reduce_scatter" else red
    if cfg.coll == "broadcast":
        return _pattern(cfg.root, count, dtype)
    if cfg.coll in ("allgather", "gather"):
        return np.concatenate([_pattern(q, count, dtype) for q in range(n)])
    if cfg.coll == "scatter":
        return _pattern(cfg.root, count * n, dtype)[r * count : (r + 1) * count]
    if cfg.coll == "alltoall":
        return np.concatenate([_pattern(q, count * n, dtype)[r * count : (r + 1) * count] for q in range(n)])
    return _pattern((r - 1) % n, count, dtype)  # sendrecv


def _run_one(cfg: Config, comm: Communicator, send: np.ndarray, recv: np.ndarray) -> None:
    # Positional arguments: through pybind11 each keyword argument costs ~0.45 us per call,
    # as much as a whole 8-byte allreduce's own work.
    op: str | PreMulSum = PreMulSum(comm.rank % 2 + 1) if cfg.op == "premulsum" else cfg.op
    if cfg.coll == "allreduce":
        comm.allreduce(send, recv, op)
    elif cfg.coll == "broadcast":
        comm.broadcast(send, recv, cfg.root)
    elif cfg.coll == "reduce":
        comm.reduce(send, recv, op, cfg.root)
    elif cfg.coll == "allgather":
        comm.allgather(send, recv)
    elif cfg.coll == "reduce_scatter":
        comm.reduce_scatter(send, recv, op)
    elif cfg.coll == "alltoall":
        comm.alltoall(send, recv)
    elif cfg.coll == "gather":
        comm.gather(send, recv, cfg.root)
    elif cfg.coll == "scatter":
        comm.scatter(send, recv, cfg.root)
    else:
        n, r = comm.nranks, comm.rank
        with group():
            comm.send(send, (r + 1) % n)
            comm.recv(recv, (r - 1) % n)


def _shape(coll: str, n: int, nbytes: int, item: int) -> tuple[int, int, int]:
    """(count, send elements, receive elements) of one rank's call for a size (nccl-tests')."""
    if coll in BLOCKED:
        count = nbytes // item // n
        send = count if coll in ("allgather", "gather") else count * n
        recv = count if coll in ("reduce_scatter", "scatter") else count * n
        return count, send, recv
    count = nbytes // item
    return count, count, count


def _buffers(cfg: Config, n: int, rank: int, nbytes: int, dtype: Any) -> tuple[int, np.ndarray, np.ndarray]:
    count, send, recv = _shape(cfg.coll, n, nbytes, np.dtype(dtype).itemsize)
    return count, _pattern(rank, send, dtype), np.zeros(recv, dtype)


def _in_window(comm: Communicator, a: np.ndarray) -> np.ndarray:
    w = comm.empty(a.shape, a.dtype)
    w[...] = a
    return w


def iterations(cfg: Config, nbytes: int) -> tuple[int, int]:
    """(timed, warm-up) calls for one size: --iters/--warmup if given, else enough calls to
    move about 64 MiB (20 to 1000) after as many warm-up calls, so one scheduling stall cannot
    dominate a small size (on CPU ranks, fewer where calls are slow: _within_time_budget)."""
    if cfg.iters > 0:
        return cfg.iters, cfg.warmup
    iters = max(20, min(1000, (64 << 20) // max(nbytes, 1)))
    return iters, max(cfg.warmup, iters)


ROW_SECONDS = 1.0  # about how long the timed calls of a size may take, when --iters is not given


def _across_ranks(comm: Communicator, value: np.ndarray, op: str) -> None:
    """`value` (one element) becomes its max or sum over the ranks, in place. Through gather and
    scatter: sends and receives, which take no algorithm, so the bookkeeping runs whatever
    MININCL_ALGO / MININCL_PROTO allow the measured collective (direct allows no allreduce on
    10 ranks, yet alltoall runs there)."""
    gathered = comm.gather(value, root=0)
    if comm.rank != 0:
        comm.scatter(recv=value, root=0)
        return
    assert gathered is not None
    combined = gathered.max() if op == "max" else gathered.sum()
    comm.scatter(np.full(comm.nranks, combined, dtype=value.dtype), value, root=0)


def _within_time_budget(
    comm: Communicator, cfg: Config, send: np.ndarray, recv: np.ndarray, iters: int, warmup: int
) -> tuple[int, int]:
    """Fewer calls where each is slow: with ranks far outnumbering the cores (64 on 2 took
    0.12 s per 8-byte allreduce) 1000 calls and as many warm-ups ran for minutes a size. The
    first warm-up calls are timed; the slowest rank's time decides for every rank. Returns
    (timed, warm-up) calls, the warm-up ones still to make."""
    probe = min(3, warmup)
    t0 = time.perf_counter()
    for _ in range(probe):
        _run_one(cfg, comm, send, recv)
    per_call = np.array([(time.perf_counter() - t0) / max(probe, 1)], dtype=np.float64)
    _across_ranks(comm, per_call, "max")
    cap = max(5, int(ROW_SECONDS / per_call[0])) if per_call[0] > 0 else iters
    return min(iters, cap), max(0, min(warmup, cap) - probe)


def bench_rank(comm: Communicator, cfg: Config) -> list[tuple[int, int, float, int]]:
    """Runs the sweep on one rank; returns (bytes, count, seconds per op, wrong) rows."""
    dtype = numpy_dtype(cfg.dtype)
    n = comm.nranks
    rows = []
    if comm.rank == 0:
        print(_header(cfg, n), flush=True)
    for nbytes in sizes(cfg, n):
        count, send, recv = _buffers(cfg, n, comm.rank, nbytes, dtype)
        if cfg.window:  # the same values, in the communicator's window
            send, recv = _in_window(comm, send), _in_window(comm, recv)
        iters, warmup = iterations(cfg, nbytes)
        if not cfg.iters:
            iters, warmup = _within_time_budget(comm, cfg, send, recv, iters, warmup)
        for _ in range(warmup):
            _run_one(cfg, comm, send, recv)
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            _run_one(cfg, comm, send, recv)
        elapsed = np.array([(time.perf_counter() - t0) / max(iters, 1)], dtype=np.float64)
        _across_ranks(comm, elapsed, "max")
        wrong = np.zeros(1, dtype=np.int64)
        if cfg.check:
            recv[...] = 0
            _run_one(cfg, comm, send, recv)
            if cfg.coll in TO_ROOT and comm.rank != cfg.root:
                pass
            else:
                want = _expected(cfg, comm, count, dtype)
                got = recv.reshape(-1)[: want.size]
                wrong[0] = _count_wrong(got, want, _tolerance(dtype, n, cfg.op))
            _across_ranks(comm, wrong, "sum")
        row = (
            count * np.dtype(dtype).itemsize * (n if cfg.coll in BLOCKED else 1),
            count,
            float(elapsed[0]),
            int(wrong[0]) if cfg.check else -1,
        )
        rows.append(row)
        if comm.rank == 0:
            print(_row(cfg, n, row), flush=True)
    return rows


def bench_gpu_ranks(comms: list[Communicator], cfg: Config) -> list[tuple[int, int, float, int]]:
    """The sweep with every rank on one GPU in this process, driven by this thread: each
    iteration is one group of all ranks' calls (the kernels run side by side on the GPU).
    Times the enqueued iterations up to a device synchronisation."""
    import cupy as cp  # the GPU arrays; minincl[cupy]

    dtype = DTYPES[cfg.dtype]
    n = len(comms)
    rows = []
    print(_header(cfg, n, "one process, ranks on " + comms[0].device), flush=True)

    def step(sends: list[Any], recvs: list[Any]) -> None:
        with group():
            for c in comms:
                _run_one(cfg, c, sends[c.rank], recvs[c.rank])

    for nbytes in sizes(cfg, n):
        host = [_buffers(cfg, n, r, nbytes, dtype) for r in range(n)]
        count = host[0][0]
        sends = [cp.asarray(h[1]) for h in host]
        recvs = [cp.asarray(h[2]) for h in host]
        iters, warmup = iterations(cfg, nbytes)
        for _ in range(warmup):
            step(sends, recvs)
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            step(sends, recvs)
        cp.cuda.Device().synchronize()
        secs = (time.perf_counter() - t0) / max(iters, 1)
        wrong = -1
        if cfg.check:
            wrong = 0
            for r in recvs:
                r.fill(0)
            step(sends, recvs)
            for c in comms:
                if cfg.coll in TO_ROOT and c.rank != cfg.root:
                    continue
                want = _expected(cfg, c, count, dtype)
                got = cp.asnumpy(recvs[c.rank]).reshape(-1)[: want.size]
                wrong += _count_wrong(got, want, _tolerance(dtype, c.nranks, cfg.op))
        row = (
            count * np.dtype(dtype).itemsize * (n if cfg.coll in BLOCKED else 1),
            count,
            secs,
            wrong,
        )
        rows.append(row)
        print(_row(cfg, n, row), flush=True)
    return rows


def _redop(cfg: Config) -> str:
    return cfg.op if cfg.coll in REDUCING else "none"


def _header(cfg: Config, n: int, where: str = "processes") -> str:
    algo = os.environ.get("MININCL_ALGO", "auto")
    proto = os.environ.get("MININCL_PROTO", "auto")
    if cfg.coll in OF_SENDS:
        algo, proto = "none (sends and receives)", "Simple"
    lines = [
        f"# minincl bench {cfg.coll}: {n} ranks ({where}), dtype {cfg.dtype}, op {_redop(cfg)}, "
        f"algo {algo}, proto {proto}, iters {cfg.iters or 'by size'}, "
        f"warmup {cfg.warmup if cfg.iters else f'as many as iters (at least {cfg.warmup})'}",
        "#",
        f"# {'size':>12} {'count':>12} {'type':>13} {'redop':>9} {'root':>5} {'time':>10} "
        f"{'algbw':>8} {'busbw':>8} {'#wrong':>7}",
        f"# {'(B)':>12} {'(elements)':>12} {'':>13} {'':>9} {'':>5} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} {'':>7}",
    ]
    return "\n".join(lines)


def _bandwidths(cfg: Config, n: int, row: tuple[int, int, float, int]) -> tuple[float, float]:
    """(algbw, busbw) of a row, in GB/s."""
    nbytes, _, secs, _ = row
    algbw = nbytes / secs / 1e9 if secs > 0 else 0.0
    return algbw, algbw * bus_factor(cfg.coll, n)


def _row(cfg: Config, n: int, row: tuple[int, int, float, int]) -> str:
    nbytes, count, secs, wrong = row
    algbw, busbw = _bandwidths(cfg, n, row)
    redop = _redop(cfg)
    root = str(cfg.root) if cfg.coll in ROOTED else "-1"
    wrong_s = "N/A" if wrong < 0 else str(wrong)
    return (
        f"  {nbytes:>12} {count:>12} {cfg.dtype:>13} {redop:>9} {root:>5} {secs * 1e6:>10.2f} "
        f"{algbw:>8.3f} {busbw:>8.3f} {wrong_s:>7}"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("collective", nargs="?", default="allreduce", choices=COLLECTIVES)
    p.add_argument(
        "--ranks",
        "-n",
        type=_at_least(1),
        default=2,
        help="local ranks to spawn (processes, each bound to a core of its own: MININCL_CPU_BIND=1 unless set; "
        "default 2)",
    )
    p.add_argument("-b", "--minbytes", type=_size_option, default="8", help="smallest size, e.g. 8, 1K, 4M (default 8)")
    p.add_argument("-e", "--maxbytes", type=_size_option, default="64M", help="largest size (default 64M)")
    p.add_argument(
        "-f",
        "--stepfactor",
        type=_at_least(1.01, float),
        default=2.0,
        help="size multiplier between rows (at least 1.01; default 2)",
    )
    p.add_argument("--iters", type=_at_least(0), default=0, help="timed iterations per size (default: by size)")
    p.add_argument(
        "--warmup",
        type=_at_least(0),
        default=5,
        help="untimed calls per size before the timed ones (default 5; with --iters unset, at least as many as "
        "the timed ones)",
    )
    p.add_argument("--dtype", default="float32", choices=[*DTYPES, *NARROW_FLOATS], help="(default float32)")
    p.add_argument("--op", default="sum", choices=OPS, help="for the reducing collectives (default sum)")
    p.add_argument("--root", type=int, default=0, help="broadcast, reduce, gather and scatter's root (default 0)")
    p.add_argument("--algo", help="force algorithms (MININCL_ALGO syntax)")
    p.add_argument("--proto", help="force protocols (MININCL_PROTO syntax)")
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        help="cpu: rank processes on this host's cores; cuda: every rank on GPU 0, in this process "
        "(default: cuda when a GPU and CuPy are usable, else cpu)",
    )
    p.add_argument("--check", action="store_true", help="verify results against NumPy; counts #wrong")
    p.add_argument(
        "--window",
        action="store_true",
        help="buffers from Communicator.empty (shared memory peers read directly; sets MININCL_WINDOW_BYTES)",
    )


def _default_device() -> str:
    from ._comm import gpu_count

    if gpu_count() == 0:
        return "cpu"
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "cpu"
    return "cuda"


def _check_options(args: argparse.Namespace) -> None:
    """Refuses --algo and --proto where nothing would take them. (--op and --root, like
    nccl-tests' -o and -r, are for the collectives that have them: the table shows "none"
    and -1 for the others.)"""
    coll = args.collective
    for option, value in (("--algo", args.algo), ("--proto", args.proto)):
        if value and coll in OF_SENDS:
            raise SystemExit(
                f"minincl bench: {option} {value}: {coll} runs as sends and receives, which have no algorithm or "
                f"protocol to choose ({option} is for the other collectives)"
            )


def run(args: argparse.Namespace) -> int:
    if parse_size(args.minbytes) > parse_size(args.maxbytes):
        raise SystemExit(f"minincl bench: -b {args.minbytes} is above -e {args.maxbytes}")
    _check_options(args)
    if args.device is None:
        args.device = _default_device()
    if args.algo:
        os.environ["MININCL_ALGO"] = args.algo
    if args.proto:
        os.environ["MININCL_PROTO"] = args.proto
    os.environ.setdefault("MININCL_CPU_BIND", "1")  # a core per rank process, as mpirun binds
    if args.window:  # the largest send and receive buffers, with room to spare
        need = 4 * parse_size(args.maxbytes) * (args.ranks if args.collective != "allreduce" else 1)
        os.environ.setdefault("MININCL_WINDOW_BYTES", str(need + (64 << 20)))
    cfg = Config(
        args.collective,
        parse_size(args.minbytes),
        parse_size(args.maxbytes),
        args.stepfactor,
        args.iters,
        args.warmup,
        args.dtype,
        args.op,
        args.root,
        args.check,
        args.window,
    )
    reduces = args.collective in ("allreduce", "reduce", "reduce_scatter")
    if reduces and args.op in BITWISE and not np.issubdtype(DTYPES.get(args.dtype, np.float32), np.integer):
        raise SystemExit(
            f"minincl bench: --op {args.op} combines integers bit by bit; --dtype {args.dtype} is not an integer type"
        )
    if not sizes(cfg, args.ranks):
        least = _smallest_row(cfg, args.ranks)
        raise SystemExit(
            f"minincl bench: no size from -b {args.minbytes} to -e {args.maxbytes} holds a whole {args.dtype} "
            f"element per rank for {args.collective} on {args.ranks} ranks (it takes {least} B)"
        )
    if args.device == "cuda" and args.dtype in NARROW_FLOATS:
        raise SystemExit(
            f"minincl bench: --dtype {args.dtype} on the GPU: CuPy has no such type; use minincl-perf -D cuda -d ..."
        )
    if args.device == "cpu":
        _check_memory(cfg, args.ranks, args.maxbytes)
    if args.device == "cuda":
        _check_gpu()
        comms = Communicator.init_all(args.ranks, device="cuda")
        try:
            rows = bench_gpu_ranks(comms, cfg)
        finally:
            for c in comms:
                c.destroy()
    else:
        rows = launch(bench_rank, args.ranks, cfg)[0]
    wrong = sum(r[3] for r in rows if r[3] > 0)
    if cfg.check:
        print(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    busbw = [_bandwidths(cfg, args.ranks, r)[1] for r in rows]
    print(f"# Avg bus bandwidth    : {sum(busbw) / max(len(busbw), 1):g}")  # (GB/s, as nccl-tests)
    return 0 if wrong == 0 else 1


def _check_gpu() -> None:
    """--device cuda where it cannot run: said in the command's terms."""
    from ._comm import gpu_count
    from ._core import build_info

    if not build_info()["cuda"]:
        raise SystemExit(
            "minincl bench: --device cuda: this build of minincl has no CUDA backend (nvcc was not found when it "
            "was built, or -C cmake.define.MININCL_CUDA=OFF); use --device cpu"
        )
    if gpu_count() == 0:
        raise SystemExit("minincl bench: --device cuda: no usable GPU here; use --device cpu")


def _check_memory(cfg: Config, n: int, max_text: str) -> None:
    """Refuses a sweep whose largest buffers would not fit this machine's memory, before the
    ranks start: otherwise they allocate their way to a MemoryError or the OOM killer."""
    item = np.dtype(numpy_dtype(cfg.dtype)).itemsize
    _, send, recv = _shape(cfg.coll, n, sizes(cfg, n)[-1], item)
    # (The input is built as int64 before its cast; a check compares float64 copies.)
    per_rank = send * (item + 8) + recv * (item + (16 if cfg.check else 0))
    have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if per_rank * n > have:
        raise SystemExit(
            f"minincl bench: -e {max_text} needs about {per_rank * n / 2**30:.1f} GiB for {n} ranks; "
            f"this machine has {have / 2**30:.1f} GiB"
        )
