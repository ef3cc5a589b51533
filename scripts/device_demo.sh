#!/usr/bin/env bash
# One device call (docs/GPU.md): builds the WHOLE stack on the GPU machine (gRPC from the
# carried Debian packages, CASCADE_DEVICE_GRPC=1), then runs the README's main job there on the
# CUDA backend: `cascade demo --backend cuda` (registry + 2 CUDA workers + gateway over loopback
# gRPC), on the tiny model and on the qwen3-0.6b shape. Logs under $OUT (or ./device-out).
# Usage there: bash scripts/device_demo.sh      (carry .devdeps, made by scripts/device_deps.sh)
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export CASCADE_DEVICE_GRPC=1 CASCADE_BUILD_DIR=build-gpu-full
t0=$(date +%s)
bash scripts/device_build.sh cascade cascade-registry cascade-worker cascade-gateway \
  >"$OUT/build_full.log" 2>&1 || { tail -60 "$OUT/build_full.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
. build-gpu-full/env.sh
BIN=build-gpu-full/bin
for preset in tiny qwen3-0.6b; do
  "$BIN/cascade" mkmodel --preset "$preset" --out "/tmp/cascade-$preset" \
    --tokenizer-dir .devdeps/tokenizer >"$OUT/mkmodel_$preset.log" 2>&1 || { cat "$OUT/mkmodel_$preset.log"; exit 1; }
  echo "=== cascade demo --backend cuda, $preset ==="
  timeout 240 "$BIN/cascade" demo --backend cuda --workers 2 --model_dir "/tmp/cascade-$preset" \
    >"$OUT/demo_$preset.log" 2>&1
  echo "demo rc=$?"
  grep -vE "^\[[0-9]+\] " "$OUT/demo_$preset.log" | tail -22
done
echo "total: $(( $(date +%s) - t0 )) s"
