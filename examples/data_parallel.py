"""Data parallelism: DistributedDataParallel on the minincl backend.

Every rank holds the whole model and trains on its own slice of each batch; DDP averages the
gradients with allreduce (through minincl) during backward. After training, rank 0 checks
that the parameters equal those of one process training on the whole batch.

    torchrun --nproc-per-node 2 examples/data_parallel.py
    python examples/data_parallel.py            # spawns 2 local ranks itself
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import minincl.torch

STEPS = 5
BATCH = 8  # per rank


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)  # every rank starts from the same weights
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def global_batch(step: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(world * BATCH, 16, generator=g), torch.randn(world * BATCH, 4, generator=g)


def train_single(world: int) -> dict[str, torch.Tensor]:
    """The reference: one process, whole batches."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = global_batch(step, world)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_ddp(backend: str, device: str = "cpu") -> dict[str, torch.Tensor]:
    """One rank of DDP training; returns the final parameters (on the CPU)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model().to(device)
    ddp = DistributedDataParallel(model, device_ids=[torch.device(device).index] if device != "cpu" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = global_batch(step, world)
        mine = slice(rank * BATCH, (rank + 1) * BATCH)  # this rank's share of the batch
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x[mine].to(device)), y[mine].to(device)).backward()
        opt.step()
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def main(backend: str = minincl.torch.BACKEND_NAME, device: str = "cpu") -> dict[str, object]:
    if device.startswith("cuda"):
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    try:
        params = train_ddp(backend, device)
        reference = train_single(dist.get_world_size())
        diff = max((params[k] - reference[k]).abs().max().item() for k in params)
        if dist.get_rank() == 0:
            print(f"data parallel on {backend}: {STEPS} steps, max |DDP - 1 process| = {diff:.2e}")
        return {"params": params, "max_diff": diff}
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    if "RANK" in os.environ:
        result = main()
        sys.exit(0 if float(result["max_diff"]) < 1e-5 else 1)  # type: ignore[arg-type]
    minincl.torch.run_local(main, 2)
