"""The `minincl` command: bench, perf, info, topo, config."""

from __future__ import annotations

import argparse
import os
import sys

from . import _c_library, _core, bench
from ._comm import LaunchError


def _info(_: argparse.Namespace) -> int:
    build = _core.build_info()
    print(f"minincl {_core.version()}")
    print(f"  compiler      : {build['compiler']}")
    cuda = f"yes, for sm_{build['cuda_archs']}" if build["cuda"] else "no"
    print(f"  CUDA compiled : {cuda}")
    print(f"  CPU cores     : {os.cpu_count()}")
    print(f"  CPU vectors   : {build['cpu_vector_isa']} (16- and 8-bit float arithmetic; MININCL_CPU_ISA)")
    gpus = _core.gpu_count()
    print("  devices       : cpu" + (f", cuda:0..{gpus - 1}" if gpus else " (no usable GPU)"))
    print(f"  C API         : {_c_library.get_include()}/minincl.h, {_c_library.library_path()}")
    return 0


def _config(args: argparse.Namespace) -> int:
    if args.cmake and (args.cflags or args.libs):  # (it printed the directory alone)
        print("minincl config: --cmake names a directory, not flags: ask for it alone", file=sys.stderr)
        return 2
    if args.cmake:
        print(_c_library.get_cmake_dir())
        return 0
    flags = (_c_library.compile_flags() if args.cflags else []) + (_c_library.link_flags() if args.libs else [])
    if not flags:
        print("minincl config: ask for --cflags, --libs (or both), or --cmake", file=sys.stderr)
        return 2
    print(" ".join(flags))
    return 0


def _topo(args: argparse.Namespace) -> int:
    report = getattr(_core, "topo_report", None)
    if report is None:
        print("minincl topo: topology support is not built into this package")
        return 2
    try:
        print(report(args.xml, args.dump, args.json))
    except RuntimeError as e:  # (the topology code's: a file it cannot read or parse, named in e)
        print(f"minincl topo: {e}", file=sys.stderr)
        return 1
    return 0


def _perf(args: list[str]) -> int:
    """Runs minincl-perf (the C++ benchmark on the C API) with these arguments, in this process."""
    program = _c_library.perf_program()
    if program is None:
        print("minincl perf: this package was built without minincl-perf (MININCL_BUILD_BENCH=OFF)", file=sys.stderr)
        return 2
    sys.stdout.flush()
    os.execv(program, ["minincl perf", *args])  # (its usage and errors name the command typed)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["perf"]:  # every later argument is minincl-perf's, --help included
        return _perf(argv[1:])
    parser = argparse.ArgumentParser(prog="minincl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_bench = sub.add_parser("bench", help="measure a collective like nccl-tests does")
    bench.add_arguments(p_bench)
    p_bench.set_defaults(func=bench.run)
    sub.add_parser("perf", help="the C++ benchmark on the C API, as nccl-tests (minincl perf -h for its options)")
    p_info = sub.add_parser("info", help="version, build and devices")
    p_info.set_defaults(func=_info)
    p_topo = sub.add_parser("topo", help="the topology matrix, NUMA affinity, rings and trees")
    p_topo.add_argument("--xml", help="load this NCCL-format topology file instead of detecting")
    p_topo.add_argument("--dump", help="write the topology as XML to this file")
    p_topo.add_argument("--json", action="store_true", help="print JSON instead of text")
    p_topo.set_defaults(func=_topo)
    p_config = sub.add_parser("config", help="compiler and linker flags for C and C++ programs on the C API")
    p_config.add_argument("--cflags", action="store_true", help="where minincl.h is (-I)")
    p_config.add_argument("--libs", action="store_true", help="how to link libminincl.so (-L, run path, -l)")
    p_config.add_argument("--cmake", action="store_true", help="the directory for find_package(minincl) (minincl_DIR)")
    p_config.set_defaults(func=_config)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader left (`minincl topo | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (no second error at exit)
        return 141
    except LaunchError as e:  # each rank's one-line story, once per distinct story (no tracebacks)
        if any(line.startswith("BrokenPipeError") for line in e.errors.values()):
            return 141  # (the rank printing the table lost its reader: `minincl bench | head`)
        stories: dict[str, list[int]] = {}
        for rank, line in sorted(e.errors.items()):
            stories.setdefault(line, []).append(rank)
        for line, ranks in stories.items():
            who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
            print(f"minincl {args.command}: {who}: {line}", file=sys.stderr)
        if not stories:
            print(f"minincl {args.command}: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - a CLI prints the sentence, not a traceback
        print(f"minincl {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
