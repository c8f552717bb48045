#!/bin/sh
# Fails when a C++ file of the tree differs from what the repository's .clang-format makes of it.
# Fix with: clang-format -i $(git ls-files '*.cpp' '*.hpp')
set -eu
cd "$(dirname "$0")/../.."
command -v clang-format >/dev/null 2>&1 || {
  echo "format: clang-format is not installed; run ./setup.sh (package clang-format)" >&2
  exit 1
}
files=$(find src include tests -name '*.cpp' -o -name '*.hpp' | sort)
[ -n "$files" ] || { echo "format: no C++ files found" >&2; exit 1; }
# shellcheck disable=SC2086
clang-format --dry-run --Werror $files
echo "format: ok ($(echo "$files" | wc -l) files)"
