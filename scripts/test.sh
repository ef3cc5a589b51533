#!/usr/bin/env bash
# The test suite: installs what is missing, builds, runs every ctest test (GPU tests skip
# themselves where there is no GPU), then builds the libFuzzer targets in their own build dir
# (clang, ASan + UBSan, CUDA, tests and benchmarks off, only the fuzz targets) and runs each for
# CASCADE_FUZZ_SECONDS (30) from its seed corpus: ctest label `fuzz`. CASCADE_FUZZ=0 skips that.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
JOBS=${CASCADE_JOBS:-$(nproc)}
(cd "${CASCADE_BUILD_DIR:-build}" && ctest --output-on-failure -j "$JOBS" "$@")

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
  cmake --build "$FUZZ_DIR" -j "$JOBS" --target gateway_request_fuzz tokenizer_fuzz \
    model_loader_fuzz registry_events_fuzz
  (cd "$FUZZ_DIR" && ctest --output-on-failure -j "$JOBS" -L fuzz)
fi
