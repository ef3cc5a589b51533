#!/usr/bin/env bash
# Runs the soak (bench/soak/README.md): builds what it needs, refuses to start while a build is
# running on this machine (CPU contention would distort the latency figures; --force to go on),
# and writes the report to bench/soak/last_run.md as well as stdout.
# Usage: bash bench/soak/run_soak.sh [--force] [cascade-soak flags, e.g. --duration=3m]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${CASCADE_BUILD_DIR:-build}
force=0
if [[ ${1:-} == --force ]]; then force=1; shift; fi
cmake --build "$BUILD_DIR" --target cascade-soak cascade cascade-registry cascade-worker \
  cascade-gateway >/dev/null
if [[ $force -eq 0 ]] && pgrep -x ninja >/dev/null; then
  echo "run_soak.sh: a build (ninja) is running; wait for it or pass --force" >&2
  exit 2
fi
"$BUILD_DIR/bench/cascade-soak" "$@" | tee bench/soak/last_run.md
exit "${PIPESTATUS[0]}"
