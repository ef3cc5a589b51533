#!/usr/bin/env bash
# Bounded libFuzzer run for ctest: FUZZER CORPUS_DIR SECONDS [extra libFuzzer flags].
# The seed corpus is copied to a scratch dir (the repo's stays as committed); a crash leaves its
# input next to the log in the scratch dir, which is kept and printed on failure.
set -euo pipefail
fuzzer=$1 corpus=$2 seconds=$3
shift 3
work=$(mktemp -d "${TMPDIR:-/tmp}/cascade-$(basename "$fuzzer").XXXXXX")
mkdir -p "$work/corpus"
cp -r "$corpus"/. "$work/corpus/"
set +e
# TMPDIR: scratch files a target writes (model_loader_fuzz) go with the rest.
TMPDIR="$work" "$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
  -print_final_stats=1 -artifact_prefix="$work/" "$@" "$work/corpus" >"$work/log" 2>&1
rc=$?
set -e
grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|Done [0-9]+ runs)" "$work/log" || true
if [ $rc -ne 0 ]; then
  tail -n 60 "$work/log"
  echo "run_fuzz: $(basename "$fuzzer") failed (exit $rc); input and log kept in $work"
  ls "$work" | grep -E "^(crash|leak|timeout|oom)-" || true
  exit $rc
fi
rm -rf "$work"
