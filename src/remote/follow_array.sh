# ferry's Slurm follower for a sweep's job array (generated; runs under /bin/sh on the login node)
# The source is src/remote/follow_array.sh; ferry fills in the @name@ fields, each already quoted
# for sh. It submits the array with sbatch and follows every task of it on this one channel,
# reporting to ferry on stdout one frame at a time (docs/slurm.md); a frame about one task names
# it (K, from 0: the point's task):
#   TAG job ID                       the array was submitted
#   TAG note TEXT                    something ferry should show (squeue cannot reach the controller)
#   TAG K state STATE REASON         squeue's view of task K, about once a second
#   TAG K out N / TAG K err N        then N bytes task K's launcher wrote to its stdout / stderr
#   TAG K node NAME                  where task K's launcher ran ("-": it never started)
#   TAG K end STATE EXIT NODES SOURCE   task K's final state, from scontrol, else sacct
# Design notes (those of submit.sh hold here too):
# - sbatch's options and the points' run directories come from the first point's
#   .ferry-sbatch-args, each line checked by ferry. Nothing here is text a user wrote.
# - One squeue call a tick asks about every task of the array at once, so the controller's load
#   and the login node's channels do not grow with the points.
# - ferry cancels a single task itself (`scancel ARRAY_K`, when that point's deadline passes); its
#   TERM (Ctrl-C) makes this script cancel the whole array, wait until it has left the queue, and
#   report how every task ended.
# - A failed write means ferry is gone: the array is cancelled and every run directory removed.
trap '' PIPE
set -f
tag=@tag@
job_name=@job_name@
end_marker=@end_marker@
set -- @run_dirs@
printf '%s\n' @sentinel@
printf '%s\n' @sentinel@ >&2
umask 077
stopping=0
tick=1
polls=1
if sleep 0.1 2>/dev/null; then
  tick=0.25 # fractions of a second (GNU, busybox): output moves sooner
  polls=4
fi
if ! printf 'x' | head -c 1 >/dev/null 2>&1; then
  printf 'ferry: the login node has no `head -c` (GNU coreutils or busybox)\n' >&2
  exit 4
fi

# The points' run directories: dir_0 ... dir_(n-1).
n=0
for dir in "$@"; do
  eval "dir_$n=\$dir"
  n=$((n + 1))
done
job=

# Cancels the whole array (by its name while sbatch has not said its id) and waits up to $1 ticks
# for every task to leave the queue.
cancel() {
  if [ -z "$job" ]; then
    scancel --name="$job_name" >/dev/null 2>&1
    return
  fi
  scancel "$job" >/dev/null 2>&1
  wait_left=$1
  while [ "$wait_left" -gt 0 ]; do
    active=0
    for state in $(squeue -h -r -t all -j "$job" -o '%T' 2>/dev/null); do
      case $state in
      PENDING | RUNNING | COMPLETING | CONFIGURING | SUSPENDED | REQUEUED | RESIZING | SIGNALING | STAGE_OUT | STOPPED) active=1 ;;
      esac
    done
    [ "$active" = 1 ] || return
    sleep "$tick"
    wait_left=$((wait_left - 1))
  done
}

# Nobody reads any more: leave nothing behind.
lost() {
  trap '' TERM INT HUP
  cancel 40
  t=0
  while [ "$t" -lt "$n" ]; do
    eval "rm -rf \"\$dir_$t\""
    t=$((t + 1))
  done
  exit 141
}

say() {
  printf '%s %s\n' "$tag" "$*" 2>/dev/null || lost
}

stopped() {
  trap '' TERM INT HUP
  stopping=1
  cancel 0
}
trap stopped TERM INT HUP

# Sends what task $1's FILE ($2) gained since its offset as a frame of STREAM ($3: out, err), at
# most 1 MiB at a time.
forward() {
  eval "d=\$dir_$1 at=\${$3_at_$1:-0}"
  [ -f "$d/$2" ] || return 0
  size=$(wc -c <"$d/$2" | tr -d ' ')
  [ -n "$size" ] && [ "$size" -gt "$at" ] || return 0
  count=$((size - at))
  [ "$count" -gt 1048576 ] && count=1048576
  tail -c "+$((at + 1))" "$d/$2" | head -c "$count" >"$d/.ferry-chunk"
  count=$(wc -c <"$d/.ferry-chunk" | tr -d ' ')
  [ "$count" -gt 0 ] || return 0
  say "$1" "$3" "$count"
  cat "$d/.ferry-chunk" 2>/dev/null || lost
  eval "$3_at_$1=\$((at + count))"
  more=1
}

