#!/usr/bin/env bash
# One device call that compares persistent-decode-kernel variants (docs/GPU.md): builds, runs
# every GPU bitwise test binary, then times cuda_attention_bench's decode rows and the three-level
# tree for each flag set in FLAGS (";"-separated; "" = the default), ROUNDS times interleaved
# (A-B-A-B: the GPU's clock drifts between rounds), and, when ENGINE_VARIANTS is set, engine_bench
# decode + tree for those variants (interleaved the same way by listing them twice).
# Usage (carry .devdeps): FLAGS="--dw-consumers=3;" ROUNDS=2 ENGINE_VARIANTS=default,dw3,default,dw3 \
#   ENGINE_ARGS=--batches=64,256 bash bench/kernels/device_decode_variants.sh   Logs: $OUT or ./device-out.
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
t0=$(date +%s)
T="cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test cuda_attention_bench"
[ -n "${ENGINE_VARIANTS:-}" ] && T="$T engine_bench"
bash scripts/device_build.sh $T >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s"
bench=build-gpu/bench/cuda_attention_bench
# (";" appended: bash's read drops one trailing empty field, and a trailing ";" in FLAGS is the
# default flag set)
# (an unset FLAGS gives the default flag set alone)
IFS=';' read -r -a flagsets <<<"${FLAGS:-};"
# A smoke run of each flag set first (20 s): a variant that hangs or fails is dropped here, not
# after a test binary's whole timeout and every bench row's.
ok=()
smoke_failed=0
for f in "${flagsets[@]}"; do
  if timeout 20 $bench --decode=64,1024 $f >"$OUT/smoke.log" 2>&1; then
    ok+=("$f")
  else
    smoke_failed=1
    echo "SMOKE FAILED (rc $?): [${f:-default}] dropped"; tail -5 "$OUT/smoke.log"
  fi
done
flagsets=("${ok[@]}")
GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-120} \
  GPU_TESTS="cuda_attention_test cuda_kernels_test cuda_backend_test engine_cuda_test" \
  bash scripts/device_gpu_tests.sh build-gpu
echo "tests: $(( $(date +%s) - t0 )) s"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for f in "${flagsets[@]}"; do
    for x in ${CASES:---decode=256,145 --decode=16,145 --decode=64,1024 --decode=256,4096 --tree=default}; do
      timeout 30 $bench $x $f 2>&1 | grep -E "^ *(decode|tree)" | grep -vE "nofold|smem|super|whole" |
        sed "s|^|r$r [${f:-default}] |" | tee -a "$OUT/decode_variants.log"
    done
  done
done
echo "kernels: $(( $(date +%s) - t0 )) s"
if [ -n "${ENGINE_VARIANTS:-}" ] && [ $smoke_failed = 0 ]; then
  timeout 300 build-gpu/bench/engine_bench --backend=cuda --preset=qwen3-0.6b \
    --sections=${ENGINE_SECTIONS:-decode,tree} --variants=$ENGINE_VARIANTS ${ENGINE_ARGS:-} 2>&1 |
    tee "$OUT/engine.log" | grep -vE "^\s*$" | tail -40
fi
echo "total: $(( $(date +%s) - t0 )) s"
