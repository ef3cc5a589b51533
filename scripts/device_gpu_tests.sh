#!/usr/bin/env bash
# Runs every GPU bitwise test binary of a device build (docs/GPU.md): kernels, attention (cascade
# == flat, cached == cold), backend (cached == cold, graph == eager, device sampler == host rule),
# engine on CUDA, and the attention planner. Appends their output to $OUT/gpu_tests.log and
# prints one line per binary. Exit status: 1 if any failed.
# Usage: bash scripts/device_gpu_tests.sh BUILD_DIR   (after `. BUILD_DIR/env.sh`); GPU_TESTS: the
# binaries to run (default all five; attention_plan_test needs tests/ in a CASCADE_SUBDIRS build).
set -uo pipefail
BUILD_DIR=${1:?usage: device_gpu_tests.sh BUILD_DIR}
OUT=${OUT:-device-out}
mkdir -p "$OUT"
fail=0
for t in ${GPU_TESTS:-cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test attention_plan_test}; do
  echo "===== $t" >>"$OUT/gpu_tests.log"
  timeout 240 "$BUILD_DIR/tests/$t" >"$OUT/$t.tmp" 2>&1
  rc=$?
  cat "$OUT/$t.tmp" >>"$OUT/gpu_tests.log"
  [ $rc -ne 0 ] && fail=1
  echo "$t rc=$rc: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.tmp" | tr '\n' ' ')"
  rm -f "$OUT/$t.tmp"
done
exit $fail
