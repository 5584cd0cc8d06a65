#!/usr/bin/env bash
# Builds the package for the GPU machine's Python ahead, on a machine without a GPU, so that the
# device check spends its few minutes on the GPU instead of compiling. Stages it in .prebuilt/
# (git-ignored) as one gzipped tar (a third of the size: the device tool carries at most 64 MiB),
# which bench/device_check.sh unpacks and imports when it can (and builds from source when it
# cannot: other system libraries, another Python).
#
#   bench/device_prebuild.sh [PYTHON] [BUILD_DIR]   # default: python3.12, /tmp/minincl-prebuild
#
# The GPU machine runs Python 3.12 (see the device tool's KINDS.md); the extension module must
# be built for the same minor version. Needs nvcc, cmake, ninja and pybind11 for that Python.
# MININCL_PREBUILD_TRACE=1 also builds a trace minincl-perf, trace/ (-DMININCL_GPU_TRACE=ON, integer and
# float32 kernels only): the device check then times the points inside an 8-byte allreduce's
# kernel (a few more minutes here).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3.12}
BD=${2:-/tmp/minincl-prebuild}
cmake -S . -B "$BD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMININCL_CUDA=ON -DPython_EXECUTABLE="$(command -v "$PY")" \
  -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" >/dev/null
ninja -C "$BD" _core minincl_shared minincl-perf
STAGE=$BD/stage
rm -rf "$STAGE" .prebuilt
mkdir -p .prebuilt
# The wheel's layout, run paths included: minincl/_core*.so, minincl/lib/libminincl.so.<soversion>
# (and libminincl.so, a linker script), minincl/include/minincl.h, minincl/bin/minincl-perf.
cmake --install "$BD" --prefix "$STAGE" --strip >/dev/null
cp minincl/*.py "$STAGE/minincl/"
if [ -n "${MININCL_PREBUILD_TRACE:-}" ]; then
  # Its own library (the trace changes what kernels and host share), found by its SONAME
  # (libminincl.so.<soversion>) through LD_LIBRARY_PATH=trace/lib by the device check.
  cmake -S . -B "$BD-trace" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMININCL_CUDA=ON -DMININCL_CUDA_QUICK=ON \
    -DMININCL_GPU_TRACE=ON -DPython_EXECUTABLE="$(command -v "$PY")" -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" >/dev/null
  ninja -C "$BD-trace" minincl-perf
  mkdir -p "$STAGE/trace/bin" "$STAGE/trace/lib"
  cp "$BD-trace"/bench/minincl-perf "$STAGE/trace/bin/"
  cp "$BD-trace"/libminincl.so.[0-9]* "$STAGE/trace/lib/"
  strip --strip-debug "$STAGE"/trace/bin/* "$STAGE"/trace/lib/*
fi
tar czf .prebuilt/prebuilt.tgz -C "$STAGE" .
git rev-parse HEAD >.prebuilt/commit
du -sh .prebuilt/prebuilt.tgz
