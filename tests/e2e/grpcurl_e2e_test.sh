#!/usr/bin/env bash
# End to end, as a user with grpcurl would see it: starts a real stack with `cascade up --port 0`
# (registry, one CPU worker, gateway, from the build's bin/), then runs every command of
# tests/e2e/README_EXAMPLES.sh, and the grpcurl lines `cascade up` itself prints, with grpcurl
# played by tests/e2e/grpcurl.js (it knows the API only through server reflection), and checks
# each output. Any mismatch fails with the command and its output. All servers stop at the end.
#
#   tests/e2e/grpcurl_e2e_test.sh [BIN_DIR]     (default: $CASCADE_BINARY_DIR/bin, else build/bin)
# Registered in ctest as grpcurl_e2e_test (tests/e2e/CMakeLists.txt). KEEP_TMP=1 keeps the logs.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${1:-${CASCADE_BINARY_DIR:+$CASCADE_BINARY_DIR/bin}}"
BIN="${BIN:-$ROOT/build/bin}"
EXAMPLES="$HERE/README_EXAMPLES.sh"
GRPCURL_JS="$HERE/grpcurl.js"
NODE_DIR="${CASCADE_NODE_DIR:-$ROOT/scripts/node}"
START=$SECONDS

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# --- prerequisites: a missing tool is a failure, not a skip ---------------------------------------
command -v node >/dev/null 2>&1 ||
  fail "node is not installed; run scripts/setup.sh (it installs node and the npm packages)"
if ! node -e '
  const req = require("module").createRequire(process.argv[1] + "/package.json");
  for (const m of ["@grpc/grpc-js", "protobufjs", "protobufjs/ext/descriptor"]) req.resolve(m);
' "$NODE_DIR" 2>/dev/null; then
  fail "npm packages @grpc/grpc-js / protobufjs are missing from $NODE_DIR/node_modules; run scripts/setup.sh"
fi
for b in cascade cascade-registry cascade-worker cascade-gateway; do
  [[ -x "$BIN/$b" ]] || fail "$BIN/$b is not built (ninja -C <build> cascade cascade-registry cascade-worker cascade-gateway)"
done
[[ -f "$EXAMPLES" ]] || fail "$EXAMPLES is missing"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/cascade-grpcurl-e2e.XXXXXX")"
UP_PID=""
OK=0

stop_stack() {
  if [[ -n "$UP_PID" ]] && kill -0 "$UP_PID" 2>/dev/null; then
    kill -TERM "$UP_PID" 2>/dev/null # `cascade up` stops its children gracefully on SIGTERM
    for _ in $(seq 1 100); do
      kill -0 "$UP_PID" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$UP_PID" 2>/dev/null
    wait "$UP_PID" 2>/dev/null
  fi
  # Children that outlived it (only if `cascade up` itself was killed): the pids it reported.
  if [[ -f "$TMP/up.err" ]]; then
    for pid in $(sed -n 's/.*(pid \([0-9][0-9]*\),.*/\1/p' "$TMP/up.err"); do
      kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    done
  fi
  UP_PID=""
}

