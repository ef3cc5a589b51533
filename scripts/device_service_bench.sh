#!/usr/bin/env bash
# One device call: builds the whole stack with gRPC on the GPU machine (as device_demo.sh) and
# runs cascade-loadgen against a local stack of CUDA workers: cache miss vs hit through the
# gateway over loopback gRPC, on the qwen3-0.6b shape. Logs under $OUT (or ./device-out).
# COMPARE="<worker flags>": the same loadgen run again on a stack whose workers take those flags
# (loadgen_compare.md), e.g. COMPARE=--overlap_min_rows=32. EXTRA_TARGETS: more targets to build
# in build-gpu-full (e.g. engine_bench), for commands run after this script in the same call.
# GPU_TESTS: GPU test binaries built in the same tree and run first (e.g. "engine_cuda_test
# cuda_backend_test"); a failure stops the call. COLD=1: then the cold-prompt TTFT runs (~7.6k
# tokens, concurrency 1 and 4, miss and hit; with COMPARE alternated with it, two rounds each).
# CONC (default 1,8,32) and DURATION (default 8s): the loadgen runs' concurrency levels and phase
# time bound.
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export CASCADE_DEVICE_GRPC=1 CASCADE_BUILD_DIR=build-gpu-full
t0=$(date +%s)
bash scripts/device_build.sh cascade cascade-registry cascade-worker cascade-gateway cascade-loadgen \
  ${EXTRA_TARGETS:-} ${GPU_TESTS:-} >"$OUT/build_full.log" 2>&1 || { tail -60 "$OUT/build_full.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
. build-gpu-full/env.sh
for t in ${GPU_TESTS:-}; do
  timeout 300 build-gpu-full/tests/$t >"$OUT/$t.log" 2>&1; rc=$?
  echo "$t rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' "$OUT/$t.log" | tr '\n' ' ')"
  [ $rc -ne 0 ] && { grep -B2 -A10 Failure "$OUT/$t.log" | head -40; exit 1; }
done
build-gpu-full/bin/cascade mkmodel --preset qwen3-0.6b --out /tmp/cascade-qwen3 \
  --tokenizer-dir .devdeps/tokenizer >"$OUT/mkmodel.log" 2>&1 || { cat "$OUT/mkmodel.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 400 build-gpu-full/bench/cascade-loadgen --local --backend=cuda --workers=1 \
  --model_dir=/tmp/cascade-qwen3 --concurrency=${CONC:-1,8,32} --duration=${DURATION:-8s} --max_requests=2000 \
  --max_tokens=32 --system_words=600 "$@" 2>"$OUT/loadgen.err" | tee "$OUT/loadgen.md"
echo "loadgen rc=${PIPESTATUS[0]}; total: $(( $(date +%s) - t0 )) s"
tail -5 "$OUT/loadgen.err"
if [ -n "${COMPARE:-}" ]; then
  timeout 400 build-gpu-full/bench/cascade-loadgen --local --backend=cuda --workers=1 \
    --model_dir=/tmp/cascade-qwen3 --concurrency=${CONC:-1,8,32} --duration=${DURATION:-8s} --max_requests=2000 \
    --max_tokens=32 --system_words=600 --worker_flags="$COMPARE" "$@" \
    2>"$OUT/loadgen_compare.err" | tee "$OUT/loadgen_compare.md"
  echo "loadgen (workers with $COMPARE) rc=${PIPESTATUS[0]}; total: $(( $(date +%s) - t0 )) s"
  tail -5 "$OUT/loadgen_compare.err"
fi
if [ "${COLD:-0}" = 1 ]; then
  for round in 1 2; do
    for flags in "" ${COMPARE:+"$COMPARE"}; do
      echo "== cold ~7.6k-token prompts, round $round, worker flags: ${flags:-(defaults)}"
      timeout 150 build-gpu-full/bench/cascade-loadgen --local --backend=cuda --workers=1 \
        --model_dir=/tmp/cascade-qwen3 --concurrency=1,4 --max_requests=24 --max_tokens=16 \
        --workloads=miss,hit --system_words=7000 ${flags:+--worker_flags="$flags"} \
        2>>"$OUT/cold.err" | tee -a "$OUT/cold.md" | grep -E "^\| [14] \| (miss|hit)"
    done
  done
  echo "cold: $(( $(date +%s) - t0 )) s"
fi
