#!/usr/bin/env bash
# One device call (see docs/GPU.md) for issue 13's host KV tier: builds the CUDA backend test,
# the engine tests and tier_bench on the GPU machine, runs the block-copy test (and the rest of
# cuda_backend_test), the engine's CPU-backend host-tier tests, then tier_bench on CUDA with the
# host tier off, on (copies ahead of eviction, the default), on without them and on with the
# selective write policy (HOST: which;
# 64 tenants x 4k-token system chunk, GPU KV a quarter of the working set).
# Logs go to $OUT (or ./device-out). Usage: bash bench/engine/device_tiers.sh [presets...]
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
export CASCADE_SUBDIRS="$CASCADE_SUBDIRS tests/engine"
PRESETS=("$@")
[ ${#PRESETS[@]} -eq 0 ] && PRESETS=(qwen3-0.6b)
t0=$(date +%s)
bash scripts/device_build.sh cuda_backend_test engine_cuda_test engine_test eviction_test engine_cpu_test tier_bench \
  >"$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
. build-gpu/env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
timeout 300 build-gpu/tests/cuda_backend_test 2>&1 | tee "$OUT/cuda_backend_test.log" |
  grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) |Failure|!=" | head -40
timeout 300 build-gpu/tests/engine_cuda_test 2>&1 | tee "$OUT/engine_cuda_test.log" | tail -1
for t in eviction_test engine_test; do
  timeout 120 build-gpu/tests/$t 2>&1 | tee "$OUT/$t.log" | tail -1
done
timeout 300 build-gpu/tests/engine_cpu_test --gtest_filter='*Host*' 2>&1 |
  tee "$OUT/engine_cpu_test.log" | tail -1
echo "tests: $(( $(date +%s) - t0 )) s"
for p in "${PRESETS[@]}"; do
  timeout 600 build-gpu/bench/tier_bench --backend=cuda --preset="$p" --tenants=64 \
    --system_len=4096 --query_len=32 --gen=8 --rounds=3 --concurrency=8 \
    --host="${HOST:-off,on,on-noahead,on-selective}" 2>&1 |
    tee "$OUT/tier_bench_$p.log"
done
echo "total: $(( $(date +%s) - t0 )) s"
