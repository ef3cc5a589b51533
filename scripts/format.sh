#!/usr/bin/env bash
# clang-format over the project's C++ and CUDA sources (.clang-format: Google style, 100 columns).
#   bash scripts/format.sh          rewrite the files in place
#   bash scripts/format.sh --check  list the files that differ and exit 1 (ctest format_check_test)
set -euo pipefail
cd "$(dirname "$0")/.."
FORMAT=${CLANG_FORMAT:-$(command -v clang-format-14 || command -v clang-format || true)}
if [ -z "$FORMAT" ]; then
  echo "format: clang-format not found; run scripts/setup.sh" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' 2>/dev/null || true)
if [ ${#files[@]} -eq 0 ]; then
  # Not a git checkout (a source tarball): every source below the project folders.
  mapfile -t files < <(find common cache_service gpu_worker services bench tests \
    -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' | sort)
fi
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do
    [ -f "$f" ] || continue
    if ! "$FORMAT" --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
  done
  if [ ${#bad[@]} -gt 0 ]; then
    printf 'format: not clang-formatted: %s\n' "${bad[@]}"
    echo "format: ${#bad[@]} file(s) differ from clang-format; run bash scripts/format.sh"
    exit 1
  fi
  echo "format: ${#files[@]} files clang-formatted"
  exit 0
fi
"$FORMAT" -i "${files[@]}"
echo "format: ${#files[@]} files formatted"
