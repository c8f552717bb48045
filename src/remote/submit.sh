# ferry's Slurm submit script (generated; runs under /bin/sh on the login node)
# The source is src/remote/submit.sh; ferry fills in the @name@ fields, each already quoted for
# sh where it is text. It submits the run's batch job with sbatch, or follows the job another
# node slot of the same allocation submitted, and reports to ferry on stdout, one frame at a time
# (docs/slurm.md; a sweep's job array has a follower of its own, follow_array.sh):
#   TAG job ID                  the job was submitted
#   TAG state STATE REASON      squeue's view, about once a second (also ferry's heartbeat)
#   TAG out N / TAG err N       then N bytes the launcher wrote to its stdout / stderr
#   TAG note TEXT               something ferry should show (squeue cannot reach the controller)
#   TAG node NAME               where the launcher ran ("-": it never started)
#   TAG end STATE EXIT NODES SOURCE   the final state, from scontrol, else sacct
# @mode@ is empty for a live run; `detach` (run --detach) submits, says the id and exits at
# once, the job staying queued; `attach` (ferry attach/stop of a detached run) follows the job
# @job_id@ names, and on TERM or a lost channel leaves it alone (no scancel, the run directory
# kept): only `ferry stop`'s own scancel stops a detached job.
# Design notes:
# - sbatch's options come from .ferry-sbatch-args, one per line, each checked by ferry; the run's
#   job id is a number ferry checked. Nothing here is text a user wrote.
# - The launcher on the node writes its stdout and stderr to files in its run directory, on the
#   filesystem the nodes share with this login node; they travel to ferry only as counted
#   chunks, so nothing a job prints can pose as a frame. Each read opens the file again, which
#   is what NFS needs to show another machine's writes.
# - The state comes from squeue while the controller lists the job and from sacct after that;
#   sbatch --wait's exit status is never used (Slurm 22.05 returns 0 for some TIMEOUTs).
# - SIGPIPE is ignored: a write that fails means ferry is gone (a lost connection), and then the
#   job is cancelled and the run directory removed, so nothing is left in the queue or on the
#   node. ferry's TERM (Ctrl-C, or its deadline) cancels the job and reports how it ended.
trap '' PIPE
set -f
run_dir=@run_dir@
tag=@tag@
job=@job_id@
job_name=@job_name@
mode=@mode@
end_marker=@end_marker@
printf '%s\n' @sentinel@
printf '%s\n' @sentinel@ >&2
umask 077
stopping=0
leaving=0
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

# Cancels the job (by its name while sbatch has not said its id) and waits up to $1 ticks for
# it to leave the queue.
cancel() {
  if [ -z "$job" ]; then
    scancel --name="$job_name" >/dev/null 2>&1
    return
  fi
  scancel "$job" >/dev/null 2>&1
  left=$1
  while [ "$left" -gt 0 ]; do
    case $(squeue -h -r -t all -j "$job" -o '%T' 2>/dev/null) in
    PENDING | RUNNING | COMPLETING | CONFIGURING | SUSPENDED | REQUEUED | RESIZING | SIGNALING | STAGE_OUT | STOPPED) ;;
    *) return ;;
    esac
    sleep "$tick"
    left=$((left - 1))
  done
}

# Nobody reads any more: leave nothing behind.
lost() {
  trap '' TERM INT HUP
  if [ "$mode" = attach ]; then
    leave_queue
    exit 141
  fi
  cancel 40
  leave_queue
  rm -rf "$run_dir"
  exit 141
}

say() {
  printf '%s %s\n' "$tag" "$*" 2>/dev/null || lost
}

stopped() {
  trap '' TERM INT HUP
  if [ "$mode" = attach ]; then
    leaving=1 # at the loop's next turn: never inside ask_queue, whose lock others wait for
    return
  fi
  stopping=1
  cancel 0
}
trap stopped TERM INT HUP

# Sends what FILE gained since OFFSET-VARIABLE as a frame of STREAM (at most 1 MiB at a time).
forward() {
  [ -f "$run_dir/$1" ] || return 0
  eval "at=\$$3"
  size=$(wc -c <"$run_dir/$1" | tr -d ' ')
  [ -n "$size" ] && [ "$size" -gt "$at" ] || return 0
  n=$((size - at))
  [ "$n" -gt 1048576 ] && n=1048576
  tail -c "+$((at + 1))" "$run_dir/$1" | head -c "$n" >"$run_dir/.ferry-chunk"
  n=$(wc -c <"$run_dir/.ferry-chunk" | tr -d ' ')
  [ "$n" -gt 0 ] || return 0
  say "$2" "$n"
  cat "$run_dir/.ferry-chunk" 2>/dev/null || lost
  eval "$3=\$((at + n))"
  more=1
}

forward_all() {
  more=0
  forward .ferry-stdout out out_at
  forward .ferry-stderr err err_at
}

