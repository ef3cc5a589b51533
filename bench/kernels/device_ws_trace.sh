#!/usr/bin/env bash
# One device call (docs/GPU.md) for the wide cascade kernel's per-work timeline: builds the
# product tree (build-gpu) and, beside it, cuda_attention_bench with the timeline stamps
# (build-trace, -DCASCADE_WS_TRACE=ON); runs every GPU bitwise test binary on the product build;
# then for each tree configuration of TREES (default "default nofold"; names as
# cuda_attention_bench --tree) times the row on both builds (what the stamps cost) and prints
# bench/kernels/ws_trace.py's report of the trace build's last launch. Logs and traces under $OUT
# (or ./device-out).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
t0=$(date +%s)
bash scripts/device_build.sh cuda_kernels_test cuda_attention_test cuda_backend_test \
  engine_cuda_test cuda_attention_bench >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s"
# The trace build while the tests run (after the first build unpacked the carried packages).
(CASCADE_BUILD_DIR=$PWD/build-trace CASCADE_CMAKE_ARGS=-DCASCADE_WS_TRACE=ON \
   bash scripts/device_build.sh cuda_attention_bench >"$OUT/build_trace.log" 2>&1 ||
   echo "trace build failed") &
trace_pid=$!
GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-150} \
  GPU_TESTS="cuda_attention_test cuda_kernels_test cuda_backend_test engine_cuda_test" \
  bash scripts/device_gpu_tests.sh build-gpu
trc=$?
echo "tests: $(( $(date +%s) - t0 )) s (rc=$trc)"
wait $trace_pid
[ -x build-trace/bench/cuda_attention_bench ] || { tail -40 "$OUT/build_trace.log"; exit 1; }
for t in ${TREES:-default nofold}; do
  echo "== tree $t: product build, trace build"
  timeout 90 build-gpu/bench/cuda_attention_bench --tree="$t" 2>&1 | grep -E "tree" |
    tee -a "$OUT/trace_rows.log"
  timeout 90 build-trace/bench/cuda_attention_bench --tree="$t" --trace="$OUT/trace_$t.csv" 2>&1 |
    grep -E "tree|trace" | tee -a "$OUT/trace_rows.log"
  python3 bench/kernels/ws_trace.py "$OUT/trace_$t.csv" | tee "$OUT/trace_$t.txt"
done
echo "total: $(( $(date +%s) - t0 )) s"
exit $trc
