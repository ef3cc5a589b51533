#!/usr/bin/env bash
# One device call: SampleKernel's time per decode step (ncu median over a run's launches) of
# qwen3-0.6b at batch BATCH (default 64) for each sampler in SAMPLERS (default greedy,topp,all),
# on this tree and on each source tree in TREES (folders carried with the call: a baseline from
# `git archive`, or a variant; name each in the call's carry, or it is not there), interleaved:
# this tree, each tree, this tree again. TESTS=1:
# first every GPU test binary on this tree (a timing counts only where they pass). SASS=<sampler>:
# then ncu's per-instruction stall samples of one launch of that sampler on this tree
# (bench/engine/sass_hot.py). RATES=1: then engine_bench's decode rate on this tree for
# RATE_SAMPLERS (default greedy,topp,all) at RATE_BATCHES (default 1,64,256) in ROUNDS (default 5)
# interleaved rounds, medians compared: the ratio to greedy in one process (issue 10's bar);
# RATE_TREES=<trees>: also on those trees (built with TREES), this tree first and last.
# Logs under $OUT.
set -uo pipefail
OUT=${OUT:-device-out}; mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
t0=$(date +%s)
# The packages once, before the parallel builds (each would unpack them otherwise).
mkdir -p /opt/cascade-deps && for f in .devdeps/*.deb; do dpkg -x "$f" /opt/cascade-deps; done &&
  touch /opt/cascade-deps/.unpacked
export GPU_TESTS="cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test"
T=engine_bench; [ "${TESTS:-0}" = 1 ] && T="$T $GPU_TESTS"
bash scripts/device_build.sh $T >"$OUT/build.log" 2>&1 &
for t in ${TREES:-}; do
  CASCADE_BUILD_DIR=$PWD/build-$t bash "$t/scripts/device_build.sh" engine_bench >"$OUT/build_$t.log" 2>&1 &
done
wait
. build-gpu/env.sh; echo "builds $(( $(date +%s) - t0 )) s"
if [ "${TESTS:-0}" = 1 ]; then
  bash scripts/device_gpu_tests.sh build-gpu && echo "all passed: yes" || echo "all passed: NO"
  grep -B2 -A8 "Failure" "$OUT/gpu_tests.log" | head -30
fi
median() {  # $1 csv, $2 label
  python3 - "$1" "$2" <<'PY'
import csv, sys, statistics
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if len(rows) < 2: print(f"{sys.argv[2]}: no launches"); sys.exit()
h = rows[0]; vi, ui = h.index("Metric Value"), h.index("Metric Unit")
us = [float(r[vi].replace(",", "")) * {"ns": 1e-3, "us": 1, "usecond": 1, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}[r[ui]] for r in rows[1:]]
print(f"{sys.argv[2]}: {len(us)} launches, median {statistics.median(us):.1f} us")
PY
}
# NCU_TREES (default TREES): the trees whose kernel is timed (a host-side change's base: none).
builds="build-gpu"; for t in ${NCU_TREES-${TREES:-}}; do builds="$builds build-$t"; done
[ -n "${NCU_TREES-${TREES:-}}" ] && builds="$builds build-gpu"
for s in $(tr ',' ' ' <<<"${SAMPLERS:-greedy,topp,all}"); do
  for b in $builds; do
    f=/tmp/ncu_${b}_$s.csv
    timeout 100 ncu --clock-control none --cache-control none --csv --metrics gpu__time_duration.sum \
      -k regex:SampleKernel $b/bench/engine_bench --backend=cuda --preset=qwen3-0.6b --sections=decode \
      --variants=default --batches=${BATCH:-64} --decode_len=16 --samplers=$s >$f 2>/dev/null
    median $f "$b batch ${BATCH:-64} $s"
  done
done
if [ -n "${SASS:-}" ]; then  # one sampler or several (comma-separated)
  E="build-gpu/bench/engine_bench --backend=cuda --preset=qwen3-0.6b --sections=decode --variants=default --batches=${BATCH:-64} --decode_len=16"
  for s in $(tr ',' ' ' <<<"$SASS"); do
    timeout 240 ncu --clock-control none --section SourceCounters --section WarpStateStats -k regex:SampleKernel \
      --launch-skip 12 --launch-count 1 -o /tmp/samp_$s $E --samplers=$s >/tmp/ncu_sass.log 2>&1
    ncu --import /tmp/samp_$s.ncu-rep --page source --print-source sass --csv >/tmp/sass_$s.csv 2>&1
    python3 bench/engine/sass_hot.py /tmp/sass_$s.csv ${TOP:-45} >"$OUT/sass_hot_$s.txt"
    echo "== $s"; head -${SASS_LINES:-70} "$OUT/sass_hot_$s.txt"
  done
fi
if [ "${RATES:-0}" = 1 ]; then
  # RATE_TREES: the same rates on those carried trees too, interleaved with this tree's
  # (this, each tree, this again): a host-side change's A-B in one call.
  rb="build-gpu"; for t in ${RATE_TREES:-}; do rb="$rb build-$t"; done
  [ -n "${RATE_TREES:-}" ] && rb="$rb build-gpu"
  i=0
  for b in $rb; do
    i=$((i + 1))
    timeout 300 $b/bench/engine_bench --backend=cuda --preset=qwen3-0.6b --sections=decode \
      --samplers=${RATE_SAMPLERS:-greedy,topp,all} --batches=${RATE_BATCHES:-1,64,256} \
      --rounds=${ROUNDS:-5} \
      >"$OUT/rates_${i}_$b.log" 2>&1 || echo "rates $b rc=$?"
    echo "== rates $i: $b"; grep -A8 "by variant" "$OUT/rates_${i}_$b.log"
  done
fi
echo "total $(( $(date +%s) - t0 )) s"
