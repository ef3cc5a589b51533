#!/usr/bin/env bash
# One device call (docs/GPU.md) for the super-tile size G of the two-level fold order and the
# wide cascade kernel's grid: builds the attention test and benchmark, runs the attention test's
# bitwise cases with the two-level order at each G of SIZES (CASCADE_TEST_SUPER_TILES; default
# "8 16"), then the kernel benchmark's cascade rows (shared prefix, three-level tree) with the
# " super" rows at G = 4 and each G of SIZES, the cascade rows with the wide kernel on each CTA
# count of WIDE_CTAS (default "48 64 96"), and the prefill table (super columns) at each G.
# Logs under $OUT (or ./device-out).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
t0=$(date +%s)
bash scripts/device_build.sh cuda_attention_test cuda_attention_bench >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s"
trc=0
for g in ${SIZES:-8 16}; do
  echo "== attention tests, super-tiles of $g"
  CASCADE_TEST_SUPER_TILES=$g GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-150} \
    GPU_TESTS="cuda_attention_test" bash scripts/device_gpu_tests.sh build-gpu || trc=1
  cp "$OUT/cuda_attention_test.log" "$OUT/cuda_attention_test_g$g.log"
done
echo "tests: $(( $(date +%s) - t0 )) s"
bench=build-gpu/bench/cuda_attention_bench
for g in 4 ${SIZES:-8 16}; do
  echo "== cascade, super-tiles of $g"
  timeout 120 $bench --cascade-only --super=$g 2>&1 | grep -E "(cascade|every tile|single-level)( super)? +[0-9]|floor" |
    tee -a "$OUT/cascade.log"
done
for n in ${WIDE_CTAS:-48 64 96}; do
  echo "== cascade, wide kernel on $n CTAs"
  timeout 120 $bench --cascade-only --wide-ctas=$n 2>&1 | grep -E "(cascade|every tile)( super)? +[0-9]|floor" |
    tee -a "$OUT/cascade.log"
done
echo "cascade: $(( $(date +%s) - t0 )) s"
for g in ${SIZES:-8 16}; do
  echo "== prefill, super-tiles of $g"
  timeout 90 $bench --prefill-only --super=$g 2>&1 | grep -E "case|prefill N" | tee -a "$OUT/prefill.log"
done
echo "total: $(( $(date +%s) - t0 )) s"
exit $trc
