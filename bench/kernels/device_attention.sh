#!/usr/bin/env bash
# One device call for an attention kernel change (see docs/GPU.md): builds on the GPU machine,
# prints the kernels' registers/spills and tensor-core instruction counts, runs every GPU bitwise
# test (cuda_kernels_test, cuda_attention_test, cuda_backend_test, engine_cuda_test), then times
# cuda_attention_bench (and its prefill with 64-token blocks) and PyTorch SDPA
# (bench/kernels/sdpa_bench.py) in the same call, and with
# ENGINE=1 engine_bench on qwen3-0.6b: its ENGINE_SECTIONS (default prefill) for ENGINE_VARIANTS
# (default "default,block64"). Logs go to $OUT (or ./device-out).
# BASE_SRC=<folder>: a baseline source tree (e.g. `git archive <rev> | tar -x -C base_src`, listed in
# .git/info/exclude and carried) whose cuda_attention_bench (and engine_bench with ENGINE=1) is
# built in build-base and timed in the same call, after this tree's (logs *_base.log).
# Usage: bash bench/kernels/device_attention.sh [--quick]   (--quick: attention bench's quick mode)
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
T="cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test cuda_attention_bench"
[ "${ENGINE:-0}" = 1 ] && T="$T engine_bench"
t0=$(date +%s)
bash scripts/device_build.sh $T >"$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
obj=$(find build-gpu -name attention.cu.o | head -1)
cuobjdump -res-usage "$obj" 2>&1 | grep --no-group-separator -A1 "Function" | paste - - |
  sed -E 's/.*(Prefill|Split|Merge|Decode)(Ws)?Kernel(ILi([0-9]+)E)?.*(REG:[0-9]+ STACK:[0-9]+).*(LOCAL:[0-9]+).*/\1\2 \4 \5 \6/' | grep -v Function
sass=$(cuobjdump -sass "$obj")
echo "attention.cu.o: HMMA $(grep -c HMMA <<<"$sass"), HGMMA $(grep -c HGMMA <<<"$sass")"
fail=0
GPU_TESTS="cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test" bash scripts/device_gpu_tests.sh build-gpu || fail=1
echo "tests: $(( $(date +%s) - t0 )) s; all passed: $([ $fail = 0 ] && echo yes || echo NO)"
timeout 150 build-gpu/bench/cuda_attention_bench "$@" >"$OUT/attn.log" 2>&1 || echo "attention bench rc=$?"
# Prefill again with 64-token KV blocks (one TMA box per K/V column half per tile).
{ echo; echo "== prefill with --block=64"; } >>"$OUT/attn.log"
timeout 60 build-gpu/bench/cuda_attention_bench --prefill-only --block=64 2>&1 | tail -6 >>"$OUT/attn.log" ||
  echo "attention bench --block=64 rc=$?"
timeout 120 python3 bench/kernels/sdpa_bench.py >"$OUT/sdpa.log" 2>&1 || echo "sdpa rc=$?"
if [ "${ENGINE:-0}" = 1 ]; then
  timeout 300 build-gpu/bench/engine_bench --backend=cuda --preset=qwen3-0.6b \
    --sections="${ENGINE_SECTIONS:-prefill}" --variants="${ENGINE_VARIANTS:-default,block64}" \
    >"$OUT/engine.log" 2>&1 || echo "engine bench rc=$?"
fi
if [ -n "${BASE_SRC:-}" ] && [ $fail = 0 ]; then  # a baseline only where every test passed
  tb=$(date +%s)
  BT="cuda_attention_bench"
  [ "${ENGINE:-0}" = 1 ] && BT="$BT engine_bench"
  CASCADE_BUILD_DIR=$PWD/build-base bash "$BASE_SRC/scripts/device_build.sh" $BT >"$OUT/build_base.log" 2>&1 ||
    { echo "baseline build failed"; tail -30 "$OUT/build_base.log"; }
  echo "baseline build: $(( $(date +%s) - tb )) s"
  timeout 150 build-base/bench/cuda_attention_bench "$@" >"$OUT/attn_base.log" 2>&1 || echo "base attention bench rc=$?"
  if [ "${ENGINE:-0}" = 1 ]; then
    timeout 300 build-base/bench/engine_bench --backend=cuda --preset=qwen3-0.6b \
      --sections="${ENGINE_SECTIONS:-prefill}" --variants=default >"$OUT/engine_base.log" 2>&1 ||
      echo "base engine bench rc=$?"
  fi
  echo "== cuda_attention_bench (baseline $BASE_SRC)"; cat "$OUT/attn_base.log"
  [ "${ENGINE:-0}" = 1 ] && { echo "== engine (baseline)"; grep -E "^\||^#" "$OUT/engine_base.log"; }
fi
echo "== cuda_attention_bench"; cat "$OUT/attn.log"
echo "== sdpa"; cat "$OUT/sdpa.log"
[ "${ENGINE:-0}" = 1 ] && { echo "== engine"; grep -E "^\||^#" "$OUT/engine.log"; }
echo "total: $(( $(date +%s) - t0 )) s"
