#!/usr/bin/env bash
# One device call for issue 10's table on the current tree: engine_bench decode (batch 1 / 64 /
# 256, prompt 128, 64 generated, greedy; with each step's bytes floor) per preset beside Hugging
# Face transformers + a CUDA-graph decode step on the same generated safetensors
# (hf_decode_bench.py), and the nano-vllm workload on qwen3-0.6b; each for VARIANTS (default
# "default,spec1": the engine's plain schedule and the worker's on CUDA, every step overlapped and
# the next one enqueued behind it since session 49). Logs under $OUT (a file per
# preset). Usage: [PRESETS="qwen3-0.6b llama-3.2-1b qwen3-8b"] [NANO=1] [VARIANTS=...] bash $0
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export CASCADE_SUBDIRS="common cache_service gpu_worker/model gpu_worker/engine gpu_worker/backend/cpu gpu_worker/backend/cuda bench/engine"
t0=$(date +%s)
bash scripts/device_build.sh engine_bench >/tmp/i10_build.log 2>&1 || { tail -60 /tmp/i10_build.log; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s; commit $(cat COMMIT 2>/dev/null || git rev-parse --short HEAD)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
for p in ${PRESETS:-qwen3-0.6b llama-3.2-1b qwen3-8b}; do
  sections=decode
  [ "$p" = qwen3-0.6b ] && [ "${NANO:-1}" = 1 ] && sections=decode,nanovllm
  # default (the engine library's schedule) and spec1 (the worker's: step n + 1 scheduled while
  # step n runs, from 1 row, and enqueued on the GPU behind it; spec1+nospec is the overlapped
  # schedule without the speculated launches), in one process.
  timeout 280 build-gpu/bench/engine_bench --backend=cuda --preset=$p --sections=$sections \
    --variants=${VARIANTS:-default,spec1} --batches=1,64,256 >"$OUT/engine_$p.log" 2>&1
  echo "engine $p rc=$? ($(( $(date +%s) - t0 )) s)"
  grep -E "^## Decode, |^\| (1|64|256) \||^\| (default|overlap|spec)|output tok/s|floor" \
    "$OUT/engine_$p.log" | head -30
  timeout 200 python3 bench/engine/hf_decode_bench.py --model_dir /tmp/cascade_bench_$p \
    --batches 1,64,256 >"$OUT/hf_$p.log" 2>&1
  echo "hf $p rc=$? ($(( $(date +%s) - t0 )) s)"
  grep -E "^\|" "$OUT/hf_$p.log"
  rm -rf /tmp/cascade_bench_$p  # the next preset's weights need the disk
done
echo "total: $(( $(date +%s) - t0 )) s"
