#!/usr/bin/env bash
# One device call (see docs/GPU.md): why a persistent decode kernel work takes ~2 us a tile. Since
# wide chains (session 31) the rows' own tiles on DecodeWsKernel end the three-level tree's step:
# 2048 one-row works of 1-2 tiles, each ~3.1-3.8 us of a consumer (bench/kernels/NOTES.md), where
# neither taking works ahead, nor 16-byte partial stores, nor overlapping a work's next S with its
# P V gained. This profiles one launch of that kernel in the tree (`cuda_attention_bench
# --tree=default`, a build with -lineinfo) under Nsight Compute with the warp-state and source
# counters, and prints the kernel's stall reasons (warps per issued instruction) and the SASS
# lines holding the most stall samples, with their CUDA source lines. CASE: the bench flags
# (default --tree=default); KERNEL: the kernel name regex (default DecodeWsKernel); SKIP: launches
# of it to skip (default 10, past the warm-ups). Reports' text under $OUT (or ./device-out).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
t0=$(date +%s)
CASCADE_BUILD_DIR=$PWD/build-lineinfo CASCADE_CMAKE_ARGS="-DCMAKE_CUDA_FLAGS=-lineinfo" \
  bash scripts/device_build.sh cuda_attention_bench >"$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; exit 1; }
. build-lineinfo/env.sh
echo "build: $(( $(date +%s) - t0 )) s"
case=${CASE:---tree=default}
kernel=${KERNEL:-DecodeWsKernel}
timeout 400 ncu --kernel-name "regex:$kernel" --launch-skip "${SKIP:-10}" --launch-count 1 \
  --section WarpStateStats --section SourceCounters --section SpeedOfLight \
  --section LaunchStats --import-source yes -o /tmp/dw_stalls \
  build-lineinfo/bench/cuda_attention_bench "$case" >"$OUT/ncu_run.log" 2>&1 ||
  { echo "ncu rc=$?"; tail -20 "$OUT/ncu_run.log"; exit 1; }
ncu -i /tmp/dw_stalls.ncu-rep --page details >"$OUT/details.txt" 2>&1
grep -E "^ +(Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per Thread|Warp Cycles Per Issued Instruction|Avg. Active Threads Per Warp)" \
  "$OUT/details.txt"
# Stall reasons: warps per issued instruction, largest first.
ncu -i /tmp/dw_stalls.ncu-rep --page raw --csv 2>/dev/null | python3 bench/kernels/ncu_stalls.py 10 "stalls"
# The SASS lines with the most warp stall samples, with their source (as ncu prints them).
ncu -i /tmp/dw_stalls.ncu-rep --page source --csv --print-source sass >"$OUT/source_sass.csv" 2>"$OUT/source.err" ||
  { echo "ncu --page source failed (this ncu may not print SASS pages):"; tail -3 "$OUT/source.err"; }
python3 - "$OUT/source_sass.csv" <<'PY'
import csv, sys
try:
    rows = list(csv.reader(open(sys.argv[1])))
except OSError:
    sys.exit(0)
if len(rows) < 2:
    sys.exit(0)
head = rows[0]
def col(*names):
    for n in names:
        for i, h in enumerate(head):
            if h.strip().lower() == n.lower():
                return i
    return None
src = col("Source")
samp = col("Warp Stall Sampling (All Samples)", "Warp Stall Sampling (All Cycles)", "Sampling Data (All)")
if src is None or samp is None:
    print("source page columns:", head[:12])
    sys.exit(0)
def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0
body = rows[1:]
total = sum(num(r[samp]) for r in body if len(r) > samp) or 1.0
top = sorted(body, key=lambda r: -num(r[samp]) if len(r) > samp else 0)[:25]
print("top SASS lines by stall samples (share of %d samples):" % total)
for r in top:
    print("  %5.1f%%  %s" % (100 * num(r[samp]) / total, r[src][:110]))
PY
echo "total: $(( $(date +%s) - t0 )) s"
