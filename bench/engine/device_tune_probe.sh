#!/usr/bin/env bash
# One device call: why tuned GEMMs (gemm.h SetTuneSizes) can slow a batch-256 decode step:
# engine decode at batch 128 / 256 for default (tuned), untuned and nopdl (tuned, no programmatic
# dependent launch), then ncu per-kernel times of batch-256 steps for default and untuned.
set -uo pipefail
OUT=${OUT:-device-out}; mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
bash scripts/device_build.sh engine_bench >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
E="build-gpu/bench/engine_bench --backend=cuda --preset=qwen3-0.6b --sections=decode"
timeout 300 $E --variants=${VARIANTS:-default,untuned,nopdl} --batches=${BATCHES:-128,256} --tune_log=1 >"$OUT/engine.log" 2>&1
grep -E "^\||^#|^\(" "$OUT/engine.log"; grep "m=\(64\|128\|256\) " "$OUT/engine.log" | head -24
[ "${NCU:-1}" = 1 ] || exit 0
for v in default untuned; do
  timeout 200 ncu --clock-control none --csv --metrics gpu__time_duration.sum \
    --launch-skip ${SKIP:-6000} --launch-count 600 $E --variants=$v --batches=256 --decode_len=16 \
    >"$OUT/ncu_$v.csv" 2>"$OUT/ncu_$v.err"
  echo "== ncu $v (rc=$?)"; python3 bench/engine/ncu_steps.py "$OUT/ncu_$v.csv" || tail -5 "$OUT/ncu_$v.err"
done
