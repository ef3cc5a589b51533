#!/usr/bin/env bash
# One device call for the persistent prefill kernel (see docs/GPU.md): builds this tree (and, with
# BASE_SRC, a baseline tree's cuda_attention_bench in build-base, beside the tests), shows where
# the prefill kernel spills (SASS: local stores per register region), runs every GPU bitwise test
# binary (attention first, short timeouts: a hang costs one binary's timeout, not the call), then
# times the prefill table: this tree, the baseline, this tree again, and torch SDPA's prefill rows.
# DECODE="B,CTX ...": decode cases after. Logs under $OUT (or ./device-out).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
t0=$(date +%s)
bash scripts/device_build.sh cuda_kernels_test cuda_attention_test cuda_backend_test \
  engine_cuda_test cuda_attention_bench >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s"
if [ -n "${BASE_SRC:-}" ]; then
  (CASCADE_BUILD_DIR=$PWD/build-base bash "$BASE_SRC/scripts/device_build.sh" cuda_attention_bench \
     >"$OUT/build_base.log" 2>&1 || echo "baseline build failed") &
  base_pid=$!
fi
obj=$(find build-gpu -name attention.cu.o | head -1)
# Per PrefillWsKernel instance: the local stores (STL) after each setmaxnreg (the warp roles).
cuobjdump -sass "$obj" | awk '/Function :.*PrefillWsKernel/ {f=$3; on=1; next} /Function :/ {on=0}
  on && /USETMAXREG/ {r++; reg[r]=$0} on && /STL/ {stl[f" region "r]++}
  END {for (k in stl) print "STL", stl[k], k}' | sed -E 's/_ZN7cascade.*PrefillWsKernelI/PrefillWs</' | sort | head -20
GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-150} \
  GPU_TESTS="cuda_attention_test cuda_kernels_test cuda_backend_test engine_cuda_test" \
  bash scripts/device_gpu_tests.sh build-gpu
echo "tests: $(( $(date +%s) - t0 )) s"
bench=build-gpu/bench/cuda_attention_bench
timeout 60 $bench --prefill-only 2>&1 | grep -E "case|prefill N" | tee "$OUT/prefill.log"
if [ -n "${BASE_SRC:-}" ]; then
  wait $base_pid
  echo "== baseline ($BASE_SRC)"
  timeout 60 build-base/bench/cuda_attention_bench --prefill-only 2>&1 | grep -E "case|prefill N" | tee "$OUT/prefill_base.log"
  echo "== this tree again"
  timeout 60 $bench --prefill-only 2>&1 | grep -E "prefill N" | tee -a "$OUT/prefill.log"
fi
timeout 120 python3 bench/kernels/sdpa_bench.py 2>&1 | grep -E "prefill" | tee "$OUT/sdpa.log"
for c in ${DECODE:-}; do
  timeout 30 $bench --decode=$c 2>&1 | grep -E "decode" | tee -a "$OUT/decode.log"
done
echo "total: $(( $(date +%s) - t0 )) s"
