#!/usr/bin/env bash
# Builds ferry's libFuzzer targets with clang (ASan + UBSan) and runs them:
#   1. regression: each fuzzer once over its committed corpus (tests/fuzz/corpus/NAME), so
#      every input that ever crashed keeps being checked;
#   2. fuzzing: each fuzzer for SECONDS on a copy of its corpus (the committed one never
#      grows), -rss_limit_mb=2048 -timeout=10, as many at once as there are cores.
# Exits non-zero when a fuzzer crashes, leaks, hangs or trips a sanitizer, printing the
# sanitizer report, the reproducer's path and its bytes as a C string.
#
#   run_fuzzers.sh [--build-dir DIR] [--seconds N] [--regress-only] [--only NAME]...
#
# DIR defaults to build/fuzz-build; the ctest `fuzz` passes its own. To reproduce a crash:
#   DIR/fuzz_NAME CRASH_FILE
# To grow the committed corpus after a long run (keep it small: only inputs adding edges):
#   DIR/fuzz_NAME -merge=1 -use_counters=0 tests/fuzz/corpus/NAME DIR/work/NAME
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
build="$repo/build/fuzz-build"
seconds=20
regress_only=0
only=()
all=(job_meta params run_record terminal_safe)

while (($#)); do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --regress-only) regress_only=1; shift ;;
    --only) only+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "run_fuzzers.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
((${#only[@]})) || only=("${all[@]}")

# Debian's clang (package clang, with libclang-rt-14-dev for libFuzzer); setup.sh installs both.
cxx="" cc=""
for v in "" -14; do
  if command -v "clang++$v" >/dev/null && command -v "clang$v" >/dev/null; then
    cxx="$(command -v "clang++$v")" cc="$(command -v "clang$v")"
    break
  fi
done
if [ -z "$cxx" ]; then
  echo "run_fuzzers.sh: clang++ not found; install the Debian packages clang and libclang-rt-14-dev (setup.sh does)" >&2
  exit 1
fi
for s in llvm-symbolizer llvm-symbolizer-14; do
  if command -v "$s" >/dev/null; then
    export ASAN_SYMBOLIZER_PATH="$(command -v "$s")"
    break
  fi
done
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"

t0=$SECONDS
echo "== configuring and building the fuzzers with $cxx in $build"
mkdir -p "$build"
if ! CC="$cc" CXX="$cxx" cmake -S "$here" -B "$build" -DFERRY_ROOT="$repo" >"$build/configure.log" 2>&1; then
  cat "$build/configure.log" >&2
  echo "run_fuzzers.sh: configuring the clang build failed" >&2
  exit 1
fi
targets=() # all of them in one parallel build, unless --only
if ((${#only[@]} < ${#all[@]})); then
  for name in "${only[@]}"; do targets+=(--target "fuzz_$name"); done
fi
if ! cmake --build "$build" -j "$(nproc)" "${targets[@]}"; then
  echo "run_fuzzers.sh: building the fuzzers failed" >&2
  exit 1
fi
echo "== build: $((SECONDS - t0)) s"

failed=0
mkdir -p "$build/logs" "$build/artifacts" "$build/work"

# Prints what a failed run left: the report and each reproducer.
report_failure() { # name log mode
  local name="$1" log="$2" mode="$3" f
  failed=1
  echo "!! fuzz_$name FAILED; log: $log" >&2
  grep -E -A60 '^==[0-9]+==ERROR|runtime error:|invariant failed|uncaught exception|deadly signal|Test unit written|ERROR: libFuzzer' "$log" | head -120 >&2
  for f in "$build/artifacts/$name"-*; do
    [ -e "$f" ] || continue
    echo "!! reproducer: $f" >&2
    python3 - "$f" <<'PY' >&2
import sys
data = open(sys.argv[1], "rb").read()
out = "".join(chr(b) if 32 <= b < 127 and chr(b) not in '"\\?' else {10: "\\n", 9: "\\t", 34: '\\"', 92: "\\\\", 63: "\\?"}.get(b, "\\x%02x\"\"" % b) for b in data[:4096])
print("   bytes (%d) as a C string: \"%s\"%s" % (len(data), out, " ..." if len(data) > 4096 else ""))
PY
    echo "   reproduce: $build/fuzz_$name $f" >&2
    if [ "$mode" = fuzz ]; then
      echo "   once fixed, keep it: cp $f $here/corpus/$name/" >&2
    else
      echo "   (a copy of an input of the committed corpus $here/corpus/$name)" >&2
    fi
  done
}

common=(-rss_limit_mb=2048 -timeout=10 -max_len=8192 -print_final_stats=1)

echo "== regression: every committed corpus input once"
for name in "${only[@]}"; do
  rm -f "$build/artifacts/$name"-*
  log="$build/logs/$name.regress.log"
  n=$(find "$here/corpus/$name" -type f | wc -l)
  if "$build/fuzz_$name" "${common[@]}" -runs=0 -artifact_prefix="$build/artifacts/$name-" \
       "$here/corpus/$name" >"$log" 2>&1; then
    echo "   fuzz_$name: $n inputs ok"
  else
    report_failure "$name" "$log" regress
  fi
done

# One fuzzer per core at a time, each for the full SECONDS (they share nothing but the CPU);
# their reports are printed in the fixed order once all have ended.
fuzz_one() { # name: runs it; the exit status is the fuzzer's
  local name="$1" work="$build/work/$1" dict=()
  rm -rf "$work" && mkdir -p "$work" && cp "$here/corpus/$name"/* "$work"/ 2>/dev/null
  [ -f "$here/$name.dict" ] && dict=(-dict="$here/$name.dict")
  "$build/fuzz_$name" "${common[@]}" "${dict[@]}" -max_total_time="$seconds" \
    -artifact_prefix="$build/artifacts/$name-" "$work" >"$build/logs/$name.fuzz.log" 2>&1
}

if ((regress_only == 0 && failed == 0)); then
  cores=$(nproc 2>/dev/null || echo 1)
  echo "== fuzzing: ${seconds} s per fuzzer, on a copy of each corpus, ${cores} at a time"
  running=0
  for name in "${only[@]}"; do
    if ((running >= cores)); then
      wait -n
      running=$((running - 1))
    fi
    rm -f "$build/logs/$name.fuzz.status"
    (fuzz_one "$name"; echo $? >"$build/logs/$name.fuzz.status") &
    running=$((running + 1))
  done
  wait
  for name in "${only[@]}"; do
    log="$build/logs/$name.fuzz.log"
    if [ "$(cat "$build/logs/$name.fuzz.status" 2>/dev/null)" = 0 ]; then
      done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1)
      execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
      rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
      echo "   fuzz_$name: ok, ${execs:-?} runs (${rate:-?}/s); ${done_line:-no summary}"
    else
      report_failure "$name" "$log" fuzz
    fi
  done
fi

echo "== total: $((SECONDS - t0)) s"
if ((failed)); then
  echo "run_fuzzers.sh: a fuzzer failed (see above)" >&2
  exit 1
fi
