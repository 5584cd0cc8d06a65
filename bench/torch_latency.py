"""What a small call costs through torch.distributed on CPU ranks: minincl's backend against gloo.

Each rank process runs both backends in turn (a fresh process group each), then minincl's own
call on the communicator under torch's group, for the floor. 8-byte tensors; per call, the
median of 5 loops, then the slower rank.

    python3 bench/torch_latency.py [--ranks 2] [--calls 2000]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist

import minincl.torch

# torch 2.13's names (their old ones, all_gather_into_tensor and reduce_scatter_tensor, warn on
# every call: ~10 us of deprecation machinery).
ALL_GATHER_SINGLE = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER_SINGLE = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@functools.cache
def _whole(numel: int, ranks: int) -> torch.Tensor:
    """The output of an all_gather_single of `numel` elements a rank, or the input of a
    reduce_scatter_single (made once)."""
    return torch.empty(numel * ranks)


def _round_trip(t: torch.Tensor) -> None:
    """Rank 0 sends to rank 1 and receives its reply, rank 1 the reverse: two hops, as a
    pipeline's stages pass activations and gradients (other ranks do nothing)."""
    rank = dist.get_rank()
    if rank == 0:
        dist.send(t, 1)
        dist.recv(t, 1)
    elif rank == 1:
        dist.recv(t, 0)
        dist.send(t, 0)


CALLS: dict[str, Callable[[torch.Tensor], object]] = {
    "all_reduce": lambda t: dist.all_reduce(t),
    "all_reduce(async_op=True).wait()": lambda t: dist.all_reduce(t, async_op=True).wait(),
    "all_reduce(async_op=True).get_future().wait()": lambda t: dist.all_reduce(t, async_op=True).get_future().wait(),
    "broadcast": lambda t: dist.broadcast(t, src=0),
    "all_gather_single": lambda t: ALL_GATHER_SINGLE(_whole(t.numel(), dist.get_world_size()), t),
    "reduce_scatter_single": lambda t: REDUCE_SCATTER_SINGLE(t, _whole(t.numel(), dist.get_world_size())),
    "barrier": lambda t: dist.barrier(),
    "send + recv round trip": _round_trip,
}

OWN = "minincl's own comm.allreduce(t)"
OWN_ASYNC = "minincl's own comm.allreduce(t, async_op=True).wait()"


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    for _ in range(calls // 10):
        fn()
    loops = []
    for _ in range(5):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        loops.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(loops)


def rank_main(calls: int) -> dict[str, float]:
    out = {}
    t = torch.ones(2)
    for backend in ("gloo", minincl.torch.BACKEND_NAME):
        dist.init_process_group(backend)
        for name, call in CALLS.items():
            out[f"{backend} {name}"] = per_call_us(lambda: call(t), calls)
        if backend == minincl.torch.BACKEND_NAME:
            comm = dist.group.WORLD._comms["cpu"].comm  # (the communicator under the group)
            out[OWN] = per_call_us(lambda: comm.allreduce(t), calls)
            out[OWN_ASYNC] = per_call_us(lambda: comm.allreduce(t, async_op=True).wait(), calls)
        dist.destroy_process_group()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--calls", type=int, default=2000)
    args = p.parse_args()
    results = minincl.torch.run_local(rank_main, args.ranks, args.calls, timeout=None)
    print(f"\n8-byte calls through torch.distributed, {args.ranks} CPU rank processes, us per call (slower rank)\n")
    print("| call | gloo | minincl |")
    print("|---|---:|---:|")
    for name in CALLS:
        gloo = max(r[f"gloo {name}"] for r in results)
        ours = max(r[f"minincl {name}"] for r in results)
        print(f"| {name} | {gloo:.1f} | {ours:.1f} |")
    for own in (OWN, OWN_ASYNC):
        print(f"| {own} | | {max(r[own] for r in results):.1f} |")


if __name__ == "__main__":
    main()
