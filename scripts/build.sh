#!/usr/bin/env bash
# Configures and builds Cascade into build/ (binaries in build/bin). Extra args go to cmake.
# CASCADE_BUILD_DIR, CASCADE_JOBS and CASCADE_TARGETS adjust where, how wide and what.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${CASCADE_BUILD_DIR:-build}
JOBS=${CASCADE_JOBS:-$(nproc)}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja "$@"
elif [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" "$@"
fi
# CASCADE_TARGETS="a b": build only these (the demo builds its four binaries, no test targets).
TARGETS=()
[ -n "${CASCADE_TARGETS:-}" ] && TARGETS=(--target ${CASCADE_TARGETS})
echo "build: compiling ${CASCADE_TARGETS:-everything} with $JOBS jobs (a first build takes a few minutes on 2 cores)"
cmake --build "$BUILD_DIR" -j "$JOBS" "${TARGETS[@]}"
