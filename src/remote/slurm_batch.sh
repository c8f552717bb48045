#!/bin/sh
# ferry's Slurm batch script (runs under /bin/sh on the job's first node)
# The source is src/remote/slurm_batch.sh; it is submitted as it is, its arguments being the run
# directories of the allocation's node slots (or of a sweep's points, for a job array), which live
# on a filesystem the nodes share with the login node. One task per node (srun when there are
# several) starts the usual launcher of that node's run directory (an array task: of the point its
# SLURM_ARRAY_TASK_ID names), its stdout and stderr going to files there that the submit script on the
# login node passes on to ferry. A node that cannot enter its run directory writes nothing and
# ends with status 97, so ferry can say that the remote base is not shared. When the launcher has
# exited, the task sends TERM to its own process group (Slurm gives each task one): what the
# launcher left there (its watchdog's sleep) must not outlive the step on a node without cgroups.
# A detached run (run --detach) has .ferry-keep-for, the seconds its finished directory waits for
# `ferry attach`: once the launcher has ended (however: Slurm's TERM is only noted meanwhile, the
# launcher handling its own), the task writes the launcher's state file as `PID +SECONDS`, so the
# run base's sweep removes the directory that long after, as a detached launcher's own on an SSH
# host (docs/run-protocol.md, "Detached runs").
task='
umask 077
shift "${SLURM_ARRAY_TASK_ID:-${SLURM_NODEID:-0}}"
dir=$1
cd "$dir" 2>/dev/null || exit 97
printf "%s\n" "${SLURMD_NODENAME:-$(hostname)}" >"$dir/.ferry-node" || exit 97
keep_for=$(cat "$dir/.ferry-keep-for" 2>/dev/null)
case $keep_for in
"" | *[!0-9]*) keep_for= ;;
*) trap : TERM ;;
esac
/bin/sh "$dir/launch.sh" </dev/null >"$dir/.ferry-stdout" 2>"$dir/.ferry-stderr"
status=$?
trap "" TERM
if [ -n "$keep_for" ]; then
  rm -f "$dir/.ferry-launcher" # made anew, so that the directory changes now
  { printf "%s +%s\n" "$$" "$keep_for" >"$dir/.ferry-launcher"; } 2>/dev/null
fi
kill -TERM 0 2>/dev/null
exit "$status"
'
if [ "$#" -gt 1 ] && [ -z "${SLURM_ARRAY_TASK_ID:-}" ]; then
  exec srun --nodes="$#" --ntasks="$#" --ntasks-per-node=1 --kill-on-bad-exit=0 \
    /bin/sh -c "$task" ferry-node "$@"
fi
exec /bin/sh -c "$task" ferry-node "$@"
