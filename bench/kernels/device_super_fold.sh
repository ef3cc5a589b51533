#!/usr/bin/env bash
# One device call for the two-level fold order (super-tiles, attention.h; see docs/GPU.md): builds,
# runs every GPU bitwise test binary (each path compared within each order: cuda_attention_test
# and cuda_backend_test run the one-level order and the device's super-tiles), then times
# cuda_attention_bench's prefill table (default = super-tiles, a 1-level column beside), the
# cascade cases (shared prefix, three-level tree; 1-level rows beside) and DECODE cases ("B,CTX",
# default and 1-level rows). Logs under $OUT (or ./device-out).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
t0=$(date +%s)
bash scripts/device_build.sh cuda_kernels_test cuda_attention_test cuda_backend_test \
  engine_cuda_test cuda_attention_bench >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s"
GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-120} \
  GPU_TESTS="cuda_attention_test cuda_kernels_test cuda_backend_test engine_cuda_test" \
  bash scripts/device_gpu_tests.sh build-gpu
echo "tests: $(( $(date +%s) - t0 )) s"
bench=build-gpu/bench/cuda_attention_bench
timeout 60 $bench --prefill-only 2>&1 | grep -E "fold order|prefill" | tee "$OUT/prefill.log"
timeout 60 $bench --cascade-only 2>&1 | grep -E "shared|tree" | tee "$OUT/cascade.log"
for c in ${DECODE:-256,4096 64,1024 256,145}; do
  timeout 30 $bench --decode=$c 2>&1 | grep -E "decode" | tee -a "$OUT/decode.log"
done
echo "total: $(( $(date +%s) - t0 )) s"
