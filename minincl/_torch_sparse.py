"""The sum of a sparse COO tensor over the ranks of a communicator (torch's all_reduce of a
sparse gradient, as an nn.Embedding(sparse=True) makes).

As gloo does it: every rank gathers every rank's indices and values, then adds them up locally
(torch's coalesce), so each rank ends with the same sum. Cost: each rank receives every
rank's non-zeros (padded to the largest rank's count), which pays off while the tensors stay
sparse; a dense allreduce moves the whole tensor.
"""

from __future__ import annotations

import torch

from ._comm import Communicator
from .errors import InvalidArgument

_MAX_DIMS = 64  # (torch's own limit on a tensor's dimensions)


def summed_over_ranks(comm: Communicator, mine: torch.Tensor) -> torch.Tensor:
    """The (coalesced) sum of every rank's `mine`, a coalesced sparse COO tensor on the
    communicator's device. (On a GPU the calls queue on the current stream, and reading the
    counts back waits for them there.)"""
    nnz = _nonzeros_of_each_rank(comm, mine)
    most = max(nnz)
    indices = _gathered(comm, mine.indices(), most, dim=1)
    values = _gathered(comm, mine.values(), most, dim=0)
    every = torch.sparse_coo_tensor(
        torch.cat([indices[r, :, : nnz[r]] for r in range(comm.nranks)], dim=1),
        torch.cat([values[r, : nnz[r]] for r in range(comm.nranks)]),
        mine.shape,
        check_invariants=False,  # (every rank's part came from a coalesced tensor of this shape)
    )
    return every.coalesce()  # (adds the values of repeated indices)


def _nonzeros_of_each_rank(comm: Communicator, mine: torch.Tensor) -> list[int]:
    """Each rank's non-zero count, once every rank is known to pass the same shape and type:
    a mismatch raises on every rank, as they all see the same gathered facts."""
    facts = torch.full((4 + _MAX_DIMS,), -1, dtype=torch.int64)
    facts[:4] = torch.tensor([mine._nnz(), mine.sparse_dim(), mine.dim(), _dtype_code(mine.dtype)])
    facts[4 : 4 + mine.dim()] = torch.tensor(mine.shape, dtype=torch.int64)
    every = comm.allgather(facts.to(mine.device)).reshape(comm.nranks, -1).cpu()
    for r in range(comm.nranks):
        if not torch.equal(every[r, 1:], every[0, 1:]):
            raise InvalidArgument(
                f"minincl backend: allreduce of sparse tensors: rank {r} gave {_described(every[r])}, "
                f"rank 0 {_described(every[0])}; every rank must give the same shape, sparse dimensions and dtype"
            )
    return [int(n) for n in every[:, 0]]


def _gathered(comm: Communicator, part: torch.Tensor, most: int, dim: int) -> torch.Tensor:
    """Every rank's `part` (`most` long along `dim`, zero-padded), stacked along a new first
    dimension."""
    padded = torch.zeros(*part.shape[:dim], most, *part.shape[dim + 1 :], dtype=part.dtype, device=part.device)
    padded.narrow(dim, 0, part.shape[dim]).copy_(part)
    every = torch.empty(comm.nranks, *padded.shape, dtype=part.dtype, device=part.device)
    comm.allgather(padded.reshape(-1).view(torch.uint8), every.reshape(-1).view(torch.uint8))
    return every


_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.complex64,
    torch.complex128,
    torch.bool,
]


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES)


def _described(facts: torch.Tensor) -> str:
    dims = int(facts[2])
    shape = tuple(int(s) for s in facts[4 : 4 + dims])
    code = int(facts[3])
    dtype = _DTYPES[code] if code < len(_DTYPES) else "another dtype"
    return f"shape {shape} with {int(facts[1])} sparse dimension(s), {dtype}"
