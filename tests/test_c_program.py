"""The C API as a C or C++ program sees it after `pip install`: tests/c_program.c compiled with
the flags `minincl config --cflags --libs` prints (as C and as C++), and by a CMake project
through find_package(minincl), against the package's minincl.h and libminincl.so, run as
processes (one per rank); what every rank received is checked against NumPy. Also: the library
exports the functions minincl.h declares under a version, and besides them only the C++ runtime
the Python module runs on (privately versioned); it has a versioned SONAME, which its file bears
and -lminincl finds; the Python module runs on that library; and the library keeps CUDA's
runtime to itself."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minincl

SOURCE = Path(__file__).with_name("c_program.c")
HEADER = Path(minincl.get_include()) / "minincl.h"
LIBRARY = Path(minincl._c_library.library_path())
COMPILERS = {"c": ["cc", "-std=c11"], "c++": ["c++", "-std=c++17", "-x", "c++"]}


def config_flags(cwd: Path, *which: str) -> list[str]:
    """`minincl config` run away from the source tree (whose minincl/ has no compiled core)."""
    out = subprocess.run(
        [sys.executable, "-m", "minincl", "config", *which], capture_output=True, text=True, check=True, cwd=cwd
    ).stdout
    return out.split()


CMAKE_PROJECT = """cmake_minimum_required(VERSION 3.16)
project(c_program C)
find_package(minincl {version} CONFIG REQUIRED)
add_executable(c_program {source})
target_link_libraries(c_program PRIVATE minincl::minincl)
"""


def build_with_compiler(build_dir: Path, compiler: list[str]) -> Path:
    exe = build_dir / "c_program"
    cmd = [*compiler, "-Wall", "-Werror", *config_flags(build_dir, "--cflags"), str(SOURCE), "-o", str(exe)]
    cmd += config_flags(build_dir, "--libs")
    build = subprocess.run(cmd, capture_output=True, text=True, cwd=build_dir)
    assert build.returncode == 0, f"{' '.join(cmd)}\n{build.stderr}"
    return exe


def build_with_cmake(build_dir: Path) -> Path:
    """A CMake project that finds minincl as `minincl config --cmake` says."""
    (build_dir / "CMakeLists.txt").write_text(
        CMAKE_PROJECT.format(version=minincl.__version__, source=SOURCE.as_posix())
    )
    (cmake_dir,) = config_flags(build_dir, "--cmake")
    for cmd in (
        ["cmake", "-S", ".", "-B", "build", f"-Dminincl_DIR={cmake_dir}", "-DCMAKE_C_FLAGS=-Wall -Werror"],
        ["cmake", "--build", "build"],
    ):
        step = subprocess.run(cmd, capture_output=True, text=True, cwd=build_dir, timeout=300)
        assert step.returncode == 0, f"{' '.join(cmd)}\n{step.stdout}\n{step.stderr}"
    return build_dir / "build" / "c_program"


@pytest.fixture(scope="module", params=[*sorted(COMPILERS), "cmake"])
def program(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """c_program.c built with cc, c++ or a CMake project (find_package(minincl))."""
    tool = COMPILERS[request.param][0] if request.param in COMPILERS else "cmake"
    if shutil.which(tool) is None:
        pytest.skip(f"no {tool} on this machine")
    build_dir = tmp_path_factory.mktemp(f"build_{request.param.replace('+', 'p')}")
    if request.param == "cmake":
        exe = build_with_cmake(build_dir)
    else:
        exe = build_with_compiler(build_dir, COMPILERS[request.param])
    # It needs the library by its SONAME (the file -lminincl's linker script names).
    if shutil.which("readelf") is not None:
        needed = subprocess.run(["readelf", "-d", str(exe)], capture_output=True, text=True, check=True).stdout
        assert f"Shared library: [{LIBRARY.name}]" in needed, needed
    return exe


def inputs(nranks: int, count: int) -> np.ndarray:
    """Every rank's send buffer (count * nranks elements), as c_program.c fills them."""
    i = np.arange(count * nranks)
    return np.stack([((r + 1) * (i % 97)).astype(np.float32) for r in range(nranks)])


