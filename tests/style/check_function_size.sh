#!/bin/sh
# Fails when a function in src/ is longer than 80 lines or has a cognitive complexity above 25
# (clang-tidy's readability-function-size and readability-function-cognitive-complexity).
# Usage: check_function_size.sh BUILD_DIR (holding compile_commands.json)
set -eu
build=${1:?usage: check_function_size.sh BUILD_DIR}
cd "$(dirname "$0")/../.."
command -v clang-tidy >/dev/null 2>&1 || {
  echo "function size: clang-tidy is not installed; run ./setup.sh (package clang-tidy)" >&2
  exit 1
}
[ -f "$build/compile_commands.json" ] || {
  echo "function size: $build/compile_commands.json is missing; configure with cmake first" >&2
  exit 1
}
config='{Checks: "-*,readability-function-size,readability-function-cognitive-complexity",
 CheckOptions: [{key: readability-function-size.LineThreshold, value: 80},
                {key: readability-function-cognitive-complexity.Threshold, value: 25},
                {key: readability-function-cognitive-complexity.DescribeBasicIncrements, value: false}]}'
out=$(find src -name '*.cpp' | sort | xargs -P "$(nproc)" -n 6 \
  clang-tidy -p "$build" --quiet --config="$config" 2>/dev/null | grep 'warning:' | sort -u || true)
if [ -n "$out" ]; then
  echo "function size: split these functions (at most 80 lines, cognitive complexity 25):"
  echo "$out"
  exit 1
fi
echo "function size: ok ($(find src -name '*.cpp' | wc -l) files)"