forward_all() {
  forward "$1" .ferry-stdout out
  forward "$1" .ferry-stderr err
}

# One squeue call for every task of the array; a task's final state is kept in final_K, and a
# task missing from an answer has left the queue (final_K=gone).
poll() {
  said=$(squeue -h -r -t all -j "$job" -o '%i %T %r' 2>&1)
  if [ "$?" != 0 ]; then
    case $said in
    *'Invalid job id'*) all_gone=1 ;; # every task has left the queue
    *) say note "squeue: $(printf '%s' "$said" | tr '\n' ' ' | cut -c 1-300)" ;;
    esac
    return
  fi
  listed=,
  while read -r id state reason; do
    task=${id#"${job}_"}
    case $task in
    '' | *[!0-9]*) continue ;;
    esac
    [ "$task" -lt "$n" ] || continue
    listed="$listed$task,"
    eval "known=\${final_$task:-}"
    [ -z "$known" ] || continue
    say "$task" state "$state" "${reason:--}"
    case $state in
    COMPLETED | FAILED | TIMEOUT | CANCELLED | OUT_OF_MEMORY | NODE_FAIL | BOOT_FAIL | DEADLINE | PREEMPTED) eval "final_$task=\$state" ;;
    esac
  done <<EOF
$said
EOF
  t=0
  while [ "$t" -lt "$n" ]; do
    case $listed in
    *",$t,"*) ;;
    *) eval "final_$t=\${final_$t:-gone}" ;;
    esac
    t=$((t + 1))
  done
}

@slurm_state@

# Task $1 has ended: its launcher's last line can reach this machine's view of the file a little
# later (NFS); wait for it briefly (not when the array was cancelled: the wait was had once), then
# send the rest and the end.
finish_task() {
  eval "d=\$dir_$1"
  final_state "${job}_$1"
  [ "$stopping" = 1 ] || await_end "$d" 12
  more=1
  while [ "$more" = 1 ]; do
    more=0
    forward_all "$1"
  done
  node=$(head -n 1 "$d/.ferry-node" 2>/dev/null | tr -c -d 'A-Za-z0-9._-')
  say "$1" node "${node:--}"
  say "$1" end "$state" "${code:--}" "$(printf '%s' "${nodes:--}" | tr ' ' '_')" "$source"
  eval "done_$1=1"
  running=$((running - 1))
}

# Ends every task whose final state is known (all of them once the array is cancelled).
finish_ended() {
  t=0
  while [ "$t" -lt "$n" ]; do
    eval "ended=\${done_$t:-0} known=\${final_$t:-}"
    if [ "$ended" = 0 ] && { [ -n "$known" ] || [ "$all_gone" = 1 ] || [ "$stopping" = 1 ]; }; then
      finish_task "$t"
    fi
    t=$((t + 1))
  done
}

# Passes on what every running task wrote since the last time.
forward_running() {
  more=0
  t=0
  while [ "$t" -lt "$n" ]; do
    eval "ended=\${done_$t:-0} started=\${started_$t:-0} d=\$dir_$t"
    if [ "$ended" = 0 ]; then
      # The node has entered the run directory: the task runs, even if squeue never saw it.
      if [ "$started" = 0 ] && [ -f "$d/.ferry-node" ]; then
        eval "started_$t=1"
        say "$t" state RUNNING -
      fi
      forward_all "$t"
    fi
    t=$((t + 1))
  done
}

submit "$dir_0/.ferry-sbatch-args"
say job "$job"

running=$n
all_gone=0
polled=0
while [ "$running" -gt 0 ]; do
  forward_running
  if [ "$stopping" = 1 ]; then
    cancel 20
    sleep 1 # the launchers' last lines
    forward_running
    finish_ended
    break
  fi
  if [ "$polled" -ge "$polls" ] || [ "$polled" = 0 ]; then
    poll
    polled=0
  fi
  polled=$((polled + 1))
  finish_ended
  [ "$more" = 1 ] || sleep "$tick"
done
exit 0
