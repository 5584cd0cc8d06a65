#!/usr/bin/env bash
# The GPU check: one script for a fresh GPU machine, run from the repository root with $OUT an
# empty directory for what comes back (default bench/out/device-check). Nothing is downloaded.
#
#   OUT=/tmp/out bench/device_check.sh
#
# (a) env.txt: nvidia-smi, nproc, tool and package versions
# (b) a package built ahead for this Python (.prebuilt/, made by bench/device_prebuild.sh on a
#     machine without a GPU and carried along) if it imports here; else pip install . (no build
#     isolation, no deps, no index) with every core: build.log, timed; stops here if both fail
# (b2) bench/gpu_smoke.py: every algorithm x protocol, each in a process of its own: smoke.log/json
# (c) minincl-perf: the package's own (minincl/bin); built in pip's build tree (the CUDA
#     kernels are already compiled there) only if the package has none: perf_build.log
# (e) minincl-perf on -D cuda: allreduce 8 B at 2 ranks (LL), 256 MiB at 8 ranks per algorithm;
#     plus device-to-device copy bandwidth (gpu_bench.py d2d) for the memory-bound limit;
#     8-byte latency with one thread driving every rank (-g: one fused kernel), A/B without
#     fusion and without the channel cache; the tuner's sweep; every algorithm x protocol
# (f) bench/gpu_bench.py: 8-byte allreduce latency, back to back and replayed from a CUDA graph
#     (A/B as above), and the floor under it (empty kernels, a bare handshake); with a trace
#     build of minincl-perf (device_prebuild.sh), the time points inside the kernel
# (d) tests/test_gpu.py and tests/test_torch_backend.py -m gpu (the torch process group on CUDA
#     tensors: DDP against gloo, sparse all_reduce) with what is left of the budget, from tests/
#     so the installed package is imported: gpu_tests.log, gpu_tests.xml
# (g) results.json and a short summary (bench/device_check_report.py); everything else packed
#     into logs.tgz (the device tool brings back at most 8 files)
#
# Every step has its own timeout inside an overall budget (MININCL_CHECK_BUDGET seconds, default
# 470) and tolerates the failure of the ones before it. Knobs: PYTHON, MININCL_CHECK_BUDGET,
# MININCL_CHECK_PYTEST_ARGS (default --maxfail=25), MININCL_CUDA_ARCHS (default: the GPU's, else 90).
set -u
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
FINAL_OUT=${OUT:-$ROOT/bench/out/device-check}
mkdir -p "$FINAL_OUT"
FINAL_OUT=$(cd "$FINAL_OUT" && pwd)
OUT=$(mktemp -d /tmp/device-check.XXXXXX)  # packed into FINAL_OUT at the end
PY=${PYTHON:-python3}
BUDGET=${MININCL_CHECK_BUDGET:-470}
START=$(date +%s)
NPROC=$(nproc 2>/dev/null || echo 4)
STEPS=$OUT/steps.tsv
printf 'step\trc\tseconds\tlimit\n' >"$STEPS"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PYTHONUNBUFFERED=1

elapsed() { echo $(($(date +%s) - START)); }
left() { echo $((BUDGET - $(elapsed))); }
# limit CAP RESERVE: CAP seconds, or what is left of the budget minus RESERVE (at least 10)
limit() {
  local l=$(($(left) - $2))
  ((l > $1)) && l=$1
  ((l < 10)) && l=10
  echo "$l"
}
# step NAME LIMIT LOG CMD...: runs CMD under timeout, output to LOG, records rc and seconds
step() {
  local name=$1 t=$2 log=$3
  shift 3
  local t0 t1 rc
  t0=$(date +%s.%N)
  timeout -k 10 "$t" "$@" >"$log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  local dt
  dt=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$dt" "$t" >>"$STEPS"
  local note=""
  ((rc == 124 || rc == 137)) && note=" (TIMED OUT)"
  echo "[$(elapsed)s] $name: rc=$rc in ${dt}s, limit ${t}s$note -> $(basename "$log")"
  return "$rc"
}

