#!/usr/bin/env bash
# One device call: ncu on the device sampler (SampleKernel) of qwen3-0.6b decode steps at BATCH
# (default 64): its duration per step for each sampler in SAMPLERS (default greedy,topp,logprobs),
# then the full SpeedOfLight / warp-state / memory / scheduler sections of one top-p launch.
# Logs under $OUT.
set -uo pipefail
OUT=${OUT:-device-out}; mkdir -p "$OUT"
export CASCADE_SUBDIRS="common cache_service gpu_worker/model gpu_worker/engine gpu_worker/backend/cpu gpu_worker/backend/cuda tests/gpu bench/engine bench/kernels"
bash scripts/device_build.sh engine_bench >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
B=${BATCH:-64}
E="build-gpu/bench/engine_bench --backend=cuda --preset=qwen3-0.6b --sections=decode --variants=default --batches=$B --decode_len=16"
for s in ${SAMPLERS:-greedy topp logprobs}; do
  timeout 200 ncu --clock-control none --cache-control none --csv --metrics gpu__time_duration.sum \
    -k regex:SampleKernel $E --samplers=$s >"$OUT/ncu_sample_$s.csv" 2>"$OUT/ncu_sample_$s.err"
  python3 - "$OUT/ncu_sample_$s.csv" "$s" <<'PY'
import csv, sys, statistics
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
h = rows[0]; vi, ui = h.index("Metric Value"), h.index("Metric Unit")
us = [float(r[vi].replace(",", "")) * {"ns": 1e-3, "us": 1, "usecond": 1, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}[r[ui]] for r in rows[1:]]
print(f"{sys.argv[2]}: {len(us)} SampleKernel launches, median {statistics.median(us):.1f} us, min {min(us):.1f} us")
PY
done
timeout 240 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
  --section MemoryWorkloadAnalysis --section SchedulerStats --section Occupancy --section LaunchStats --print-details all \
  -k regex:SampleKernel --launch-skip 12 --launch-count 1 $E --samplers=topp >"$OUT/ncu_topp_sections.txt" 2>&1
grep -E "Duration|Throughput|Issued|Eligible|Active Warps|Stall|Occupancy|Registers|Shared Memory|Block Size|Grid Size|Cluster|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|One or More|No Eligible" "$OUT/ncu_topp_sections.txt" | head -60
