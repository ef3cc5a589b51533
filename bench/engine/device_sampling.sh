#!/usr/bin/env bash
# One device call for sampling on the GPU (issue 10): builds on the GPU machine, runs every GPU
# bitwise test (kernels, attention incl. cascade == flat, backend incl. cached == cold, graph ==
# eager and device sampler == host rule on full-vocabulary rows, engine incl. device == host
# sampling with every option), then times engine_bench decode for each sampler (greedy,
# temperature, topk, topp, minp, penalty, freqpres, logprobs, all) in one process, for the
# variants default and overlap (the engine's overlapped schedule), then the nano-vllm workload
# for both.
# Usage: bash bench/engine/device_sampling.sh [preset, default qwen3-0.6b]
# Environment: BATCHES (default 1,64,256), VARIANTS (default default,overlap), SAMPLERS (default
# all of them), ROUNDS (default 5: each batch's samplers in interleaved rounds, medians compared),
# NANO (default 1).
# Logs under $OUT (or ./device-out).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
PRESET=${1:-qwen3-0.6b}
export CASCADE_SUBDIRS="common cache_service gpu_worker/model gpu_worker/engine gpu_worker/backend/cpu gpu_worker/backend/cuda tests/gpu bench/engine"
T="cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test engine_bench"
t0=$(date +%s)
bash scripts/device_build.sh $T >"$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
fail=0
GPU_TESTS="cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test" GPU_TEST_TIMEOUT=300 GPU_TEST_GREP="graph == eager|device == host|overlap == plain|identical:|cascade:" \
  bash scripts/device_gpu_tests.sh build-gpu || fail=1
echo "tests: $(( $(date +%s) - t0 )) s; all passed: $([ $fail = 0 ] && echo yes || echo NO)"
timeout 300 build-gpu/bench/engine_bench --backend=cuda --preset=$PRESET --sections=decode \
  --samplers=${SAMPLERS:-greedy,temperature,topk,topp,minp,penalty,freqpres,logprobs,all} \
  --variants=${VARIANTS:-default,overlap} --batches=${BATCHES:-1,64,256} --rounds=${ROUNDS:-5} \
  >"$OUT/decode_sampling_$PRESET.log" 2>&1
echo "decode rc=$? ($(( $(date +%s) - t0 )) s)"
sed -n '/by variant/,$p' "$OUT/decode_sampling_$PRESET.log"
if [ "${NANO:-1}" = 1 ]; then
  timeout 300 build-gpu/bench/engine_bench --backend=cuda --preset=$PRESET --sections=nanovllm \
    --variants=${VARIANTS:-default,overlap} >"$OUT/nano_$PRESET.log" 2>&1
  echo "nano rc=$? ($(( $(date +%s) - t0 )) s)"
  grep -E "^\||^## nano" "$OUT/nano_$PRESET.log"
fi
echo "total: $(( $(date +%s) - t0 )) s; tests all passed: $([ $fail = 0 ] && echo yes || echo NO)"
