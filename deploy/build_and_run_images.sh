#!/usr/bin/env bash
# Opt-in (not in ctest): builds the CPU images of deploy/Dockerfile with buildah, starts registry,
# a CPU worker and the gateway from them, sends Generate requests through the containerized
# gateway with the cli image's `cascade generate`, checks the answers, and removes what it started.
# Needs root, buildah, podman (import only) and debootstrap; see deploy/IMAGES.md for a recorded run
# and for why the servers run under `buildah run --isolation chroot` rather than `podman run`.
#
#   deploy/build_and_run_images.sh            # all steps
#   CASCADE_IMG_STEPS="run" deploy/...        # only some of: base build run
#
# Environment: CASCADE_JOBS (compile jobs, default 2), CASCADE_NICE (default 19),
# CASCADE_BASE_IMAGE (default localhost/debian:bookworm, made with debootstrap when absent),
# CASCADE_BUILD_CA (a PEM bundle the build's npm trusts; default $NODE_EXTRA_CA_CERTS),
# CASCADE_IMAGE_TAG (default dev), CASCADE_IMG_PORT_BASE (default 45000: registry +51,
# gateway +52, worker +61, metrics +90..+92). The images stay (a re-run reuses the cached layers);
# CASCADE_IMG_KEEP=0 removes them at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=${CASCADE_IMG_STEPS:-base build run}
JOBS=${CASCADE_JOBS:-2}
NICE=${CASCADE_NICE:-19}
BASE=${CASCADE_BASE_IMAGE:-localhost/debian:bookworm}
TAG=${CASCADE_IMAGE_TAG:-dev}
PB=${CASCADE_IMG_PORT_BASE:-45000}
REG_PORT=$((PB + 51)) GW_PORT=$((PB + 52)) WK_PORT=$((PB + 61))
REG_METRICS=$((PB + 90)) WK_METRICS=$((PB + 91)) GW_METRICS=$((PB + 92))
TARGETS=(registry gateway worker-cpu cli)
RUN_DIR=$(mktemp -d /tmp/cascade-images.XXXXXX)
T0=$SECONDS
trap 'rm -rf "$RUN_DIR"' EXIT

log() { printf '[%s +%4ds] %s\n' "$(date +%H:%M:%S)" $((SECONDS - T0)) "$*"; }
has_step() { [[ " $STEPS " == *" $1 "* ]]; }
image_exists() { buildah inspect --type image "$1" >/dev/null 2>&1; }

[ "$(id -u)" = 0 ] || { echo "run as root (buildah chroot isolation, debootstrap)"; exit 1; }
for c in buildah podman; do
  command -v $c >/dev/null || { echo "missing $c: apt-get install buildah podman"; exit 1; }
done
log "buildah $(buildah --version | awk '{print $3}'), podman $(podman --version | awk '{print $3}'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- 1. base image: Debian bookworm minbase, imported (no image registry is reachable) ----
if has_step base; then
  if image_exists "$BASE"; then
    log "base: $BASE present"
  else
    command -v debootstrap >/dev/null || { echo "missing debootstrap: apt-get install debootstrap"; exit 1; }
    log "base: debootstrap --variant=minbase bookworm -> $BASE"
    t=$SECONDS
    nice -n "$NICE" debootstrap --variant=minbase bookworm "$RUN_DIR/rootfs" http://deb.debian.org/debian \
      >"$RUN_DIR/debootstrap.log" 2>&1 || { tail -20 "$RUN_DIR/debootstrap.log"; exit 1; }
    tar -C "$RUN_DIR/rootfs" -c . | podman import - "$BASE" >/dev/null
    rm -rf "$RUN_DIR/rootfs"
    log "base: made in $((SECONDS - t))s"
  fi
fi

