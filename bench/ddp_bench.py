"""DDP (or FSDP2) step time on local CPU ranks: the minincl backend against gloo, interleaved.

Both process groups live in the same processes (gloo is the default group, minincl a second
group over the same ranks); two identical models train under DDP, one on each, and the steps
alternate gloo, minincl, gloo, ... so that both see the same machine state. Prints a markdown
table of median step times.

With `--fsdp` each model is sharded with FSDP2 (`fully_shard`, each linear layer a unit) over
a DeviceMesh made from its group: every step all-gathers each layer's weights before its
forward and again before its backward, and reduce-scatters its gradients.

    python bench/ddp_bench.py                         # 2 local ranks
    python bench/ddp_bench.py --ranks 2 --width 1024 --layers 4 --steps 30
    python bench/ddp_bench.py --hook bf16             # gradients allreduced as bfloat16
    python bench/ddp_bench.py --fsdp [--bf16]         # FSDP2 [with bfloat16 weights]
    torchrun --nproc-per-node 2 bench/ddp_bench.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import minincl.torch


def make_model(width: int, layers: int) -> nn.Module:
    torch.manual_seed(0)
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks)


def bfloat16_hook(group, bucket):  # type: ignore[no-untyped-def]  # (DDP checks the annotations' objects)
    """PyTorch's fp16_compress_hook in bfloat16 (its own bf16 hook, by name, refuses CPU process groups)."""
    sent = bucket.buffer().to(torch.bfloat16).div_(group.size())
    fut = dist.all_reduce(sent, group=group, async_op=True).get_future()

    def unpack(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        return bucket.buffer().copy_(f.value()[0])

    return fut.then(unpack)


def wrap(model: nn.Module, group: dist.ProcessGroup, args: argparse.Namespace) -> nn.Module:
    """DDP over `group`, or FSDP2 over a one-dimensional mesh of it."""
    if not args.fsdp:
        return DistributedDataParallel(model, process_group=group)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = DeviceMesh.from_group(group, "cpu")
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    policy = bf16 if args.bf16 else MixedPrecisionPolicy()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy)


def timed_step(ddp: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, sync: dist.ProcessGroup) -> float:
    dist.barrier(group=sync)  # start together: a step's time is then the slowest rank's
    start = time.perf_counter()
    opt.zero_grad()
    ddp(x).float().square().mean().backward()  # DDP allreduces the gradients in buckets here
    opt.step()
    return time.perf_counter() - start


def bench(args: argparse.Namespace) -> dict[str, list[float]]:
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    groups = {
        "gloo": dist.group.WORLD,
        "minincl": dist.new_group(backend=minincl.torch.BACKEND_NAME),
    }
    ddps = {name: wrap(make_model(args.width, args.layers), pg, args) for name, pg in groups.items()}
    if args.hook != "none":  # gradient compression: allreduce 16-bit copies of the gradients
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hook = default_hooks.fp16_compress_hook if args.hook == "fp16" else bfloat16_hook
        for name, ddp in ddps.items():
            ddp.register_comm_hook(groups[name], hook)
    opts = {name: torch.optim.SGD(m.parameters(), lr=1e-3) for name, m in ddps.items()}
    x = torch.randn(args.batch, args.width)
    times: dict[str, list[float]] = {name: [] for name in ddps}
    for step in range(args.warmup + args.steps):
        for name, ddp in ddps.items():  # interleaved: gloo, minincl, gloo, minincl, ...
            t = timed_step(ddp, opts[name], x, groups["gloo"])
            if step >= args.warmup:
                times[name].append(t)
    params = sum(p.numel() for p in make_model(args.width, args.layers).parameters())
    if dist.get_rank() == 0:
        print_table(args, params, times)
    dist.destroy_process_group()
    return times


def print_table(args: argparse.Namespace, params: int, times: dict[str, list[float]]) -> None:
    gloo = statistics.median(times["gloo"])
    sent = "" if args.hook == "none" else f", allreduced as {args.hook}"
    kind = ("FSDP2 with bfloat16 weights" if args.bf16 else "FSDP2") if args.fsdp else "DDP"
    print(
        f"\n{kind} on {dist.get_world_size()} CPU ranks: {args.layers} x Linear({args.width}, "
        f"{args.width}) = {params / 1e6:.1f} M parameters ({params * 4 / 2**20:.0f} MiB of fp32 "
        f"gradients{sent}), batch {args.batch} per rank, {args.threads} thread(s) per rank, "
        f"{args.steps} timed steps (+{args.warmup} warm-up), interleaved\n"
    )
    print("| backend | median step (ms) | min (ms) | max (ms) | vs gloo |")
    print("|---|---:|---:|---:|---:|")
    for name, ts in times.items():
        med, low, high = statistics.median(ts) * 1e3, min(ts) * 1e3, max(ts) * 1e3
        print(f"| {name} | {med:.1f} | {low:.1f} | {high:.1f} | {med / 1e3 / gloo:.2f}x |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2, help="local ranks to spawn (ignored under torchrun)")
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=32, help="samples per rank")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--hook", choices=["none", "fp16", "bf16"], default="none", help="DDP gradient compression hook")
    p.add_argument("--fsdp", action="store_true", help="shard with FSDP2 instead of DDP")
    p.add_argument("--bf16", action="store_true", help="with --fsdp: bfloat16 weights, float32 gradient reduction")
    args = p.parse_args(argv)
    if args.hook != "none" and args.fsdp:
        p.error("--hook is DDP's; FSDP2 takes --bf16")
    if "RANK" in os.environ:
        bench(args)
    else:
        minincl.torch.run_local(bench, args.ranks, args, timeout=None)


if __name__ == "__main__":
    main()
