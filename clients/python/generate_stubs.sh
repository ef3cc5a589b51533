#!/usr/bin/env bash
# Generates the Python gRPC stubs of Cascade's public API (cascade.v2: gateway.proto, common.proto)
# with Debian's protoc and grpc_python_plugin (packages protobuf-compiler, protobuf-compiler-grpc),
# matching Debian's python3-grpcio and python3-protobuf.
#   bash clients/python/generate_stubs.sh [OUT_DIR]     (default: clients/python/gen)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="${1:-$HERE/gen}"
PLUGIN="$(command -v grpc_python_plugin || true)"
[[ -n "$PLUGIN" ]] || { echo "grpc_python_plugin not found: apt-get install protobuf-compiler-grpc" >&2; exit 1; }
mkdir -p "$OUT"
protoc -I "$ROOT/proto" --python_out="$OUT" --grpc_python_out="$OUT" \
  --plugin=protoc-gen-grpc_python="$PLUGIN" \
  "$ROOT/proto/cascade/v2/common.proto" "$ROOT/proto/cascade/v2/gateway.proto"
echo "stubs in $OUT (import cascade.v2.gateway_pb2, cascade.v2.gateway_pb2_grpc)"
