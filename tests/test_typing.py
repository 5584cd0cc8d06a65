"""The package's types: `minincl/_core.pyi` describes the compiled core as it is, the package
type-checks with mypy, and a user's program gets real types (an array back for an array in,
a Work for async_op=True) and its mistakes reported."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import minincl
from minincl import _core

PACKAGE = Path(minincl.__file__).parent
STUB = PACKAGE / "_core.pyi"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
CLASSES = ["Communicator", "Work", "PreMulSum"]


def _stub_functions(nodes: list[ast.stmt]) -> dict[str, list[ast.FunctionDef]]:
    """name -> its definitions (several where overloaded; a property's setter counts too)."""
    out: dict[str, list[ast.FunctionDef]] = {}
    for node in nodes:
        if isinstance(node, ast.FunctionDef):
            out.setdefault(node.name, []).append(node)
    return out


def _stub() -> tuple[dict[str, list[ast.FunctionDef]], dict[str, dict[str, list[ast.FunctionDef]]]]:
    tree = ast.parse(STUB.read_text())
    classes = {n.name: _stub_functions(n.body) for n in tree.body if isinstance(n, ast.ClassDef)}
    return _stub_functions(tree.body), classes


def _split_top_level(text: str) -> list[str]:
    """'a: list[int, str] = 1, b' -> ['a: list[int, str] = 1', 'b']"""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


def _runtime_signature(obj: Any) -> tuple[list[tuple[str, bool]], str | None]:
    """[(parameter, has a default)] without self, and the return type pybind11 names (None
    where it does not: the per-call methods, which carry a text signature instead)."""
    text_signature = getattr(obj, "__text_signature__", None)
    if text_signature:
        params = inspect.signature(obj).parameters.values()
        return [(p.name, p.default is not inspect.Parameter.empty) for p in params if p.name != "self"], None
    first = (obj.__doc__ or "").splitlines()[0]
    m = re.fullmatch(r"\w+\((.*)\) -> (.+)", first)
    assert m, f"no pybind11 signature in {first!r}"
    params = []
    for part in _split_top_level(m.group(1)):
        name = part.split(":")[0].strip()
        if name != "self":
            params.append((name, "=" in part))
    return params, m.group(2)


def _stub_signature(fn: ast.FunctionDef) -> list[tuple[str, bool]]:
    args = fn.args
    positional = args.args[1:] if args.args and args.args[0].arg == "self" else args.args
    defaults = [False] * (len(positional) - len(args.defaults)) + [True] * len(args.defaults)
    out = [(a.arg, d) for a, d in zip(positional, defaults)]
    out += [(a.arg, d is not None) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    return out


def _base_type(annotation: str) -> str:
    """'dict[str, Any]' -> 'dict'; 'typing.SupportsInt' -> 'SupportsInt'."""
    return annotation.split("[")[0].split(".")[-1].strip()


def _public_members(cls: type) -> set[str]:
    hidden = {"__doc__", "__module__", "_pybind11_conduit_v1_", "__repr__"}
    return {n for n in vars(cls) if n not in hidden and (not n.startswith("__") or n == "__init__")}


def test_stub_names_everything_the_core_defines() -> None:
    functions, classes = _stub()
    module_functions = {n for n in dir(_core) if not n.startswith("__") and inspect.isbuiltin(getattr(_core, n))}
    assert set(functions) == module_functions
    module_classes = {n for n in dir(_core) if isinstance(getattr(_core, n), type)}
    assert set(classes) == module_classes == set(CLASSES)
    for name in CLASSES:
        runtime = _public_members(getattr(_core, name))
        if name == "Work":
            runtime.discard("__init__")  # (object's: a Work is made by the calls only)
        assert set(classes[name]) == runtime, name


@pytest.mark.parametrize("owner", ["module", *CLASSES])
def test_stub_parameters_and_returns_match_the_core(owner: str) -> None:
    functions, classes = _stub()
    defs = functions if owner == "module" else classes[owner]
    where = _core if owner == "module" else getattr(_core, owner)
    checked = 0
    for name, overloads in defs.items():
        obj = getattr(where, name)
        if isinstance(obj, property):
            continue  # (a property's type is its getter's return, checked by the mypy run below)
        params, returns = _runtime_signature(obj)
        for fn in overloads:
            stub_params = _stub_signature(fn)
            # An overload may drop a default to tell its cases apart (async_op: Literal[True]).
            assert [p for p, _ in stub_params] == [p for p, _ in params], f"{owner}.{name}"
            if len(overloads) == 1:
                assert stub_params == params, f"{owner}.{name}: defaults"
            if returns is not None and returns != "object":
                assert fn.returns is not None
                assert _base_type(ast.unparse(fn.returns)) == _base_type(returns), f"{owner}.{name}"
        checked += 1
    assert checked >= 1


def test_package_carries_its_types() -> None:
    assert (PACKAGE / "py.typed").is_file()
    assert STUB.is_file()


def _mypy(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mypy", reason="mypy is not installed (pip install mypy)")
    cache = tmp_path.parent / "mypy_cache"  # (shared by this module's tests: torch's types take a while)
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(PYPROJECT), "--cache-dir", str(cache), *args]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)


def test_package_type_checks(tmp_path: Path) -> None:
    run = _mypy(tmp_path, "-p", "minincl")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Success: no issues found" in run.stdout


USER_PROGRAM = """
import numpy as np
import minincl

def work(comm: minincl.Communicator) -> float:
    x = np.ones(8, np.float32)
    total = comm.allreduce(x)
    reveal_type(total)  # R1
    reveal_type(comm.allreduce(x, np.empty_like(x), op="max"))  # R2
    reveal_type(comm.allreduce(x, async_op=True))  # R3
    reveal_type(comm.allgather(x))  # R4
    reveal_type(comm.rank)  # R5
    reveal_type(comm.split(comm.rank % 2))  # R6
    comm.allreduce(x, op=3)  # E1
    comm.send(x)  # E2
    comm.rank = 1  # E3
    with minincl.group():
        comm.send(x, peer=(comm.rank + 1) % comm.nranks)
        comm.recv(x, peer=(comm.rank - 1) % comm.nranks)
    return float(total[0])

comms = minincl.Communicator.init_all(2)
reveal_type(comms)  # R7
"""

REVEALED = {
    "R1": "numpy.ndarray[",
    "R2": "numpy.ndarray[",
    "R3": "minincl._core.Work",
    "R4": "numpy.ndarray[",
    "R5": "int",
    "R6": "minincl._comm.Communicator | None",
    "R7": "list[minincl._comm.Communicator]",
}
ERRORS = {"E1": "call-overload", "E2": "call-overload", "E3": "misc"}


def test_a_users_program_gets_real_types_and_its_mistakes_reported(tmp_path: Path) -> None:
    program = tmp_path / "user.py"
    program.write_text(USER_PROGRAM)
    lines = {tag: i + 1 for i, line in enumerate(USER_PROGRAM.splitlines()) for tag in re.findall(r"# (\w\d)$", line)}
    run = _mypy(tmp_path, "user.py")
    out = run.stdout
    for tag, expected in REVEALED.items():
        note = re.search(rf"user\.py:{lines[tag]}: note: Revealed type is \"([^\"]+)\"", out)
        assert note and note.group(1).replace("builtins.", "").startswith(expected), f"{tag}: {out}"
    reported = re.findall(r"user\.py:(\d+): error: .*\[([\w-]+)\]$", out, re.M)
    assert sorted(reported) == sorted((str(lines[t]), code) for t, code in ERRORS.items()), out
