"""Tensor parallelism: a Megatron-style MLP, one linear layer split by columns, the next by rows.

    Y = GeLU(X @ A) @ B        A split by columns: rank i holds A_i, computes GeLU(X @ A_i)
                               B split by rows:    rank i holds B_i, computes GeLU(X @ A_i) @ B_i
                               Y = allreduce(sum over i) + bias

No communication between the two layers; one allreduce at the end of the forward pass and one
(for the input's gradient) in the backward pass. The column-parallel layer can also gather its
output along the feature dimension (allgather). Each rank checks the outputs and gradients
against the unsplit layers run in one process.

    torchrun --nproc-per-node 2 examples/tensor_parallel.py
    python examples/tensor_parallel.py            # spawns 2 local ranks itself
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import minincl.torch

IN, HIDDEN, OUT, BATCH = 16, 32, 8, 6
# all_gather_into_tensor was renamed all_gather_single in recent PyTorch.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class CopyToParallel(torch.autograd.Function):
    """Forward: every rank uses the same input. Backward: the input's gradient is the sum."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad


class ReduceFromParallel(torch.autograd.Function):
    """Forward: sum the partial outputs of all ranks. Backward: each rank gets the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class GatherFromParallel(torch.autograd.Function):
    """Forward: concatenate the ranks' feature slices. Backward: keep this rank's slice."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        world = dist.get_world_size()
        gathered = x.new_empty((world, *x.shape))
        all_gather_single(gathered, x.contiguous())
        return torch.cat(gathered.unbind(0), dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.chunk(dist.get_world_size(), dim=-1)[dist.get_rank()].contiguous()


class ColumnParallelLinear(nn.Module):
    """This rank's slice of the output features of ``full``."""

    def __init__(self, full: nn.Linear, gather_output: bool = False) -> None:
        super().__init__()
        rank, world = dist.get_rank(), dist.get_world_size()
        self.weight = nn.Parameter(full.weight.detach().chunk(world, dim=0)[rank].clone())
        self.bias = nn.Parameter(full.bias.detach().chunk(world, dim=0)[rank].clone())
        self.gather_output = gather_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(CopyToParallel.apply(x), self.weight, self.bias)
        return GatherFromParallel.apply(y) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """This rank's slice of the input features of ``full``; the bias is added after the sum."""

    def __init__(self, full: nn.Linear) -> None:
        super().__init__()
        rank, world = dist.get_rank(), dist.get_world_size()
        self.weight = nn.Parameter(full.weight.detach().chunk(world, dim=1)[rank].clone())
        self.bias = nn.Parameter(full.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ReduceFromParallel.apply(nn.functional.linear(x, self.weight)) + self.bias


def make_full() -> tuple[nn.Linear, nn.Linear, torch.Tensor]:
    torch.manual_seed(0)  # every rank builds the same unsplit layers and input
    return nn.Linear(IN, HIDDEN), nn.Linear(HIDDEN, OUT), torch.randn(BATCH, IN)


def check_mlp() -> float:
    """Column-parallel -> GeLU -> row-parallel: output and all gradients vs the unsplit MLP."""
    rank, world = dist.get_rank(), dist.get_world_size()
    full_a, full_b, x = make_full()
    col, row = ColumnParallelLinear(full_a), RowParallelLinear(full_b)
    x_par, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_par = row(nn.functional.gelu(col(x_par)))
    y_ref = full_b(nn.functional.gelu(full_a(x_ref)))
    y_par.square().sum().backward()
    y_ref.square().sum().backward()
    assert full_a.weight.grad is not None and full_b.weight.grad is not None
    diffs = [
        (y_par - y_ref).abs().max(),
        (x_par.grad - x_ref.grad).abs().max(),
        (col.weight.grad - full_a.weight.grad.chunk(world, dim=0)[rank]).abs().max(),
        (row.weight.grad - full_b.weight.grad.chunk(world, dim=1)[rank]).abs().max(),
    ]
    return max(d.item() for d in diffs)


def check_gathered_column() -> float:
    """A column-parallel layer that gathers its output equals the unsplit layer."""
    full_a, _, x = make_full()
    col = ColumnParallelLinear(full_a, gather_output=True)
    return (col(x) - full_a(x)).abs().max().item()


def main(backend: str = minincl.torch.BACKEND_NAME) -> dict[str, float]:
    dist.init_process_group(backend)
    try:
        result = {"mlp_max_diff": check_mlp(), "gather_max_diff": check_gathered_column()}
        if dist.get_rank() == 0:
            print(
                f"tensor parallel on {backend}: MLP max diff {result['mlp_max_diff']:.2e}, "
                f"gathered column-parallel max diff {result['gather_max_diff']:.2e}"
            )
        return result
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    if "RANK" in os.environ:
        result = main()
        sys.exit(0 if max(result.values()) < 1e-5 else 1)
    minincl.torch.run_local(main, 2)
