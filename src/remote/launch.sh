# ferry launcher (generated; runs under /bin/sh)
# The source is src/remote/launch.sh; ferry fills in the @name@ fields, each already quoted for
# sh where it is text. Design notes:
# - The job runs under setsid so it leads a process group of its own: on timeout or interrupt
#   the whole group is killed, children included. Job control (`set -m`) is not an option: dash
#   turns it off without a tty, and exec channels have none.
# - sshd's `signal` request kills the launcher's group (not the job's): the trap forwards it.
# - The watchdog's streams go to /dev/null, or its sleep would hold the channel open.
# - Anything the job leaves in its group after it exits is killed too: no stray process keeps
#   the channel (and the user's session) open.
FERRY_RUN_DIR=@run_dir@
FERRY_PARAMS=@run_dir@/params.json
FERRY_RESULT=@run_dir@/result.json
FERRY_JOB=@job_name@
export FERRY_RUN_DIR FERRY_PARAMS FERRY_RESULT FERRY_JOB
printf '%s\n' @sentinel@
printf '%s\n' @sentinel@ >&2
cd "$FERRY_RUN_DIR" || exit 125
interpreter=@interpreter@
if ! command -v "$interpreter" >/dev/null 2>&1; then
  printf '@no_interp_prefix@%s not found on this host (PATH=%s); install it or set an absolute path in the job'"'"'s interpreter\n' "$interpreter" "$PATH" >&2
  exit @no_interp_exit@
fi
grouped=0
if command -v setsid >/dev/null 2>&1; then
  grouped=1
  setsid "$interpreter" "$FERRY_RUN_DIR"/@job_file@ </dev/null &
else
  "$interpreter" "$FERRY_RUN_DIR"/@job_file@ </dev/null &
fi
job=$!
(
  trap 'kill "$nap" 2>/dev/null; exit 0' TERM
  sleep @timeout@ &
  nap=$!
  wait "$nap" || exit 0
  : >"$FERRY_RUN_DIR"/@timeout_marker@
  kill -TERM $$ 2>/dev/null
) </dev/null >/dev/null 2>&1 &
watchdog=$!
signal_job() {
  if [ "$grouped" = 1 ]; then kill -"$1" -"$job" 2>/dev/null; fi
  kill -"$1" "$job" 2>/dev/null
}
finish() {
  trap '' PIPE
  printf '%s\n' @end_marker@ 2>/dev/null || rm -rf "$FERRY_RUN_DIR"
  exit "$1"
}
stop() {
  trap '' TERM INT HUP
  code=$1
  [ -e "$FERRY_RUN_DIR"/@timeout_marker@ ] && code=@timeout_exit@
  signal_job TERM
  (
    trap 'kill "$nap" 2>/dev/null; exit 0' TERM
    sleep @grace@ &
    nap=$!
    wait "$nap" || exit 0
    signal_job KILL
  ) </dev/null >/dev/null 2>&1 &
  killer=$!
  wait "$job"
  signal_job KILL
  kill "$killer" "$watchdog" 2>/dev/null
  finish "$code"
}
trap 'stop 143' TERM
trap 'stop 130' INT
trap 'stop 129' HUP
wait "$job"
status=$?
trap '' TERM INT HUP
if [ "$grouped" = 1 ]; then kill -KILL -"$job" 2>/dev/null; fi
kill "$watchdog" 2>/dev/null
[ -e "$FERRY_RUN_DIR"/@timeout_marker@ ] && status=@timeout_exit@
finish "$status"
