#!/usr/bin/env bash
# One device call (docs/GPU.md) for the cascade step's kernel overlap: builds the attention,
# backend and engine GPU tests and the benchmarks, runs those tests (bitwise: cascade == flat,
# cached == cold, graph == eager), then the kernel benchmark's cascade rows (shared prefix and
# three-level tree; the " serial" row waits for the wide kernel before the split kernel runs, the
# default overlaps them) and engine_bench's three-level tree. Logs under $OUT (or ./device-out).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
t0=$(date +%s)
bash scripts/device_build.sh cuda_attention_test cuda_backend_test engine_cuda_test \
  cuda_attention_bench engine_bench >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s"
GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-200} \
  GPU_TESTS="cuda_attention_test cuda_backend_test engine_cuda_test" \
  bash scripts/device_gpu_tests.sh build-gpu
trc=$?
echo "tests: $(( $(date +%s) - t0 )) s"
timeout 120 build-gpu/bench/cuda_attention_bench --cascade-only 2>&1 | grep -E "case|shared|tree" |
  tee "$OUT/cascade.log"
echo "cascade: $(( $(date +%s) - t0 )) s"
timeout 200 build-gpu/bench/engine_bench --backend=cuda --preset=qwen3-0.6b --sections=tree 2>&1 |
  tee "$OUT/engine_tree.log" | grep -E "^\||^#|tree|floor" | head -30
echo "total: $(( $(date +%s) - t0 )) s"
exit $trc
