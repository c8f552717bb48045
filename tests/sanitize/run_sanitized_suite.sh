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
ctest --test-dir "$dir" --output-on-failure --label-exclude "fuzz|style" -j 2