@pytest.mark.parametrize("nranks,count", [(2, 1), (3, 1031), (4, 65536)])
def test_c_program_runs_collectives_as_numpy_computes_them(program: Path, tmp_path: Path, nranks: int, count: int):
    run = subprocess.run(
        [str(program), str(nranks), str(count), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr
    major, minor, patch = (int(part) for part in minincl.__version__.split(".")[:3])
    code = major * 10000 + minor * 100 + patch
    assert f"version {code}, header {code}" in run.stdout
    assert re.search(r"wrong type: .*invalid argument.*: .*\S", run.stdout, re.IGNORECASE), run.stdout

    x = inputs(nranks, count)
    expected = {
        "allreduce": x[:, :count].sum(axis=0),
        "allgather": x[:, :count].reshape(-1),
        "broadcast": x[nranks - 1, :count],
        "allreduce_min": x[:, :count].min(axis=0),
    }
    for r in range(nranks):

        def got(name: str, r: int = r) -> np.ndarray:
            return np.fromfile(tmp_path / f"rank{r}_{name}.bin", dtype=np.float32)

        for name, want in expected.items():
            np.testing.assert_array_equal(got(name), want, err_msg=f"{name} on rank {r}")
        np.testing.assert_array_equal(got("reduce_scatter"), x[:, r * count : (r + 1) * count].max(axis=0))
        np.testing.assert_array_equal(got("sendrecv"), x[(r - 1) % nranks, :count])


def declared_functions() -> list[str]:
    """The functions minincl.h declares."""
    return re.findall(r"^(?:mnclResult_t|const char\*)\s+(mncl\w+)\(", HEADER.read_text(), re.MULTILINE)


def test_the_library_exports_every_function_the_header_declares():
    names = declared_functions()
    assert len(names) > 30 and "mnclAllReduce" in names
    lib = ctypes.CDLL(str(LIBRARY))
    missing = [name for name in names if not hasattr(lib, name)]
    assert missing == []


def exported_symbols() -> dict[str, str]:
    """The library's exported (defined, dynamic) symbols: raw name -> version node."""
    out = subprocess.run(
        ["readelf", "--dyn-syms", "--wide", str(LIBRARY)], capture_output=True, text=True, check=True
    ).stdout
    symbols: dict[str, str] = {}
    for line in out.splitlines():
        fields = line.split()
        # Num: Value Size Type Bind Vis Ndx Name@@VERSION; skipped: UND (needed from elsewhere),
        # ABS (the version nodes' own names)
        if len(fields) >= 8 and fields[0][:-1].isdigit() and fields[6] not in ("UND", "ABS") and fields[4] != "LOCAL":
            name, _, version = fields[7].partition("@")
            symbols[name] = version.lstrip("@")
    return symbols


def test_the_library_exports_the_c_api_and_the_modules_runtime_only():
    """The C API under MININCL_<soversion>, the C++ runtime (namespace mncl, for minincl._core)
    under MININCL_PRIVATE_<version>; no template instantiations of the standard library's."""
    if shutil.which("readelf") is None or shutil.which("c++filt") is None:
        pytest.skip("no readelf / c++filt on this machine")
    soversion = minincl.build_info()["library"].removeprefix("libminincl.so.")
    symbols = exported_symbols()
    c_names = sorted(name for name in symbols if not name.startswith("_Z"))
    assert c_names == sorted(declared_functions())
    assert {symbols[name] for name in c_names} == {f"MININCL_{soversion}"}

    cxx = sorted(name for name in symbols if name.startswith("_Z"))
    assert {symbols[name] for name in cxx} == {f"MININCL_PRIVATE_{minincl.__version__}"}
    demangled = subprocess.run(["c++filt"], input="\n".join(cxx), capture_output=True, text=True, check=True)
    prefixes = ("mncl::", "typeinfo for mncl::", "typeinfo name for mncl::", "vtable for mncl::")
    assert [name for name in demangled.stdout.splitlines() if not name.startswith(prefixes)] == []
    assert "typeinfo for mncl::Error" in demangled.stdout  # (the module catches it, thrown in here)


def test_the_library_is_named_by_its_versioned_soname():
    """The file bears its SONAME (libminincl.so.<major>.<minor> while the major is 0); lib/'s
    libminincl.so is a linker script naming it, which -lminincl links."""
    if shutil.which("readelf") is None:
        pytest.skip("no readelf on this machine")
    dynamic = subprocess.run(["readelf", "-d", str(LIBRARY)], capture_output=True, text=True, check=True).stdout
    assert f"Library soname: [{LIBRARY.name}]" in dynamic, dynamic
    major, minor = minincl.__version__.split(".")[:2]
    assert LIBRARY.name == (f"libminincl.so.{major}.{minor}" if major == "0" else f"libminincl.so.{major}")
    script = (LIBRARY.parent / "libminincl.so").read_text()
    assert f"INPUT({LIBRARY.name})" in script


def test_the_library_keeps_cudas_runtime_to_itself():
    """Exported, the static CUDA runtime's functions could stand in for PyTorch's or CuPy's own
    in one process. (A build without CUDA has none to export.)"""
    if shutil.which("readelf") is None:
        pytest.skip("no readelf on this machine")
    exported = exported_symbols()
    assert "mnclAllReduce" in exported
    assert [name for name in exported if name.startswith(("cuda", "__cuda"))] == []


def test_the_python_module_runs_on_the_library():
    """One copy of the runtime in a process: the module needs the library (by its SONAME) and
    defines none of the C API itself."""
    if shutil.which("readelf") is None or shutil.which("nm") is None:
        pytest.skip("no readelf / nm on this machine")
    module = minincl._core.__file__
    needed = subprocess.run(["readelf", "-d", module], capture_output=True, text=True, check=True).stdout
    assert f"Shared library: [{LIBRARY.name}]" in needed, needed
    symbols = subprocess.run(["nm", "-D", "--defined-only", module], capture_output=True, text=True, check=True)
    assert [line for line in symbols.stdout.splitlines() if " mncl" in line] == []


def test_config_refuses_the_cmake_directory_mixed_with_flags(tmp_path: Path):
    """`--cflags --cmake` printed the directory alone, dropping the flags asked for."""
    run = subprocess.run(
        [sys.executable, "-m", "minincl", "config", "--cflags", "--cmake"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert run.returncode == 2 and run.stdout == "", run.stdout
    assert "--cmake names a directory, not flags: ask for it alone" in run.stderr, run.stderr
