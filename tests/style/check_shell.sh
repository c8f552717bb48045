#!/bin/sh
# The shell text ferry ships (the launcher, the built-in sh jobs) parses under sh and dash.
set -eu
cd "$(dirname "$0")/../.."
status=0
for file in src/remote/*.sh jobs/*.sh; do
  for shell in sh dash; do
    if ! "$shell" -n "$file"; then
      echo "shell: $file does not parse under $shell" >&2
      status=1
    fi
  done
done
[ "$status" = 0 ] && echo "shell: ok"
exit "$status"
