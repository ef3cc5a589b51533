#!/usr/bin/env bash
# Runs a command with TMPDIR set to a fresh directory that is removed after it, pass or fail, so
# what the command keeps in the temp dir (the benchmarks cache their generated model there) does
# not outlive the test, and tests running at once do not share it. Exits with the command's status.
#   in_scratch_tmpdir.sh COMMAND [ARGS...]
set -uo pipefail
scratch="$(mktemp -d "${TMPDIR:-/tmp}/cascade-scratch.XXXXXX")" || exit 1
trap 'rm -rf "$scratch"' EXIT
TMPDIR="$scratch" "$@"
