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
# The build's commands, one per source file: a unity build lists its batches, not the files, so
# each library file gets the library's command (without a GCC precompiled header, which clang
# cannot read).
db=$(mktemp -d)
trap 'rm -rf "$db"' EXIT
python3 - "$build/compile_commands.json" "$db/compile_commands.json" <<'EOF_PY'
import glob, json, os, re, sys
entries = json.load(open(sys.argv[1]))
out = [e for e in entries if not e["file"].endswith(".cxx")]
known = {e["file"] for e in out}
lib = next((e for e in entries if "/ferry_core.dir/" in e.get("command", "")), None)
for f in glob.glob("src/**/*.cpp", recursive=True) if lib else []:
    path = os.path.abspath(f)
    if path not in known:
        out.append({"directory": lib["directory"], "file": path,
                    "command": lib["command"].replace(lib["file"], path)})
for e in out:
    e["command"] = re.sub(r" -Winvalid-pch| -include \S*cmake_pch\.hxx", "", e["command"])
json.dump(out, open(sys.argv[2], "w"))
EOF_PY
# One file per clang-tidy, as many at once as there are cores: parsing dominates, and the files
# differ up to tenfold in cost, so small batches keep every core busy to the end.
out=$(find src -name '*.cpp' | sort | xargs -P "$(nproc)" -n 1 \
  clang-tidy -p "$db" --quiet --config="$config" 2>/dev/null | grep 'warning:' | sort -u || true)
if [ -n "$out" ]; then
  echo "function size: split these functions (at most 80 lines, cognitive complexity 25):"
  echo "$out"
  exit 1
fi
echo "function size: ok ($(find src -name '*.cpp' | wc -l) files)"
