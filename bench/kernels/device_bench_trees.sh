#!/usr/bin/env bash
# One device call (docs/GPU.md) that times cuda_attention_bench rows on several source trees, to
# find which change moved a row (a bisection): no tests, so nothing measured here is a speedup;
# re-measure the winner with device_ws_trace.sh, which runs every GPU test in the same call.
# TREES="dir [dir ...]": source trees carried with the call (carry [".devdeps", dir, ...]), e.g.
# main with one kernel file from an older commit:
#   mkdir alt_a && git archive HEAD | tar -x -C alt_a &&
#   git show REV:gpu_worker/backend/cuda/attention_hopper.cuh > alt_a/gpu_worker/backend/cuda/attention_hopper.cuh
# (each tree is ~8 MB and a call carries at most 64 MiB with .devdeps' ~36: for three or more,
# `find alt_a -name '*.log' -delete; rm -rf alt_a/bench/kernels/experiments`; keep services/ and
# tests/, which the top-level CMakeLists adds whatever CASCADE_SUBDIRS says; list each tree in
# .git/info/exclude so only `carry` takes it).
# This tree (build-gpu) and each of TREES (build-t0, build-t1, ...) are timed in turn, ROUNDS
# times (default 3), the order reversed every other round. ROWS (default "--tree=default
# --shared-row=default"): cuda_attention_bench arguments, one row set per argument. ENGINE_ARGS
# (e.g. "--sections=tree"): also engine_bench --variants=default on every tree, in turn, ROUNDS
# times. GPU_TESTS (e.g. "cuda_attention_test cuda_kernels_test cuda_backend_test
# engine_cuda_test"): those test binaries are built in this tree and run before any row, so its
# rows count as a speedup only where they passed (the script says which). Logs under $OUT (or
# ./device-out).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
t0=$(date +%s)
targets=cuda_attention_bench
[ -n "${ENGINE_ARGS:-}" ] && targets="$targets engine_bench"
# shellcheck disable=SC2086
bash scripts/device_build.sh $targets ${GPU_TESTS:-} >"$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
builds=(build-gpu)
names=(this)
read -r -a trees <<<"${TREES:-}"
# The other builds after the first, which unpacked the carried packages; one at a time on the
# device's cores.
for i in "${!trees[@]}"; do
  # shellcheck disable=SC2086
  if CASCADE_BUILD_DIR=$PWD/build-t$i bash "${trees[$i]}/scripts/device_build.sh" $targets \
    >"$OUT/build_t$i.log" 2>&1; then
    builds+=("build-t$i")
    names+=("${trees[$i]}")
  else
    echo "build of ${trees[$i]} failed:"
    tail -20 "$OUT/build_t$i.log"
  fi
done
echo "builds: $(( $(date +%s) - t0 )) s"
if [ -n "${GPU_TESTS:-}" ]; then
  if GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-150} bash scripts/device_gpu_tests.sh build-gpu; then
    echo "GPU tests of this tree: all passed"
  else
    echo "GPU tests of this tree: FAILED (its rows below are not a speedup)"
  fi
  echo "tests: $(( $(date +%s) - t0 )) s"
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
# Rounds alternate the trees' order (A B C, C B A, ...): a row run first after a pause, or the
# GPU's clock drifting through a round, does not always favour the same tree.
order() {  # the builds' indices, forward in odd rounds and reversed in even ones
  local i
  if (($1 % 2)); then seq 0 $((${#builds[@]} - 1)); else
    for ((i = ${#builds[@]} - 1; i >= 0; --i)); do echo "$i"; done
  fi
}
for r in $(seq 1 "${ROUNDS:-3}"); do
  for b in $(order "$r"); do
    for row in ${ROWS:---tree=default --shared-row=default}; do
      timeout 60 "${builds[$b]}"/bench/cuda_attention_bench "$row" 2>&1 |
        grep -E "^(tree|shared|decode|prefill N)" | sed "s|^|r$r [${names[$b]}] |" |
        tee -a "$OUT/rows.log"
    done
  done
done
if [ -n "${ENGINE_ARGS:-}" ]; then
  for r in $(seq 1 "${ROUNDS:-3}"); do
    for b in $(order "$r"); do
      echo "== engine r$r [${names[$b]}]" | tee -a "$OUT/engine.log"
      # shellcheck disable=SC2086
      timeout 120 "${builds[$b]}"/bench/engine_bench --backend=cuda --preset=qwen3-0.6b \
        $ENGINE_ARGS --variants=default 2>&1 | grep -E "^\|" | tee -a "$OUT/engine.log"
    done
  done
fi
echo "total: $(( $(date +%s) - t0 )) s"
