#!/usr/bin/env bash
# End to end with the clients OpenAI users hold: starts `cascade up --http_port` (registry, one CPU
# worker, gateway with its OpenAI HTTP front) from the build's bin/, then runs curl and the
# official `openai` npm client (tests/e2e/openai_client.js) against it. Fails, never skips, when
# node, curl or the npm package is missing (scripts/setup.sh installs them).
#   tests/e2e/openai_e2e_test.sh [BIN_DIR]
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${1:-${CASCADE_BINARY_DIR:+$CASCADE_BINARY_DIR/bin}}"
BIN="${BIN:-$ROOT/build/bin}"
NODE_DIR="${CASCADE_NODE_DIR:-$ROOT/scripts/node}"
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v node >/dev/null 2>&1 || fail "node is not installed; run scripts/setup.sh"
command -v curl >/dev/null 2>&1 || fail "curl is not installed; run scripts/setup.sh"
node -e 'require(require.resolve("openai", {paths: [process.argv[1]]}))' "$NODE_DIR" 2>/dev/null ||
  fail "the npm package openai is missing from $NODE_DIR/node_modules; run scripts/setup.sh"
for b in cascade cascade-registry cascade-worker cascade-gateway; do
  [[ -x "$BIN/$b" ]] || fail "$BIN/$b is not built"
done

TMP="$(mktemp -d "${TMPDIR:-/tmp}/cascade-openai-e2e.XXXXXX")"
. "$HERE/up_stack.sh"

BASE="http://127.0.0.1:$HTTP_PORT/v1"
# curl, as the README shows it.
out="$(curl -sS "$BASE/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}')" ||
  fail "curl chat failed"
echo "$out" | grep -q '"object":"chat.completion"' || fail "curl chat: unexpected body: $out"
echo "ok: curl chat.completion"
# Qwen3's enable_thinking=false through vLLM's chat_template_kwargs: the same chat, its
# generation prompt four tokens longer (the empty think block).
pt() { sed -E 's/.*"prompt_tokens":([0-9]+).*/\1/' <<<"$1"; }
nothink="$(curl -sS "$BASE/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0,
       "chat_template_kwargs": {"enable_thinking": false}}')" || fail "curl chat without thinking failed"
[[ "$(pt "$nothink")" == "$(( $(pt "$out") + 4 ))" ]] ||
  fail "enable_thinking=false: prompt_tokens $(pt "$nothink"), want $(pt "$out") + 4: $nothink"
echo "ok: curl chat_template_kwargs.enable_thinking=false adds the empty think block"
code="$(curl -sS -o "$TMP/err.json" -w '%{http_code}' "$BASE/completions" \
  -H 'Content-Type: application/json' -d '{"prompt": "Hi", "top_p": 5}')"
[[ "$code" == 400 ]] || fail "curl bad top_p: HTTP $code, want 400"
grep -q '"invalid_request_error"' "$TMP/err.json" || fail "curl bad top_p: $(cat "$TMP/err.json")"
echo "ok: curl bad input is a 400 invalid_request_error"
sse="$(curl -sSN "$BASE/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "Hi", "max_tokens": 3, "stream": true}')" || fail "curl stream failed"
echo "$sse" | tail -n 2 | grep -q '^data: \[DONE\]' || fail "curl stream does not end in [DONE]: $sse"
echo "ok: curl stream ends in data: [DONE]"

# echo: a token-id prompt ("Hello there" in Qwen3's vocabulary) comes back decoded before the
# completion, through the gateway's own tokenizer.
out="$(curl -sS "$BASE/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": [9707, 1052], "max_tokens": 2, "temperature": 0, "echo": true}')" ||
  fail "curl echo failed"
echo "$out" | grep -q '"text":"Hello there' || fail "curl echo: the prompt is not echoed: $out"
echo "ok: curl echo of a token-id prompt"
# min_tokens (vLLM's): accepted and passed to the worker (4 of 4 tokens, EOS held off); one above
# max_tokens is the gateway's 400 naming the field.
out="$(curl -sS "$BASE/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "Hi", "max_tokens": 4, "min_tokens": 4, "temperature": 0}')" ||
  fail "curl min_tokens failed"
echo "$out" | grep -q '"completion_tokens":4' || fail "curl min_tokens: not 4 tokens: $out"
code="$(curl -sS -o "$TMP/err.json" -w '%{http_code}' "$BASE/completions" \
  -H 'Content-Type: application/json' -d '{"prompt": "Hi", "max_tokens": 2, "min_tokens": 3}')"
[[ "$code" == 400 ]] || fail "curl min_tokens above max_tokens: HTTP $code, want 400"
grep -q 'min_tokens' "$TMP/err.json" || fail "curl min_tokens above max_tokens: $(cat "$TMP/err.json")"
echo "ok: curl min_tokens"

node "$HERE/openai_client.js" "$BASE" "$NODE_DIR" || fail "the openai client checks failed"
echo "openai_e2e_test: passed"
