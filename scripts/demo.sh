#!/usr/bin/env bash
# The main job: installs what is missing, builds, then `cascade demo` starts a registry, workers
# and a gateway on loopback and streams real requests through them. Extra args go to `cascade demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what the demo runs: no fuzzing toolchain, no test or benchmark targets (scripts/test.sh
# builds those).
CASCADE_FUZZ=0 bash scripts/setup.sh
CASCADE_TARGETS="cascade cascade-registry cascade-worker cascade-gateway" bash scripts/build.sh
exec "${CASCADE_BUILD_DIR:-build}/bin/cascade" demo "$@"
