#!/usr/bin/env bash
# One device call for decode CUDA graphs (issue 10): builds on the GPU machine, runs every GPU
# bitwise test (kernels, attention incl. cascade == flat, backend incl. cached == cold and graph ==
# eager, engine acceptance incl. device sampler == host sampler), then times engine_bench:
# decode by batch for the variants default (pinned GEMMs + graphs), eager (no graphs) and
# heuristic (cuBLAS heuristics, no pinning) in one process, and the nano-vllm workload.
# Usage: bash bench/engine/device_graphs.sh [presets for the decode table, default qwen3-0.6b]
# Environment: SECTIONS (default "tests decode nano"). Logs under $OUT (or ./device-out).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
SECTIONS=${SECTIONS:-tests decode nano}
PRESETS=${*:-qwen3-0.6b}
export CASCADE_SUBDIRS="cache_service gpu_worker/model gpu_worker/engine gpu_worker/backend/cpu gpu_worker/backend/cuda tests/gpu bench/engine bench/kernels"
T="cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test engine_bench cuda_hf_logits_dump cuda_attention_bench"
t0=$(date +%s)
bash scripts/device_build.sh $T >"$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
fail=0
if [[ " $SECTIONS " == *" tests "* ]]; then
  GPU_TESTS="cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test" GPU_TEST_TIMEOUT=400 GPU_TEST_GREP="graph == eager|graph captures|identical:|cascade:" \
    bash scripts/device_gpu_tests.sh build-gpu || fail=1
  echo "tests: $(( $(date +%s) - t0 )) s; all passed: $([ $fail = 0 ] && echo yes || echo NO)"
fi
B="--backend=cuda"
if [[ " $SECTIONS " == *" decode "* ]]; then
  for p in $PRESETS; do
    timeout 400 build-gpu/bench/engine_bench $B --preset=$p --sections=decode \
      --variants=${VARIANTS:-default,eager,heuristic} --batches=${BATCHES:-1,8,32,64,128,256} \
      >"$OUT/decode_$p.log" 2>&1
    echo "decode $p rc=$? ($(( $(date +%s) - t0 )) s)"
    sed -n '/by variant/,$p' "$OUT/decode_$p.log"
  done
fi
if [[ " $SECTIONS " == *" nano "* ]]; then
  timeout 300 build-gpu/bench/engine_bench $B --preset=qwen3-0.6b --sections=nanovllm \
    --variants=default,eager >"$OUT/nano.log" 2>&1
  echo "nano rc=$? ($(( $(date +%s) - t0 )) s)"
  grep -E "^\||^## nano" "$OUT/nano.log"
fi
echo "total: $(( $(date +%s) - t0 )) s; tests all passed: $([ $fail = 0 ] && echo yes || echo NO)"