# The queue's view is shared by the submit scripts of this user on this login node (every run
# of an invocation, every node slot, every other ferry at the same time): each tick one of them
# asks squeue about all their jobs at once and leaves the answer in a state file beside the
# others', so the controller gets one squeue call a second, not one per run (docs/slurm.md).
# The state file: a generation number, squeue's exit status, the ids asked (",1,2_3,"), then
# squeue's lines. A job missing from an answer that asked about it has left the queue.
queue_dir=${run_dir%/*}/.ferry-squeue/$(uname -n 2>/dev/null | tr -c -d 'A-Za-z0-9._-')
seen=
lock_waits=0

# Where the base takes no directory of ours, the script asks for its job alone, as before.
join_queue() {
  if ! { mkdir -p "$queue_dir" && chmod 700 "${queue_dir%/*}" "$queue_dir" &&
    : >"$queue_dir/job.$job.$$"; } 2>/dev/null; then
    queue_dir=$run_dir/.ferry-squeue
    mkdir -p "$queue_dir" 2>/dev/null
    : >"$queue_dir/job.$job.$$" 2>/dev/null
  fi
}

# The last script to leave removes the shared state: nothing stays under the base.
leave_queue() {
  [ -n "$job" ] || return 0
  rm -f "$queue_dir/job.$job.$$" 2>/dev/null
  set +f
  for entry in "$queue_dir"/job.*; do
    if [ -e "$entry" ]; then
      set -f
      return 0
    fi
  done
  set -f
  rm -f "$queue_dir/state" 2>/dev/null
  rmdir "$queue_dir" "${queue_dir%/*}" 2>/dev/null
  return 0
}

# One squeue call for every registered job whose submit script is alive (job.ID.PID: the
# node slots of one allocation follow one id).
ask_queue() {
  ids=
  set +f # globs are off in this script but where it lists the registered jobs
  for entry in "$queue_dir"/job.*; do
    [ -f "$entry" ] || continue
    name=${entry##*/job.}
    owner=${name##*.}
    case $owner in
    '' | *[!0-9]*) owner=0 ;;
    esac
    if [ "$owner" -gt 0 ] && kill -0 "$owner" 2>/dev/null; then
      case "$ids," in
      *",${name%.*},"*) ;;
      *) ids="$ids,${name%.*}" ;;
      esac
    else
      rm -f "$entry"
    fi
  done
  set -f
  case $ids in
  *",$job") ;;
  *",$job,"*) ;;
  *) ids="$ids,$job" ;;
  esac
  said=$(squeue -h -r -t all -j "${ids#,}" -o '%i %T %r' 2>&1)
  status=$?
  generation=$(sed -n 1p "$queue_dir/state" 2>/dev/null)
  case $generation in
  '' | *[!0-9]*) generation=0 ;;
  esac
  printf '%s\n%s\n%s,\n%s\n' "$((generation + 1))" "$status" "$ids" "$said" >"$queue_dir/state.$$" &&
    mv -f "$queue_dir/state.$$" "$queue_dir/state"
}

# Asks squeue for everyone unless someone did since this script last looked; then reads this
# job's line.
poll() {
  now=$(sed -n 1p "$queue_dir/state" 2>/dev/null)
  if [ -z "$now" ] || [ "$now" = "$seen" ]; then
    if mkdir "$queue_dir/.asking" 2>/dev/null; then
      [ "$(sed -n 1p "$queue_dir/state" 2>/dev/null)" = "$now" ] && ask_queue
      rmdir "$queue_dir/.asking" 2>/dev/null
      lock_waits=0
    else
      # Another script is asking; one that died asking (a squeue that hung past the
      # controller's timeout) must not stop everyone.
      lock_waits=$((lock_waits + 1))
      [ "$lock_waits" -gt 30 ] && rmdir "$queue_dir/.asking" 2>/dev/null && lock_waits=0
    fi
  fi
  [ -f "$queue_dir/state" ] || return
  {
    IFS= read -r seen
    IFS= read -r status
    IFS= read -r asked
    line=
    while IFS= read -r row; do
      case $row in
      "$job "*) line=${row#"$job "} ;;
      *) [ "$status" = 0 ] || line="$line $row" ;;
      esac
    done
  } <"$queue_dir/state"
  case $asked in
  *",$job,"*) ;;
  *) return ;; # asked before this job was registered: no news of it yet
  esac
  if [ "$status" != 0 ]; then
    case $line in
    *'Invalid job id'*) final=gone ;;
    *) say note "squeue: $(printf '%s' "$line" | cut -c 1-300)" ;;
    esac
    return
  fi
  set -- $line
  if [ "$#" -eq 0 ]; then
    final=gone
    return
  fi
  say state "$1" "${2:--}"
  case $1 in
  COMPLETED | FAILED | TIMEOUT | CANCELLED | OUT_OF_MEMORY | NODE_FAIL | BOOT_FAIL | DEADLINE | PREEMPTED) final=$1 ;;
  esac
}

@slurm_state@

# Sends the rest once the launcher's last line is here, then how the job ended.
finish() {
  leave_queue
  final_state "$job"
  if [ "$stopping" = 1 ]; then
    await_end "$run_dir" 4 # ferry waits only briefly now
  else
    await_end "$run_dir" 12
  fi
  more=1
  while [ "$more" = 1 ]; do forward_all; done
  node=$(head -n 1 "$run_dir/.ferry-node" 2>/dev/null | tr -c -d 'A-Za-z0-9._-')
  say node "${node:--}"
  say end "$state" "${code:--}" "$(printf '%s' "${nodes:--}" | tr ' ' '_')" "$source"
}

[ -n "$job" ] || submit "$run_dir/.ferry-sbatch-args"
say job "$job"
[ "$mode" = detach ] && exit 0
join_queue

out_at=0
err_at=0
final=
polled=0
waited=0
started=0
while :; do
  if [ "$leaving" = 1 ]; then
    leave_queue
    exit 130
  fi
  # The node has entered the run directory: the job runs, even if squeue never saw it running.
  if [ "$started" = 0 ] && [ -f "$run_dir/.ferry-node" ]; then
    started=1
    say state RUNNING -
  fi
  forward_all
  if [ "$polled" -ge "$polls" ] || [ "$polled" = 0 ] || [ "$stopping" = 1 ]; then
    poll
    polled=0
  fi
  polled=$((polled + 1))
  [ -n "$final" ] && break
  if [ "$stopping" = 1 ]; then
    waited=$((waited + 1))
    [ "$waited" -gt 8 ] && break
  fi
  [ "$more" = 1 ] || sleep "$tick"
done
finish
exit 0
