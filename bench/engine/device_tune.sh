#!/usr/bin/env bash
# One device call for the GEMM tuning of decode buckets (gemm.h SetTuneSizes): builds, runs every
# GPU test binary (cuda_kernels_test prints each tuning of TunedGemmGivesThePinnedRowsBitwise),
# then engine_bench decode of PRESET (qwen3-0.6b) for VARIANTS (default "untuned,tuned") at
# BATCHES with the tuning log; NANO=1: the nano-vllm workload for NANO_VARIANTS; SAMPLERS=a,b:
# qwen3-0.6b decode per sampler at SAMPLER_BATCHES; HF=1: hf_decode_bench.py on the same weights
# at HF_BATCHES; GEMM=1: cuda_gemm_bench --quick after the tests (DecodeGemm, SmallGemm, pinned, heuristic
# per projection shape); BASE_SRC=<folder> (a baseline tree, e.g. `git archive main | tar -x -C
# base_src`, in .git/info/exclude and carried): its engine_bench's default decode table, then this
# tree's again. Logs under $OUT.
set -uo pipefail
OUT=${OUT:-device-out}; mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
t0=$(date +%s)
extra=""; [ "${GEMM:-0}" = 1 ] && extra=cuda_gemm_bench
bash scripts/device_build.sh cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test engine_bench $extra >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh; echo "build $(( $(date +%s) - t0 )) s"
fail=0
GPU_TESTS="cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test" GPU_TEST_TIMEOUT=300 bash scripts/device_gpu_tests.sh build-gpu || fail=1
echo "all passed: $([ $fail = 0 ] && echo yes || echo NO) ($(( $(date +%s) - t0 )) s)"
grep "^tune\|replaced the pinned" "$OUT/cuda_kernels_test.log" | head -${TUNE_LINES:-70}
if [ "${GEMM:-0}" = 1 ]; then
  timeout 300 build-gpu/bench/cuda_gemm_bench --quick >"$OUT/gemm.log" 2>&1 || echo "gemm bench rc=$?"
  grep -E "^\| .*(pinned S=1 |decode|small S=1 f32|heuristic)|decode sweep" "$OUT/gemm.log"
fi
timeout 300 build-gpu/bench/engine_bench --backend=cuda --preset=${PRESET:-qwen3-0.6b} --sections=decode --variants=${VARIANTS:-untuned,tuned} --batches=${BATCHES:-1,8,32,64,128,256} --tune_log=1 >"$OUT/engine.log" 2>&1 || echo "engine rc=$?"
[ "${NANO:-0}" = 1 ] && { timeout 200 build-gpu/bench/engine_bench --backend=cuda --preset=qwen3-0.6b --sections=nanovllm --variants=${NANO_VARIANTS:-untuned,tuned} >"$OUT/nano.log" 2>&1 || echo "nano rc=$?"; grep -E "^\||^#" "$OUT/nano.log"; }
grep -v "^  tune" "$OUT/engine.log" | grep -E "^\||^#|^\(" ; grep "^  tune" "$OUT/engine.log" | head -${TUNE_LINES:-40}
if [ "${HF:-0}" = 1 ]; then  # the Hugging Face + CUDA-graph baseline on the same weights, same call
  timeout 200 python3 bench/engine/hf_decode_bench.py --model_dir /tmp/cascade_bench_${PRESET:-qwen3-0.6b} --batches ${HF_BATCHES:-1,64,256} >"$OUT/hf.log" 2>&1 || echo "hf rc=$?"
  grep -E "^\||^#" "$OUT/hf.log" | tail -8
fi
if [ -n "${SAMPLERS:-}" ]; then  # decode rate per sampler on qwen3-0.6b (issue 10: within 10% of greedy)
  timeout 200 build-gpu/bench/engine_bench --backend=cuda --preset=qwen3-0.6b --sections=decode --samplers=$SAMPLERS --batches=${SAMPLER_BATCHES:-1,64,256} >"$OUT/samplers.log" 2>&1 || echo "samplers rc=$?"
  grep -A20 "by variant" "$OUT/samplers.log"
fi
if [ -n "${BASE_SRC:-}" ] && [ $fail = 0 ]; then  # the decode table of a baseline tree, same machine
  CASCADE_BUILD_DIR=$PWD/build-base bash "$BASE_SRC/scripts/device_build.sh" engine_bench >"$OUT/build_base.log" 2>&1 ||
    { echo "baseline build failed"; tail -20 "$OUT/build_base.log"; }
  for run in base again; do  # baseline, then this tree's default again (A B A: drift shows)
    bin=build-gpu/bench/engine_bench; [ $run = base ] && bin=build-base/bench/engine_bench
    timeout 200 $bin --backend=cuda --preset=${PRESET:-qwen3-0.6b} --sections=decode --variants=default --batches=${BATCHES:-1,8,32,64,128,256} >"$OUT/engine_$run.log" 2>&1 || echo "$run engine rc=$?"
    echo "== $run ($([ $run = base ] && echo "$BASE_SRC" || echo "this tree")): ms/step by batch"
    grep -E "^\| [0-9]" "$OUT/engine_$run.log" | awk -F'|' '{printf "%s:%s ", $2, $4} END {print ""}'
  done
fi
echo "total $(( $(date +%s) - t0 )) s"
