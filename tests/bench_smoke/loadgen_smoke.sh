#!/usr/bin/env bash
# Smoke test of cascade-loadgen: --local mode with 1 s per phase (the time bound) must exit 0, print the phase
# table with a miss and a hit row and the ratio table, and the hit phase must really be served
# from cache (cached fraction > 0.5) while the miss phase is not (< 0.5). A non-loopback
# --gateway must be refused with exit code 2, and so must bad --qps / --route_policies values.
# Usage: loadgen_smoke.sh LOADGEN BIN_DIR WORK_DIR
set -uo pipefail
loadgen=$1 bin_dir=$2 work=$3
mkdir -p "$work"
out=$work/stdout.txt err=$work/stderr.txt

fail() { echo "FAIL: $*"; echo "--- stdout"; cat "$out"; echo "--- stderr (tail)"; tail -n 40 "$err"; exit 1; }

timeout 150 "$loadgen" --local --bin_dir="$bin_dir" --model_dir="$work/tiny" --workers=1 \
  --concurrency=2 --duration=1s --max_requests=500 --max_tokens=4 --system_words=150 \
  --warmup_requests=1 --progress_interval=500ms --request_timeout=30s >"$out" 2>"$err"
rc=$?
[[ $rc -eq 0 ]] || fail "cascade-loadgen exited $rc"
grep -q '^| conc | workload | requests' "$out" || fail "no phase table header"
grep -q '^hit / miss' "$out" || fail "no hit/miss ratio table"
grep -q 'finished' "$err" || fail "no progress line on stderr"

# Column 9 (with the empty field before the first '|') is the cached fraction; 5 is ok requests.
row() { awk -F'|' -v w=" $1 " '$3 == w { print $'"$2"' }' "$out" | tr -d ' '; }
miss_ok=$(row miss 5) hit_ok=$(row hit 5) miss_frac=$(row miss 9) hit_frac=$(row hit 9)
[[ -n $miss_ok && $miss_ok -gt 0 ]] || fail "miss phase: no ok request ('$miss_ok')"
[[ -n $hit_ok && $hit_ok -gt 0 ]] || fail "hit phase: no ok request ('$hit_ok')"
awk -v f="$hit_frac" 'BEGIN { exit !(f > 0.5) }' || fail "hit cached fraction $hit_frac <= 0.5"
awk -v f="$miss_frac" 'BEGIN { exit !(f < 0.5) }' || fail "miss cached fraction $miss_frac >= 0.5"

"$loadgen" --gateway=10.1.2.3:50051 >/dev/null 2>"$work/refused.txt"
rc=$?
[[ $rc -eq 2 ]] || fail "non-loopback --gateway: exit $rc, want 2"
grep -q 'loopback' "$work/refused.txt" || fail "non-loopback --gateway: no explanation"
# Bad cluster-benchmark flags: exit 2 with a message naming the flag, before anything starts.
bad_flag() {  # bad_flag WANT_TEXT ARGS...
  local want=$1
  shift
  "$loadgen" --local --bin_dir="$bin_dir" "$@" >/dev/null 2>"$work/bad.txt"
  local code=$?
  [[ $code -eq 2 ]] || fail "$*: exit $code, want 2 ($(cat "$work/bad.txt"))"
  grep -q -- "$want" "$work/bad.txt" || fail "$*: no '$want' in: $(cat "$work/bad.txt")"
}
bad_flag "--qps: 'abc' is not a rate" --qps=abc
bad_flag "--qps: '0' is not a rate" --qps=1,0
bad_flag "--qps: '-2' is not a rate" --qps=-2
bad_flag "--qps: '1e9' is not a rate" --qps=1e9
bad_flag "--route_policies: 'fastest'" --qps=1 --route_policies=cost,fastest
bad_flag "--route_policies: none given" --qps=1 --route_policies=,
echo "PASS: miss ok=$miss_ok frac=$miss_frac, hit ok=$hit_ok frac=$hit_frac"
