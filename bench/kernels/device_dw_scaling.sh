#!/usr/bin/env bash
# One device call (docs/GPU.md): how the persistent decode kernel's rate scales with its CTAs
# (cuda_attention_bench --dw-ctas=N). If a work's time is its consumer's own chain (latency),
# halving the CTAs doubles a step; if the SM's shared resources (tensor cores, issue slots, the
# copy engine's bandwidth) bound it, the step grows by less. Builds cuda_attention_bench only (no
# kernel change: nothing here is a speedup). CTAS (default "132 66 33 16"), CASES, FLAGS (";"-
# separated flag sets, default the 64-row form and the decode-shaped one). Logs under $OUT.
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
t0=$(date +%s)
bash scripts/device_build.sh cuda_attention_bench >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
IFS=';' read -r -a flagsets <<<"${FLAGS:---dw-n8=0;--dw-n8=1}"
for f in "${flagsets[@]}"; do
  for x in ${CASES:---decode=256,145 --decode=64,1024 --decode=256,4096 --tree=default}; do
    for n in ${CTAS:-132 66 33 16}; do
      timeout 30 build-gpu/bench/cuda_attention_bench $x $f --dw-ctas=$n 2>&1 |
        grep -E "^ *(decode|tree)" | grep -E "\[ws\]|tree" | grep -vE "whole|super|nofold|smem" |
        sed "s|^|[$f ctas=$n] |" | tee -a "$OUT/scaling.log"
    done
  done
done
echo "total: $(( $(date +%s) - t0 )) s"