# ---- (a) environment ----
if ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
    if [ -x "$d/nvcc" ]; then
      export PATH="$d:$PATH"
      break
    fi
  done
fi
ARCH=${MININCL_CUDA_ARCHS:-}
if [ -z "$ARCH" ]; then
  ARCH=$(timeout 20 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  [[ "$ARCH" =~ ^[0-9]+$ ]] || ARCH=90
fi
{
  echo "date: $(date -u +%FT%TZ)"
  echo "nproc: $NPROC"
  echo "cuda archs for the build: $ARCH"
  echo "budget: ${BUDGET}s"
  echo "--- nvidia-smi"
  timeout 20 nvidia-smi 2>&1
  echo "--- nvidia-smi -L / topo"
  timeout 20 nvidia-smi -L 2>&1
  timeout 20 nvidia-smi topo -m 2>&1
  echo "--- tools"
  echo "python: $(command -v "$PY") $($PY --version 2>&1)"
  echo "nvcc: $(command -v nvcc || echo missing) $(nvcc --version 2>/dev/null | tail -1)"
  echo "cmake: $(cmake --version 2>/dev/null | head -1)"
  echo "ninja: $(ninja --version 2>/dev/null)"
  echo "gcc: $(gcc --version 2>/dev/null | head -1)"
  echo "memory: $(free -g 2>/dev/null | awk '/Mem:/ {print $2 " GiB"}')"
  echo "--- python packages"
  timeout 60 "$PY" - <<'EOF' 2>&1
import importlib
for name in ("numpy", "pytest", "pytest_timeout", "pybind11", "scikit_build_core", "torch", "cupy"):
    try:
        m = importlib.import_module(name)
        extra = ""
        if name == "torch":
            extra = f" cuda={m.version.cuda} available={m.cuda.is_available()}"
        if name == "cupy":
            extra = f" runtime={m.cuda.runtime.runtimeGetVersion()} devices={m.cuda.runtime.getDeviceCount()}"
        print(f"{name}: {getattr(m, '__version__', '?')}{extra}")
    except Exception as e:  # noqa: BLE001
        print(f"{name}: MISSING ({type(e).__name__}: {e})")
EOF
} >"$OUT/env.txt" 2>&1
echo "[$(elapsed)s] env: $NPROC cores, archs $ARCH, $(grep -c MISSING "$OUT/env.txt") python package(s) missing -> env.txt"

# ---- (b) the package: built ahead and carried (.prebuilt/), or built here ----
BUILD_OK=0
PERF=""
PREBUILT=/tmp/minincl-prebuilt
if [ -f "$ROOT/.prebuilt/prebuilt.tgz" ]; then
  rm -rf "$PREBUILT" && mkdir -p "$PREBUILT" && tar xzf "$ROOT/.prebuilt/prebuilt.tgz" -C "$PREBUILT"
fi
probe() {  # imports minincl away from the source tree; writes installed.json
  (cd "$OUT" && timeout 60 "$PY" -c '
import json, minincl
info = dict(minincl.build_info())
info["file"] = minincl.__file__
info["version"] = minincl.__version__
try:
    info["gpu_count"] = minincl.gpu_count()
except Exception as e:
    info["gpu_count"] = f"{type(e).__name__}: {e}"
print(json.dumps(info))
' >"$OUT/installed.json" 2>"$OUT/installed.err")
}
if [ -d "$PREBUILT/minincl" ] && [ -z "${MININCL_CHECK_NO_PREBUILT:-}" ]; then
  export PYTHONPATH=$PREBUILT${PYTHONPATH:+:$PYTHONPATH}
  if probe && grep -q '"cuda": true' "$OUT/installed.json"; then
    BUILD_OK=1
    [ -x "$PREBUILT/minincl/bin/minincl-perf" ] && PERF=$PREBUILT/minincl/bin/minincl-perf
    printf 'prebuilt\t0\t0\t-\n' >>"$STEPS"
    echo "[$(elapsed)s] prebuilt package imports: $(cat "$OUT/installed.json")"
  else
    echo "[$(elapsed)s] prebuilt package unusable here: $(tail -2 "$OUT/installed.err" 2>/dev/null); building"
    printf 'prebuilt\t1\t0\t-\n' >>"$STEPS"
    export PYTHONPATH=${PYTHONPATH#"$PREBUILT"}
    PYTHONPATH=${PYTHONPATH#:}
  fi
fi
if ((!BUILD_OK)); then
  if step pip_install "$(limit 420 45)" "$OUT/build.log" \
    env CMAKE_BUILD_PARALLEL_LEVEL="$NPROC" "$PY" -m pip install --no-build-isolation --no-deps --no-index -v \
    --config-settings=cmake.define.MININCL_CUDA_ARCHS="$ARCH" .; then
    BUILD_OK=1
  fi
  probe
  echo "[$(elapsed)s] installed: $(cat "$OUT/installed.json" 2>/dev/null || echo none) $(tail -1 "$OUT/installed.err" 2>/dev/null)"
fi

SKB=$(ls -td build/cp*/ 2>/dev/null | head -1)
# Per-object compile times of the package build (the slowest kernels bound the build time).
[ -n "$SKB" ] && cp "$SKB/.ninja_log" "$OUT/ninja_log.txt" 2>/dev/null
if ((BUILD_OK)) && [ -z "$PERF" ]; then
  # ---- (c) minincl-perf: the installed package's; else built in pip's build tree ----
  PERF=$(cd "$OUT" && timeout 60 "$PY" -c 'import minincl._c_library as c; print(c.perf_program() or "")' 2>/dev/null)
fi
if ((BUILD_OK)) && [ -z "$PERF" ]; then
  if [ -n "$SKB" ] && [ -f "$SKB/build.ninja" ] &&
    step perf_build "$(limit 90 60)" "$OUT/perf_build.log" cmake --build "$SKB" --target minincl-perf -j "$NPROC"; then
    PERF=$ROOT/${SKB%/}/bench/minincl-perf
  fi
fi

if ((BUILD_OK)); then
  # ---- (b2) every algorithm x protocol, a process each ----
  step smoke "$(limit 150 150)" "$OUT/smoke.log" \
    "$PY" bench/gpu_smoke.py --json "$OUT/smoke.json" --timeout 30 --budget 120
  sed 's/^/  smoke| /' "$OUT/smoke.log" | head -60

  # ---- (e) benchmarks: copy bandwidth, then minincl-perf ----
  step gpu_bench_d2d "$(limit 40 120)" "$OUT/gpu_bench_d2d.log" \
    "$PY" bench/gpu_bench.py d2d --json "$OUT/gpu_bench_d2d.json"
  if [ -n "$PERF" ] && [ -x "$PERF" ]; then
    step perf_lat_2 "$(limit 45 110)" "$OUT/perf_lat_2.log" \
      "$PERF" allreduce -t 2 -b 8 -e 8 -n 2000 -w 200 -P ll -D cuda -c 1
    for algo in ring tree direct; do
      step "perf_bw_8_$algo" "$(limit 45 100)" "$OUT/perf_bw_8_$algo.log" \
        env MININCL_DEBUG=INFO MININCL_DEBUG_SUBSYS=TUNE \
        "$PERF" allreduce -t 8 -b 256M -e 256M -n 10 -w 3 -A "$algo" -D cuda -c 0
    done
    # The tuner's own choice, checked; a bigger Simple step for direct; direct without pointer
    # steps / direct writes (the FIFO path), for A/B.
    step perf_bw_8_auto "$(limit 45 100)" "$OUT/perf_bw_8_auto.log" env MININCL_DEBUG=INFO MININCL_DEBUG_SUBSYS=TUNE \
      "$PERF" allreduce -t 8 -b 256M -e 256M -n 10 -w 3 -D cuda -c 1
    step perf_bw_8_direct_2m "$(limit 45 100)" "$OUT/perf_bw_8_direct_2m.log" \
      env MININCL_SIMPLE_SLOT_BYTES=2M "$PERF" allreduce -t 8 -b 256M -e 256M -n 10 -w 3 -A direct -D cuda -c 0
    step perf_bw_8_direct_fifo "$(limit 45 100)" "$OUT/perf_bw_8_direct_fifo.log" \
      env MININCL_POINTER_STEPS=0 "$PERF" allreduce -t 8 -b 256M -e 256M -n 10 -w 3 -A direct -D cuda -c 0
    for f in "$OUT"/perf_bw_8_*.log; do
      awk -v f="$(basename "$f" .log)" '/^ +[0-9]+ /{printf "%-26s %10s us  busbw %8s GB/s  #wrong %s\n", f, $6, $8, $9}' "$f"
    done
    # 8-byte latency: one thread driving both ranks, a group per call (one fused kernel), and
    # A/B: a kernel per rank (MININCL_GPU_FUSE=0), channels read from device memory
    # (MININCL_GPU_CHANNEL_CACHE=0), the LL kernel for direct LL too
    # (MININCL_GPU_PATH_KERNELS=0); per algorithm.
    lat_args=(allreduce -b 8 -e 8 -n 2000 -w 200 -P ll -D cuda -c 1)
    step perf_lat_2_grouped "$(limit 30 100)" "$OUT/perf_lat_2_grouped.log" "$PERF" "${lat_args[@]}" -t 2 -g
    step perf_lat_2_grouped_unfused "$(limit 30 100)" "$OUT/perf_lat_2_grouped_unfused.log" \
      env MININCL_GPU_FUSE=0 "$PERF" "${lat_args[@]}" -t 2 -g
    step perf_lat_2_grouped_nocache "$(limit 30 100)" "$OUT/perf_lat_2_grouped_nocache.log" \
      env MININCL_GPU_CHANNEL_CACHE=0 "$PERF" "${lat_args[@]}" -t 2 -g
    step perf_lat_2_grouped_llkernel "$(limit 30 100)" "$OUT/perf_lat_2_grouped_llkernel.log" \
      env MININCL_GPU_PATH_KERNELS=0 "$PERF" "${lat_args[@]}" -t 2 -g
    step perf_lat_2_nocache "$(limit 30 100)" "$OUT/perf_lat_2_nocache.log" \
      env MININCL_GPU_CHANNEL_CACHE=0 "$PERF" "${lat_args[@]}" -t 2
    for a in ring tree direct; do
      step "perf_lat_2_grouped_$a" "$(limit 30 100)" "$OUT/perf_lat_2_grouped_$a.log" "$PERF" "${lat_args[@]}" -t 2 -g -A "$a"
    done
    step perf_lat_8_grouped "$(limit 30 100)" "$OUT/perf_lat_8_grouped.log" "$PERF" "${lat_args[@]}" -t 8 -g
    step perf_lat_8_grouped_nocache "$(limit 30 100)" "$OUT/perf_lat_8_grouped_nocache.log" \
      env MININCL_GPU_CHANNEL_CACHE=0 "$PERF" "${lat_args[@]}" -t 8 -g
    for f in "$OUT"/perf_lat_*.log; do
      awk -v f="$(basename "$f" .log)" '/^ +[0-9]+ /{printf "%-30s %10s us  #wrong %s\n", f, $6, $9}' "$f"
    done
    # Sends and receives (blocks sized by bytes since the seventh session), 2 ranks, checked.
    step perf_sendrecv_2 "$(limit 25 100)" "$OUT/perf_sendrecv_2.log" \
      "$PERF" sendrecv -t 2 -b 8 -e 16M -f 8 -n 20 -w 5 -D cuda -c 1
    awk '/^ +[0-9]+ /{s = s sprintf(" %s:%sus", $1, $6); w += $9} END {printf "%-26s%s  #wrong %d\n", "perf_sendrecv_2", s, w}' \
      "$OUT/perf_sendrecv_2.log"
    # Alltoall on 8 ranks up to 128 MiB, checked: blocks big enough to take many channels each
    # (a launch holds 56 channel ops; before the twenty-sixth session these were refused), and
    # A/B: every exchange starting on channel 0 (MININCL_P2P_SPREAD=0, the CPU's default).
    for spread in 1 0; do
      step "perf_alltoall_8_spread$spread" "$(limit 25 100)" "$OUT/perf_alltoall_8_spread$spread.log" \
        env MININCL_P2P_SPREAD=$spread "$PERF" alltoall -t 8 -g -b 256K -e 128M -f 8 -n 10 -w 2 -D cuda -c 1
      awk -v f="perf_alltoall_8_spread$spread" '/^ +[0-9]+ /{s = s sprintf(" %s:%sus", $1, $6); w += $9}
        END {printf "%-26s%s  #wrong %d\n", f, s, w}' "$OUT/perf_alltoall_8_spread$spread.log"
    done
    # 8- and 16-bit floats, 8 ranks driven by one thread, the tuner's choice, checked.
    for d in f8e4m3 f8e5m2 bfloat16; do
      step "perf_type_8_$d" "$(limit 25 100)" "$OUT/perf_type_8_$d.log" \
        "$PERF" allreduce -t 8 -g -b 1K -e 256M -f 16 -n 10 -w 2 -d "$d" -D cuda -c 1
      awk -v f="perf_type_8_$d" '/^ +[0-9]+ /{s = s sprintf(" %s:%sus", $1, $6); w += $9} END {printf "%-26s%s  #wrong %d\n", f, s, w}' \
        "$OUT/perf_type_8_$d.log"
    done
    # The tuner's choice from 8 B to 256 MiB, 2 and 8 ranks, checked: a thread per rank, and
    # one thread driving every rank (-g).
    for n in 2 8; do
      for how in threads grouped; do
        g=()
        [ "$how" = grouped ] && g=(-g)
        step "perf_sweep_${n}_$how" "$(limit 40 100)" "$OUT/perf_sweep_${n}_$how.log" \
          env MININCL_DEBUG=INFO MININCL_DEBUG_SUBSYS=TUNE \
          "$PERF" allreduce -t "$n" "${g[@]}" -b 8 -e 256M -f 4 -n 20 -w 5 -D cuda -c 1
        grep -v INFO "$OUT/perf_sweep_${n}_$how.log" | grep -E "^ +[0-9]+ " |
          awk '{printf "%s:%s/%s ", $1, $6, $8} END {print ""}'
      done
    done
    # Every algorithm x protocol through the C API, checked, 8 B to 64 MiB (no Python involved).
    for n in 2 8; do
      for algo in ring tree direct; do
        for proto in simple ll ll128; do
          step "perf_check_${n}_${algo}_$proto" "$(limit 25 100)" "$OUT/perf_check_${n}_${algo}_$proto.log" \
            "$PERF" allreduce -t "$n" -b 8 -e 64M -f 8 -n 5 -w 1 -A "$algo" -P "$proto" -D cuda -c 1
        done
      done
    done
    for f in "$OUT"/perf_check_*.log; do  # name, size, time (us), busbw, #wrong
      awk -v f="$(basename "$f" .log)" '/^ +[0-9]+ /{if (!n++) t0 = $6; bw = $8; w += $9; rows++}
        END {printf "%-28s rows %d  8 B %s us  64 MiB busbw %s GB/s  #wrong %d\n", f, rows, t0, bw, w}' "$f"
    done
  else
    echo "[$(elapsed)s] minincl-perf: no binary; GPU perf runs skipped"
    printf 'perf_runs\tno-binary\t0\t-\n' >>"$STEPS"
  fi

  # ---- (f) latency: back to back, CUDA graph, a thread per rank ----
  step gpu_bench_latency "$(limit 40 90)" "$OUT/gpu_bench_latency.log" \
    "$PY" bench/gpu_bench.py latency --json "$OUT/gpu_bench_latency.json"
  step gpu_bench_graph "$(limit 30 80)" "$OUT/gpu_bench_graph.log" \
    "$PY" bench/gpu_bench.py graph --json "$OUT/gpu_bench_graph.json"
  for v in unfused:MININCL_GPU_FUSE=0 nocache:MININCL_GPU_CHANNEL_CACHE=0 llkernel:MININCL_GPU_PATH_KERNELS=0; do  # A/B of the graph replay
    step "gpu_bench_graph_${v%%:*}" "$(limit 30 80)" "$OUT/gpu_bench_graph_${v%%:*}.log" \
      env "${v#*:}" "$PY" bench/gpu_bench.py graph --json "$OUT/gpu_bench_graph_${v%%:*}.json"
  done
  step gpu_bench_floor "$(limit 30 80)" "$OUT/gpu_bench_floor.log" \
    "$PY" bench/gpu_bench.py floor --json "$OUT/gpu_bench_floor.json"
  step gpu_bench_threads "$(limit 30 80)" "$OUT/gpu_bench_threads.log" \
    "$PY" bench/gpu_bench.py threads --json "$OUT/gpu_bench_threads.json"
  # Inside the kernel: time points of an 8-byte allreduce, with its direct-LL kernel and with
  # the LL one (a trace build, when device_prebuild.sh made one; printed at comm destroy).
  TRACE_PERF=$PREBUILT/trace/bin/minincl-perf
  if [ -x "$TRACE_PERF" ] && (($(left) > 120)); then
    for pk in 1 0; do
      step "perf_trace_paths$pk" "$(limit 30 90)" "$OUT/perf_trace_paths$pk.log" env MININCL_GPU_PATH_KERNELS=$pk \
        LD_LIBRARY_PATH="$PREBUILT/trace/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        "$TRACE_PERF" allreduce -t 2 -g -b 8 -e 8 -n 2000 -w 200 -A direct -P ll -D cuda -c 1
      grep -E "^ +[0-9]+ " "$OUT/perf_trace_paths$pk.log" | awk -v k=$pk '{printf "trace, path kernels %s: %s us\n", k, $6}'
    done
  fi
  if [ -n "$PERF" ] && (($(left) > 100)); then
    step perf_lat_2proc "$(limit 30 80)" "$OUT/perf_lat_2proc.log" \
      "$PERF" allreduce -p 2 -b 8 -e 8 -n 200 -w 20 -D cuda -c 1
  fi

  # ---- (d) the GPU tests, with what is left ----
  if timeout 30 "$PY" -c "import pytest" >/dev/null 2>&1; then
    TIMEOUT_ARGS=()
    if timeout 30 "$PY" -c "import pytest_timeout" >/dev/null 2>&1; then
      TIMEOUT_ARGS=(--timeout 100)
    fi
    read -r -a EXTRA <<<"${MININCL_CHECK_PYTEST_ARGS:---maxfail=25}"
    (cd tests && step gpu_tests "$(limit 400 25)" "$OUT/gpu_tests.log" \
      env MININCL_TEST_WATCHDOG=40 "$PY" -m pytest test_gpu.py test_torch_backend.py -m gpu ${EXTRA[@]+"${EXTRA[@]}"} -v -rfEs \
      --durations=15 -p no:cacheprovider -o faulthandler_timeout=90 --junitxml="$OUT/gpu_tests.xml" \
      ${TIMEOUT_ARGS[@]+"${TIMEOUT_ARGS[@]}"})
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-400 | tail -40
  else
    echo "[$(elapsed)s] gpu_tests: pytest is not installed; skipped"
    printf 'gpu_tests\tno-pytest\t0\t-\n' >>"$STEPS"
  fi
else
  echo "[$(elapsed)s] no usable package: no tests, no benchmarks (see build.log)"
fi

# ---- (g) results.json and the summary; the logs packed (at most 8 files come back) ----
timeout 60 "$PY" bench/device_check_report.py "$OUT" --budget "$BUDGET" --elapsed "$(elapsed)" |
  tee "$OUT/summary.txt" || echo "device_check_report.py failed; raw files are in logs.tgz"
cp "$OUT/results.json" "$OUT/summary.txt" "$FINAL_OUT/" 2>/dev/null
tar czf "$FINAL_OUT/logs.tgz" -C "$OUT" . && echo "logs: $FINAL_OUT/logs.tgz ($(du -k "$FINAL_OUT/logs.tgz" | cut -f1) KiB)"
