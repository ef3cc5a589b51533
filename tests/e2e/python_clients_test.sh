#!/usr/bin/env bash
# The Python examples (clients/python) against a live `cascade up --http_port`: the gRPC client on
# stubs generated from proto/ with Debian's protoc + grpc_python_plugin, run by Debian's python3
# with python3-grpcio and python3-protobuf, and the plain-HTTP OpenAI client. Fails, never skips,
# when a package is missing (scripts/setup.sh installs them).
#   tests/e2e/python_clients_test.sh [BIN_DIR]
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${1:-${CASCADE_BINARY_DIR:+$CASCADE_BINARY_DIR/bin}}"
BIN="${BIN:-$ROOT/build/bin}"
PY=/usr/bin/python3  # Debian's, where python3-grpcio lives (not a pyenv or venv python)
fail() { echo "FAIL: $*" >&2; exit 1; }
[[ -x "$PY" ]] || fail "$PY is missing; apt-get install python3"
"$PY" -c 'import grpc, google.protobuf' 2>/dev/null ||
  fail "python3-grpcio / python3-protobuf are missing; run scripts/setup.sh"
for b in cascade cascade-registry cascade-worker cascade-gateway; do
  [[ -x "$BIN/$b" ]] || fail "$BIN/$b is not built"
done
TMP="$(mktemp -d "${TMPDIR:-/tmp}/cascade-python-e2e.XXXXXX")"
. "$HERE/up_stack.sh"  # from here on, exiting removes $TMP
bash "$ROOT/clients/python/generate_stubs.sh" "$TMP/stubs" >/dev/null || fail "generating the stubs failed"
"$PY" "$ROOT/clients/python/cascade_client.py" --gateway "$GATEWAY" --stubs "$TMP/stubs" ||
  fail "clients/python/cascade_client.py failed"
"$PY" "$ROOT/clients/python/openai_http_client.py" --base "http://127.0.0.1:$HTTP_PORT/v1" ||
  fail "clients/python/openai_http_client.py failed"
echo "python_clients_test: passed"
