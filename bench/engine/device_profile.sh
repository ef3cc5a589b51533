#!/usr/bin/env bash
# One device call: per-kernel GPU time of decode steps (ncu, clocks untouched) at batch 1 and 256
# on qwen3-0.6b, summed by kernel (bench/engine/ncu_steps.py); then the GPU tests and the
# decode variants (bench/engine/device_graphs.sh). Logs under $OUT.
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export CASCADE_SUBDIRS="cache_service gpu_worker/model gpu_worker/engine gpu_worker/backend/cpu gpu_worker/backend/cuda tests/gpu bench/engine bench/kernels"
bash scripts/device_build.sh engine_bench >"$OUT/build_prof.log" 2>&1 || { tail -40 "$OUT/build_prof.log"; exit 1; }
. build-gpu/env.sh
E="build-gpu/bench/engine_bench --backend=cuda --preset=${PRESET:-qwen3-0.6b} --sections=decode --variants=${VARIANT:-default}"
for spec in ${PROFILE:-1:1600:900 256:2800:700}; do
  IFS=: read -r batch skip count <<<"$spec"
  timeout 240 ncu --clock-control none --csv --metrics gpu__time_duration.sum \
    --launch-skip "$skip" --launch-count "$count" $E --batches="$batch" --decode_len=16 \
    >"$OUT/ncu_b$batch.csv" 2>"$OUT/ncu_b$batch.err"
  echo "== batch $batch (ncu rc=$?)"
  python3 bench/engine/ncu_steps.py "$OUT/ncu_b$batch.csv" || tail -5 "$OUT/ncu_b$batch.err"
done
[ "${SKIP_GRAPHS_SCRIPT:-0}" = 1 ] || bash bench/engine/device_graphs.sh "$@"
