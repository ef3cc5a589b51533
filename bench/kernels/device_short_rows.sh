#!/usr/bin/env bash
# One device call on the decode kernels at short rows (see docs/GPU.md): builds, runs every GPU
# bitwise test binary, times `cuda_attention_bench --decode=B,CTX` for each of CASES (default
# "256,145 64,145 256,160 64,1024"), then profiles with Nsight Compute (--set full + the SASS
# source page: per-instruction warp stall samples through bench/engine/sass_hot.py) one launch
# of each of PROFILES ("name:B,CTX:kernel regex:launches to skip"; default: the persistent
# kernel on whole 3-tile rows and the shared-memory kernel's form-2 launch at B=256 ctx 145, and
# the persistent kernel at B=64 ctx 1024; PROFILES="" none). BASE_SRC=<tree> (carried, see
# docs/GPU.md) times that tree's kernels beside this one's; ENGINE=<variants> adds engine_bench's
# decode table (ENGINE_BATCHES, default 64,128,256); PREFILL=1 the prefill rows. Logs under $OUT (or ./device-out).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
t0=$(date +%s)
bash scripts/device_build.sh cuda_kernels_test cuda_attention_test cuda_backend_test \
  engine_cuda_test cuda_attention_bench >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
fail=0
if [ "${TESTS:-1}" = 1 ]; then
  GPU_TESTS="cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test" bash scripts/device_gpu_tests.sh build-gpu || fail=1
  echo "tests: $(( $(date +%s) - t0 )) s; all passed: $([ $fail = 0 ] && echo yes || echo NO)"
fi
CASES=${CASES:-256,145 64,145 256,160 64,1024}
decode_rows() {  # BUILD_DIR B,CTX [REGEX]: the bench's decode rows of that shape, into attn.log
  timeout 60 "$1/bench/cuda_attention_bench" --decode="$2" 2>&1 | grep -E "${3:-decode}" |
    tee -a "$OUT/attn.log"
}
for c in $CASES; do decode_rows build-gpu "$c" "decode|floor|GB/s"; done
if [ -n "${BASE_SRC:-}" ] && [ $fail = 0 ]; then  # a baseline tree, built and timed beside
  CASCADE_BUILD_DIR=$PWD/build-base bash "$BASE_SRC/scripts/device_build.sh" cuda_attention_bench \
    >"$OUT/build_base.log" 2>&1 || { tail -20 "$OUT/build_base.log"; }
  for c in $CASES; do
    echo "== base $c" | tee -a "$OUT/attn.log"
    decode_rows build-base "$c"
    echo "== this tree $c (again)" | tee -a "$OUT/attn.log"
    decode_rows build-gpu "$c"
  done
fi
if [ "${PREFILL:-0}" = 1 ]; then  # prefill rows (TFLOP/s), this tree then the baseline, twice
  for r in 1 2; do
    for tree in build-gpu ${BASE_SRC:+build-base}; do
      echo "== prefill $tree ($r)" | tee -a "$OUT/attn.log"
      timeout 60 $tree/bench/cuda_attention_bench --prefill-only 2>&1 | grep -E "prefill" |
        tee -a "$OUT/attn.log"
    done
  done
fi
if [ -n "${ENGINE:-}" ] && [ $fail = 0 ]; then  # engine decode, e.g. ENGINE=default,ws,nows
  bash scripts/device_build.sh engine_bench >>"$OUT/build.log" 2>&1
  timeout 240 build-gpu/bench/engine_bench --backend=cuda --preset=qwen3-0.6b --sections=decode \
    --batches=${ENGINE_BATCHES:-64,128,256} --variants="$ENGINE" >"$OUT/engine.log" 2>&1 ||
    echo "engine bench rc=$?"
  grep -vE "^\s*$" "$OUT/engine.log" | tail -${ENGINE_TAIL:-25}
fi
[ -n "${PROFILES+x}" ] && [ -z "$PROFILES" ] && { echo "total: $(( $(date +%s) - t0 )) s"; exit $fail; }
# In --decode=B,CTX the configurations run in order nofold, default, smem, whole ws, whole smem,
# 23 launches each (3 warm-ups + 20 timed).
for p in ${PROFILES:-ws_b256_145:256,145:DecodeWsKernel:10 f2_b256_145:256,145:SplitKernel:33 ws_b64_1024:64,1024:DecodeWsKernel:33}; do
  IFS=: read -r name flag kern skip <<<"$p"
  timeout 200 ncu --kernel-name "regex:$kern" --launch-skip "$skip" --launch-count 1 --set full \
    --import-source no -o "/tmp/$name" build-gpu/bench/cuda_attention_bench --decode=$flag \
    >"$OUT/$name.run.log" 2>&1 || { echo "ncu $name rc=$?"; tail -5 "$OUT/$name.run.log"; continue; }
  ncu -i "/tmp/$name.ncu-rep" --page details >"$OUT/$name.txt" 2>&1
  echo "== $name"
  grep -E "^ +(Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|Achieved Occupancy|Registers Per Thread|Eligible Warps Per Scheduler|Issued Warp Per Scheduler|Warp Cycles Per Issued Instruction)" "$OUT/$name.txt"
  ncu -i "/tmp/$name.ncu-rep" --page source --print-source sass --csv >"/tmp/$name.csv" 2>&1
  python3 bench/engine/sass_hot.py "/tmp/$name.csv" 30 ${CONTEXT:-14} >"$OUT/${name}_sass.txt" 2>&1
  head -45 "$OUT/${name}_sass.txt"
done
echo "total: $(( $(date +%s) - t0 )) s"
