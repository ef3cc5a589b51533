#!/usr/bin/env bash
# Kept as the call that measured experiments/sampler_first_pass_ahead.patch (NOTES run 42):
# build engine_bench + engine_cuda_test, a CUPTI timeline of decode at batch 1 / 64 / 256 (the
# SampleKernel line of each steady graph), then engine_cuda_test (device == host sampler).
# session 54 call 7: the sampler's first pass with 4 rounds of quads in flight (ForEachQuadAhead)
set -uo pipefail
OUT=${OUT:-device-out}; mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
t0=$(date +%s)
bash scripts/device_build.sh engine_bench engine_cuda_test >/tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
. build-gpu/env.sh; echo "build $(( $(date +%s)-t0 )) s commit $(cat COMMIT)+sampler"
CUDA=/usr/local/cuda
hdr=$(find -L "$CUDA"/ -name cupti_activity.h 2>/dev/null | head -1)
lib=$(find -L "$CUDA"/ -name 'libcupti.so*' 2>/dev/null | head -1)
rec=$(grep -oE '\} CUpti_ActivityKernel[0-9]+;' "$hdr" | grep -oE '[0-9]+' | sort -n | tail -1)
g++ -std=c++17 -shared -fPIC -O2 -DKERNEL_RECORD=CUpti_ActivityKernel$rec -I"$(dirname "$hdr")" \
  -I"$CUDA/include" bench/engine/cupti_trace.cc -L"$(dirname "$lib")" -lcupti \
  -Wl,-rpath,"$(dirname "$lib")" -o /tmp/libcupti_trace.so || exit 1
CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so CUPTI_TRACE_OUT=/tmp/trace.csv timeout 120 \
  build-gpu/bench/engine_bench --backend=cuda --preset=qwen3-0.6b --sections=decode \
  --variants=default --batches=1,64,256 >$OUT/decode_traced.log 2>&1
echo "traced rc=$? $(( $(date +%s)-t0 )) s"
grep -E "^\| *[0-9]" $OUT/decode_traced.log
python3 bench/engine/cupti_steps.py /tmp/trace.csv --top 14 >$OUT/timeline.md
grep -E "^## graph|SampleKernel" $OUT/timeline.md | grep -A1 -E "[0-9]{2,} replays" | grep -vE "^--"
timeout 150 build-gpu/tests/engine_cuda_test >$OUT/engine_cuda_test.log 2>&1
echo "engine_cuda_test rc=$? $(grep -E '^\[  PASSED|^\[  FAILED' $OUT/engine_cuda_test.log | tr '\n' ' ') $(( $(date +%s)-t0 )) s"
