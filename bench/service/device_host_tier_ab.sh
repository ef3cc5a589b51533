#!/usr/bin/env bash
# One device call: the host KV tier's cost to the miss phase once the GPU KV cache is full.
# Builds the stack with gRPC (as device_service_bench.sh; GPU_TESTS run first, a failure stops
# the call), then runs cascade-loadgen's miss workload (every request's prompt new) on a local
# stack whose worker's GPU KV is KV_BYTES (default 6 GiB, ~56k tokens of qwen3-0.6b: full after
# ~80 requests), once per worker flag set of VARIANTS (';'-separated, "label=flags"), ROUNDS
# times in turn; FULL_KV=1 then runs each variant once more at the default KV size over PHASES
# (the cache fills in the first phase). Logs under $OUT (or ./device-out).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export CASCADE_DEVICE_GRPC=1 CASCADE_BUILD_DIR=build-gpu-full
VARIANTS=${VARIANTS:-"default=;tier_off=--host_kv_bytes=0"}
t0=$(date +%s)
bash scripts/device_build.sh cascade cascade-registry cascade-worker cascade-gateway cascade-loadgen \
  ${EXTRA_TARGETS:-} ${GPU_TESTS:-} >"$OUT/build_full.log" 2>&1 || { tail -60 "$OUT/build_full.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s; commit $(cat COMMIT 2>/dev/null || git rev-parse --short HEAD)"
. build-gpu-full/env.sh
for t in ${GPU_TESTS:-}; do
  timeout 300 build-gpu-full/tests/$t >"$OUT/$t.log" 2>&1; rc=$?
  echo "$t rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' "$OUT/$t.log" | tr '\n' ' ')"
  [ $rc -ne 0 ] && { grep -B2 -A10 Failure "$OUT/$t.log" | head -40; exit 1; }
done
build-gpu-full/bin/cascade mkmodel --preset qwen3-0.6b --out /tmp/cascade-qwen3 \
  --tokenizer-dir .devdeps/tokenizer >"$OUT/mkmodel.log" 2>&1 || { cat "$OUT/mkmodel.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
run() {  # label kv_bytes concurrency worker_flags
  echo "== $1: kv_cache_bytes=${2:-default} concurrency=$3 worker flags: ${4:-(defaults)}"
  timeout 200 build-gpu-full/bench/cascade-loadgen --local --backend=cuda --workers=1 \
    --model_dir=/tmp/cascade-qwen3 --concurrency="$3" --duration=${DURATION:-8s} \
    --max_requests=4000 --max_tokens=32 --system_words=600 --workloads=miss \
    ${2:+--kv_cache_bytes=$2} ${4:+--worker_flags="$4"} 2>>"$OUT/loadgen_$1.err" \
    | tee -a "$OUT/host_tier_ab.md" | grep -E "^\| [0-9]+ \| miss"
}
IFS=';' read -ra VS <<<"$VARIANTS"
for round in $(seq 1 ${ROUNDS:-2}); do
  for v in "${VS[@]}"; do run "${v%%=*}" "${KV_BYTES:-6442450944}" "${CONC:-32,32}" "${v#*=}"; done
done
if [ "${FULL_KV:-0}" = 1 ]; then
  for v in "${VS[@]}"; do run "${v%%=*}_fullkv" "" "${PHASES:-32,32,32}" "${v#*=}"; done
fi
echo "total: $(( $(date +%s) - t0 )) s"
