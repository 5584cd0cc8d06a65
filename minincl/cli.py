"""The `minincl` command: bench, info, topo."""

from __future__ import annotations

import argparse
import os
import sys

from . import _core, bench


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
    return 0


def _topo(args: argparse.Namespace) -> int:
    report = getattr(_core, "topo_report", None)
    if report is None:
        print("minincl topo: topology support is not built into this package")
        return 2
    print(report(args.xml, args.dump, args.json))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minincl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_bench = sub.add_parser("bench", help="measure a collective like nccl-tests does")
    bench.add_arguments(p_bench)
    p_bench.set_defaults(func=bench.run)
    p_info = sub.add_parser("info", help="version, build and devices")
    p_info.set_defaults(func=_info)
    p_topo = sub.add_parser("topo", help="the topology matrix, NUMA affinity, rings and trees")
    p_topo.add_argument("--xml", help="load this NCCL-format topology file instead of detecting")
    p_topo.add_argument("--dump", help="write the topology as XML to this file")
    p_topo.add_argument("--json", action="store_true", help="print JSON instead of text")
    p_topo.set_defaults(func=_topo)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - a CLI prints the sentence, not a traceback
        print(f"minincl {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
