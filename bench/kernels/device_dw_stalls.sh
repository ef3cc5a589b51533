#!/usr/bin/env bash
# One device call (see docs/GPU.md): why a persistent decode kernel work takes ~2 us a tile. Since
# wide chains (session 31) the rows' own tiles on DecodeWsKernel end the three-level tree's step:
# 2048 one-row works of 1-2 tiles, each ~3.1-3.8 us of a consumer (bench/kernels/NOTES.md), where
# neither taking works ahead, nor 16-byte partial stores, nor overlapping a work's next S with its
# P V gained. This profiles one launch of that kernel in the tree (`cuda_attention_bench
# --tree=default`, a build with -lineinfo) under Nsight Compute with the warp-state and source
# counters, and prints the kernel's stall reasons (warps per issued instruction) and the SASS
# lines holding the most stall samples, with their CUDA source lines. CASE: the bench flags
# (default --tree=default); KERNELS (or KERNEL): the kernel name regexes, each profiled in turn
# (default DecodeWsKernel; e.g. "DecodeWsKernel PrefillWsKernel" for the tree's own tiles and its
# wide chains); SKIP: launches of each to skip (default 10, past the warm-ups). Reports' text
# under $OUT (or ./device-out).
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
# KERNELS: the kernel name regexes to profile in turn, one launch each (KERNEL: one).
for kernel in ${KERNELS:-${KERNEL:-DecodeWsKernel}}; do
echo "== $kernel ($case)"
rep=/tmp/stalls_$kernel
timeout 300 ncu --kernel-name "regex:$kernel" --launch-skip "${SKIP:-10}" --launch-count 1 \
  --section WarpStateStats --section SourceCounters --section SpeedOfLight \
  --section LaunchStats --import-source yes -f -o "$rep" \
  build-lineinfo/bench/cuda_attention_bench "$case" >"$OUT/ncu_run_$kernel.log" 2>&1 ||
  { echo "ncu rc=$?"; tail -20 "$OUT/ncu_run_$kernel.log"; continue; }
ncu -i "$rep.ncu-rep" --page details >"$OUT/details_$kernel.txt" 2>&1
grep -E "^ +(Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per Thread|Warp Cycles Per Issued Instruction|Avg. Active Threads Per Warp)" \
  "$OUT/details_$kernel.txt"
# Stall reasons: warps per issued instruction, largest first.
ncu -i "$rep.ncu-rep" --page raw --csv 2>/dev/null | python3 bench/kernels/ncu_stalls.py 10 "stalls"
# The SASS lines with the most warp stall samples, with their source (as ncu prints them).
ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$OUT/source_sass_$kernel.csv" \
  2>"$OUT/source_$kernel.err" ||
  { echo "ncu --page source failed (this ncu may not print SASS pages):"; tail -3 "$OUT/source_$kernel.err"; }
python3 - "$OUT/source_sass_$kernel.csv" <<'PY'
import csv, sys
try:
    rows = list(csv.reader(open(sys.argv[1])))
except OSError:
    sys.exit(0)
# The page may start with the kernel's name on a row of its own: the header is the first row
# that names a Source column.
at = next((i for i, r in enumerate(rows[:10]) if any(c.strip().lower() == "source" for c in r)), None)
if at is None:
    print("source page: no header row among", [r[:4] for r in rows[:3]])
    sys.exit(0)
head, body = rows[at], rows[at + 1:]
def col(*names):
    for n in names:
        for i, h in enumerate(head):
            if h.strip().lower() == n.lower():
                return i
    for n in names:  # a column whose name starts with it
        for i, h in enumerate(head):
            if h.strip().lower().startswith(n.lower()):
                return i
    return None
src = col("Source")
samp = col("Warp Stall Sampling (All Samples)", "Warp Stall Sampling (All Cycles)", "Sampling Data (All)",
           "Warp Stall Sampling")
if samp is None:
    print("source page columns:", head[:16])
    sys.exit(0)
def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0
total = sum(num(r[samp]) for r in body if len(r) > samp) or 1.0
top = sorted((r for r in body if len(r) > samp), key=lambda r: -num(r[samp]))[:30]
print("top SASS lines by stall samples (share of %d samples):" % total)
for r in top:
    print("  %5.1f%%  %s" % (100 * num(r[samp]) / total, r[src][:110]))
PY
done
echo "total: $(( $(date +%s) - t0 )) s"
