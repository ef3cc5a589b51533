#!/usr/bin/env bash
# Prefill-kernel tuning sweep, run after bench/kernels/device_attention.sh in the same device call
# (build-gpu/ configured): rebuilds cuda_attention_bench with each variant of the prefill CTA
# shape and times the prefill cases (--prefill-only). The tree is restored afterwards.
#   rows: (row, head) pairs per CTA (kernel_types.h PrefillQueriesPerCta; 16 per warp)
#   qregs: Q fragments kept in registers (attention.cu kQRegs) or re-read from shared memory
set -uo pipefail
OUT=${OUT:-device-out}
. build-gpu/env.sh
KT=gpu_worker/backend/cuda/kernel_types.h
AT=gpu_worker/backend/cuda/attention.cu
cp $KT /tmp/kt.h && cp $AT /tmp/at.cu
for v in "128 regs" "64 regs" "128 smem" "64 smem"; do
  set -- $v
  cp /tmp/kt.h $KT && cp /tmp/at.cu $AT
  sed -i "s/return head_dim > 128 ? 64 : 128;/return head_dim > 128 ? 64 : $1;/" $KT
  [ "$2" = smem ] && sed -i 's/constexpr bool kQRegs = D <= 128;/constexpr bool kQRegs = false;/' $AT
  ninja -C build-gpu cuda_attention_bench >"$OUT/variant_build.log" 2>&1 || { tail -20 "$OUT/variant_build.log"; continue; }
  echo "== variant rows=$1 q=$2"
  timeout 60 build-gpu/bench/cuda_attention_bench --prefill-only 2>&1 | grep "prefill N="
done
cp /tmp/kt.h $KT && cp /tmp/at.cu $AT
