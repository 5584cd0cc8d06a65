"""Where the C API lives in an installed package: minincl.h under include/, the library under
lib/ with a CMake package for it under lib/cmake/minincl, and the nccl-tests-style benchmark on
it, bin/minincl-perf. The Python module runs on the same library, so a C or C++ program built
against it runs the very runtime the package was built with.

The library is the file named by its SONAME (libminincl.so.0.1 for minincl 0.1.x); lib/ also
holds libminincl.so, a linker script naming that file, for `-lminincl` (a wheel cannot hold the
usual symlink)."""

from __future__ import annotations

from pathlib import Path

from . import _core
from ._core import build_info

# Where the build put the extension module, and beside it include/, lib/ and bin/: the
# package's folder, but for an editable install, whose Python files stay in the source tree.
_PACKAGE = Path(_core.__file__).resolve().parent


def get_include() -> str:
    """The directory holding minincl.h (for a compiler's -I)."""
    return str(_PACKAGE / "include")


def get_library_dir() -> str:
    """The directory holding the library (for a linker's -L and the program's run path)."""
    return str(_PACKAGE / "lib")


def library_path() -> str:
    """The library itself, named by its SONAME (what ctypes.CDLL opens to call the C API from
    Python: the file the Python module runs on, so the process keeps one copy of the runtime)."""
    return str(Path(get_library_dir()) / build_info()["library"])


def get_cmake_dir() -> str:
    """The directory holding minincl-config.cmake (for find_package(minincl) as minincl_DIR)."""
    return str(_PACKAGE / "lib" / "cmake" / "minincl")


def compile_flags() -> list[str]:
    """What a compiler needs to include minincl.h."""
    return [f"-I{get_include()}"]


def link_flags() -> list[str]:
    """What a linker needs to link libminincl.so, and find it again when the program runs."""
    lib = get_library_dir()
    return [f"-L{lib}", f"-Wl,-rpath,{lib}", "-lminincl"]


def perf_program() -> str | None:
    """minincl-perf's path; None in a package built without the C++ microbenchmarks
    (MININCL_BUILD_BENCH=OFF)."""
    program = _PACKAGE / "bin" / "minincl-perf"
    return str(program) if program.is_file() else None