# ---- 2. images: one buildah bud per target; --layers caches the build stage, so the project
# compiles once (the first target) and the other targets reuse that stage's layers. ----
if has_step build; then
  # A TLS-intercepting egress proxy (this machine has one): the build's npm must trust its CA.
  CA=${CASCADE_BUILD_CA:-${NODE_EXTRA_CA_CERTS:-}}
  CA_ARGS=()
  if [ -n "$CA" ] && [ -f "$CA" ]; then
    CA_ARGS=(-v "$CA:/etc/ssl/build-ca.pem:ro" --build-arg NODE_EXTRA_CA_CERTS=/etc/ssl/build-ca.pem)
    log "build: npm in the build trusts $CA (mounted, not copied into any layer)"
  fi
  for target in "${TARGETS[@]}"; do
    log "build: cascade/$target:$TAG (nice $NICE, CASCADE_JOBS=$JOBS)"
    t=$SECONDS
    nice -n "$NICE" buildah bud --layers --isolation chroot \
      --ignorefile deploy/Dockerfile.dockerignore \
      --build-arg DEBIAN_IMAGE="$BASE" --build-arg CASCADE_JOBS="$JOBS" "${CA_ARGS[@]}" \
      -f deploy/Dockerfile --target "$target" -t "localhost/cascade/$target:$TAG" . 2>&1 |
      sed -u 's/^/  | /' || { log "build: cascade/$target FAILED"; exit 1; }
    log "build: cascade/$target:$TAG done in $((SECONDS - t))s"
  done
  log "images:"
  buildah images --format '{{.Name}}:{{.Tag}}  {{.Size}}' | grep -E 'cascade/|debian' | sed 's/^/  /'
fi

