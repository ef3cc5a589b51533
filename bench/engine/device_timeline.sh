#!/usr/bin/env bash
# One device call: where a decode step's replay goes, kernel by kernel, not serialized (no nsys on
# the device machine; ncu serializes). Builds engine_bench and cuda_gemm_bench, compiles
# bench/engine/cupti_trace.cc against the toolkit's CUPTI, runs the gemm bench's decode split sweep
# (GEMM_ARGS), then engine_bench decode (VARIANTS, BATCHES) once plain and once traced (the step
# times side by side say what tracing costs), and prints bench/engine/cupti_steps.py's table for
# every decode graph, once per sampler of SAMPLERS (a process each, so each table is that
# sampler's steps). TESTS="cuda_backend_test engine_cuda_test ..." runs those GPU test binaries
# first (a speedup read from the timeline counts only where they pass in the same call).
# Usage: [BATCHES=1,64,256] [VARIANTS=default] [GEMM_ARGS="--quick --preset=qwen3-0.6b"]
#        [SAMPLERS=greedy,all] [TESTS="..."]
#        [ENGINE_ARGS=--tune_log=1 (engine_bench flags; tune_log: the decode GEMM choices)]
#        bash bench/engine/device_timeline.sh [preset]
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
PRESET=${1:-qwen3-0.6b}
export CASCADE_SUBDIRS="common cache_service gpu_worker/model gpu_worker/engine gpu_worker/backend/cpu gpu_worker/backend/cuda bench/kernels bench/engine"
[ -n "${TESTS:-}" ] && CASCADE_SUBDIRS="$CASCADE_SUBDIRS tests/gpu"
t0=$(date +%s)
bash scripts/device_build.sh engine_bench cuda_gemm_bench ${TESTS:-} >/tmp/timeline_build.log 2>&1 ||
  { tail -60 /tmp/timeline_build.log; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s; commit $(cat COMMIT 2>/dev/null || git rev-parse --short HEAD)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
if [ -n "${TESTS:-}" ]; then
  GPU_TESTS="$TESTS" bash scripts/device_gpu_tests.sh build-gpu && echo "tests all passed: yes" ||
    echo "tests all passed: NO"
fi

CUDA=${CUDA_HOME:-/usr/local/cuda}
hdr=$(find -L "$CUDA"/ /usr/include -name cupti_activity.h 2>/dev/null | head -1)
lib=$(find -L "$CUDA"/ /usr/lib -name 'libcupti.so*' 2>/dev/null | head -1)
tracer=""
if [ -n "$hdr" ] && [ -n "$lib" ]; then
  rec=$(grep -oE '\} CUpti_ActivityKernel[0-9]+;' "$hdr" | grep -oE '[0-9]+' | sort -n | tail -1)
  flags=""
  grep -q cuptiActivityFlushPeriod "$(dirname "$hdr")"/*.h || flags="-DNO_FLUSH_PERIOD"
  if g++ -std=c++17 -shared -fPIC -O2 -DKERNEL_RECORD=CUpti_ActivityKernel$rec $flags \
      -I"$(dirname "$hdr")" -I"$CUDA/include" bench/engine/cupti_trace.cc \
      -L"$(dirname "$lib")" -lcupti -Wl,-rpath,"$(dirname "$lib")" -o /tmp/libcupti_trace.so \
      2>/tmp/cupti_build.log; then
    tracer=/tmp/libcupti_trace.so
    echo "tracer: CUpti_ActivityKernel$rec from $hdr $flags"
  else
    echo "tracer did not compile:"; head -30 /tmp/cupti_build.log
  fi
else
  echo "no CUPTI found under $CUDA (header '$hdr', library '$lib')"
fi

GEMM_ARGS=${GEMM_ARGS-"--quick --preset=$PRESET"}  # empty: no gemm bench
if [ -n "$GEMM_ARGS" ]; then
  timeout 200 build-gpu/bench/cuda_gemm_bench $GEMM_ARGS >"$OUT/gemm_bench.log" 2>&1
  echo "gemm bench rc=$? ($(( $(date +%s) - t0 )) s)"
  grep "split sweep" "$OUT/gemm_bench.log"
fi
for s in $(tr ',' ' ' <<<"${SAMPLERS:-greedy}"); do
  ARGS="--backend=cuda --preset=$PRESET --sections=decode --variants=${VARIANTS:-default} --batches=${BATCHES:-1,64,256} --samplers=$s ${ENGINE_ARGS:-}"
  sfx=$([ "$s" = greedy ] && echo "" || echo "_$s")
  timeout 200 build-gpu/bench/engine_bench $ARGS >"$OUT/decode_plain$sfx.log" 2>&1
  echo "decode plain ($s) rc=$? ($(( $(date +%s) - t0 )) s)"
  grep -E "^## Decode, variant|^\| *[0-9]" "$OUT/decode_plain$sfx.log"
  grep -E "chosen" "$OUT/decode_plain$sfx.log" | sort | uniq -c | sort -rn | head -${CHOICES:-40}
  if [ -n "$tracer" ]; then
    CUDA_INJECTION64_PATH=$tracer CUPTI_TRACE_OUT=/tmp/trace$sfx.csv timeout 300 \
      build-gpu/bench/engine_bench $ARGS >/tmp/decode_traced$sfx.log 2>&1
    echo "decode traced ($s) rc=$? ($(( $(date +%s) - t0 )) s); $(wc -l </tmp/trace$sfx.csv) trace lines"
    grep -E "^## Decode, variant|^\| *[0-9]|cupti_trace" /tmp/decode_traced$sfx.log
    python3 bench/engine/cupti_steps.py /tmp/trace$sfx.csv --top ${TOP:-16} | tee "$OUT/timeline$sfx.md"
  fi
done
echo "total: $(( $(date +%s) - t0 )) s"
