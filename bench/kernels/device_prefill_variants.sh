#!/usr/bin/env bash
# Prefill-kernel tuning sweep (one device call; see docs/GPU.md): builds cuda_attention_bench with
# each variant of attention.cu's kPrefillMT (m16 tiles per warp: 1 = 8 warps x 16 rows,
# 2 = 4 warps x 32 rows, 128 query rows per CTA either way) and times the prefill cases
# (--prefill-only). With PICK=1 the variant fastest at N=4096 + N=8192 is left in the tree (for
# bench/kernels/device_attention.sh to test and record in the same call); else the tree is
# restored.
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
bash scripts/device_build.sh cuda_attention_bench >"$OUT/variant_build.log" 2>&1 || { tail -40 "$OUT/variant_build.log"; exit 1; }
. build-gpu/env.sh
AT=gpu_worker/backend/cuda/attention.cu
cp $AT /tmp/at.cu
best=""
best_us=1e30
for mt in 1 2; do
  sed "s/constexpr int kPrefillMT = [0-9];/constexpr int kPrefillMT = $mt;/" /tmp/at.cu >$AT
  ninja -C build-gpu cuda_attention_bench >>"$OUT/variant_build.log" 2>&1 || { echo "MT=$mt: build failed"; continue; }
  echo "== variant kPrefillMT=$mt"
  timeout 60 build-gpu/bench/cuda_attention_bench --prefill-only 2>&1 | grep "prefill N=" | tee /tmp/v.txt
  us=$(awk '/N=4096|N=8192/ {s += $3} END {print s}' /tmp/v.txt)
  if awk -v a="$us" -v b="$best_us" 'BEGIN {exit !(a < b)}'; then best=$mt; best_us=$us; fi
done
if [ "${PICK:-0}" = 1 ] && [ -n "$best" ]; then
  sed "s/constexpr int kPrefillMT = [0-9];/constexpr int kPrefillMT = $best;/" /tmp/at.cu >$AT
  echo "picked kPrefillMT=$best"
else
  cp /tmp/at.cu $AT
fi
