"""The parallelisms in examples/, on 2 (a 2-D mesh: 4) CPU ranks with the minincl backend.

Each example checks itself against one process running the unsplit computation and returns
the differences; these tests assert on them (and, for data parallel, compare with gloo).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
run_local = pytest.importorskip("minincl.torch").run_local

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, *args: Any) -> Any:
    """In a rank's process: load examples/<name>.py and call its main()."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(*args)


def test_data_parallel_matches_single_process_and_gloo() -> None:
    ours = run_local(run_example, 2, "data_parallel", "minincl", timeout=120)
    gloo = run_local(run_example, 2, "data_parallel", "gloo", timeout=120)
    for rank in range(2):
        assert ours[rank]["max_diff"] < 1e-5
        for key, value in gloo[rank]["params"].items():
            torch.testing.assert_close(ours[rank]["params"][key], value, rtol=1e-6, atol=1e-6)


def test_pipeline_parallel_matches_single_process() -> None:
    results = run_local(run_example, 2, "pipeline_parallel", timeout=120)
    assert results[1]["loss"] == pytest.approx(results[1]["reference_loss"], rel=1e-6)
    for r in results:
        assert r["max_grad_diff"] < 1e-5


def test_tensor_parallel_matches_unsplit_layers() -> None:
    for r in run_local(run_example, 2, "tensor_parallel", timeout=120):
        assert r["mlp_max_diff"] < 1e-5
        assert r["gather_max_diff"] < 1e-6


def test_fully_sharded_matches_single_process_and_gloo() -> None:
    """FSDP2 with bfloat16 weights, then a torch.distributed.checkpoint save and load."""
    ours = run_local(run_example, 2, "fully_sharded", "fsdp", "minincl", timeout=180)
    gloo = run_local(run_example, 2, "fully_sharded", "fsdp", "gloo", timeout=180)
    for rank in range(2):
        assert ours[rank]["checkpoint_diff"] == 0
        assert ours[rank]["max_diff"] < 1e-2  # bfloat16 weights against float32 in one process
        for key, value in gloo[rank]["params"].items():
            torch.testing.assert_close(ours[rank]["params"][key], value, rtol=1e-6, atol=1e-6)


def test_fsdp_and_tensor_parallel_on_a_2d_mesh_match_single_process() -> None:
    """4 ranks: (dp, tp) DeviceMesh, DTensor's column / row split inside tp, FSDP across dp."""
    results = run_local(run_example, 4, "fully_sharded", "2d", timeout=240)
    for r in results:
        assert r["checkpoint_diff"] == 0
        assert r["max_diff"] < 1e-5
        for key, value in results[0]["params"].items():
            torch.testing.assert_close(r["params"][key], value, rtol=0, atol=0)
