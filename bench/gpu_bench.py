"""GPU measurements for bench/device_check.sh, one part per invocation (each under its own timeout):

    python3 bench/gpu_bench.py d2d      --json OUT.json   # device-to-device copy bandwidth (CuPy)
    python3 bench/gpu_bench.py latency  --json OUT.json   # 8-byte allreduce, 2 ranks, one thread, group
    python3 bench/gpu_bench.py graph    --json OUT.json   # the same captured in a CUDA graph, replayed
    python3 bench/gpu_bench.py threads  --json OUT.json   # 8-byte allreduce, a thread and stream per rank
    python3 bench/gpu_bench.py floor    --json OUT.json   # what launches and a handshake cost alone

Run it where ``import minincl`` finds the installed package (the source tree's ``minincl/`` has
no compiled core): ``python3 bench/gpu_bench.py`` from the repository root does, since Python
puts ``bench/`` first on the path. Latency targets: <= 8 us per grouped call back to back,
<= 4 us per call replayed from a graph. The JSON holds what was measured, or the error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable

DEVICE = "cuda:0"


def init(nranks: int, proto: str | None) -> list[Any]:
    import minincl

    saved = os.environ.get("MININCL_PROTO")
    try:
        if proto:
            os.environ["MININCL_PROTO"] = proto
        else:
            os.environ.pop("MININCL_PROTO", None)
        return minincl.Communicator.init_all(nranks, device=DEVICE)
    finally:
        if saved is None:
            os.environ.pop("MININCL_PROTO", None)
        else:
            os.environ["MININCL_PROTO"] = saved


def part_d2d(args: argparse.Namespace) -> dict[str, Any]:
    """Device-to-device copy of args.bytes: cupy.copyto and cudaMemcpyAsync, timed with events.
    copy_gbs counts the bytes once (as a copy's bandwidth); traffic_gbs counts read + write."""
    import cupy as cp

    nbytes = args.bytes
    src = cp.ones(nbytes // 4, cp.float32)
    dst = cp.empty_like(src)
    cp.cuda.Device().synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    out: dict[str, Any] = {"bytes": nbytes, "iters": args.iters}

    def timed(fn: Callable[[], None]) -> float:
        with s:
            for _ in range(3):
                fn()
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(s)
            for _ in range(args.iters):
                fn()
            e1.record(s)
            e1.synchronize()
        return cp.cuda.get_elapsed_time(e0, e1) * 1e3 / args.iters  # us per copy

    out["copyto_us"] = timed(lambda: cp.copyto(dst, src))
    kind = cp.cuda.runtime.memcpyDeviceToDevice
    out["memcpy_us"] = timed(lambda: cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, kind, s.ptr))
    best = min(out["copyto_us"], out["memcpy_us"])
    out["copy_us"] = best
    out["copy_gbs"] = nbytes / best / 1e3
    out["traffic_gbs"] = 2 * nbytes / best / 1e3
    props = cp.cuda.runtime.getDeviceProperties(0)
    out["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    out["sms"] = int(props["multiProcessorCount"])
    return out


def _latency_one(cp: Any, comms: list[Any], calls: int, count: int) -> dict[str, Any]:
    import minincl

    n = len(comms)
    xs = [cp.full(count, r + 1, cp.float32) for r in range(n)]
    ys = [cp.zeros(count, cp.float32) for _ in range(n)]
    cp.cuda.Device().synchronize()  # filled on the legacy stream, which `s` does not wait for
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        for _ in range(100):
            with minincl.group():
                for c in comms:
                    c.allreduce(xs[c.rank], ys[c.rank])
        s.synchronize()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(s)
        t0 = time.perf_counter()
        for _ in range(calls):
            with minincl.group():
                for c in comms:
                    c.allreduce(xs[c.rank], ys[c.rank])
        t_enqueue = time.perf_counter() - t0
        e1.record(s)
        s.synchronize()
        wall = time.perf_counter() - t0
    want = float(n * (n + 1) // 2)
    ok = all(bool((cp.asnumpy(y) == want).all()) for y in ys)
    return {
        "us_per_op": wall / calls * 1e6,
        "gpu_us_per_op": cp.cuda.get_elapsed_time(e0, e1) * 1e3 / calls,
        "enqueue_us_per_op": t_enqueue / calls * 1e6,
        "calls": calls,
        "correct": ok,
    }


def part_latency(args: argparse.Namespace) -> dict[str, Any]:
    """args.calls grouped allreduces of 8 bytes (2 float32) back to back, 2 ranks on one GPU,
    one thread: the tuner's choice, then LL forced. Target <= 8 us per op."""
    import cupy as cp

    out: dict[str, Any] = {"nranks": args.nranks, "bytes": 8, "target_us": 8.0}
    for label, proto in (("auto", None), ("ll", "ll")):
        comms: list[Any] = []
        try:
            comms = init(args.nranks, proto)
            out[label] = _latency_one(cp, comms, args.calls, 2)
        except Exception as e:  # noqa: BLE001 - recorded, the next variant still runs
            out[label] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
        finally:
            for c in comms:
                c.destroy()
    return out


def part_graph(args: argparse.Namespace) -> dict[str, Any]:
    """args.per_graph grouped 8-byte allreduces (2 ranks) captured in one CUDA graph, replayed
    args.replays times; time per allreduce. Target <= 4 us per op."""
    import cupy as cp

    import minincl

    n, count = args.nranks, 2
    out: dict[str, Any] = {"nranks": n, "bytes": 8, "per_graph": args.per_graph, "target_us": 4.0}
    comms = init(n, None)
    try:
        xs = [cp.full(count, r + 1, cp.float32) for r in range(n)]
        ys = [cp.zeros(count, cp.float32) for _ in range(n)]
        cp.cuda.Device().synchronize()
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            with minincl.group():  # one eager call first: lazy setup stays out of the capture
                for c in comms:
                    c.allreduce(xs[c.rank], ys[c.rank])
            s.synchronize()
            t0 = time.perf_counter()
            s.begin_capture()
            try:
                for _ in range(args.per_graph):
                    with minincl.group():
                        for c in comms:
                            c.allreduce(xs[c.rank], ys[c.rank])
            except BaseException:
                with contextlib.suppress(Exception):  # end the broken capture; report the first error
                    s.end_capture()
                raise
            graph = s.end_capture()
            out["capture_s"] = time.perf_counter() - t0
            graph.launch(stream=s)
            graph.launch(stream=s)
            s.synchronize()
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(s)
            t0 = time.perf_counter()
            for _ in range(args.replays):
                graph.launch(stream=s)
            e1.record(s)
            s.synchronize()
            wall = time.perf_counter() - t0
        ops = args.replays * args.per_graph
        want = float(n * (n + 1) // 2)
        out.update(
            replays=args.replays,
            us_per_op=wall / ops * 1e6,
            gpu_us_per_op=cp.cuda.get_elapsed_time(e0, e1) * 1e3 / ops,
            correct=all(bool((cp.asnumpy(y) == want).all()) for y in ys),
        )
    finally:
        for c in comms:
            c.destroy()
    return out


def part_threads(args: argparse.Namespace) -> dict[str, Any]:
    """8-byte allreduce, a thread and a non-blocking stream per rank (NCCL's usual model)."""
    import cupy as cp

    n, count, calls = args.nranks, 2, args.calls
    comms = init(n, None)
    times: list[float] = [0.0] * n
    errors: list[str | None] = [None] * n
    ready = threading.Barrier(n)
    # Every array made up front: a CuPy kernel loaded (lazily) by one rank's thread while the
    # other rank's collective spins can wait for the device to go idle, which it never does.
    xs = [cp.full(count, r + 1, cp.float32) for r in range(n)]
    ys = [cp.zeros(count, cp.float32) for _ in range(n)]
    cp.cuda.Device().synchronize()

    def body(c: Any) -> None:
        try:
            s = cp.cuda.Stream(non_blocking=True)
            with s:
                x = xs[c.rank]
                for _ in range(100):
                    c.allreduce(x, ys[c.rank])
                s.synchronize()
                ready.wait(30)
                t0 = time.perf_counter()
                for _ in range(calls):
                    c.allreduce(x, ys[c.rank])
                s.synchronize()
                times[c.rank] = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - reported
            errors[c.rank] = f"{type(e).__name__}: {e}"
            ready.abort()

    try:
        threads = [threading.Thread(target=body, args=(c,), daemon=True) for c in comms]
        for t in threads:
            t.start()
        for t in threads:
            t.join(args.join_timeout)
        if any(t.is_alive() for t in threads):
            for c in comms:
                c.abort()
            return {"error": f"a rank thread did not finish within {args.join_timeout} s (comms aborted)"}
        if any(errors):
            return {"error": "; ".join(e for e in errors if e)}
        want = float(n * (n + 1) // 2)
        return {
            "nranks": n,
            "bytes": 8,
            "calls": calls,
            "us_per_op": max(times) / calls * 1e6,
            "correct": all(bool((cp.asnumpy(y) == want).all()) for y in ys),
        }
    finally:
        for c in comms:
            c.destroy()


# Two blocks (or two kernels of one block) that each bump their own counter and wait for the
# other's: the least a 2-rank 8-byte exchange does on one GPU, without minincl.
_FLOOR_SRC = r"""
extern "C" __global__ void empty_kernel() {}
extern "C" __global__ void empty_params_2k(PARAMS) {}
extern "C" __global__ void handshake(unsigned long long* counters, int first) {
  if (threadIdx.x != 0) return;
  int me = first + blockIdx.x;
  volatile unsigned long long* mine = counters + me * 32;
  volatile unsigned long long* other = counters + (me ^ 1) * 32;
  unsigned long long want = *mine + 1;
  *mine = want;
  __threadfence();
  while (*other < want) {
  }
}
"""


def part_floor(args: argparse.Namespace) -> dict[str, Any]:
    """The floor under part_latency and part_graph, from kernels of our own (CuPy RawKernel):
    an empty kernel per op, two empty kernels forked onto two streams and joined (minincl's
    shape for two ranks on one stream), and a 2-way flag handshake, as one kernel of two blocks
    (a fused launch) or as two forked kernels. Back to back and replayed from a graph."""
    import cupy as cp
    import numpy as np

    # 2.3 KiB of kernel arguments, as many as minincl's collective kernel takes.
    n_params = 288
    params = ", ".join(f"unsigned long long p{i}" for i in range(n_params))
    mod = cp.RawModule(code=_FLOOR_SRC.replace("PARAMS", params))
    empty = mod.get_function("empty_kernel")
    empty_big = mod.get_function("empty_params_2k")
    big_args = tuple(np.uint64(i) for i in range(n_params))
    handshake = mod.get_function("handshake")
    counters = cp.zeros(64, cp.uint64)
    cp.cuda.Device().synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    side = cp.cuda.Stream(non_blocking=True)
    fork, join = cp.cuda.Event(disable_timing=True), cp.cuda.Event(disable_timing=True)

    def on(stream: Any, kernel: Any, blocks: int, kargs: tuple[Any, ...]) -> None:
        with stream:  # a RawKernel launches on the current stream
            kernel((blocks,), (32,), kargs)

    def forked(kernel: Any, args_a: tuple[Any, ...], args_b: tuple[Any, ...]) -> None:
        fork.record(s)
        side.wait_event(fork)
        on(s, kernel, 1, args_a)
        on(side, kernel, 1, args_b)
        join.record(side)
        s.wait_event(join)

    shapes: dict[str, Callable[[], None]] = {
        "empty_1": lambda: on(s, empty, 1, ()),
        "empty_1_params_2k": lambda: on(s, empty_big, 1, big_args),
        "empty_2_forked": lambda: forked(empty, (), ()),
        "handshake_fused": lambda: on(s, handshake, 2, (counters, cp.int32(0))),
        "handshake_forked": lambda: forked(handshake, (counters, cp.int32(0)), (counters, cp.int32(1))),
    }

    def timed(op: Callable[[], None]) -> dict[str, float]:
        for _ in range(50):
            op()
        s.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            op()
        s.synchronize()
        eager = (time.perf_counter() - t0) / args.calls * 1e6
        s.begin_capture()
        for _ in range(args.per_graph):
            op()
        graph = s.end_capture()
        graph.launch(stream=s)
        s.synchronize()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(s)
        for _ in range(args.replays):
            graph.launch(stream=s)
        e1.record(s)
        s.synchronize()
        replayed = cp.cuda.get_elapsed_time(e0, e1) * 1e3 / (args.replays * args.per_graph)
        return {"back_to_back": eager, "graph": replayed}

    out: dict[str, Any] = {"unit": "us per op"}
    for name, op in shapes.items():
        try:
            out[name] = timed(op)
        except Exception as e:  # noqa: BLE001 - recorded, the next shape still runs
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    return out


PARTS = {"d2d": part_d2d, "latency": part_latency, "graph": part_graph, "threads": part_threads, "floor": part_floor}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=sorted(PARTS))
    ap.add_argument("--json", help="write the result here (also printed)")
    ap.add_argument("--bytes", type=int, default=256 << 20, help="d2d: bytes per copy")
    ap.add_argument("--iters", type=int, default=20, help="d2d: timed copies")
    ap.add_argument("--nranks", type=int, default=2)
    ap.add_argument("--calls", type=int, default=1000, help="latency/threads: timed calls")
    ap.add_argument("--per-graph", type=int, default=100, help="graph: calls captured per graph")
    ap.add_argument("--replays", type=int, default=20, help="graph: timed replays")
    ap.add_argument("--join-timeout", type=float, default=60.0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    try:
        result = PARTS[args.part](args)
        code = 0
    except Exception as e:  # noqa: BLE001 - the device check records it and goes on
        result = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
        code = 1
    result["part"] = args.part
    result["seconds"] = time.perf_counter() - t0
    try:
        import minincl

        result["minincl"] = minincl.__file__
    except Exception as e:  # noqa: BLE001
        result["minincl"] = f"import failed: {e}"
    text = json.dumps(result, indent=1, default=str)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
