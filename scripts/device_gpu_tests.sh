# Sourced by the device scripts (docs/GPU.md). run_gpu_tests [TIMEOUT_S [EXTRA_REGEX]] runs the four
# GPU test binaries of build-gpu/tests (cuda_kernels_test, cuda_attention_test, cuda_backend_test,
# engine_cuda_test), each log in $OUT/<name>.log; prints each one's result, the lines matching
# EXTRA_REGEX and the failures; sets fail=1 if any failed (the caller sets fail=0 first).
run_gpu_tests() {
  local limit=${1:-300} extra=${2:-} t rc
  for t in cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test; do
    timeout "$limit" build-gpu/tests/$t >"$OUT/$t.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && fail=1
    echo "$t rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' "$OUT/$t.log" | tr '\n' ' ')"
    if [ -n "$extra" ]; then grep -E "$extra" "$OUT/$t.log" | head -6; fi
    grep -B2 -A8 "Failure" "$OUT/$t.log" | head -40
  done
}
