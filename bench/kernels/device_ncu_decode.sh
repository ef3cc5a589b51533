#!/usr/bin/env bash
# One device call: Nsight Compute on the decode / cascade attention kernels (see docs/GPU.md).
# Builds cuda_attention_bench, then profiles one launch each (--set full) of the split kernel
# at decode B=256 ctx 4096 (the default: fold items) and of the split and merge kernels of the
# shared-prefix case (4096 + 128, B=64, every-tile cascade). Prints duration, throughput,
# occupancy and the warp stall breakdown; full reports' text under $OUT (or ./device-out).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
t0=$(date +%s)
bash scripts/device_build.sh cuda_attention_bench >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s"
# The bench times each config with 3 warm-ups + 20 runs; launch 50 of a kernel is a timed run of
# the third config (decode: the default; shared: every-tile cascade).
profile() {  # name, bench flag, kernel
  timeout 300 ncu --kernel-name "regex:$3" --launch-skip 50 --launch-count 1 --set full \
    -o "/tmp/$1" build-gpu/bench/cuda_attention_bench "$2" >"$OUT/$1.run.log" 2>&1 ||
    { echo "ncu $1 rc=$?"; tail -5 "$OUT/$1.run.log"; return; }
  ncu -i "/tmp/$1.ncu-rep" --page details >"$OUT/$1.txt" 2>&1
  echo "== $1"
  grep -E "^ +(Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|L1/TEX Hit Rate|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Block Limit (Registers|Shared Mem)|Eligible Warps Per Scheduler|Issued Warp Per Scheduler|No Eligible|Warp Cycles Per Issued Instruction)" "$OUT/$1.txt"
  grep -E "^ +(Stall|.*stall)" "$OUT/$1.txt" | head -5
  ncu -i "/tmp/$1.ncu-rep" --page raw --csv 2>/dev/null | python3 bench/kernels/ncu_stalls.py 8 "  stalls"
}
profile split_decode --decode=256,4096 SplitKernel
profile split_shared --shared=64 SplitKernel
profile merge_shared --shared=64 MergeKernel
echo "total: $(( $(date +%s) - t0 )) s"
