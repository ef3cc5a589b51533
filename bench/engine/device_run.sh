#!/usr/bin/env bash
# One device call (see docs/GPU.md): builds the engine test and benchmark on the GPU machine,
# runs the engine-over-CUDA test, then engine_bench on the tiny and qwen3-0.6b presets.
# Logs go to $OUT (or ./device-out). Usage: bash bench/engine/device_run.sh [extra ninja targets]
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export CASCADE_SUBDIRS="cache_service gpu_worker/model gpu_worker/engine gpu_worker/backend/cpu gpu_worker/backend/cuda tests/gpu bench/engine bench/kernels"
t0=$(date +%s)
bash scripts/device_build.sh engine_cuda_test engine_bench "$@" >"$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
. build-gpu/env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv >"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
timeout 300 build-gpu/tests/engine_cuda_test 2>&1 | tee "$OUT/engine_cuda_test.log" | grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) |preemptions|cascade:|CUDA vs CPU|Failure|differ" | head -60
echo "test: $(( $(date +%s) - t0 )) s"
timeout 60 build-gpu/bench/engine_bench --backend=cuda --preset=tiny --batches=1,64,256 --prefill_lens=2048 --queries=64 2>&1 | tee "$OUT/bench_tiny.log" | tail -25
echo "tiny bench: $(( $(date +%s) - t0 )) s"
timeout 360 build-gpu/bench/engine_bench --backend=cuda --preset=qwen3-0.6b 2>&1 | tee "$OUT/bench_qwen3.log"
echo "total: $(( $(date +%s) - t0 )) s"
