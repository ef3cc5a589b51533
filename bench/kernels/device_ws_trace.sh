#!/usr/bin/env bash
# One device call (docs/GPU.md) for the wide cascade kernel: builds the product tree (build-gpu)
# and, beside it, cuda_attention_bench with the per-work timeline stamps (build-trace,
# -DCASCADE_WS_TRACE=ON); runs every GPU bitwise test binary on the product build; then for each
# tree configuration of TREES (default "default nofold"; names as cuda_attention_bench --tree)
# times the row on every build and prints bench/kernels/ws_trace.py's report of each trace
# build's last launch (and, with --dw, the persistent decode kernel's that followed it).
# ALT_SRC="dir [dir ...]" (other source trees carried with the call, e.g. main plus a patch:
# `mkdir alt_src && git archive HEAD | tar -x -C alt_src && (cd alt_src && patch -p1 < PATCH)`,
# carry [".devdeps", "alt_src", ...]): the same for each (build-alt<i>, build-alt<i>-trace; test
# logs under $OUT/alt<i>), every row timed on all trees in turn, this tree first and again last,
# so a speedup is measured in the same call as every tree's tests.
# EXTRA_ROWS (e.g. "--shared=64 --prefill=8192"): more cuda_attention_bench rows timed the same way.
# SHARED_TRACE (e.g. "default"): the shared-prefix row of those configurations timed and traced.
# TRACE=0: no timeline builds or reports (time for two alternative trees in one call).
# ENGINE_AB=1: also engine_bench's three-level tree (--sections=tree --variants=default) on every
# tree, A-B-A-B (this tree first); ENGINE_AB_ARGS (e.g. "--sections=decode --batches=64,256")
# replaces --sections=tree. ALT_TESTS=0: the alternative trees' tests are not run (only
# where they differ from this tree in a default the tests set themselves).
# Logs and traces under $OUT (or ./device-out): gpu_tests.log, trace_rows.log, engine_tree.log
# and the rest (build logs, trace CSVs and reports) in ws_trace_out.tgz.
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
TESTS="cuda_attention_test cuda_kernels_test cuda_backend_test engine_cuda_test"
TARGETS="cuda_kernels_test cuda_attention_test cuda_backend_test engine_cuda_test cuda_attention_bench"
[ "${ENGINE_AB:-0}" = 1 ] && TARGETS="$TARGETS engine_bench"
t0=$(date +%s)
# shellcheck disable=SC2086
bash scripts/device_build.sh $TARGETS >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s"
read -r -a alts <<<"${ALT_SRC:-}"
# The other builds while the tests run (after the first build unpacked the carried packages).
(
  if [ "${TRACE:-1}" != 0 ]; then
    CASCADE_BUILD_DIR=$PWD/build-trace CASCADE_CMAKE_ARGS=-DCASCADE_WS_TRACE=ON \
      bash scripts/device_build.sh cuda_attention_bench >"$OUT/build_trace.log" 2>&1 ||
      echo "trace build failed"
  fi
  for i in "${!alts[@]}"; do
    # shellcheck disable=SC2086
    CASCADE_BUILD_DIR=$PWD/build-alt$i bash "${alts[$i]}/scripts/device_build.sh" $TARGETS \
      >"$OUT/build_alt$i.log" 2>&1 || echo "alt build $i (${alts[$i]}) failed"
    if [ "${TRACE:-1}" != 0 ]; then
      CASCADE_BUILD_DIR=$PWD/build-alt$i-trace CASCADE_CMAKE_ARGS=-DCASCADE_WS_TRACE=ON \
        bash "${alts[$i]}/scripts/device_build.sh" cuda_attention_bench \
        >"$OUT/build_alt${i}_trace.log" 2>&1 || echo "alt trace build $i failed"
    fi
  done
) &
builds_pid=$!
GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-150} GPU_TESTS="$TESTS" bash scripts/device_gpu_tests.sh build-gpu
trc=$?
echo "tests: $(( $(date +%s) - t0 )) s (rc=$trc)"
wait $builds_pid
if [ "${TRACE:-1}" != 0 ] && [ ! -x build-trace/bench/cuda_attention_bench ]; then
  tail -40 "$OUT/build_trace.log"
  exit 1
