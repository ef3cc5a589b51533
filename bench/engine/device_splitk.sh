#!/usr/bin/env bash
# One device call for the batch-invariant split-K (gemm.h): builds, runs every GPU bitwise test
# (kernels incl. split-K rows == for every m and small == cuBLAS, attention, backend incl. cached
# == cold and graph == eager, engine incl. device == host sampler; attention_plan_test), then
# cuda_gemm_bench (per shape: pinned unsplit / S = 2, 4, 8 vs heuristics, bitwise and timed), then
# engine_bench decode (and prefill) per preset with the variants in one process.
# Usage: bash bench/engine/device_splitk.sh [preset[:variants] ..., default qwen3-0.6b]
#   e.g. qwen3-0.6b:default,splitk,heuristic qwen3-8b:default,split2,heuristic
# Environment: SECTIONS (default "tests gemm decode"; also "prefill", "score"), VARIANTS, BATCHES,
# PREFILL_VARIANTS, PREFILL_PRESETS (default qwen3-0.6b), SCORE_PRESETS, SCORE_VARIANTS, SCORE_LENS, ENGINE_ARGS (more engine_bench flags for decode, e.g. --tune_log=1). Logs under $OUT (or ./device-out).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
SECTIONS=${SECTIONS:-tests gemm decode}
PRESETS=${*:-qwen3-0.6b}
export CASCADE_SUBDIRS="common cache_service gpu_worker/model gpu_worker/engine gpu_worker/backend/cpu gpu_worker/backend/cuda tests/gpu tests/backend_cuda bench/kernels bench/engine"
TESTS="cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test attention_plan_test"
t0=$(date +%s)
bash scripts/device_build.sh $TESTS engine_bench cuda_gemm_bench >/tmp/splitk_build.log 2>&1 ||
  { tail -60 /tmp/splitk_build.log; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s; commit $(cat COMMIT 2>/dev/null || git rev-parse --short HEAD)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
fail=0
if [[ " $SECTIONS " == *" tests "* ]]; then
  for t in $TESTS; do
    timeout 300 build-gpu/tests/$t >/tmp/$t.log 2>&1; rc=$?
    [ $rc -ne 0 ] && fail=1
    { echo "===== $t rc=$rc"; cat /tmp/$t.log; } >>"$OUT/tests.log"  # at most 8 files come back
    echo "$t rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' /tmp/$t.log | tr '\n' ' ')"
    grep -E "graph == eager|identical:|cascade:" /tmp/$t.log | head -4
    grep -B2 -A10 "Failure" /tmp/$t.log | head -40
  done
  echo "tests: $(( $(date +%s) - t0 )) s; all passed: $([ $fail = 0 ] && echo yes || echo NO)"
fi
if [[ " $SECTIONS " == *" gemm "* ]]; then
  timeout 200 build-gpu/bench/cuda_gemm_bench ${GEMM_ARGS:-} >"$OUT/gemm_bench.log" 2>&1
  echo "gemm bench rc=$? ($(( $(date +%s) - t0 )) s)"
  tail -3 "$OUT/gemm_bench.log"
fi
B="--backend=cuda"
if [[ " $SECTIONS " == *" decode "* ]]; then
  for spec in $PRESETS; do
    p=${spec%%:*}
    v=${VARIANTS:-default,splitk,heuristic}
    [[ $spec == *:* ]] && v=${spec#*:}
    timeout 300 build-gpu/bench/engine_bench $B --preset=$p --sections=decode \
      --variants=$v --batches=${BATCHES:-1,8,64,256} ${ENGINE_ARGS:-} >"$OUT/decode_$p.log" 2>&1
    echo "decode $p rc=$? ($(( $(date +%s) - t0 )) s)"
    grep "split-K slices" "$OUT/decode_$p.log" | sort | uniq -c
    sed -n '/by variant/,$p' "$OUT/decode_$p.log"
  done
fi
if [[ " $SECTIONS " == *" prefill "* ]]; then
  for p in ${PREFILL_PRESETS:-qwen3-0.6b}; do
    timeout 200 build-gpu/bench/engine_bench $B --preset=$p --sections=prefill \
      --variants=${PREFILL_VARIANTS:-default,splitk} >"$OUT/prefill_$p.log" 2>&1
    echo "prefill $p rc=$? ($(( $(date +%s) - t0 )) s)"
    grep -E "^\|" "$OUT/prefill_$p.log"
  done
fi
if [[ " $SECTIONS " == *" score "* ]]; then  # prompt scoring: device score rows vs host scoring
  for p in ${SCORE_PRESETS:-qwen3-0.6b}; do
    timeout 240 build-gpu/bench/engine_bench $B --preset=$p --sections=score \
      --variants=${SCORE_VARIANTS:-default,scorerows1024,scorerows4096} \
      --prefill_lens=${SCORE_LENS:-512,2048,8192} >"$OUT/score_$p.log" 2>&1
    echo "score $p rc=$? ($(( $(date +%s) - t0 )) s)"
    grep -E "^\|" "$OUT/score_$p.log"
    # The host scoring of whole rows (before session 46) costs ms a row: a smaller run.
    timeout 200 build-gpu/bench/engine_bench $B --preset=$p --sections=score \
      --variants=hostscore,default --prefill_lens=512,2048 --prefill_tokens=2048 \
      >"$OUT/score_host_$p.log" 2>&1
    echo "score (host) $p rc=$? ($(( $(date +%s) - t0 )) s)"
    grep -E "^\|" "$OUT/score_host_$p.log"
  done
fi
echo "total: $(( $(date +%s) - t0 )) s; tests all passed: $([ $fail = 0 ] && echo yes || echo NO)"
