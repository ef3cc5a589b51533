#!/usr/bin/env bash
# Configures and builds Cascade into build/ (binaries in build/bin). Extra args go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${CASCADE_BUILD_DIR:-build}
JOBS=${CASCADE_JOBS:-$(nproc)}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja "$@"
elif [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" "$@"
fi
echo "build: compiling with $JOBS jobs (first build takes a few minutes on 2 cores)"
cmake --build "$BUILD_DIR" -j "$JOBS"
