# ferry launcher (generated; runs under /bin/sh)
@standby@
# The source is src/remote/launch.sh; ferry fills in the @name@ fields, each already quoted for
# sh where it is text. Design notes:
# - The job runs under setsid so it leads a process group of its own: on timeout or interrupt
#   the whole group is killed, children included. Job control (`set -m`) is not an option: dash
#   turns it off without a tty, and exec channels have none.
# - sshd's `signal` request kills the launcher's group (not the job's): the trap forwards it.
# - The deadline lives in the launcher's memory: the watchdog signals USR1 when it passes, so
#   the job is stopped even when no file can be written (a full or read-only disk, a job that
#   removed its run directory). The marker file is only a courtesy for someone looking.
# - SIGPIPE is ignored by the launcher (never by the job): when ferry's connection is gone, a
#   write to the dead output must fail, not kill the launcher before it cleans up.
# - The watchdog's streams go to /dev/null, or its sleep would hold the channel open.
# - Anything the job leaves in its group after it exits is killed too: no stray process keeps
#   the channel (and the user's session) open.
# - The launcher's report ends stdout: `END_MARKER CODE CAUSE` (cause: exit, timeout or
#   stopped), then `gpus INDEX UUID ...` when it locked GPUs for the job (--gpus: src/remote/gpus.sh,
#   put in below for such a run only), then `result KIND [SIZE]` with the bytes of a regular result.json up to the frame
#   limit (so ferry needs no fetch), then `clean removed|kept|failed` once it removed the run
#   directory (so ferry needs no cleanup; kept when ferry still has files to fetch). When the
#   end line cannot be written, nobody reads any more: the launcher removes the run directory
#   all the same.
# - params.json travels as the last @params_size@ bytes of this file, after the final `exit`:
#   the shell never reads that far as commands; `tail -c` copies them out.
# - The job's environment is built here and given to it through `env -i`: PATH, HOME, USER,
#   LANG, TERM and the LC_ categories when the login environment has them, the FERRY_*
#   variables, then the declared ones (which win); under Slurm also SLURM_*, SLURMD_* (the
#   node's name, SLURMD_NODENAME) and the GPU variables the scheduler set. Nothing else is
#   inherited, so a local run and a remote one see the same set. Values never pass through eval: only names do, and those are checked.
# - The second line: for a job with no declared environment, `# ferry-standby 2` and this
#   launcher's fields in hex (the interpreter last), for a python standby
#   (src/remote/standby.py), which runs such a job as this file would, starting no process but
#   the job (and rm -rf for what of the run directory it could not remove), and leaves to this
#   file any run it would refuse; else `#`. tests/remote holds the two to one contract.
trap '' PIPE
FERRY_RUN_DIR=@run_dir@
FERRY_PARAMS=@run_dir@/params.json
FERRY_RESULT=@run_dir@/result.json
FERRY_JOB=@job_name@
export FERRY_RUN_DIR FERRY_PARAMS FERRY_RESULT FERRY_JOB
printf '%s\n' @sentinel@
printf '%s\n' @sentinel@ >&2
cd "$FERRY_RUN_DIR" || exit 125
# --detach (docs/run-protocol.md, "Detached runs"): @detach@ is the seconds a finished run waits
# for collection, empty for a run ferry follows on this channel. This launcher then starts itself
# again as `launch.sh detached` in a session of its own, its output going to files of the run
# directory, says `detached PID` and exits: closing the channel stops nothing. `launch.sh stop
# RUN_DIR` (ferry stop, from a run directory of its own: never the detached run's launch.sh, which
# its job can rewrite) sends TERM to the detached launcher named in RUN_DIR's state file, which
# stops the job as on an interrupt.
detach=@detach@
if [ "${1-}" = stop ]; then
  target=${2-}
  case $target in /*) ;; *)
    printf 'stop gone\n'
    exit 0
    ;;
  esac
  if [ -e "$target"/@done_file@ ]; then
    printf 'stop finished\n'
    exit 0
  fi
  pid=
  read -r pid rest <"$target"/@state_file@ 2>/dev/null
  case $pid in '' | *[!0-9]*) pid= ;; esac
  # A pid that now names another process (the launcher died and its pid was reused) is left alone.
  if [ -n "$pid" ] && [ -r /proc/"$pid"/cmdline ] &&
    ! tr '\000' '\n' </proc/"$pid"/cmdline | grep -qxF "$target"/@launch_file@; then
    pid=
  fi
  if [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null; then
    printf 'stop sent\n'
  else
    printf 'stop gone\n'
  fi
  exit 0
fi
if [ -n "$detach" ] && [ "${1-}" != detached ]; then
  if command -v setsid >/dev/null 2>&1; then
    (trap - PIPE; exec setsid /bin/sh "$FERRY_RUN_DIR"/@launch_file@ detached) \
      </dev/null >"$FERRY_RUN_DIR"/@stdout_file@ 2>"$FERRY_RUN_DIR"/@stderr_file@ &
  else
    (trap '' HUP; trap - PIPE; exec /bin/sh "$FERRY_RUN_DIR"/@launch_file@ detached) \
      </dev/null >"$FERRY_RUN_DIR"/@stdout_file@ 2>"$FERRY_RUN_DIR"/@stderr_file@ &
  fi
  printf 'detached %s\n' "$!"
  exit 0
fi
# The detached launcher always leaves a done file, even when it refuses the run before the job
# starts (no interpreter, a refused job cache entry, no free GPUs): `CODE early` then.
if [ -n "$detach" ]; then
  trap 'early=$?; [ -e "$FERRY_RUN_DIR"/@done_file@ ] || { printf "%s early\n" "$early" >"$FERRY_RUN_DIR"/@done_file@.tmp && mv -f "$FERRY_RUN_DIR"/@done_file@.tmp "$FERRY_RUN_DIR"/@done_file@; } 2>/dev/null' EXIT
fi
# params.json, then who runs here and for how long at most, for ferry's sweep of directories
# nobody will clean up: a run directory is only removed once this launcher is gone and that many
# seconds have passed since the directory last changed (`+SECONDS`: no clock is read). Both are
# written in one subshell with umask 077 ($$ is still the launcher's pid there); the state
# file is best effort.
if ! (umask 077 && tail -c @params_size@ "$FERRY_RUN_DIR"/@launch_file@ >"$FERRY_PARAMS" &&
  { { printf '%s +%s\n' "$$" "$((@timeout@ + @grace@))" >"$FERRY_RUN_DIR"/@state_file@; } 2>/dev/null || :; }); then
  printf 'ferry-launcher: cannot write %s\n' "$FERRY_PARAMS" >&2
  exit 125
fi
interpreter=@interpreter@
if ! command -v "$interpreter" >/dev/null 2>&1; then
  printf '@no_interp_prefix@%s not found on this host (PATH=%s); install it or set an absolute path in the job'"'"'s interpreter\n' "$interpreter" "$PATH" >&2
  exit @no_interp_exit@
fi
# A job linked from the job cache runs only while the entry's bytes still match their sha256: a
# process of this user may have changed it since ferry put it there. A mismatch (or no way to
# hash here) refuses the run before anything of it runs; ferry then discards the entry and sends
# the job again (docs/run-protocol.md, "The job cache"). The link's target is read from `ls -l`
# only then: ferry made the link, to a shell-neutral path.
if [ -n @job_sha256@ ] && [ -L "$FERRY_RUN_DIR"/@job_file@ ]; then
  if command -v sha256sum >/dev/null 2>&1; then
    sum=$(sha256sum <"$FERRY_RUN_DIR"/@job_file@ 2>/dev/null)
  elif command -v shasum >/dev/null 2>&1; then
    sum=$(shasum -a 256 <"$FERRY_RUN_DIR"/@job_file@ 2>/dev/null)
  else
    sum=none
  fi
  if [ "${sum%% *}" != @job_sha256@ ]; then
    entry=$(ls -l "$FERRY_RUN_DIR"/@job_file@ 2>/dev/null)
    why='does not match its sha256'
    [ "$sum" = none ] && why='cannot be checked: no sha256sum or shasum on this host'
    printf '@cache_refused_prefix@%s %s\n' "${entry##* -> }" "$why" >&2
    exit @cache_refused_exit@
  fi
fi
# --gpus: GPUs picked and locked for the job (src/remote/gpus.sh, which sets gpu_ids and
# gpu_report and defines gpu_release), or nothing.
gpu_ids=
gpu_report=
gpu_release() { :; }
@gpu_picker@
set --
# Under Slurm the allocation is part of the job's world: the variables slurmd gives a job
# (SLURM_*, and SLURMD_NODENAME: the node it runs on) and the GPUs the scheduler gave it.
scheduled=
if [ -n "${SLURM_JOB_ID:-}" ]; then
  scheduled="$(env | sed -n 's/^\(SLURMD\{0,1\}_[A-Za-z0-9_]*\)=.*/\1/p') CUDA_VISIBLE_DEVICES ROCR_VISIBLE_DEVICES GPU_DEVICE_ORDINAL"