# ---- 3. run: registry, one CPU worker and the gateway, each its own container (podman run, runc),
# on podman's default bridge network like pods on a cluster network, with the manifests' flags ----
if has_step run; then
  command -v runc >/dev/null || { echo "missing runc: apt-get install runc (crun fails here, see deploy/IMAGES.md)"; exit 1; }
  # Why runc and explicit ulimits (deploy/IMAGES.md): without CAP_SYS_RESOURCE no process may raise
  # a hard rlimit, and podman's default nofile (1048576) is above the host's hard limit; nproc must
  # stay <= 32768, the limit podman's runtime process runs under. crun refuses this host's cgroup
  # layout (v1 hierarchies plus a v2 mount holding a controller, hugetlb) whatever the flags.
  PODMAN_RUN=(podman run --runtime runc --ulimit nofile=20000:20000 --ulimit nproc=32768:32768)
  CTRS=()
  cleanup() {
    for c in "${CTRS[@]}"; do podman rm -f -t 5 "$c" >/dev/null 2>&1 || true; done
    rm -rf "$RUN_DIR"
  }
  trap cleanup EXIT
  ip_of() { podman inspect -f '{{.NetworkSettings.IPAddress}}' "$1"; }
  wait_log() {  # wait_log CONTAINER REGEX SECONDS
    for _ in $(seq $(($3 * 5))); do
      podman logs "$1" 2>&1 | grep -qE "$2" && return 0
      [ "$(podman inspect -f '{{.State.Running}}' "$1")" = true ] || break
      sleep 0.2
    done
    log "run: $1 did not log /$2/ within $3s (or exited); its log:"
    podman logs "$1" 2>&1 | sed 's/^/  | /'
    return 1
  }
  wait_healthz() {  # wait_healthz CONTAINER HOSTPORT SECONDS: /healthz on the published metrics port
    for _ in $(seq $(($3 * 5))); do
      [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$2/healthz")" = 200 ] && return 0
      [ "$(podman inspect -f '{{.State.Running}}' "$1")" = true ] || break
      sleep 0.2
    done
    log "run: $1 not healthy on 127.0.0.1:$2 within $3s; its log:"
    podman logs "$1" 2>&1 | sed 's/^/  | /'
    return 1
  }
  command -v curl >/dev/null || { echo "missing curl"; exit 1; }

  # The demo overlay's init container: `cascade mkmodel` (cli image) into the models volume, which
  # workers and gateways then mount read-only (uid 10001, as runAsUser in the manifests).
  mkdir -p "$RUN_DIR/models" && chown 10001:10001 "$RUN_DIR/models"
  log "run: mkmodel (cli image, the demo overlay's init container)"
  "${PODMAN_RUN[@]}" --rm -v "$RUN_DIR/models:/models" "localhost/cascade/cli:$TAG" \
    mkmodel --preset=tiny --seed=0 --out=/models/tiny --tokenizer-dir=/opt/cascade/tokenizer 2>&1 |
    sed 's/^/  | /'
  ls -l "$RUN_DIR/models/tiny" | sed 's/^/  | /'

  # Flags of deploy/k8s/base + overlays/demo. The Services' DNS names become --add-host entries
  # (podman's default network has no DNS here); the worker advertises its name as the headless
  # Service would resolve it, instead of $(POD_IP).
  # Internal RPCs (gateway/worker -> registry, gateway -> worker) take mTLS with roles, as in the
  # manifests: the certs Job's first step (`cascade certs`, cli image) writes a CA, a certificate
  # per role and the gateway's bearer token; each container mounts only its own files read-only at
  # /etc/cascade/tls (and the gateway /etc/cascade/auth), with the manifests' flags.
  CERTS="$RUN_DIR/certs"
  mkdir -p "$CERTS" && chown 10001:10001 "$CERTS"
  log "run: cascade certs (cli image, the certs Job's init container)"
  "${PODMAN_RUN[@]}" --rm -v "$CERTS:/certs" "localhost/cascade/cli:$TAG" \
    certs --out=/certs --workers=1 --worker_prefix=cascade-worker- --write_auth_token 2>&1 |
    sed 's/^/  | /'
  role_dir() {  # role_dir ROLE CERT_BASENAME: a folder with ca.crt and the role's tls.crt/tls.key
    mkdir -p "$RUN_DIR/tls-$1"
    cp "$CERTS/ca.crt" "$RUN_DIR/tls-$1/ca.crt"
    cp "$CERTS/$2.crt" "$RUN_DIR/tls-$1/tls.crt"
    cp "$CERTS/$2.key" "$RUN_DIR/tls-$1/tls.key"
    chown -R 10001:10001 "$RUN_DIR/tls-$1"
  }
  role_dir registry registry
  role_dir worker worker.cascade-worker-0
  role_dir gateway gateway
  mkdir -p "$RUN_DIR/auth" && cp "$CERTS/auth-token" "$RUN_DIR/auth/token" &&
    chown -R 10001:10001 "$RUN_DIR/auth"
  TOKEN=$(cat "$CERTS/auth-token")
  tls() { echo "--volume=$RUN_DIR/tls-$1:/etc/cascade/tls:ro"; }
  INTERNAL=(--internal_ca=/etc/cascade/tls/ca.crt --internal_cert=/etc/cascade/tls/tls.crt
    --internal_key=/etc/cascade/tls/tls.key)
  reg=cascade-img-registry-$$ wk=cascade-img-worker-$$ gw=cascade-img-gateway-$$
  CTRS+=("$reg")
  log "run: registry"
  "${PODMAN_RUN[@]}" -d --name "$reg" -p "127.0.0.1:$REG_METRICS:9090" "$(tls registry)" \
    "localhost/cascade/registry:$TAG" \
    --host=0.0.0.0 --port=50051 --metrics_port=9090 \
    --drain_timeout=5s --lease_ms=10000 --log_format=text "${INTERNAL[@]}" >/dev/null
  wait_healthz "$reg" $REG_METRICS 30
  reg_ip=$(ip_of "$reg")
  log "run: registry up at $reg_ip:50051"

  CTRS+=("$wk")
  log "run: worker-cpu"
  "${PODMAN_RUN[@]}" -d --name "$wk" --hostname cascade-worker-0 \
    --add-host "cascade-registry:$reg_ip" -p "127.0.0.1:$WK_METRICS:9090" \
    -v "$RUN_DIR/models:/models:ro" "$(tls worker)" "localhost/cascade/worker-cpu:$TAG" \
    --host=0.0.0.0 --port=50061 --metrics_port=9090 \
    --advertise_address=cascade-worker-0:50061 --worker_id=cascade-worker-0 \
    --registry=cascade-registry:50051 --model_dir=/models/tiny --model_name=tiny \
    --kv_cache_bytes=268435456 --max_batch=32 --drain_timeout=55s --log_format=text \
    --threads=2 "${INTERNAL[@]}" >/dev/null
  wait_healthz "$wk" $WK_METRICS 120
  wk_ip=$(ip_of "$wk")
  log "run: worker up at $wk_ip:50061"

  CTRS+=("$gw")
  log "run: gateway"
  "${PODMAN_RUN[@]}" -d --name "$gw" \
    --add-host "cascade-registry:$reg_ip" --add-host "cascade-worker-0:$wk_ip" \
    -p "127.0.0.1:$GW_PORT:50051" -p "127.0.0.1:$GW_METRICS:9090" \
    -v "$RUN_DIR/models:/models:ro" "$(tls gateway)" -v "$RUN_DIR/auth:/etc/cascade/auth:ro" \
    "localhost/cascade/gateway:$TAG" \
    --host=0.0.0.0 --port=50051 --metrics_port=9090 \
    --registry=cascade-registry:50051 --workers=cascade-worker-0:50061 \
    --model_dir=/models/tiny --model_name=tiny --max_concurrent=128 --request_timeout=120s \
    --drain_timeout=25s --max_connection_age=5m --log_format=text \
    --auth_token_file=/etc/cascade/auth/token "${INTERNAL[@]}" >/dev/null
  wait_healthz "$gw" $GW_METRICS 60
  log "run: gateway up at $(ip_of "$gw"):50051, published on 127.0.0.1:$GW_PORT"
  sleep 2  # a worker heartbeat, so the gateway routes by the registry's view

  # The demo's acceptance check (`cascade demo` starts its own local stack, so it cannot target
  # containers), done with the cli image's `cascade generate` against the published gateway port
  # from another container (host network: as a client outside the cluster comes in through a
  # port-forward): three greedy requests with one system prompt, cold, a warm repeat and a repeat
  # under another cache_salt. All three must say the same thing; only the warm one reports cached
  # tokens.
  SYSTEM="You are Cascade's container smoke test. Answer in one short sentence. Prefer plain words to jargon, say when you do not know, and never use more words than you need to be correct. The answer is read by a shell script that only checks it twice."
  ok=1
  for n in 1 2 3; do
    salt=()
    [ $n = 3 ] && salt=(--cache_salt=tenant-b)
    log "run: cascade generate #$n (cli image) -> gateway 127.0.0.1:$GW_PORT ${salt[*]}"
    "${PODMAN_RUN[@]}" --rm --network host "localhost/cascade/cli:$TAG" generate \
      --gateway=127.0.0.1:$GW_PORT --system="$SYSTEM" --query="What is a prefix cache?" \
      --max_tokens=24 --temperature=0 --token="$TOKEN" "${salt[@]}" >"$RUN_DIR/gen$n.txt" 2>"$RUN_DIR/gen$n.err" ||
      { sed 's/^/  | /' "$RUN_DIR/gen$n.err"; log "check: FAIL generate #$n"; exit 1; }
    printf '  | text: %q\n' "$(cat "$RUN_DIR/gen$n.txt")"
    sed 's/^/  | /' "$RUN_DIR/gen$n.err"
  done
  # The summary line: "<worker>: prompt P tokens (C cached), completion N tokens, ..."
  cached() { grep -oE '\([0-9]+ cached\)' "$RUN_DIR/gen$1.err" | grep -oE '[0-9]+' | head -1; }
  c1=$(cached 1) c2=$(cached 2) c3=$(cached 3)
  [ -s "$RUN_DIR/gen1.txt" ] || { log "check: FAIL empty answer"; ok=0; }
  cmp -s "$RUN_DIR/gen1.txt" "$RUN_DIR/gen2.txt" || { log "check: FAIL the warm repeat differs"; ok=0; }
  cmp -s "$RUN_DIR/gen1.txt" "$RUN_DIR/gen3.txt" || { log "check: FAIL the salted repeat differs"; ok=0; }
  [ "${c1:-x}" = 0 ] || { log "check: FAIL cold request had cached tokens '${c1:-?}'"; ok=0; }
  [ "${c2:-0}" -gt 0 ] || { log "check: FAIL warm repeat had no cached tokens"; ok=0; }
  [ "${c3:-x}" = 0 ] || { log "check: FAIL salted repeat had cached tokens '${c3:-?}'"; ok=0; }
  [ $ok = 1 ] && log "check: ok: the same greedy answer 3 times; cached tokens: cold $c1, warm $c2, salted $c3"

  log "run: the gateway's cache counters (GET 127.0.0.1:$GW_METRICS/metrics)"
  curl -s "127.0.0.1:$GW_METRICS/metrics" |
    grep -E '^cascade:gateway_prefix_cache_(hits|queries)_total|^cascade:request_success_total' |
    sed 's/^/  | /' || true

  # ---- 4. stop: SIGTERM (podman stop, the image's StopSignal) gateway, worker, registry, as
  # Kubernetes would, with the manifests' grace periods; then remove the containers ----
  for pair in "$gw:35" "$wk:65" "$reg:15"; do
    c=${pair%:*} t=$SECONDS
    podman stop -t "${pair#*:}" "$c" >/dev/null
    log "stop: $c exited $(podman inspect -f '{{.State.ExitCode}}' "$c") after $((SECONDS - t))s"
  done
  for c in "$reg" "$wk" "$gw"; do
    log "log of $c (last 6 lines):"
    podman logs "$c" 2>&1 | tail -6 | sed 's/^/  | /'
  done
  [ $ok = 1 ] || exit 1
fi

if [ "${CASCADE_IMG_KEEP:-1}" = 0 ]; then
  for t in "${TARGETS[@]}"; do buildah rmi "localhost/cascade/$t:$TAG" >/dev/null 2>&1 || true; done
  log "removed the cascade images"
fi
log "done in $((SECONDS - T0))s"
