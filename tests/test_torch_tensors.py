"""PyTorch CPU tensors handed straight to a communicator (read through the tensor's own
attributes, src/python/arrays.cc viewTorch): every type, views with a storage offset, new
result tensors, and the clear refusals (not contiguous, requires grad, other devices)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import run_ranks

import minincl

torch = pytest.importorskip("torch")

TYPES = ["int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


@pytest.fixture(scope="module")
def trio() -> Any:
    comms = minincl.Communicator.init_all(3)
    yield comms
    for c in comms:
        c.destroy()


@pytest.mark.parametrize("dtype", TYPES)
def test_allreduce_every_type_in_and_out_of_place(trio: Any, dtype: str) -> None:
    tt = getattr(torch, dtype)
    count = 1009

    def body(c: Any) -> tuple[Any, Any]:
        base = torch.arange(count, dtype=torch.int64) % 5 + c.rank
        x = base.to(tt)
        out = torch.zeros(count, dtype=tt)
        c.allreduce(x, out)
        c.allreduce(x, op="max")  # in place
        return out, x

    want_sum = sum((np.arange(count) % 5 + r) for r in range(3)).astype(np.float64)
    want_max = (np.arange(count) % 5 + 2).astype(np.float64)
    for out, x in run_ranks(trio, body):
        assert out.dtype == tt and x.dtype == tt
        np.testing.assert_array_equal(out.to(torch.float64).numpy(), want_sum)
        np.testing.assert_array_equal(x.to(torch.float64).numpy(), want_max)


def test_views_with_an_offset_and_new_results(trio: Any) -> None:
    def body(c: Any) -> tuple[Any, Any, Any]:
        whole = torch.full((10,), -1.0)
        part = whole[3:7]  # storage offset 3
        part.fill_(float(c.rank + 1))
        c.allreduce(part)
        gathered = c.allgather(torch.full((2, 2), c.rank, dtype=torch.int32))
        scattered = c.reduce_scatter(torch.ones(6, 4, dtype=torch.float64))
        return whole, gathered, scattered

    for whole, gathered, scattered in run_ranks(trio, body):
        np.testing.assert_array_equal(whole.numpy(), [-1, -1, -1, 6, 6, 6, 6, -1, -1, -1])
        assert isinstance(gathered, torch.Tensor) and gathered.shape == (6, 2) and gathered.dtype == torch.int32
        np.testing.assert_array_equal(gathered.numpy(), np.repeat(np.arange(3), 4).reshape(6, 2))
        assert isinstance(scattered, torch.Tensor) and scattered.shape == (2, 4)
        np.testing.assert_array_equal(scattered.numpy(), np.full((2, 4), 3.0))


def test_a_send_that_requires_grad_is_read(trio: Any) -> None:
    def body(c: Any) -> Any:
        w = torch.full((5,), float(c.rank), requires_grad=True)
        out = torch.zeros(5)
        c.allreduce(w, out)
        return out

    for out in run_ranks(trio, body):
        np.testing.assert_array_equal(out.numpy(), np.full(5, 3.0))


def test_refusals_are_clear_and_write_nothing(trio: Any) -> None:
    c = trio[0]
    out = torch.full((4,), 7.0)
    cases = [
        (lambda: c.allreduce(torch.zeros(4, 2).t(), torch.zeros(2, 4)), "not contiguous"),
        (lambda: c.allreduce(torch.zeros(4, requires_grad=True)), "requires grad"),
        (lambda: c.allreduce(torch.zeros(4), torch.zeros(4, requires_grad=True)), "recv requires grad"),
        (lambda: c.allreduce(torch.zeros(4, dtype=torch.bool), out), r"unsupported element type \(torch.bool\)"),
        (lambda: c.allreduce(torch.zeros(4, dtype=torch.int16), out), r"unsupported element type \(torch.int16\)"),
        (lambda: c.allreduce(torch.zeros(4, device="meta"), out), "on device 'meta'"),
        (lambda: c.allreduce(torch.zeros(4, dtype=torch.float64), out), "must match"),
        # (A negated view holds the negations: taken as it lies, every value had the wrong sign.)
        (lambda: c.allreduce(torch.ones(4)._neg_view(), out), r"send is a negated view .* tensor.resolve_neg\(\)"),
        (lambda: c.allreduce(torch.ones(4), out._neg_view()), "recv is a negated view"),
        (lambda: c.allreduce(torch.ones(4).to_sparse(), out), "send is a torch.sparse_coo tensor"),
        (lambda: c.allreduce(torch.eye(2).to_sparse_csr(), out), "send is a torch.sparse_csr tensor"),
    ]
    for call, words in cases:
        with pytest.raises(minincl.InvalidArgument, match=words):
            call()
    np.testing.assert_array_equal(out.numpy(), np.full(4, 7.0))
