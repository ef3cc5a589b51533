#!/usr/bin/env bash
# One device call (docs/GPU.md) for issue 13's peer fetch: builds with gRPC on the GPU machine
# (CASCADE_DEVICE_GRPC=1), runs every GPU bitwise test binary (kernels, attention, backend incl.
# cached == cold, graph == eager, device sampler == host rule; engine on CUDA incl. cached ==
# cold and cascade == flat), then cascade_peer_fetch_bench on CUDA for each preset: two workers on
# the one GPU, peer fetch vs re-prefill at 2k/8k/32k-token prefixes, fetched == cold checked
# bitwise in every call. Logs under $OUT (or ./device-out).
# Usage: bash bench/service/device_peer_fetch.sh [presets...]   (default: qwen3-0.6b qwen3-8b)
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export CASCADE_DEVICE_GRPC=1 CASCADE_BUILD_DIR=build-gpu-full
PRESETS=("$@")
[ ${#PRESETS[@]} -eq 0 ] && PRESETS=(qwen3-0.6b qwen3-8b)
t0=$(date +%s)
TESTS=(cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test attention_plan_test)
bash scripts/device_build.sh "${TESTS[@]}" cascade_peer_fetch_bench >"$OUT/build.log" 2>&1 ||
  { tail -60 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
. build-gpu-full/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fail=0
bash scripts/device_gpu_tests.sh build-gpu-full || fail=1
echo "tests: $(( $(date +%s) - t0 )) s, failures: $fail"
for p in "${PRESETS[@]}"; do
  timeout 300 build-gpu-full/bench/cascade_peer_fetch_bench --backend=cuda --preset="$p" \
    --lengths=2048,8192,32768 --reps=2 2>>"$OUT/peer_fetch.err" | tee "$OUT/peer_fetch_$p.log"
  echo "$p rc=${PIPESTATUS[0]}: $(( $(date +%s) - t0 )) s"
  grep -E "error|Error|fell back|fallback" "$OUT/peer_fetch.err" | head -5
done
echo "total: $(( $(date +%s) - t0 )) s"
