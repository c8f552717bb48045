#!/usr/bin/env bash
# The ctest `sanitized_suite`: every test of ferry (unit, kv_calc, jobs, integration against a
# real sshd) run against the AddressSanitizer + UndefinedBehaviorSanitizer build.
#   run_sanitized_suite.sh BUILD_DIR     (made by `./setup.sh --sanitize`: build-asan)
set -euo pipefail
dir=${1:?usage: run_sanitized_suite.sh BUILD_DIR}
if ! grep -qs '^FERRY_SANITIZE:BOOL=ON$' "$dir/CMakeCache.txt"; then
  echo "sanitized_suite: $dir is not a -DFERRY_SANITIZE=ON build; run ./setup.sh --sanitize first" >&2
  exit 1
fi
# The same sources as the build under test: bring the sanitizer build up to date.
cmake --build "$dir" -j "$(nproc)"
# The unit tests are found by running their binary (catch_discover_tests); one that a sanitizer
# stops before main lists none, and ctest would then run none without a word. So: every test
# case the binary lists must be a ctest here (the label also has a few tests of their own).
unit="$dir/tests/ferry_unit_tests"
errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
# (Catch2 exits with the number of tests it listed: the status says nothing.)
want=$("$unit" --list-test-names-only 2>"$errors" | grep -c .) || :
have=$(ctest --test-dir "$dir" -N -L '^unit$' | sed -n 's/^Total Tests: //p')
if [ "${want:-0}" -eq 0 ] || [ "${have:-0}" -lt "$want" ]; then
  echo "sanitized_suite: $unit lists ${want:-0} test cases under the sanitizers, ctest has ${have:-0}:" >&2
  head -40 "$errors" >&2
  exit 1
fi
ctest --test-dir "$dir" --output-on-failure --label-exclude "fuzz|style" -j 2
