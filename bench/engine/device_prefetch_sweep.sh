#!/usr/bin/env bash
# One device call (measurement only: no test binary runs): decode ms/step with and without the
# decode graphs' L2 weight prefetch (CudaBackendOptions::prefetch_weights_max_rows) by context
# length, A-B-A-B in one process per prompt length. Usage: [PROMPTS="128 384 768 1536"]
# [BATCHES=8,32,64] [VARIANTS=default,noprefetch,default,noprefetch] bash $0
set -uo pipefail
OUT=${OUT:-device-out}; mkdir -p $OUT
export CASCADE_SUBDIRS="common cache_service gpu_worker/model gpu_worker/engine gpu_worker/backend/cpu gpu_worker/backend/cuda bench/kernels bench/engine"
t0=$(date +%s)
bash scripts/device_build.sh engine_bench >/tmp/b.log 2>&1 || { tail -40 /tmp/b.log; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s; commit $(cat COMMIT)"
for p in ${PROMPTS:-128 384 768 1536}; do
  timeout 200 build-gpu/bench/engine_bench --backend=cuda --preset=qwen3-0.6b --sections=decode \
    --variants=${VARIANTS:-default,noprefetch,default,noprefetch} --batches=${BATCHES:-8,32,64} --prompt_len=$p --decode_len=32 --num_blocks=16384 >$OUT/sweep_$p.log 2>&1
  echo "prompt $p rc=$? ($(( $(date +%s) - t0 )) s)"
  sed -n '/by variant/,$p' $OUT/sweep_$p.log | grep -E "^\| [0-9]"
done
