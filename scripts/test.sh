#!/usr/bin/env bash
# The test suite: installs what is missing, builds, runs every ctest test (GPU tests skip
# themselves where there is no GPU), then builds the libFuzzer targets in their own build dir
# (clang, ASan + UBSan, CUDA, tests and benchmarks off, only the fuzz targets) and runs each for
# CASCADE_FUZZ_SECONDS (30) from its seed corpus: ctest label `fuzz`. CASCADE_FUZZ=0 skips that.
# The tests' temp files go to <build>/test-tmp, emptied first and removed after a passing run (a
# failing run keeps it, with what the failing tests left there, until the next run). First it
# removes what older suites left in the temp dir and warns when the build dir's disk has less
# than CASCADE_MIN_FREE_GB (4) free.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${CASCADE_BUILD_DIR:-build}

# Suites before 2026-11-28 left their temp dirs in $TMPDIR (or /tmp) after every run (~0.6 GB a
# run): a machine that ran them for long enough filled its disk. Remove those (names only those
# tests made, untouched for an hour, so no test running now loses its files).
stale=$(find "${TMPDIR:-/tmp}" -maxdepth 1 -mmin +60 \( -name 'cascade_model_??????' -o \
  -name 'cascade_cpu_??????' -o -name 'cascade_f32_??????' -o -name 'cascade-it-[0-9]*' -o \
  -name 'cascade-certs-[0-9]*' -o -name 'cascade-engine-cpu-[0-9]*' \) 2>/dev/null | wc -l)
if [ "$stale" -gt 0 ]; then
  echo "test: removing $stale temp dirs that earlier test runs left in ${TMPDIR:-/tmp}"
  find "${TMPDIR:-/tmp}" -maxdepth 1 -mmin +60 \( -name 'cascade_model_??????' -o \
    -name 'cascade_cpu_??????' -o -name 'cascade_f32_??????' -o -name 'cascade-it-[0-9]*' -o \
    -name 'cascade-certs-[0-9]*' -o -name 'cascade-engine-cpu-[0-9]*' \) \
    -exec rm -rf {} + 2>/dev/null || true
fi

# A full disk fails deep inside a build step or a test ("write failed"): say so up front (a
# warning, not a stop: how much a machine needs depends on what is built already).
mkdir -p "$BUILD_DIR"
free_gb=$(df -Pk "$BUILD_DIR" | awk 'NR == 2 { printf "%.1f", $4 / 1048576 }')
if awk -v f="$free_gb" -v min="${CASCADE_MIN_FREE_GB:-4}" 'BEGIN { exit !(f < min) }'; then
  echo "test: WARNING: only $free_gb GB free on $(cd "$BUILD_DIR" && pwd); a fresh build needs" \
    "~3 GB and the tests ~1 GB. If a step fails with 'No space left on device' or 'write" \
    "failed', free some space and rerun." >&2
fi

bash scripts/setup.sh
bash scripts/build.sh
JOBS=${CASCADE_JOBS:-$(nproc)}

# From here on the temp dir is TEST_TMP: $TMPDIR for the test binaries, scripts and the servers
# they start, $TEST_TMPDIR for GoogleTest's ::testing::TempDir() (else /tmp/). Nothing a test
# forgets there outlives the run.
TEST_TMP="$(cd "$BUILD_DIR" && pwd)/test-tmp"
rm -rf "$TEST_TMP"
mkdir -p "$TEST_TMP"
on_exit() {
  local rc=$?
  if [ "$rc" -eq 0 ] || [ -z "$(ls -A "$TEST_TMP" 2>/dev/null)" ]; then
    rm -rf "$TEST_TMP"
  else
    echo "test: what the tests left in the temp dir is in $TEST_TMP (emptied by the next run)" >&2
  fi
}
trap on_exit EXIT
export TMPDIR="$TEST_TMP" TEST_TMPDIR="$TEST_TMP"
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS" "$@")

if [ "${CASCADE_FUZZ:-1}" != 0 ]; then
  FUZZ_DIR=${CASCADE_FUZZ_BUILD_DIR:-build-fuzz}
  if [ ! -f "$FUZZ_DIR/build.ninja" ]; then
    # shellcheck disable=SC2086  # extra cmake args are split on purpose
    cmake -S . -B "$FUZZ_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DCASCADE_FUZZ=ON \
      -DCASCADE_CUDA=OFF -DCASCADE_BUILD_TESTS=OFF -DCASCADE_BUILD_BENCHMARKS=OFF \
      -DCASCADE_FUZZ_SECONDS="${CASCADE_FUZZ_SECONDS:-30}" ${CASCADE_FUZZ_CMAKE_ARGS:-}
  fi
  echo "test: building the fuzz targets in $FUZZ_DIR"
  cmake --build "$FUZZ_DIR" -j "$JOBS" --target gateway_request_fuzz openai_request_fuzz \
    tokenizer_fuzz model_loader_fuzz registry_events_fuzz
  (cd "$FUZZ_DIR" && ctest --output-on-failure -j "$JOBS" -L fuzz)
fi
