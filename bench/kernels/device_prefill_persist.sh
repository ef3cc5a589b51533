#!/usr/bin/env bash
# One device call for the persistent prefill kernel (see docs/GPU.md): builds this tree (and, with
# BASE_SRC, a baseline tree's cuda_attention_bench in build-base, beside the tests), shows where
# the prefill kernel spills (SASS: local stores per register region), runs every GPU bitwise test
# binary (attention first, short timeouts: a hang costs one binary's timeout, not the call), then
# times the prefill table: this tree, the baseline, this tree again, and torch SDPA (decode and
# prefill rows, each also back to back). DECODE="B,CTX ...": decode cases after; CASCADE=1: the
# cascade cases (both also on the baseline with BASE_SRC); ENGINE=1: engine_bench's
# ENGINE_SECTIONS (default prefill; ENGINE_FLAGS: more flags) on qwen3-0.6b, this tree's and with
# BASE_SRC the baseline's; SDPA=0 skips torch. Logs under $OUT (or ./device-out).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
t0=$(date +%s)
T="cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test cuda_attention_bench"
[ "${ENGINE:-0}" = 1 ] && T="$T engine_bench"
bash scripts/device_build.sh $T >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s"
if [ -n "${BASE_SRC:-}" ]; then
  BT="cuda_attention_bench"
  [ "${ENGINE:-0}" = 1 ] && BT="$BT engine_bench"
  (CASCADE_BUILD_DIR=$PWD/build-base bash "$BASE_SRC/scripts/device_build.sh" $BT \
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
[ "${SDPA:-1}" = 1 ] && timeout 150 python3 bench/kernels/sdpa_bench.py 2>&1 | tee "$OUT/sdpa.log"
benches=$bench
[ -n "${BASE_SRC:-}" ] && benches="$bench build-base/bench/cuda_attention_bench"
for b in $benches; do
  [ "$b" != "$bench" ] && echo "== baseline ($BASE_SRC): decode and cascade"
  for c in ${DECODE:-}; do
    timeout 60 $b --decode=$c 2>&1 | grep -E "case|decode" | tee -a "$OUT/decode.log"
  done
  if [ "${CASCADE:-0}" = 1 ]; then
    timeout 90 $b --cascade-only 2>&1 | grep -E "shared|tree" | tee -a "$OUT/cascade.log"
  fi
done
if [ "${ENGINE:-0}" = 1 ]; then
  sec=${ENGINE_SECTIONS:-prefill}
  timeout 200 build-gpu/bench/engine_bench --backend=cuda --preset=qwen3-0.6b --sections=$sec \
    ${ENGINE_FLAGS:-} 2>&1 | tee "$OUT/engine.log" | grep -E "^\||^#|tok/s|prefill attention"
  if [ -n "${BASE_SRC:-}" ]; then
    echo "== engine_bench, baseline ($BASE_SRC)"
    timeout 200 build-base/bench/engine_bench --backend=cuda --preset=qwen3-0.6b --sections=$sec \
      ${ENGINE_FLAGS:-} 2>&1 | tee "$OUT/engine_base.log" | grep -E "^\||^#|tok/s"
  fi
fi
echo "total: $(( $(date +%s) - t0 )) s"
