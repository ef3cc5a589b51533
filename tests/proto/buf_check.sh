#!/usr/bin/env bash
# Cascade's contracts under buf (buf.yaml at the repository root, module proto/):
#   buf_check.sh lint       `buf lint` (STANDARD) is clean.
#   buf_check.sh breaking   `buf breaking` of proto/ against the committed baseline image
#                           proto/baseline/cascade_v2.binpb finds nothing (see its README).
#   buf_check.sh self-test  the two checks catch what they are for: on a temporary copy of the
#                           tree, a removed field and a changed field type fail `buf breaking`, and
#                           a service renamed without the Service suffix fails `buf lint`; the
#                           unedited copy passes both first.
# buf is the npm package @bufbuild/buf in scripts/node (scripts/setup.sh); all three run offline.
# Fails, never skips, when buf is missing.
set -euo pipefail
ROOT="${CASCADE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
NODE_DIR="${CASCADE_NODE_DIR:-$ROOT/scripts/node}"
BUF="$NODE_DIR/node_modules/.bin/buf"
BASELINE=proto/baseline/cascade_v2.binpb
if [ ! -x "$BUF" ]; then
  echo "buf_check: $BUF is missing; run scripts/setup.sh (it installs @bufbuild/buf with npm)" >&2
  exit 1
fi
# buf keeps a cache (nothing is downloaded: the module has no dependencies); keep it out of $HOME.
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
export BUF_CACHE_DIR="$TMP/cache"

lint() { (cd "$1" && "$BUF" lint); }
breaking() { (cd "$1" && "$BUF" breaking --against "$BASELINE"); }

# Runs `$1` (lint or breaking) in the tree $2 and expects it to fail with a message matching $3.
expect_failure() {
  local out rc=0
  out="$("$1" "$2" 2>&1)" || rc=$?
  if [ "$rc" = 0 ]; then
    echo "FAIL: buf $1 passed on an edit it must reject (wanted: $3)" >&2
    exit 1
  fi
  if ! grep -qE "$3" <<<"$out"; then
    echo "FAIL: buf $1 failed (exit $rc) without the expected finding '$3':" >&2
    echo "$out" >&2
    exit 1
  fi
  echo "ok: buf $1 rejects it: $(grep -E "$3" <<<"$out" | head -1)"
}

# Replaces the exact line $2 of file $1 by $3 (empty: deletes it); fails when the line is absent,
# so an edit that no longer applies cannot make the self-test pass vacuously.
edit_line() {
  python3 - "$1" "$2" "$3" <<'EOF'
import sys
path, old, new = sys.argv[1:]
lines = open(path).read().split("\n")
if lines.count(old) != 1:
    sys.exit(f"self-test: expected exactly one line {old!r} in {path}")
lines[lines.index(old)] = new
open(path, "w").write("\n".join(lines))
EOF
}

# A fresh copy of what buf reads: buf.yaml, proto/ and the baseline.
copy_tree() {
  rm -rf "$1"
  mkdir -p "$1"
  cp "$ROOT/buf.yaml" "$1/"
  cp -r "$ROOT/proto" "$1/proto"
}

case "${1:-}" in
  lint)
    lint "$ROOT"
    echo "ok: buf lint (STANDARD) is clean"
    ;;
  breaking)
    breaking "$ROOT"
    echo "ok: no breaking change against $BASELINE"
    ;;
  self-test)
    copy_tree "$TMP/clean"
    lint "$TMP/clean"
    breaking "$TMP/clean"
    echo "ok: the unedited copy passes lint and breaking"

    copy_tree "$TMP/removed"
    edit_line "$TMP/removed/proto/cascade/v2/gateway.proto" "  string request_id = 5;" ""
    expect_failure breaking "$TMP/removed" \
      'Previously present field "5" with name "request_id" on message "GenerateRequest" was deleted'

    copy_tree "$TMP/retyped"
    edit_line "$TMP/retyped/proto/cascade/v2/worker.proto" "  int64 pin_ttl_seconds = 6;" \
      "  int32 pin_ttl_seconds = 6;"
    expect_failure breaking "$TMP/retyped" \
      'Field "6" with name "pin_ttl_seconds" on message "WorkerServiceGenerateRequest" changed type'

    copy_tree "$TMP/unsuffixed"
    edit_line "$TMP/unsuffixed/proto/cascade/v2/gateway.proto" "service GatewayService {" \
      "service Gateway {"
    expect_failure lint "$TMP/unsuffixed" 'Service name "Gateway" should be suffixed with "Service"'
    ;;
  *)
    echo "usage: $0 lint|breaking|self-test" >&2
    exit 2
    ;;
esac
