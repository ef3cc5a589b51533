#!/usr/bin/env bash
# One device call (docs/GPU.md): builds and runs cublas_pdl_probe.cu (what it asks: its header).
# Needs only the CUDA toolkit. Log: $OUT/cublas_pdl.log (or ./device-out).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
nvcc -O2 -std=c++17 -arch=sm_90a bench/engine/probes/cublas_pdl_probe.cu -o /tmp/cublas_pdl_probe \
  -lcublasLt -lcuda || exit 1
timeout 300 /tmp/cublas_pdl_probe 2>&1 | tee "$OUT/cublas_pdl.log"
