# Sourced by the e2e tests: starts `cascade up` (one CPU worker, free ports, the OpenAI HTTP front
# on a free port too) from $BIN with logs under $TMP, waits for its banner, stops it on exit, and
# sets GATEWAY to the gateway's host:port and HTTP_PORT to the HTTP front's port, both read from
# the banner (a port picked by the test and released before the stack bound it could be taken
# meanwhile). Needs BIN, TMP and a fail() function.
"$BIN/cascade" up --port 0 --registry_port 0 --http_port 0 --log_dir "$TMP/logs" \
  >"$TMP/up.out" 2>"$TMP/up.err" &
UP_PID=$!
cleanup() {
  local status=$?
  if [[ $status -ne 0 ]]; then  # what the stack said, for a failure seen only in CI
    for f in "$TMP/up.err" "$TMP"/logs/*.log; do
      [[ -s "$f" ]] && { echo "--- last lines of $f" >&2; tail -n 30 "$f" >&2; }
    done
  fi
  kill -TERM "$UP_PID" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$UP_PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$UP_PID" 2>/dev/null
  [[ -n "${KEEP_TMP:-}" ]] || rm -rf "$TMP"
}
trap cleanup EXIT
for _ in $(seq 1 600); do
  grep -q "Ctrl-C stops everything" "$TMP/up.out" 2>/dev/null && break
  kill -0 "$UP_PID" 2>/dev/null || { cat "$TMP/up.err"; fail "cascade up exited"; }
  sleep 0.1
done
grep -q "Ctrl-C stops everything" "$TMP/up.out" || { cat "$TMP/up.err"; fail "cascade up did not come up in 60 s"; }
GATEWAY="$(sed -n 's/^  gateway   \([^ ]*\) .*/\1/p' "$TMP/up.out" | head -n 1)"
[[ -n "$GATEWAY" ]] || { cat "$TMP/up.out"; fail "no gateway address in the banner"; }
HTTP_PORT="$(sed -n 's|.*OpenAI API at http://localhost:\([0-9]*\)/v1.*|\1|p' "$TMP/up.out" | head -n 1)"
[[ -n "$HTTP_PORT" ]] || { cat "$TMP/up.out"; fail "no OpenAI API address in the banner"; }
