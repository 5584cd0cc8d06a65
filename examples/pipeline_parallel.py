"""Pipeline parallelism: a model cut in two stages, one per rank, fed micro-batches.

Rank 0 runs the first layers and sends each micro-batch's activations to rank 1; rank 1 runs
the rest and the loss, and sends the gradient of each activation back; rank 0 finishes the
backward pass with it. This is the GPipe schedule (all forwards, then all backwards), with
point-to-point send/recv through minincl. Each rank then checks its gradients, and rank 1
the loss, against one process running the whole model on the whole batch.

    torchrun --nproc-per-node 2 examples/pipeline_parallel.py
    python examples/pipeline_parallel.py            # spawns 2 local ranks itself
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import minincl.torch

MICRO_BATCHES = 4
MICRO_BATCH = 4
HIDDEN = 32


def make_stages() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)  # both ranks build the same model and keep their own stage
    first = nn.Sequential(nn.Linear(16, HIDDEN), nn.Tanh())
    second = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 4))
    return first, second


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    n = MICRO_BATCHES * MICRO_BATCH
    return torch.randn(n, 16, generator=g), torch.randn(n, 4, generator=g)


def run_first_stage(stage: nn.Module, x: torch.Tensor) -> None:
    activations = []
    for xm in x.chunk(MICRO_BATCHES):
        a = stage(xm)
        dist.send(a.detach(), dst=1)
        activations.append(a)
    for a in activations:
        grad = torch.empty_like(a)
        dist.recv(grad, src=1)
        a.backward(grad)


def run_second_stage(stage: nn.Module, y: torch.Tensor) -> float:
    grads, total = [], 0.0
    for ym in y.chunk(MICRO_BATCHES):
        a = torch.empty(MICRO_BATCH, HIDDEN)
        dist.recv(a, src=0)
        a.requires_grad_()
        # Mean over the whole batch = sum over micro-batches of their means / their count.
        loss = nn.functional.mse_loss(stage(a), ym) / MICRO_BATCHES
        loss.backward()
        grads.append(a.grad)
        total += loss.item()
    for g in grads:
        dist.send(g, dst=0)
    return total


def reference() -> tuple[float, list[torch.Tensor], list[torch.Tensor]]:
    """One process, the whole model, the whole batch: the loss and both stages' gradients."""
    first, second = make_stages()
    x, y = batch()
    loss = nn.functional.mse_loss(second(first(x)), y)
    loss.backward()
    return loss.item(), [p.grad for p in first.parameters()], [p.grad for p in second.parameters()]


def main(backend: str = minincl.torch.BACKEND_NAME) -> dict[str, float]:
    dist.init_process_group(backend)
    try:
        if dist.get_world_size() != 2:
            raise SystemExit("pipeline_parallel.py runs on exactly 2 ranks")
        rank = dist.get_rank()
        stage = make_stages()[rank]
        x, y = batch()
        loss = float("nan")  # only the last stage sees the loss
        if rank == 0:
            run_first_stage(stage, x)
        else:
            loss = run_second_stage(stage, y)
        ref_loss, *ref_grads = reference()
        diff = max((p.grad - g).abs().max().item() for p, g in zip(stage.parameters(), ref_grads[rank]))
        if rank == 1:
            print(
                f"pipeline parallel on {backend}: loss {loss:.6f} (single process {ref_loss:.6f}), "
                f"max grad diff {diff:.2e}"
            )
        return {"loss": loss, "reference_loss": ref_loss, "max_grad_diff": diff}
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    if "RANK" in os.environ:
        result = main()
        sys.exit(0 if result["max_grad_diff"] < 1e-5 else 1)
    minincl.torch.run_local(main, 2)
