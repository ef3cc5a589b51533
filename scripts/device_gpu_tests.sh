#!/usr/bin/env bash
# Runs every GPU bitwise test binary of a device build (docs/GPU.md): kernels, attention (cascade
# == flat, cached == cold), backend (cached == cold, graph == eager, device sampler == host rule),
# engine on CUDA, and the attention planner. Writes each one's output to $OUT/<name>.log and
# appends it to $OUT/gpu_tests.log; prints one line per binary, the lines matching
# GPU_TEST_GREP (if set) and the failures. Exit status: 1 if any failed.
# Usage: bash scripts/device_gpu_tests.sh BUILD_DIR   (after `. BUILD_DIR/env.sh`); GPU_TESTS: the
# binaries to run (default all five; attention_plan_test needs tests/ in a CASCADE_SUBDIRS build);
# GPU_TEST_TIMEOUT: seconds per binary (240).
set -uo pipefail
BUILD_DIR=${1:?usage: device_gpu_tests.sh BUILD_DIR}
OUT=${OUT:-device-out}
mkdir -p "$OUT"
fail=0
for t in ${GPU_TESTS:-cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test attention_plan_test}; do
  timeout "${GPU_TEST_TIMEOUT:-240}" "$BUILD_DIR/tests/$t" >"$OUT/$t.log" 2>&1
  rc=$?
  { echo "===== $t"; cat "$OUT/$t.log"; } >>"$OUT/gpu_tests.log"
  [ $rc -ne 0 ] && fail=1
  echo "$t rc=$rc: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.log" | tr '\n' ' ')"
  if [ -n "${GPU_TEST_GREP:-}" ]; then grep -E "$GPU_TEST_GREP" "$OUT/$t.log" | head -6; fi
  grep -B2 -A8 "Failure" "$OUT/$t.log" | head -40
done
exit $fail
