#!/usr/bin/env bash
# One device call profiling the warp-specialized prefill kernel (see docs/GPU.md): builds
# cuda_attention_bench, prints its prefill rows at N (default 8192; `--prefill=N`), then Nsight
# Compute on one launch of PrefillWsKernel at N (--set full + the SASS source page: warp stall
# samples per instruction through bench/engine/sass_hot.py, CONTEXT instructions before the
# hottest). The variants run in the order v7, v8 default, v8 ping-pong, 3 warm-ups + 20 timed
# each, so launch 3 of the PrefillWsKernel name is the default's first timed one (SKIP).
# TESTS=1 also runs every GPU test binary first. ARGS: other bench flags to profile instead (e.g.
# "--tree=nofold": the three-level tree's wide cascade kernel, PrefillWsKernel's kSplit form, whose
# first timed launch is also launch 3), NAME its files' name. Logs under $OUT (or ./device-out).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
t0=$(date +%s)
T="cuda_attention_bench"
[ "${TESTS:-0}" = 1 ] && T="cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test $T"
bash scripts/device_build.sh $T >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s"
fail=0
if [ "${TESTS:-0}" = 1 ]; then
  GPU_TESTS="cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test" bash scripts/device_gpu_tests.sh build-gpu || fail=1
  echo "tests: $(( $(date +%s) - t0 )) s; all passed: $([ $fail = 0 ] && echo yes || echo NO)"
fi
N=${N:-8192}
ARGS=${ARGS:---prefill=$N}
timeout 60 build-gpu/bench/cuda_attention_bench $ARGS 2>&1 | tee "$OUT/bench.log" | tail -3
name=${NAME:-prefill_ws_$N}
timeout 300 ncu --kernel-name "regex:PrefillWsKernel" --launch-skip "${SKIP:-3}" --launch-count 1 \
  --set full --import-source no -o "/tmp/$name" build-gpu/bench/cuda_attention_bench $ARGS \
  >"$OUT/$name.run.log" 2>&1 || { echo "ncu rc=$?"; tail -5 "$OUT/$name.run.log"; exit 1; }
ncu -i "/tmp/$name.ncu-rep" --page details >"$OUT/$name.txt" 2>&1
grep -E "^ +(Duration|SM Frequency|DRAM Throughput|Memory Throughput|L2 Hit Rate|L1/TEX Hit Rate|Achieved Occupancy|Registers Per Thread|Eligible Warps Per Scheduler|Issued Warp Per Scheduler|No Eligible|Warp Cycles Per Issued Instruction|Executed Instructions |Compute \(SM\) Throughput|SM Busy|Issue Slots Busy|Executed Ipc Active|Shared Memory)" "$OUT/$name.txt"
ncu -i "/tmp/$name.ncu-rep" --page source --print-source sass --csv >"/tmp/$name.csv" 2>&1
python3 bench/engine/sass_hot.py "/tmp/$name.csv" ${TOP:-40} ${CONTEXT:-12} >"$OUT/${name}_sass.txt" 2>&1
head -${LINES_OUT:-120} "$OUT/${name}_sass.txt"
echo "total: $(( $(date +%s) - t0 )) s"
exit $fail