fi
trees="build-gpu"
traces="build-trace"
for i in "${!alts[@]}"; do
  if [ -x "build-alt$i/bench/cuda_attention_bench" ]; then
    if [ "${ALT_TESTS:-1}" != 0 ]; then
      echo "== tests of ${alts[$i]} (build-alt$i)"
      OUT=$OUT/alt$i GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-150} GPU_TESTS="$TESTS" \
        bash scripts/device_gpu_tests.sh "build-alt$i" || trc=1
      echo "alt $i tests: $(( $(date +%s) - t0 )) s (rc=$trc)"
    fi
    trees="$trees build-alt$i"
    traces="$traces build-alt$i-trace"
  else
    tail -40 "$OUT/build_alt$i.log"
  fi
done
[ "$trees" != build-gpu ] && trees="$trees build-gpu"
# rows KIND NAME FLAG PREFIX: the row (grep KIND) of configuration NAME (cuda_attention_bench
# FLAG=NAME) timed on every tree, then traced on every trace build, with ws_trace.py's reports
# of the wide kernel's timeline and (where it ran) the persistent decode kernel's, FILE PREFIX.
rows() {
  local kind=$1 t=$2 flag=$3 prefix=$4 b
  for b in $trees; do
    echo "== $kind $t: $b"
    timeout 90 "$b"/bench/cuda_attention_bench "$flag=$t" 2>&1 | grep -E "^$kind" |
      tee -a "$OUT/trace_rows.log"
  done
  [ "${TRACE:-1}" != 0 ] || return 0
  for b in $traces; do
    [ -x "$b"/bench/cuda_attention_bench ] || continue
    local f="$OUT/${prefix}${t}_$b"
    echo "== $kind $t: $b"
    timeout 90 "$b"/bench/cuda_attention_bench "$flag=$t" --trace="$f.csv" 2>&1 |
      grep -E "^$kind|trace" | tee -a "$OUT/trace_rows.log"
    python3 bench/kernels/ws_trace.py "$f.csv" | tee "$f.txt"
    if [ -f "$f.csv.dw" ]; then  # the persistent decode kernel's (own tiles)
      echo "== $kind $t: $b, persistent decode kernel"
      python3 bench/kernels/ws_trace.py --dw "$f.csv.dw" | tee "$f.dw.txt"
    fi
    python3 bench/kernels/ws_trace.py --step "$f.csv" | tee -a "$f.txt"  # both kernels' spans
  done
}
for t in ${TREES:-default nofold}; do rows tree "$t" --tree trace_; done
# SHARED_TRACE="NAME ...": the shared-prefix row (4096 + 128, B=64) of each configuration timed
# and traced the same way (--shared-row=NAME).
for t in ${SHARED_TRACE:-}; do rows shared "$t" --shared-row trace_shared_; done
for r in ${EXTRA_ROWS:-}; do
  for b in $trees; do
    echo "== $r: $b"
    timeout 90 "$b"/bench/cuda_attention_bench "$r" 2>&1 | grep -E "[0-9]+\.[0-9]" |
      tee -a "$OUT/trace_rows.log"
  done
done
if [ "${ENGINE_AB:-0}" = 1 ]; then
  echo "# engine_bench --backend=cuda --preset=qwen3-0.6b ${ENGINE_AB_ARGS:---sections=tree} --variants=default, A-B-A-B"
  for round in 1 2; do
    for b in $(echo "$trees" | tr ' ' '\n' | awk '!seen[$0]++'); do
      echo "== engine $b (round $round)"
      # shellcheck disable=SC2086
      timeout 120 "$b"/bench/engine_bench --backend=cuda --preset=qwen3-0.6b \
        ${ENGINE_AB_ARGS:---sections=tree} --variants=default 2>&1 | grep -E "^\||^\(every" |
        tee -a "$OUT/engine_tree.log"
      [ "${PIPESTATUS[0]}" = 0 ] || { echo "engine_bench on $b failed (tokens differ?)"; trc=1; }
    done
  done
fi
echo "total: $(( $(date +%s) - t0 )) s"
# The device tool brings back at most 8 files from $OUT: everything in one archive, beside the
# three logs read first.
tar -czf /tmp/ws_trace_out.tgz -C "$OUT" . && mv /tmp/ws_trace_out.tgz "$OUT/" &&
  find "$OUT" -mindepth 1 ! -name ws_trace_out.tgz ! -name gpu_tests.log ! -name trace_rows.log \
    ! -name engine_tree.log -delete 2>/dev/null
exit $trc
