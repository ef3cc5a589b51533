#!/usr/bin/env bash
# Builds Cascade ON THE GPU MACHINE (which reaches no package registry): unpacks the Debian
# packages that scripts/device_deps.sh downloaded into .devdeps/ (carried with the `run` call:
# carry: [".devdeps"]) into /opt/cascade-deps with `dpkg -x`, configures with gRPC off and CUDA on,
# and builds with ninja. Usage (from the repo root, on the device):
#   bash scripts/device_build.sh [ninja targets...]      # default: everything
#   . build-gpu/env.sh                                   # runtime library path for the binaries
# Environment: CASCADE_BUILD_DIR (default build-gpu), CASCADE_DEPS_DIR (default /opt/cascade-deps),
# CASCADE_CMAKE_ARGS: more cmake arguments, space-separated (e.g. -DCASCADE_WS_TRACE=ON),
# CASCADE_SUBDIRS: optional space-separated folders (e.g. "gpu_worker/backend/cuda tests/gpu") to
# configure a shadow source tree with only those folders' CMakeLists (plus the root's), so that
# folders other people are half-way through cannot break the configure step; every folder is
# still reachable for #include.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DEPS=${CASCADE_DEPS_DIR:-/opt/cascade-deps}
BUILD_DIR=${CASCADE_BUILD_DIR:-build-gpu}
JOBS=${CASCADE_JOBS:-16}

if [ ! -f "$DEPS/.unpacked" ]; then
  ls .devdeps/*.deb >/dev/null 2>&1 || { echo "device_build: no .devdeps/*.deb (run scripts/device_deps.sh here and carry .devdeps)"; exit 1; }
  mkdir -p "$DEPS"
  for f in .devdeps/*.deb; do dpkg -x "$f" "$DEPS"; done
  touch "$DEPS/.unpacked"
fi
LIBDIR=$DEPS/usr/lib/x86_64-linux-gnu
export PKG_CONFIG_PATH=$LIBDIR/pkgconfig:$DEPS/usr/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$DEPS
export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LIBRARY_PATH=$LIBDIR${LIBRARY_PATH:+:$LIBRARY_PATH}
# Debian's multiarch header dir (openssl/configuration.h) is not on the compiler's default path.
export CPATH=$DEPS/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}
PKGCONF_ARGS=()
if ! command -v pkg-config >/dev/null 2>&1; then
  PKGCONF_ARGS=(-DPKG_CONFIG_EXECUTABLE="$DEPS/usr/bin/pkgconf")
fi

SRC=$ROOT
# inert REAL SHADOW: SHADOW becomes a real folder linking REAL's entries, minus CMakeLists.txt
# (so cascade_add_subdirectories() skips it); sub-folders stay links (never added either).
inert() {
  mkdir -p "$2"
  for c in "$1"/*; do
    [ -e "$c" ] || continue
    [ "$(basename "$c")" = CMakeLists.txt ] || ln -sfn "$c" "$2/$(basename "$c")"
  done
}
if [ -n "${CASCADE_SUBDIRS:-}" ]; then
  SRC=/tmp/cascade-shadow-src-$(basename "$BUILD_DIR")  # one per build folder (device_attention.sh BASE_SRC)
  rm -rf "$SRC"
  mkdir -p "$SRC"
  ln -s "$ROOT/CMakeLists.txt" "$ROOT/cmake" "$SRC/"
  for e in "$ROOT"/*/; do
    name=$(basename "$e")
    case "$name" in build* | cmake) continue ;; esac
    inert "$ROOT/$name" "$SRC/$name"
    : >"$SRC/$name/CMakeLists.txt"  # the root adds these explicitly
  done
  # common/ is the floor every component links (chunk hash, locks, status): always configured.
  case " $CASCADE_SUBDIRS " in *" common "*) ;; *) CASCADE_SUBDIRS="common $CASCADE_SUBDIRS" ;; esac
  for sub in $CASCADE_SUBDIRS; do
    path=""
    IFS=/ read -ra parts <<<"$sub"
    for ((i = 0; i < ${#parts[@]}; i++)); do
      path=${path:+$path/}${parts[$i]}
      if [ $i -eq $((${#parts[@]} - 1)) ]; then
        rm -rf "$SRC/$path"
        ln -s "$ROOT/$path" "$SRC/$path"
      else
        if [ -L "$SRC/$path" ]; then
          rm "$SRC/$path"
          inert "$ROOT/$path" "$SRC/$path"
        fi
        if [ ! -L "$SRC/$path/CMakeLists.txt" ]; then  # first visit: make it live
          ln -sfn "$ROOT/$path/CMakeLists.txt" "$SRC/$path/CMakeLists.txt"
          for c in "$ROOT/$path"/*/; do  # children not listed must not be added
            c=$(basename "$c")
            if [ -L "$SRC/$path/$c" ]; then rm "$SRC/$path/$c"; inert "$ROOT/$path/$c" "$SRC/$path/$c"; fi
          done
        fi
      fi
    done
  done
fi

# CASCADE_DEVICE_GRPC=1 builds the whole stack (servers, CLI) with the carried gRPC packages.
GRPC=OFF
if [ "${CASCADE_DEVICE_GRPC:-0}" = 1 ]; then
  GRPC=ON
  export PATH=$DEPS/usr/bin:$PATH  # protoc, grpc_cpp_plugin
fi
# shellcheck disable=SC2086  # CASCADE_CMAKE_ARGS is split on purpose
cmake -S "$SRC" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCASCADE_GRPC=$GRPC \
  -DCASCADE_CUDA=ON -DCMAKE_PREFIX_PATH="$DEPS/usr" -DCMAKE_BUILD_RPATH="$LIBDIR" \
  "${PKGCONF_ARGS[@]}" ${CASCADE_CMAKE_ARGS:-} >"$BUILD_DIR.configure.log" 2>&1 || { tail -40 "$BUILD_DIR.configure.log"; exit 1; }
grep -E "^-- cascade:" "$BUILD_DIR.configure.log" || true
cat >"$BUILD_DIR/env.sh" <<ENV
export LD_LIBRARY_PATH=$LIBDIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
ENV
# A warm machine keeps $BUILD_DIR between calls, and each call's copy of the tree keeps the
# sources' own times. A source a call changed here (a patch applied with git apply) and the next
# call restored is then older than its objects, and ninja would keep the patched build. So every
# source whose content differs from the last build's is touched first.
SUMS=$BUILD_DIR/.source-sums
find . \( -path './build*' -o -path './.devdeps' -o -path './.git' -o -path '*/node_modules' \) -prune \
  -o -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.proto' \
  -o -name 'CMakeLists.txt' -o -name '*.cmake' \) -print | sort | xargs md5sum >"$SUMS.new"
if [ -f "$SUMS" ]; then
  changed=$(comm -13 <(sort "$SUMS") <(sort "$SUMS.new") | cut -c35-)
  if [ -n "$changed" ]; then
    echo "device_build: $(wc -l <<<"$changed") source(s) changed since the last build here: touched"
    xargs touch <<<"$changed"
  fi
fi
mv "$SUMS.new" "$SUMS"
ninja -C "$BUILD_DIR" -j"$JOBS" "$@"
