#!/usr/bin/env bash
# One device call (docs/GPU.md) for the wide cascade kernel's per-work timeline: builds the
# product tree (build-gpu) and, beside it, cuda_attention_bench with the timeline stamps
# (build-trace, -DCASCADE_WS_TRACE=ON); runs every GPU bitwise test binary on the product build;
# then for each tree configuration of TREES (default "default nofold"; names as
# cuda_attention_bench --tree) times the row on both builds (what the stamps cost) and prints
# bench/kernels/ws_trace.py's report of the trace build's last launch.
# ALT_SRC=dir (a second source tree carried with the call, e.g. a branch: `mkdir alt_src && git
# archive BRANCH | tar -x -C alt_src`, carry [".devdeps", "alt_src"]): the same for that tree
# (build-alt, build-alt-trace; its test logs under $OUT/alt), every row timed on both trees in
# turn (this, alt, this again) so a speedup is measured in the same call as both trees' tests.
# EXTRA_ROWS (below): more rows timed the same way.
# Logs and traces under $OUT (or ./device-out).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
t0=$(date +%s)
bash scripts/device_build.sh cuda_kernels_test cuda_attention_test cuda_backend_test \
  engine_cuda_test cuda_attention_bench >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s"
# The other builds while the tests run (after the first build unpacked the carried packages).
(
  CASCADE_BUILD_DIR=$PWD/build-trace CASCADE_CMAKE_ARGS=-DCASCADE_WS_TRACE=ON \
    bash scripts/device_build.sh cuda_attention_bench >"$OUT/build_trace.log" 2>&1 ||
    echo "trace build failed"
  if [ -n "${ALT_SRC:-}" ]; then
    CASCADE_BUILD_DIR=$PWD/build-alt bash "$ALT_SRC/scripts/device_build.sh" cuda_kernels_test \
      cuda_attention_test cuda_backend_test engine_cuda_test cuda_attention_bench \
      >"$OUT/build_alt.log" 2>&1 || echo "alt build failed"
    CASCADE_BUILD_DIR=$PWD/build-alt-trace CASCADE_CMAKE_ARGS=-DCASCADE_WS_TRACE=ON \
      bash "$ALT_SRC/scripts/device_build.sh" cuda_attention_bench \
      >"$OUT/build_alt_trace.log" 2>&1 || echo "alt trace build failed"
  fi
) &
builds_pid=$!
GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-150} \
  GPU_TESTS="cuda_attention_test cuda_kernels_test cuda_backend_test engine_cuda_test" \
  bash scripts/device_gpu_tests.sh build-gpu
trc=$?
echo "tests: $(( $(date +%s) - t0 )) s (rc=$trc)"
wait $builds_pid
[ -x build-trace/bench/cuda_attention_bench ] || { tail -40 "$OUT/build_trace.log"; exit 1; }
trees="build-gpu"
if [ -n "${ALT_SRC:-}" ]; then
  if [ -x build-alt/bench/cuda_attention_bench ]; then
    echo "== tests of $ALT_SRC"
    OUT=$OUT/alt GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-150} \
      GPU_TESTS="cuda_attention_test cuda_kernels_test cuda_backend_test engine_cuda_test" \
      bash scripts/device_gpu_tests.sh build-alt || trc=1
    echo "alt tests: $(( $(date +%s) - t0 )) s (rc=$trc)"
    trees="build-gpu build-alt build-gpu"
  else
    tail -40 "$OUT/build_alt.log"
  fi
fi
for t in ${TREES:-default nofold}; do
  for b in $trees; do
    echo "== tree $t: $b"
    timeout 90 "$b"/bench/cuda_attention_bench --tree="$t" 2>&1 | grep -E "tree" |
      tee -a "$OUT/trace_rows.log"
  done
  for b in build-trace build-alt-trace; do
    [ -x "$b"/bench/cuda_attention_bench ] || continue
    echo "== tree $t: $b"
    timeout 90 "$b"/bench/cuda_attention_bench --tree="$t" --trace="$OUT/trace_${t}_$b.csv" 2>&1 |
      grep -E "tree|trace" | tee -a "$OUT/trace_rows.log"
    python3 bench/kernels/ws_trace.py "$OUT/trace_${t}_$b.csv" | tee "$OUT/trace_${t}_$b.txt"
  done
done
# EXTRA_ROWS: other cuda_attention_bench selections (e.g. "--shared=64 --prefill=8192"), each
# timed on every tree in turn like the tree rows.
for r in ${EXTRA_ROWS:-}; do
  for b in $trees; do
    echo "== $r: $b"
    timeout 90 "$b"/bench/cuda_attention_bench "$r" 2>&1 | grep -E "[0-9]+\.[0-9]" |
      tee -a "$OUT/trace_rows.log"
  done
done
echo "total: $(( $(date +%s) - t0 )) s"
exit $trc
