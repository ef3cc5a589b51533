#!/usr/bin/env bash
# One device call for the tensor-core attention tile: builds the current tree, runs the GPU tests
# (kernels vs float64, cascade == flat, cached == cold, engine acceptance), times the attention
# kernel bench and the engine's prefill/shared sections; then rebuilds with the previous
# attention.cu (carried as build-eng/attention_v4.cu) and times the same, for before/after.
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export CASCADE_SUBDIRS="cache_service gpu_worker/model gpu_worker/engine gpu_worker/backend/cpu gpu_worker/backend/cuda tests/gpu bench/engine bench/kernels"
T="engine_cuda_test engine_bench cuda_attention_test cuda_backend_test cuda_attention_bench"
t0=$(date +%s)
bash scripts/device_build.sh $T >"$OUT/build_new.log" 2>&1 || { tail -60 "$OUT/build_new.log"; exit 1; }
. build-gpu/env.sh
obj=$(find build-gpu -name attention.cu.o | head -1)
cuobjdump -res-usage "$obj" 2>&1 | grep -A1 AttentionTile | grep -o "REG:[0-9]*\|STACK:[0-9]*\|SHARED:[0-9]*" | paste - - - >"$OUT/res.txt"
echo "HMMA: $(cuobjdump -sass "$obj" | grep -c HMMA)"; cat "$OUT/res.txt"
echo "build: $(( $(date +%s) - t0 )) s"
for t in cuda_attention_test cuda_backend_test engine_cuda_test; do
  timeout 240 build-gpu/tests/$t >"$OUT/$t.log" 2>&1; echo "$t rc=$?"
  grep -E "^\[ +(FAILED|PASSED) |preemptions|cascade:|CUDA vs CPU|greedy agreement" "$OUT/$t.log" | head -20
  grep -B2 -A6 "Failure" "$OUT/$t.log" | head -40
done
echo "tests: $(( $(date +%s) - t0 )) s"
B="--backend=cuda --preset=qwen3-0.6b --sections=prefill,shared --queries=64,256"
timeout 120 build-gpu/bench/cuda_attention_bench >"$OUT/attn_new.log" 2>&1
timeout 200 build-gpu/bench/engine_bench $B >"$OUT/eng_new.log" 2>&1
echo "new benches: $(( $(date +%s) - t0 )) s"
cp gpu_worker/backend/cuda/attention.cu /tmp/attention_new.cu
cp build-eng/attention_v4.cu gpu_worker/backend/cuda/attention.cu
bash scripts/device_build.sh engine_bench cuda_attention_bench >"$OUT/build_old.log" 2>&1 || tail -30 "$OUT/build_old.log"
timeout 120 build-gpu/bench/cuda_attention_bench >"$OUT/attn_old.log" 2>&1
timeout 200 build-gpu/bench/engine_bench $B >"$OUT/eng_old.log" 2>&1
cp /tmp/attention_new.cu gpu_worker/backend/cuda/attention.cu
echo "== attention bench: v4 (CUDA cores) then mma"; grep -E "^\|" "$OUT/attn_old.log"; grep -E "^\|" "$OUT/attn_new.log"
echo "== engine: v4 then mma"; grep -E "^\||^#" "$OUT/eng_old.log"; grep -E "^\||^#" "$OUT/eng_new.log"
echo "total: $(( $(date +%s) - t0 )) s"
