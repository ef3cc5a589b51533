#!/usr/bin/env bash
# One device call: ncu on the device sampler (SampleKernel) of qwen3-0.6b decode steps at each
# batch of BATCHES (default 64): its duration per step for each sampler in SAMPLERS (default
# greedy,topp,logprobs); then (SECTIONS=1, the default) the full SpeedOfLight / warp-state /
# memory / scheduler sections of one top-p launch. TESTS=1: first every GPU test binary (a timing
# counts only where they pass). BASE_SRC=<folder> (a baseline tree, carried): the same ncu
# durations for its build, same call. RATES=1: then engine_bench's decode rate per sampler at
# RATE_BATCHES (default BATCHES) for RATE_SAMPLERS (default SAMPLERS) in ROUNDS (default 5)
# interleaved rounds, medians compared (ratio to greedy, issue 10's bar). Logs under $OUT.
set -uo pipefail
OUT=${OUT:-device-out}; mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
export GPU_TESTS="cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test"
T=engine_bench; [ "${TESTS:-0}" = 1 ] && T="$T $GPU_TESTS"
t0=$(date +%s)
bash scripts/device_build.sh $T >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh; echo "build $(( $(date +%s) - t0 )) s"
if [ "${TESTS:-0}" = 1 ]; then
  bash scripts/device_gpu_tests.sh build-gpu && echo "all passed: yes" || echo "all passed: NO"
  grep -B2 -A8 "Failure" "$OUT/gpu_tests.log" | head -30
fi
if [ -n "${BASE_SRC:-}" ]; then
  CASCADE_BUILD_DIR=$PWD/build-base bash "$BASE_SRC/scripts/device_build.sh" engine_bench >"$OUT/build_base.log" 2>&1 ||
    { echo "baseline build failed"; tail -20 "$OUT/build_base.log"; }
fi
median() {  # $1 csv, $2 label
  python3 - "$1" "$2" <<'PY'
import csv, sys, statistics
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
h = rows[0]; vi, ui = h.index("Metric Value"), h.index("Metric Unit")
us = [float(r[vi].replace(",", "")) * {"ns": 1e-3, "us": 1, "usecond": 1, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}[r[ui]] for r in rows[1:]]
print(f"{sys.argv[2]}: {len(us)} SampleKernel launches, median {statistics.median(us):.1f} us, min {min(us):.1f} us")
PY
}
for B in $([ "${NCU:-1}" = 1 ] && tr ',' ' ' <<<"${BATCHES:-64}"); do  # NCU=0: none
  for build in build-gpu $([ -n "${BASE_SRC:-}" ] && echo build-base); do
    E="$build/bench/engine_bench --backend=cuda --preset=qwen3-0.6b --sections=decode --variants=default --batches=$B --decode_len=16"
    for s in $(tr ',' ' ' <<<"${SAMPLERS:-greedy,topp,logprobs}"); do
      f="/tmp/ncu_${build}_b${B}_$s.csv"  # (not under $OUT: few files come back)
      timeout 200 ncu --clock-control none --cache-control none --csv --metrics gpu__time_duration.sum \
        -k regex:SampleKernel $E --samplers=$s >"$f" 2>"${f%.csv}.err"
      median "$f" "$build batch $B $s"
    done
  done
done
if [ "${SECTIONS:-1}" = 1 ]; then
  E="build-gpu/bench/engine_bench --backend=cuda --preset=qwen3-0.6b --sections=decode --variants=default --batches=${BATCHES%%,*} --decode_len=16"
  timeout 240 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section SchedulerStats --section Occupancy --section LaunchStats --print-details all \
    -k regex:SampleKernel --launch-skip 12 --launch-count 1 $E --samplers=topp >"$OUT/ncu_topp_sections.txt" 2>&1
  grep -E "Duration|Throughput|Issued|Eligible|Active Warps|Stall|Occupancy|Registers|Shared Memory|Block Size|Grid Size|Cluster|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|One or More|No Eligible" "$OUT/ncu_topp_sections.txt" | head -60
fi
if [ "${RATES:-0}" = 1 ]; then  # decode rate per sampler (issue 10: within 10% of greedy)
  timeout 300 build-gpu/bench/engine_bench --backend=cuda --preset=qwen3-0.6b --sections=decode --samplers=${RATE_SAMPLERS:-${SAMPLERS:-greedy,topp,logprobs}} --batches=${RATE_BATCHES:-${BATCHES:-64}} --rounds=${ROUNDS:-5} >"$OUT/samplers.log" 2>&1 || echo "samplers rc=$?"
  grep -A20 "by variant" "$OUT/samplers.log"
fi
echo "total $(( $(date +%s) - t0 )) s"
