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
# Tracked files and new ones not yet added (not ignored ones): a new file is formatted before its
# first commit, not caught by format_check_test after it.
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cc' '*.h' '*.cu' '*.cuh' \
  2>/dev/null || true)
if [ ${#files[@]} -eq 0 ]; then
  # Not a git checkout (a source tarball): every source below the project folders.
  mapfile -t files < <(find common cache_service gpu_worker services bench tests \
    -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' | sort)
fi
if [ "${1:-}" = "--check" ]; then
  # One clang-format process for all files (one per file took a minute on 2 busy cores); with
  # --Werror it prints "<file>:<line>:<col>: error: code should be clang-formatted" per difference.
  if out=$("$FORMAT" --dry-run --Werror "${files[@]}" 2>&1); then
    echo "format: ${#files[@]} files clang-formatted"
    exit 0
  fi
  mapfile -t bad < <(printf '%s\n' "$out" | sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error: .*/\1/p' | sort -u)
  if [ ${#bad[@]} -eq 0 ]; then
    printf '%s\n' "$out" >&2
    echo "format: clang-format failed (see above)" >&2
    exit 1
  fi
  printf 'format: not clang-formatted: %s\n' "${bad[@]}"
  echo "format: ${#bad[@]} file(s) differ from clang-format; run bash scripts/format.sh"
  exit 1
fi
"$FORMAT" -i "${files[@]}"
echo "format: ${#files[@]} files formatted"
