#!/usr/bin/env bash
# The ctests `sanitized_*`: every test of ferry (unit, kv_calc, jobs, integration against a
# real sshd, MCP) run against the AddressSanitizer + UndefinedBehaviorSanitizer build, in two
# parts that together hold every test of that build but the fuzzers and the style checks.
#   run_sanitized_suite.sh BUILD_DIR build   bring BUILD_DIR up to date, check it, install its MCP SDK
#   run_sanitized_suite.sh BUILD_DIR sshd    its tests that use the test users' sshd (label sshd)
#   run_sanitized_suite.sh BUILD_DIR local   all its other tests
# BUILD_DIR is made by `./setup.sh --sanitize` (build-asan). Each part runs one test at a time.
set -euo pipefail
dir=${1:?usage: run_sanitized_suite.sh BUILD_DIR build|sshd|local}
part=${2:?usage: run_sanitized_suite.sh BUILD_DIR build|sshd|local}
if ! grep -qs '^FERRY_SANITIZE:BOOL=ON$' "$dir/CMakeCache.txt"; then
  echo "sanitized_$part: $dir is not a -DFERRY_SANITIZE=ON build; run ./setup.sh --sanitize first" >&2
  exit 1
fi
# The parts: -FS keeps ctest from adding the SDK's install (the build part's) to either.
all=(--label-exclude 'fuzz|style')
sshd=(--label-regex '^sshd$' --fixture-exclude-setup mcp_sdk)
others=(--label-exclude 'fuzz|style|^sshd$' --exclude-regex '^mcp_sdk_install$' --fixture-exclude-setup mcp_sdk)
count() { ctest --test-dir "$dir" -N "$@" | sed -n 's/^Total Tests: //p'; }

case $part in
build)
  # The same sources as the build under test: bring the sanitizer build up to date.
  cmake --build "$dir" -j "$(nproc)"
  # The unit tests are found by running their binary (catch_discover_tests); one that a
  # sanitizer stops before main lists none, and ctest would then run none without a word. So:
  # every test case the binary lists must be a ctest here (the label also has a few tests of
  # their own). (Catch2 exits with the number of tests it listed: the status says nothing.)
  unit="$dir/tests/ferry_unit_tests"
  errors=$(mktemp)
  trap 'rm -f "$errors"' EXIT
  want=$("$unit" --list-test-names-only 2>"$errors" | grep -c .) || :
  have=$(count --label-regex '^unit$')
  if [ "${want:-0}" -eq 0 ] || [ "${have:-0}" -lt "$want" ]; then
    echo "sanitized_build: $unit lists ${want:-0} test cases under the sanitizers, ctest has ${have:-0}:" >&2
    head -40 "$errors" >&2
    exit 1
  fi
  # Every test is in exactly one part (the SDK's install is this one's), and every test that
  # holds the test users' lock is in the sshd part.
  n_all=$(count "${all[@]}") n_sshd=$(count "${sshd[@]}") n_local=$(count "${others[@]}")
  if [ "$((n_sshd + n_local + 1))" -ne "$n_all" ] || [ "$n_sshd" -eq 0 ] || [ "$n_local" -eq 0 ]; then
    echo "sanitized_build: $n_all tests, but the sshd part has $n_sshd and the local part $n_local (+1, mcp_sdk_install)" >&2
    exit 1
  fi
  unlabelled=$(ctest --test-dir "$dir" --show-only=json-v1 | python3 -c '
import json, sys
for t in json.load(sys.stdin)["tests"]:
    p = {q["name"]: q["value"] for q in t.get("properties", [])}
    if "sshd_users" in (p.get("RESOURCE_LOCK") or []) and "sshd" not in (p.get("LABELS") or []):
        print(t["name"])')
  if [ -n "$unlabelled" ]; then
    echo "sanitized_build: these hold RESOURCE_LOCK sshd_users without the label sshd (see ferry_label_sshd_test in tests/CMakeLists.txt): $unlabelled" >&2
    exit 1
  fi
  echo "sanitized_build: $n_all tests: $n_sshd in sanitized_sshd, $n_local in sanitized_local, and the MCP SDK's install here"
  ctest --test-dir "$dir" --output-on-failure --tests-regex '^mcp_sdk_install$'
  ;;
sshd) ctest --test-dir "$dir" --output-on-failure "${sshd[@]}" ;;
local) ctest --test-dir "$dir" --output-on-failure "${others[@]}" ;;
*)
  echo "run_sanitized_suite.sh: the part is build, sshd or local, not '$part'" >&2
  exit 2
  ;;
esac
