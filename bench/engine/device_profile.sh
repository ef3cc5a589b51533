#!/usr/bin/env bash
# One device call: per-kernel GPU time of decode steps (ncu, clocks and caches untouched, every
# kernel of the run profiled, graph nodes one by one, so kernels run serialized and the sum is
# above a graph replay's time) of PRESET (qwen3-0.6b) for each VARIANT:BATCH in PROFILE (default
# "default:1 default:64"), summed by kernel over the decode steps (bench/engine/ncu_steps.py);
# PROMPT_LEN (128) and DECODE_LEN (8) set the rows' context (896 + 8: a nano-vllm-like step).
# The summary averages the most common kernel sequence: at batch 256 with long prompts the
# prefill steps outnumber 8 decode steps, so profile decode there with DECODE_LEN >= 24.
# Then, unless SKIP_GRAPHS_SCRIPT=1, the GPU tests and decode variants (device_graphs.sh).
# Logs under $OUT.
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
bash scripts/device_build.sh engine_bench >"$OUT/build_prof.log" 2>&1 || { tail -40 "$OUT/build_prof.log"; exit 1; }
. build-gpu/env.sh
for spec in ${PROFILE:-default:1 default:64}; do
  IFS=: read -r variant batch <<<"$spec"
  t0=$(date +%s)
  timeout 280 ncu --clock-control none --cache-control none --csv --metrics gpu__time_duration.sum \
    --launch-count 40000 build-gpu/bench/engine_bench --backend=cuda --preset=${PRESET:-qwen3-0.6b} \
    --sections=decode --variants=$variant --batches=$batch --decode_len=${DECODE_LEN:-8} \
    --prompt_len=${PROMPT_LEN:-128} \
    >"$OUT/ncu_${variant}_b$batch.csv" 2>"$OUT/ncu_${variant}_b$batch.err"
  echo "== $variant batch $batch (ncu rc=$?, $(( $(date +%s) - t0 )) s)"
  python3 bench/engine/ncu_steps.py "$OUT/ncu_${variant}_b$batch.csv" || tail -5 "$OUT/ncu_${variant}_b$batch.err"
done
[ "${SKIP_GRAPHS_SCRIPT:-0}" = 1 ] || bash bench/engine/device_graphs.sh "$@"
