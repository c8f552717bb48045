#!/usr/bin/env bash
# Benchmark, not a test: how fast `ferry log --limit 20` and `ferry show RUN` are on an archive
# of 100,000 runs, next to `ferry --version` (process start-up alone) in the same hyperfine run;
# then the same `log` once a run with 100 MB of params is among the last 20, with the peak RSS
# of that `log` and of the `ferry run` that recorded it (/usr/bin/time).
#
#   tests/bench/archive_bench.sh [BUILD_DIR] [N]
#
# BUILD_DIR (default: ./build) must hold `ferry` and `tests/bench/ferry_make_archive` (built by
# tests/bench/CMakeLists.txt: cmake --build BUILD_DIR --target ferry ferry_make_archive).
# N (default 100000) runs are recorded through the library, one transaction each as `ferry run`
# does, into a fresh archive under $BENCH_TMPDIR (default /dev/shm when it exists: every
# commit fsyncs, which on a disk makes generation take minutes instead of about 1.5). Needs
# hyperfine, python3 and /usr/bin/time. Writes the medians as a markdown table to stdout and to
# BUILD_DIR/archive_bench.md (hyperfine's own table: BUILD_DIR/archive_bench.hyperfine.md).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
runs=${2:-100000}
ferry=$build/ferry
generator=$build/tests/bench/ferry_make_archive

for tool in "$ferry" "$generator"; do
  if [ ! -x "$tool" ]; then
    echo "archive_bench.sh: $tool is missing; build it first: cmake --build $build --target ferry ferry_make_archive" >&2
    exit 2
  fi
done
for tool in hyperfine python3 /usr/bin/time; do
  command -v "$tool" >/dev/null || { echo "archive_bench.sh: $tool is not installed" >&2; exit 2; }
done

default_tmp=${TMPDIR:-/tmp}
[ -d /dev/shm ] && [ -w /dev/shm ] && default_tmp=/dev/shm
work=$(mktemp -d "${BENCH_TMPDIR:-$default_tmp}/ferry-bench-XXXXXX")
trap 'rm -rf "$work"' EXIT
archive=$work/archive.db

echo "archive_bench.sh: recording $runs runs into $archive ..." >&2
start=$(date +%s)
run_id=$("$generator" "$archive" "$runs" | tail -n 1)
echo "archive_bench.sh: done in $(( $(date +%s) - start )) s, $(du -h "$archive" | cut -f1); showing run $run_id" >&2

# -N: no shell in between, so the numbers are ferry's own.
hyperfine -N --warmup 2 --runs 20 \
  --export-json "$work/results.json" \
  --export-markdown "$build/archive_bench.hyperfine.md" \
  -n "ferry --version" "$ferry --version" \
  -n "ferry log --limit 20" "$ferry --archive $archive log --limit 20" \
  -n "ferry show RUN" "$ferry --archive $archive show $run_id" >&2

peak_kib() { # peak RSS in KiB of one run of the command
  /usr/bin/time -f %M -o "$work/rss" "$@" >/dev/null
  tail -n 1 "$work/rss"
}
log_kib=$(peak_kib "$ferry" --archive "$archive" log --limit 20)

# One run with 100 MB of params (a string parameter) becomes the newest.
cat >"$work/blob.py" <<'JOB'
# /// ferry
# description = "archive_bench: takes a big parameter"
# interpreter = "python3"
# [params.blob]
# type = "string"
# ///
import json, os
params = json.load(open(os.environ["FERRY_PARAMS"]))
json.dump({"blob_bytes": len(params["blob"])}, open(os.environ["FERRY_RESULT"], "w"))
JOB
python3 -c 'import json, sys; json.dump({"blob": "x" * 100_000_000}, open(sys.argv[1], "w"))' \
  "$work/big.json"
echo "archive_bench.sh: recording a run with 100 MB of params ..." >&2
run_kib=$(peak_kib "$ferry" --archive "$archive" run "$work/blob.py" --local --params "$work/big.json")
big_log_kib=$(peak_kib "$ferry" --archive "$archive" log --limit 20)
hyperfine -N --warmup 2 --runs 20 --export-json "$work/results_big.json" \
  -n "ferry log --limit 20 (100 MB params run among them)" \
  "$ferry --archive $archive log --limit 20" >&2

python3 - "$work/results.json" "$work/results_big.json" "$runs" "$log_kib" "$big_log_kib" "$run_kib" \
  <<'PY' | tee "$build/archive_bench.md"
import json, sys
results = json.load(open(sys.argv[1]))["results"] + json.load(open(sys.argv[2]))["results"]
runs, log_kib, big_log_kib, run_kib = (int(x) for x in sys.argv[3:7])
print(f"Archive of {runs:,} runs; hyperfine --warmup 2 --runs 20 (times in ms)\n")
print("| command | median | mean | min | max |")
print("|---|---:|---:|---:|---:|")
for r in results:
    ms = lambda s: f"{s * 1000:.1f}"
    print(f"| `{r['command']}` | {ms(r['median'])} | {ms(r['mean'])} | {ms(r['min'])} | {ms(r['max'])} |")
print("\nPeak RSS (/usr/bin/time, MiB)\n")
print("| command | peak RSS |")
print("|---|---:|")
print(f"| `ferry log --limit 20` | {log_kib / 1024:.1f} |")
print(f"| `ferry run` with 100 MB of params | {run_kib / 1024:.1f} |")
print(f"| `ferry log --limit 20`, that run among them | {big_log_kib / 1024:.1f} |")
PY
