"""The two groups the torch A/B benchmarks alternate: gloo's default group and a minincl group."""

from __future__ import annotations

import datetime

import torch.distributed as dist

import minincl.torch  # noqa: F401  (registers the backend)


def gloo_and_minincl(rank: int, nranks: int, port: int) -> dict[str, dist.ProcessGroup | None]:
    """Starts gloo's default group on 127.0.0.1:`port`; None stands for it in torch's calls."""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=nranks,
        timeout=datetime.timedelta(seconds=300),
    )
    return {"gloo": None, "minincl": dist.new_group(backend="minincl")}
