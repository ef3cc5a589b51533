#!/usr/bin/env bash
# Issue 14's cluster run, for a device kind with several GPUs (nvidia-h200-x2 / -x4; ask `status`
# first): builds the stack with gRPC on the GPU machine, runs every GPU bitwise test binary, then
# cascade-loadgen's customer workload (llm-d's shape: each customer its own long system + context
# chunk, fresh queries, Poisson arrivals at each QPS) against a fresh local stack per routing
# policy, one CUDA worker per visible GPU (`--local --backend=cuda --workers=N` passes each
# worker its --cuda_device and KV share). Tables per preset under $OUT (or ./device-out).
# Usage: bash bench/service/device_cluster.sh [preset=qps,qps,qps ...]
#   default: qwen3-0.6b=4,8,16. One preset per call fits the 10-minute limit (4 policies x 3
#   rates x DURATION plus a stack start each); qwen3-8b=1,2,4 in a second call.
#   Environment: DURATION (30s), CUSTOMERS (150), CONTEXT_WORDS (4000), POLICIES
#   (cost,load,round_robin,random), KV_CACHE_BYTES per worker (0: the worker's default share of
#   its GPU; set it below the customers' total KV to put the cache under pressure, as llm-d's
#   benchmark does), WORKER_FLAGS (extra worker flags, e.g. "--host_kv_bytes=0"), MAX_REQUESTS
#   per rate (100000), SKIP_TESTS=1 to neither build nor run the
#   GPU tests (only where the same tree passed them in an earlier call). The servers' logs come
#   back as logs_<preset>.tgz (a folder per policy), with a count of the gateway's admission
#   limit decreases printed per policy.
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export CASCADE_DEVICE_GRPC=1 CASCADE_BUILD_DIR=build-gpu-full
SPECS=("$@")
[ ${#SPECS[@]} -eq 0 ] && SPECS=(qwen3-0.6b=4,8,16)
TESTS=(cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test attention_plan_test)
[ "${SKIP_TESTS:-0}" = 1 ] && TESTS=()
t0=$(date +%s)
bash scripts/device_build.sh "${TESTS[@]}" cascade cascade-registry cascade-worker cascade-gateway \
  cascade-loadgen >"$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
. build-gpu-full/env.sh
GPUS=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
if [ "$GPUS" -lt 2 ]; then
  echo "device_cluster: $GPUS GPU visible; the cluster run needs >= 2 (a multi-GPU kind)" >&2
  exit 2
fi
fail=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  bash scripts/device_gpu_tests.sh build-gpu-full || fail=1
  echo "tests: $(( $(date +%s) - t0 )) s, failures: $fail"
fi
for spec in "${SPECS[@]}"; do
  preset=${spec%%=*}
  qps=${spec#*=}
  dir=/tmp/cascade-$preset
  [ -d "$dir" ] || build-gpu-full/bin/cascade mkmodel --preset "$preset" --out "$dir" \
    --tokenizer-dir .devdeps/tokenizer >"$OUT/mkmodel_$preset.log" 2>&1 ||
    { cat "$OUT/mkmodel_$preset.log"; exit 1; }
  build-gpu-full/bench/cascade-loadgen --local --backend=cuda --workers="$GPUS" \
    --model_dir="$dir" --qps="$qps" --duration="${DURATION:-30s}" \
    --customers="${CUSTOMERS:-150}" --context_words="${CONTEXT_WORDS:-4000}" \
    --route_policies="${POLICIES:-cost,load,round_robin,random}" --max_tokens=64 \
    --kv_cache_bytes="${KV_CACHE_BYTES:-0}" --max_requests="${MAX_REQUESTS:-100000}" \
    --progress_interval=5s --worker_flags="${WORKER_FLAGS:-}" --log_dir="/tmp/cluster-logs/$preset" \
    2>"$OUT/loadgen_$preset.err" | tee "$OUT/cluster_$preset.md"
  echo "$preset rc=${PIPESTATUS[0]}: $(( $(date +%s) - t0 )) s"
  tail -3 "$OUT/loadgen_$preset.err"
  for d in /tmp/cluster-logs/"$preset"/*/; do
    echo "$(basename "$d"): $(cat "$d"gateway*.log 2>/dev/null | grep -c admission_limit_down) admission_limit_down lines"
    cat "$d"gateway*.log 2>/dev/null | grep admission_limit_down | tail -2
  done
  tar czf "$OUT/logs_$preset.tgz" -C /tmp/cluster-logs "$preset" 2>/dev/null
done
echo "total: $(( $(date +%s) - t0 )) s; GPU tests failed: $fail"
