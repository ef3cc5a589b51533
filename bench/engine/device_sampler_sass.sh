#!/usr/bin/env bash
# One device call: where the device sampler (SampleKernel) spends its time, per SASS instruction.
# ncu's SourceCounters of one launch at BATCH (default 64) of each sampler in SAMPLERS (default
# logprobs,topp), then the instructions with the most warp stall samples and the samples summed
# by opcode (bench/engine/sass_hot.py). Logs under $OUT.
set -uo pipefail
OUT=${OUT:-device-out}; mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
bash scripts/device_build.sh engine_bench >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
E="build-gpu/bench/engine_bench --backend=cuda --preset=qwen3-0.6b --sections=decode --variants=default --batches=${BATCH:-64} --decode_len=16"
for s in $(tr ',' ' ' <<<"${SAMPLERS:-logprobs,topp}"); do
  rm -f /tmp/samp_$s.ncu-rep
  timeout 240 ncu --clock-control none --section SourceCounters --section WarpStateStats --section SpeedOfLight \
    -k regex:SampleKernel --launch-skip 12 --launch-count 1 -o /tmp/samp_$s $E --samplers=$s >/tmp/ncu_sass_$s.log 2>&1
  ncu --import /tmp/samp_$s.ncu-rep --page source --print-source sass --csv >/tmp/sass_$s.csv 2>&1
  ncu --import /tmp/samp_$s.ncu-rep --print-details all 2>&1 | grep -E "Duration|Executed Ipc|Issued|Stall" | head -20
  echo "== $s"; python3 bench/engine/sass_hot.py /tmp/sass_$s.csv ${TOP:-45} | tee "$OUT/sass_hot_$s.txt"
done