fi
# The locale categories are named rather than listed from `env`: no process is started.
for name in PATH HOME USER LANG TERM LC_ALL LC_CTYPE LC_NUMERIC LC_TIME LC_COLLATE LC_MONETARY \
  LC_MESSAGES LC_PAPER LC_NAME LC_ADDRESS LC_TELEPHONE LC_MEASUREMENT LC_IDENTIFICATION $scheduled; do
  eval "isset=\${$name+1}"
  if [ -n "$isset" ]; then eval "set -- \"\$@\" \"$name=\${$name}\""; fi
done
set -- "$@" "FERRY_RUN_DIR=$FERRY_RUN_DIR" "FERRY_PARAMS=$FERRY_PARAMS" \
  "FERRY_RESULT=$FERRY_RESULT" "FERRY_JOB=$FERRY_JOB"
@env@
if [ -n "$gpu_ids" ]; then
  set -- "$@" "CUDA_VISIBLE_DEVICES=$gpu_ids" CUDA_DEVICE_ORDER=PCI_BUS_ID
fi
# A detached run's output files stay within the run's output cap (@detach_cap@ bytes each): each of
# the job's streams goes through a FIFO to a filter that copies the first half of the cap to the
# output file as it comes, keeps the last half of the rest (in .ferry-STREAM.tail) and counts the
# rest (in .ferry-STREAM.rest); finish() appends the tail after the job and puts the bytes dropped
# between them in the done file. The filter never stops reading, so the cap neither blocks the job
# nor gives it SIGPIPE. The launcher's own lines (the sentinel, the report) go to the files
# directly. The FIFOs are opened here, before the job starts: a job never waits on them. Without
# mkfifo the files are not capped. The job writes to fds 5 and 6 either way.
capped=
if [ -n "$detach" ] && [ @detach_cap@ -gt 0 ] 2>/dev/null &&
  mkfifo "$FERRY_RUN_DIR"/.ferry-stdout.pipe "$FERRY_RUN_DIR"/.ferry-stderr.pipe 2>/dev/null; then
  capped=1
  cap_head=$((@detach_cap@ - @detach_cap@ / 2))
  cap_tail=$((@detach_cap@ / 2))
  # head -c writes through stdio, which buffers a file's bytes: stdbuf -o0 makes each read show
  # as it comes (attach and ferry_run_output read them live). Without stdbuf the first 4 KiB show
  # only once the job ends or writes more.
  if command -v stdbuf >/dev/null 2>&1; then
    cap_copy() { stdbuf -o0 head -c "$cap_head" >&3; }
  else
    cap_copy() { head -c "$cap_head" >&3; }
  fi
  cap_filter() {
    exec <"$FERRY_RUN_DIR"/.ferry-"$2".pipe 3>&"$1" >/dev/null 2>&1
    cap_copy
    { tee /dev/fd/4 | tail -c "$cap_tail" >"$FERRY_RUN_DIR"/.ferry-"$2".tail; } 4>&1 |
      wc -c >"$FERRY_RUN_DIR"/.ferry-"$2".rest
  }
  (trap - PIPE; cap_filter 1 stdout) &
  out_filter=$!
  (trap - PIPE; cap_filter 2 stderr) &
  err_filter=$!
  exec 5>"$FERRY_RUN_DIR"/.ferry-stdout.pipe 6>"$FERRY_RUN_DIR"/.ferry-stderr.pipe
