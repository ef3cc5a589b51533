#!/usr/bin/env bash
# One device call for the small-m GEMM: builds, runs the GEMM harness (bitwise vs the pinned
# cuBLASLt rows, and timings), then bench/engine/device_graphs.sh (every GPU test, decode
# variants default / cublas / eager / heuristic per preset, nano-vllm). Logs under $OUT.
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export CASCADE_SUBDIRS="cache_service gpu_worker/model gpu_worker/engine gpu_worker/backend/cpu gpu_worker/backend/cuda tests/gpu bench/engine bench/kernels"
bash scripts/device_build.sh cuda_gemm_bench >"$OUT/build_gemm.log" 2>&1 || { tail -40 "$OUT/build_gemm.log"; exit 1; }
. build-gpu/env.sh
timeout 120 build-gpu/bench/cuda_gemm_bench >"$OUT/gemm_bench.log" 2>&1
echo "gemm bench rc=$?"; grep "^|" "$OUT/gemm_bench.log"
bash bench/engine/device_graphs.sh "$@"