on_exit() {
  stop_stack
  if [[ "$OK" != 1 ]]; then
    echo "--- cascade up stdout/stderr and server logs (tails) ---" >&2
    for f in "$TMP/up.out" "$TMP/up.err" "$TMP"/logs/*.log; do
      [[ -f "$f" ]] && { echo "== $f" >&2; tail -n 20 "$f" >&2; }
    done
  fi
  if [[ "${KEEP_TMP:-0}" == 1 ]]; then echo "kept $TMP" >&2; else rm -rf "$TMP"; fi
}
trap on_exit EXIT
trap 'exit 130' INT TERM

# --- the stack --------------------------------------------------------------------------------
"$BIN/cascade" mkmodel --preset tiny --out "$TMP/model" >"$TMP/mkmodel.log" 2>&1 ||
  fail "cascade mkmodel --preset tiny failed: $(cat "$TMP/mkmodel.log")"

"$BIN/cascade" up --port 0 --registry_port 0 --workers 1 --backend cpu --worker_threads 1 \
  --model_dir "$TMP/model" --log_dir "$TMP/logs" --certs_dir "$TMP/certs" --ready_timeout 40s \
  >"$TMP/up.out" 2>"$TMP/up.err" &
UP_PID=$!
for _ in $(seq 1 450); do
  grep -q '^Ctrl-C stops everything' "$TMP/up.out" 2>/dev/null && break
  kill -0 "$UP_PID" 2>/dev/null || fail "cascade up exited early: $(cat "$TMP/up.err")"
  sleep 0.1
done
grep -q '^Ctrl-C stops everything' "$TMP/up.out" || fail "cascade up printed no ready banner in 45 s"
GATEWAY="$(awk '$1 == "gateway" {print $2; exit}' "$TMP/up.out")"
REGISTRY="$(awk '$1 == "registry" {print $2; exit}' "$TMP/up.out")"
[[ "$GATEWAY" =~ :[0-9]+$ && "$REGISTRY" =~ :[0-9]+$ ]] ||
  fail "cannot read the gateway and registry addresses from cascade up's banner: $(cat "$TMP/up.out")"
echo "stack up in $((SECONDS - START)) s: gateway $GATEWAY, registry $REGISTRY"

# --- running a documented command ---------------------------------------------------------------
# run NAME COMMAND: runs COMMAND (a grpcurl line) with grpcurl.js; sets RC, OUT_FILE, ERR_FILE.
run() {
  local name="$1" line="$2"
  local cmd="node \"$GRPCURL_JS\"${line#grpcurl}"
  cmd="${cmd//localhost:50051/$GATEWAY}"
  cmd="${cmd//localhost:50052/$REGISTRY}"
  cmd="${cmd//\/tmp\/cascade-certs/$TMP/certs}"
  CMD="$line"
  OUT_FILE="$TMP/$name.out"
  ERR_FILE="$TMP/$name.err"
  timeout 30 bash -c "$cmd" >"$OUT_FILE" 2>"$ERR_FILE"
  RC=$?
}

mismatch() {
  {
    echo "FAIL: $CURRENT: $*"
    echo "  command: $CMD"
    echo "  exit status: $RC"
    echo "  --- stdout ---"
    sed 's/^/  /' "$OUT_FILE"
    echo "  --- stderr ---"
    sed 's/^/  /' "$ERR_FILE"
  } >&2
  exit 1
}

# expect_js DESCRIPTION JS: JS is an expression, or a function body ending in `return EXPR;`,
# over `msgs` (the printed JSON messages, in order), `out`, `err` (texts) and `rc`; it must be true.
expect_js() {
  local what="$1" js="$2"
  RC="$RC" node -e '
    const fs = require("fs");
    const [outFile, errFile, js] = process.argv.slice(1);
    const out = fs.readFileSync(outFile, "utf8");
    const err = fs.readFileSync(errFile, "utf8");
    let ok = false;
    try {
      const msgs = out.split(/^(?=\{)/m).filter((s) => s.trim()).map((s) => JSON.parse(s));
      const body = /\breturn\b/.test(js) ? js : `return (${js});`;
      ok = !!new Function("msgs", "out", "err", "rc", "require", body)(
          msgs, out, err, Number(process.env.RC), require);
    } catch (e) {
      console.error(String(e));
    }
    process.exit(ok ? 0 : 1);
  ' "$OUT_FILE" "$ERR_FILE" "$js" || mismatch "expected $what"
}

expect_rc() {
  [[ "$RC" == "$1" ]] || mismatch "expected exit status $1"
}

# --- the documented examples ----------------------------------------------------------------------
declare -A EXAMPLE
ORDER=()
while IFS= read -r header; do
  name="${header#\#\# }"
  name="${name%%:*}"
  IFS= read -r line || line=""
  [[ "$line" == grpcurl\ * ]] || fail "README_EXAMPLES.sh: '## $name' is not followed by a grpcurl line"
  [[ -z "${EXAMPLE[$name]+x}" ]] || fail "README_EXAMPLES.sh: example '$name' appears twice"
  EXAMPLE[$name]="$line"
  ORDER+=("$name")
done < <(grep -A1 '^## ' "$EXAMPLES" | grep -v '^--$')

for name in list describe health list-models tokenize generate generate-again invalid \
  list-chunks list-workers registry-needs-a-certificate; do
  [[ -n "${EXAMPLE[$name]+x}" ]] || fail "README_EXAMPLES.sh has no '## $name' example"
done

GENERATE_TOKENS='msgs.filter((m) => m.delta).flatMap((m) => m.delta.tokenIds || [])'
for name in "${ORDER[@]}"; do
  CURRENT="$name"
  run "$name" "${EXAMPLE[$name]}"
  case "$name" in
    list)
      expect_rc 0
      for svc in cascade.v2.GatewayService grpc.health.v1.Health grpc.reflection.v1alpha.ServerReflection; do
        grep -qx "$svc" "$OUT_FILE" || mismatch "expected a line '$svc'"
      done
      ;;
    describe)
      expect_rc 0
      grep -qx 'cascade.v2.GatewayService is a service:' "$OUT_FILE" || mismatch "expected 'cascade.v2.GatewayService is a service:'"
      for rpc in \
        'rpc Generate ( .cascade.v2.GenerateRequest ) returns ( stream .cascade.v2.GenerateResponse );' \
        'rpc Chat ( stream .cascade.v2.ChatRequest ) returns ( stream .cascade.v2.ChatResponse );' \
        'rpc Tokenize ( .cascade.v2.TokenizeRequest ) returns ( .cascade.v2.TokenizeResponse );' \
        'rpc ListModels ( .cascade.v2.ListModelsRequest ) returns ( .cascade.v2.ListModelsResponse );'; do
        grep -qxF "  $rpc" "$OUT_FILE" || mismatch "expected the line '  $rpc'"
      done
      ;;
    health)
      expect_rc 0
      expect_js 'exactly {"status": "SERVING"}' 'msgs && msgs.length === 1 && JSON.stringify(msgs[0]) === "{\"status\":\"SERVING\"}"'
      ;;
    list-models)
      expect_rc 0
      expect_js 'one model with a name, maxContext, vocabSize and workers >= 1' \
        'msgs.length === 1 && msgs[0].models.length === 1 && msgs[0].models[0].name &&
         Number(msgs[0].models[0].maxContext) > 0 && msgs[0].models[0].vocabSize > 0 &&
         msgs[0].models[0].workers >= 1'
      ;;
    tokenize)
      expect_rc 0
      expect_js 'a non-empty tokenIds list of integers' \
        'msgs.length === 1 && msgs[0].tokenIds.length > 0 && msgs[0].tokenIds.every(Number.isInteger)'
      ;;
    generate | generate-again)
      expect_rc 0
      expect_js 'a start, then deltas, then a finish (nothing else)' \
        'msgs.length >= 3 && Object.keys(msgs[0]).join() === "start" &&
         Object.keys(msgs[msgs.length - 1]).join() === "finish" &&
         msgs.slice(1, -1).every((m) => Object.keys(m).join() === "delta")'
      expect_js 'a start with requestId, workerId, promptTokens and the 3 chunks (system, query, generation prompt)' \
        'const s = msgs[0].start; return s.requestId && s.workerId && Number(s.promptTokens) > 0 &&
         s.chunks.map((c) => c.kind).join() === "CHUNK_KIND_SYSTEM,CHUNK_KIND_QUERY,CHUNK_KIND_GENERATION_PROMPT" &&
         s.chunks[2].end === s.promptTokens;'
      expect_js 'a finish whose usage counts the streamed tokens (1..8)' \
        'const f = msgs[msgs.length - 1].finish; const n = ('"$GENERATE_TOKENS"').length;
         return f.finishReason && f.finishReason.startsWith("FINISH_REASON_") && n >= 1 && n <= 8 &&
         Number(f.usage.completionTokens) === n && f.usage.promptTokens === msgs[0].start.promptTokens;'
      if [[ "$name" == generate ]]; then
        cp "$OUT_FILE" "$TMP/first-generate.json"
      else
        expect_js 'start.cachedTokens > 0 (the first request cached the prompt)' \
          'Number(msgs[0].start.cachedTokens) > 0 && Number(msgs[msgs.length - 1].finish.usage.cachedTokens) > 0'
        FIRST="$TMP/first-generate.json" expect_js 'the same tokens as the first (cold) request' \
          'const first = require("fs").readFileSync(process.env.FIRST, "utf8").split(/^(?=\{)/m)
             .filter((s) => s.trim()).map((s) => JSON.parse(s));
           const tokens = (msgs) => '"$GENERATE_TOKENS"';
           return JSON.stringify(tokens(first)) === JSON.stringify(tokens(msgs));'
      fi
      ;;
    invalid)
      expect_rc 67
      grep -q '^  Code: InvalidArgument$' "$ERR_FILE" || mismatch "expected '  Code: InvalidArgument' on stderr"
      grep -q '^  Message: .*max_tokens' "$ERR_FILE" || mismatch "expected a message naming max_tokens"
      [[ ! -s "$OUT_FILE" ]] || mismatch "expected no response messages"
      ;;
    score)
      expect_rc 0
      expect_js "the prompt's first token in the start, then every other prompt token scored once (logprob <= 0, rank >= 1, one top token), computed (cachedTokens 0), then one generated token" \
        'const s = msgs[0].start; const n = Number(s.promptTokens);
         const lps = msgs.filter((m) => m.delta).flatMap((m) => m.delta.promptLogprobs || []);
         return s.firstPromptToken && Number.isInteger(s.firstPromptToken.tokenId) && n > 1 &&
           Number(s.cachedTokens || 0) === 0 && lps.length === n - 1 &&
           lps.every((e) => e.sampled.logprob <= 0 && e.rank >= 1 && e.top.length === 1) &&
           ('"$GENERATE_TOKENS"').length === 1;'
      ;;
    list-chunks)
      expect_rc 0
      expect_js "the prompt's system, query and generation-prompt chunks, one held by worker-0" \
        'const cs = msgs[0].chunks; const kinds = new Set(cs.map((c) => c.kind));
         return ["CHUNK_KIND_SYSTEM", "CHUNK_KIND_QUERY", "CHUNK_KIND_GENERATION_PROMPT"].every((k) => kinds.has(k)) &&
         cs.some((c) => (c.holders || []).some((h) => h.workerId === "worker-0" && Number(h.heldTokens) > 0)) &&
         cs.every((c) => /^[0-9a-f]{32}$/.test(c.hash));'
      ;;
    list-workers)
      expect_rc 0
      expect_js 'one live worker with an address, its load and its KV numerics' \
        'const ws = msgs[0].workers; return ws.length === 1 && ws[0].workerId && ws[0].address &&
         Number(ws[0].load.totalKvBlocks) > 0 && ws[0].kvNumerics === "cpu";'
      ;;
    registry-needs-a-certificate)
      expect_rc 1
      grep -q 'Unauthenticated: internal RPCs need a client certificate' "$ERR_FILE" ||
        mismatch "expected Unauthenticated asking for a client certificate on stderr"
      [[ ! -s "$OUT_FILE" ]] || mismatch "expected no output"
      ;;
    *)
      expect_rc 0 # a documented example this test has no specific check for must at least succeed
      ;;
  esac
  echo "ok   $name  ($(grep -c '' "$OUT_FILE") lines)"
done

# --- the grpcurl lines `cascade up` prints under "Try:" work too ----------------------------------
n=0
while IFS= read -r line; do
  n=$((n + 1))
  CURRENT="cascade-up-example-$n"
  # They name the real port already; make the substitution in run() a no-op.
  run "$CURRENT" "$line"
  expect_rc 0
  [[ -s "$OUT_FILE" ]] || mismatch "expected some output"
  if [[ "$line" == *Gateway/Generate* ]]; then
    expect_js 'a start, deltas and a finish' \
      'msgs[0].start && msgs.some((m) => m.delta) && msgs[msgs.length - 1].finish'
  fi
  echo "ok   $CURRENT"
done < <(sed -n 's/^ *\(grpcurl .*\)$/\1/p' "$TMP/up.out")
((n >= 2)) || fail "cascade up printed $n grpcurl examples; expected at least 2"

stop_stack
OK=1
echo "PASS: ${#ORDER[@]} documented examples and $n printed by cascade up, in $((SECONDS - START)) s"