else
  exec 5>&1 6>&2
fi
grouped=0
if command -v setsid >/dev/null 2>&1; then
  grouped=1
  (trap - PIPE; exec setsid env -i "$@" "$interpreter" "$FERRY_RUN_DIR"/@job_file@ </dev/null >&5 2>&6 5>&- 6>&-) &
else
  (trap - PIPE; exec env -i "$@" "$interpreter" "$FERRY_RUN_DIR"/@job_file@ </dev/null >&5 2>&6 5>&- 6>&-) &
fi
job=$!
exec 5>&- 6>&-
# Sleeps $1 seconds; false when a TERM cut it short. The sleep never outlives a TERM, whenever
# it comes (before the sleep starts, before its pid is known, or during the wait). It is killed
# with KILL: a TERM that reaches the sleep's process between its fork and its exec is caught by
# the handler it still has from this shell, and lost, and the sleep would stay for its seconds.
nap() {
  napping=
  cut=0
  trap 'cut=1; [ -n "$napping" ] && kill -KILL "$napping" 2>/dev/null' TERM
  sleep "$1" &
  napping=$!
  [ "$cut" = 1 ] && kill -KILL "$napping" 2>/dev/null
  wait "$napping" && [ "$cut" = 0 ]
}
# A launcher that is gone when the deadline passes (a job killed it) cannot stop the job: the
# watchdog does, as stop() would, TERM to the job's group, then KILL after the grace.
(
  nap @timeout@ || exit 0
  true >"$FERRY_RUN_DIR"/@timeout_marker@ 2>/dev/null # a failure must not end the watchdog
  kill -USR1 $$ 2>/dev/null && exit 0
  if [ "$grouped" = 1 ]; then kill -TERM -"$job" 2>/dev/null; fi
  kill -TERM "$job" 2>/dev/null
  nap @grace@ || :
  if [ "$grouped" = 1 ]; then kill -KILL -"$job" 2>/dev/null; fi
  kill -KILL "$job" 2>/dev/null
) </dev/null >/dev/null 2>&1 &
watchdog=$!
signal_job() {
  if [ "$grouped" = 1 ]; then kill -"$1" -"$job" 2>/dev/null; fi
  kill -"$1" "$job" 2>/dev/null
}
# The result section of the report. A link, directory, FIFO or device is named, never opened
# or followed; `fetch` leaves a file too large for the frame (or unreadable) to ferry. The file
# is opened read-write on fd 3 and read through /dev/fd/3 once that is seen to be a regular
# file: a FIFO that a process put at the name after the test opens at once that way, where a
# read-only open would wait for a writer forever. A file without write permission is left to
# ferry's fetch, which opens it read-only on the word of its own inspection.
send_result() {
  result_left=0
  if [ -L "$FERRY_RESULT" ]; then
    printf 'result link\n'
  elif [ -f "$FERRY_RESULT" ]; then
    size=
    if command exec 3<>"$FERRY_RESULT" && [ -f /dev/fd/3 ]; then
      size=$(wc -c </dev/fd/3 2>/dev/null)
      size=${size#"${size%%[!	 ]*}"} # a BSD wc pads the number with blanks
    fi
    if [ -n "$size" ] && [ "$size" -le @frame_limit@ ] 2>/dev/null; then
      printf 'result file %s\n' "$size"
      cat /dev/fd/3
    else
      result_left=1
      printf 'result fetch\n'
    fi
    command exec 3<&-
  elif [ -d "$FERRY_RESULT" ]; then
    printf 'result directory\n'
  elif [ -e "$FERRY_RESULT" ]; then
    printf 'result special\n'
  else
    printf 'result none\n'
  fi
}
# A capped run's output (see `capped`): the filters end once the job's last process closed its
# streams; one kept open longer (by a process that left the job's group) is not waited for past
# ~2 s, and its stream's last half is then left out. Each stream's tail is appended to its file,
# and out_dropped and err_dropped say how many bytes were dropped before it.
out_dropped=0
err_dropped=0
drain_output() {
  [ -n "$capped" ] || return 0
  (
    nap 2 || exit 0
    kill -KILL "$out_filter" "$err_filter" 2>/dev/null
  ) </dev/null >/dev/null 2>&1 &
  timer=$!
  wait "$out_filter" 2>/dev/null
  out_ended=$?
  wait "$err_filter" 2>/dev/null
  err_ended=$?
  kill "$timer" 2>/dev/null
  wait "$timer" 2>/dev/null
  if [ "$out_ended" = 0 ]; then
    cat "$FERRY_RUN_DIR"/.ferry-stdout.tail 2>/dev/null
    read -r rest <"$FERRY_RUN_DIR"/.ferry-stdout.rest 2>/dev/null &&
      [ "$rest" -gt "$cap_tail" ] 2>/dev/null && out_dropped=$((rest - cap_tail))
  fi
  if [ "$err_ended" = 0 ]; then
    cat "$FERRY_RUN_DIR"/.ferry-stderr.tail >&2 2>/dev/null
    read -r rest <"$FERRY_RUN_DIR"/.ferry-stderr.rest 2>/dev/null &&
      [ "$rest" -gt "$cap_tail" ] 2>/dev/null && err_dropped=$((rest - cap_tail))
  fi
  rm -f "$FERRY_RUN_DIR"/.ferry-stdout.* "$FERRY_RUN_DIR"/.ferry-stderr.* 2>/dev/null
}
# A detached run keeps its directory for `ferry attach`: the state file then gives the seconds it
# waits for collection (the sweep removes it after), and the done file ("CODE CAUSE OUT_DROPPED
# ERR_DROPPED"), renamed into place last, says the report in the output file is whole.
finish_detached() {
  printf 'clean kept\n' 2>/dev/null
  { printf '%s +%s\n' "$$" "$detach" >"$FERRY_RUN_DIR"/@state_file@; } 2>/dev/null || :
  { printf '%s %s %s %s\n' "$1" "$2" "$out_dropped" "$err_dropped" >"$FERRY_RUN_DIR"/@done_file@.tmp &&
    mv -f "$FERRY_RUN_DIR"/@done_file@.tmp "$FERRY_RUN_DIR"/@done_file@; } 2>/dev/null || :
  exit "$1"
}
finish() {
  gpu_release
  drain_output
  if ! printf '%s %s %s\n' @end_marker@ "$1" "$2" 2>/dev/null && [ -z "$detach" ]; then
    rm -rf "$FERRY_RUN_DIR"
    exit "$1"
  fi
  if [ -n "$gpu_report" ]; then printf 'gpus%s\n' "$gpu_report" 2>/dev/null; fi
  send_result 2>/dev/null
  cd / || :
  if [ -n "$detach" ]; then finish_detached "$1" "$2"; fi
  if [ @keep@ = 1 ] || [ "$result_left" = 1 ]; then
    rm -f "$FERRY_RUN_DIR"/@state_file@ 2>/dev/null
    printf 'clean kept\n' 2>/dev/null
  elif rm -rf "$FERRY_RUN_DIR" 2>/dev/null && [ ! -e "$FERRY_RUN_DIR" ]; then
    printf 'clean removed\n' 2>/dev/null
  else
    printf 'clean failed\n' 2>/dev/null
  fi
  exit "$1"
}
stop() {
  trap '' TERM INT HUP USR1
  signal_job TERM
  (
    nap @grace@ || exit 0
    signal_job KILL
  ) </dev/null >/dev/null 2>&1 &
  killer=$!
  wait "$job" 2>/dev/null
  signal_job KILL
  # Waited for, so their sleeps are gone before the launcher is: a scheduler that kills what is
  # left of the step could otherwise kill a subshell before its trap ends its sleep.
  kill "$killer" "$watchdog" 2>/dev/null
  wait "$killer" "$watchdog" 2>/dev/null
  finish "$1" "$2"
}
trap 'stop @timeout_exit@ timeout' USR1
trap 'stop 143 stopped' TERM
trap 'stop 130 stopped' INT
if [ -n "$detach" ]; then
  trap '' HUP # nobody's terminal or channel: a hangup stops nothing
else
  trap 'stop 129 stopped' HUP
fi
wait "$job" 2>/dev/null
status=$?
trap '' TERM INT HUP USR1
if [ "$grouped" = 1 ]; then kill -KILL -"$job" 2>/dev/null; fi
kill "$watchdog" 2>/dev/null
wait "$watchdog" 2>/dev/null
finish "$status" exit
exit 125
# The parameters follow (params.json); the shell never reads them as commands.
