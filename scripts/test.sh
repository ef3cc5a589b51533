#!/usr/bin/env bash
# The test suite: installs what is missing, builds, runs every ctest test (GPU tests skip
# themselves where there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd "${CASCADE_BUILD_DIR:-build}"
ctest --output-on-failure -j "${CASCADE_JOBS:-$(nproc)}" "$@"
