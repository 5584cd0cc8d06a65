"""Random torch.distributed programs run on gloo and on minincl must give the same results.

Each program is a seeded sequence of calls, the same on every rank: every collective with
random types, shapes (0, 1, primes), reductions, roots, non-contiguous tensors, async calls
waited in shuffled order, sparse all_reduce, coalesced calls, a subgroup, object collectives
and point-to-point batches. gloo is the reference: an independent implementation of the same API.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mtorch = pytest.importorskip("minincl.torch")  # registers the "minincl" backend

TYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.int8, torch.uint8]
INTEGERS = {torch.int32, torch.int64, torch.int8, torch.uint8}
SIZES = [0, 1, 2, 7, 13, 64, 1000, 4099]


def values(shape: tuple[int, ...], dtype: Any, rank: int, salt: int) -> Any:
    """1..3 by rank and salt: sums and products stay exact in every type."""
    g = torch.Generator().manual_seed(salt * 131 + rank)
    return torch.randint(1, 4, shape, generator=g).to(dtype)


class Program:
    """One rank's run of a seeded program; `results` holds each call's outcome."""

    def __init__(self, seed: int, world: int, rank: int) -> None:
        self.rng = random.Random(seed)
        self.world, self.rank = world, rank
        self.results: list[tuple[str, Any]] = []
        self.sub_ranks = sorted(self.rng.sample(range(world), 2))
        self.sub = dist.new_group(self.sub_ranks)

    def run(self, calls: int) -> list[tuple[str, Any]]:
        kinds: dict[str, Callable[[int], Any]] = {
            name.removeprefix("op_"): getattr(self, name) for name in dir(self) if name.startswith("op_")
        }
        names = sorted(kinds)
        for i in range(calls):
            kind = self.rng.choice(names)
            self.dtype = self.rng.choice(TYPES)
            self.shape = (self.rng.choice(SIZES), self.rng.choice([1, 3]))
            self.root = self.rng.randrange(self.world)
            ops = ["SUM", "MAX", "MIN", "PRODUCT"] + (["BAND", "BOR", "BXOR"] if self.dtype in INTEGERS else [])
            self.op = self.rng.choice(ops)
            self.strided = self.rng.random() < 0.3
            self.results.append((f"{i}: {kind} {self.dtype} {self.shape} {self.op} root {self.root}", kinds[kind](i)))
        return self.results

    def t(self, salt: int, strided: bool = False) -> Any:
        """The call's tensor; `strided`: column-major, as 30% of calls that take such tensors."""
        x = values(self.shape, self.dtype, self.rank, salt)
        return x.t().contiguous().t() if strided and self.strided else x

    def reduce_op(self) -> Any:
        return getattr(dist.ReduceOp, self.op)

    def op_all_reduce(self, i: int) -> Any:
        x = self.t(i, strided=True)
        work = dist.all_reduce(x, op=self.reduce_op(), async_op=self.strided)
        if work is not None:
            work.wait()
        return x

    def op_sparse_all_reduce(self, i: int) -> Any:
        """SUM of sparse COO tensors with repeated indices; some ranks may have none."""
        rows, cols = self.shape
        g = torch.Generator().manual_seed(i * 131 + self.rank)
        nnz = int(torch.randint(0, 6, (1,), generator=g)) if rows else 0
        at = torch.stack(
            [torch.randint(0, max(rows, 1), (nnz,), generator=g), torch.randint(0, cols, (nnz,), generator=g)]
        )
        dtype = torch.float32 if self.dtype == torch.float16 else self.dtype  # (gloo cannot add float16 ones)
        x = torch.sparse_coo_tensor(at, values((nnz,), dtype, self.rank, i), self.shape)
        work = dist.all_reduce(x, async_op=self.strided)
        if work is not None:
            work.wait()
        return [x.to_dense(), x.is_coalesced()]

    def op_broadcast(self, i: int) -> Any:
        x = self.t(i, strided=True)
        dist.broadcast(x, src=self.root)
        return x

    def op_reduce(self, i: int) -> Any:
        x = self.t(i, strided=True)
        dist.reduce(x, dst=self.root, op=self.reduce_op())
        return x if self.rank == self.root else None

    def op_all_gather(self, i: int) -> Any:
        x = self.t(i)
        outs = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(outs, x)
        return outs

    def op_all_gather_into_tensor(self, i: int) -> Any:
        n, cols = self.shape
        out = torch.empty((self.world * n, cols), dtype=self.dtype)
        dist.all_gather_into_tensor(out, values(self.shape, self.dtype, self.rank, i))
        return out

    def op_reduce_scatter(self, i: int) -> Any:
        out = torch.empty(self.shape, dtype=self.dtype)
        dist.reduce_scatter(out, [self.t(i * 7 + k) for k in range(self.world)], op=self.reduce_op())
        return out

    def op_reduce_scatter_tensor(self, i: int) -> Any:
        n, cols = self.shape
        out = torch.empty(self.shape, dtype=self.dtype)
        dist.reduce_scatter_tensor(out, values((self.world * n, cols), self.dtype, self.rank, i), op=self.reduce_op())
        return out

    def op_all_to_all_single(self, i: int) -> Any:
        split = [[self.rng.randrange(0, 5) for _ in range(self.world)] for _ in range(self.world)]
        ins, outs = split[self.rank], [split[p][self.rank] for p in range(self.world)]
        cols = self.shape[1]
        out = torch.empty((sum(outs), cols), dtype=self.dtype)
        x = values((sum(ins), cols), self.dtype, self.rank, i)
        dist.all_to_all_single(out, x, output_split_sizes=outs, input_split_sizes=ins)
        return out

    def op_all_to_all(self, i: int) -> Any:
        outs = [torch.empty(self.shape, dtype=self.dtype) for _ in range(self.world)]
        dist.all_to_all(outs, [self.t(i * 5 + k) for k in range(self.world)])
        return outs

    def op_gather(self, i: int) -> Any:
        x = self.t(i)
        outs = [torch.empty_like(x) for _ in range(self.world)] if self.rank == self.root else None
        dist.gather(x, outs, dst=self.root)
        return outs

    def op_scatter(self, i: int) -> Any:
        out = torch.empty(self.shape, dtype=self.dtype)
        ins = [self.t(i * 3 + k) for k in range(self.world)] if self.rank == self.root else None
        dist.scatter(out, ins, src=self.root)
        return out

    def op_ring(self, i: int) -> Any:
        x, out = self.t(i), torch.empty(self.shape, dtype=self.dtype)
        ops = [
            dist.P2POp(dist.isend, x, (self.rank + 1) % self.world),
            dist.P2POp(dist.irecv, out, (self.rank - 1) % self.world),
        ]
        if self.rng.random() < 0.5:
            ops.reverse()
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return out

    def op_async_mix(self, i: int) -> Any:
        """Async calls of several kinds, on plain tensors (minincl's own async worker runs
        them where the group's lane is idle) and column-major ones (the lane), waited on or
        through their futures in shuffled order."""
        works, outs, kinds = [], [], []
        for k in range(self.rng.randrange(2, 6)):
            x = values(self.shape, torch.float32, self.rank, i * 11 + k)
            kind = self.rng.choice(["all_reduce", "broadcast", "all_gather", "reduce_scatter"])
            kinds.append(kind)
            if kind == "all_gather":
                out = torch.empty((self.world * self.shape[0], self.shape[1]))
                works.append(dist.all_gather_into_tensor(out, x, async_op=True))
                outs.append(out)
            elif kind == "reduce_scatter":
                out = torch.empty(self.shape)
                whole = values((self.world * self.shape[0], self.shape[1]), torch.float32, self.rank, i * 11 + k)
                works.append(dist.reduce_scatter_tensor(out, whole, async_op=True))
                outs.append(out)
            else:
                x = x.t().contiguous().t() if self.rng.random() < 0.3 else x
                call = dist.all_reduce if kind == "all_reduce" else lambda t, **kw: dist.broadcast(t, self.root, **kw)
                works.append(call(x, async_op=True))
                outs.append(x)
        order = list(range(len(works)))
        self.rng.shuffle(order)
        for k in order:
            if kinds[k] in ("all_reduce", "broadcast") and self.rng.random() < 0.3:  # (gloo's others have none)
                works[k].get_future().wait()
            else:
                works[k].wait()
        return outs

    def op_coalesced(self, i: int) -> Any:
        xs = [values((self.rng.choice([1, 5, 300]),), torch.float32, self.rank, i * 13 + k) for k in range(3)]
        with dist._coalescing_manager(async_ops=True) as cm:
            for x in xs:
                dist.all_reduce(x)
        cm.wait()
        return xs

    def op_subgroup(self, i: int) -> Any:
        if self.rank not in self.sub_ranks:
            return "not a member"
        x = self.t(i, strided=True)
        dist.all_reduce(x, op=self.reduce_op(), group=self.sub)
        return x

    def op_objects(self, i: int) -> Any:
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, {"rank": self.rank, "i": i, "pad": "x" * self.rng.randrange(100)})
        sent = [self.rank, "s" * (i % 5), {"k": i}] if self.rank == self.root else [None, None, None]
        dist.broadcast_object_list(sent, src=self.root)
        at_root: list[Any] | None = [None] * self.world if self.rank == self.root else None
        dist.gather_object(list(range(self.rank + i % 7)), at_root, dst=self.root)
        mine: list[Any] = [None]
        dist.scatter_object_list(
            mine, [f"to {p}" for p in range(self.world)] if self.rank == self.root else None, self.root
        )
        return repr((gathered, sent, at_root, mine))

    def op_barrier(self, i: int) -> Any:
        dist.barrier()
        return "barrier"


def run_program(backend: str, seed: int, calls: int) -> list[tuple[str, Any]]:
    dist.init_process_group(backend)
    try:
        return Program(seed, dist.get_world_size(), dist.get_rank()).run(calls)
    finally:
        dist.destroy_process_group()


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.is_floating_point():  # (the same small integers; sums may differ in rounding order)
            return torch.allclose(a.double(), b.double(), rtol=1e-2, atol=1e-2)
        return torch.equal(a, b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


@pytest.mark.parametrize(("world", "seed"), [(3, 1), (2, 2), (4, 3)])
def test_random_programs_match_gloo(world: int, seed: int) -> None:
    calls = 30
    want = mtorch.run_local(run_program, world, "gloo", seed, calls, timeout=240)
    got = mtorch.run_local(run_program, world, "minincl", seed, calls, timeout=240)
    for rank in range(world):
        assert len(got[rank]) == len(want[rank]) == calls
        for (where, g), (_, w) in zip(got[rank], want[rank]):
            assert same(g, w), f"seed {seed}, rank {rank}, call {where}:\n minincl {g}\n gloo {w}"
