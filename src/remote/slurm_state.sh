# What submit.sh and follow_array.sh share (src/remote/slurm_state.sh; ferry fills it into both).
# They define `tick` (the pause between tries), `stopping` (1 once ferry's TERM came),
# `end_marker` (the launcher's last line) and `cancel TICKS` (scancel, by name while job is empty).
# `submit ARGS_FILE` submits with sbatch and sets job; `await_end DIR TICKS` waits for the
# launcher's last line; `final_state JOB` sets state, code, nodes and source (scontrol once the
# job has ended there, else sacct, a moment behind; UNKNOWN and none when neither says).

# Submits the batch job with the options in ARGS_FILE (one per line, each checked by ferry) and
# sets job to the id sbatch printed (--parsable: ID or ID;CLUSTER; white space trimmed). Exits 3
# when sbatch failed (it said why on stderr) or printed no id, 130 when ferry stopped meanwhile
# (the job cancelled).
submit() {
  args_file=$1
  set --
  while IFS= read -r arg || [ -n "$arg" ]; do
    set -- "$@" "$arg"
  done <"$args_file"
  submitted=$(sbatch "$@" </dev/null)
  status=$?
  job=$(printf '%s' "${submitted%%;*}" | tr -d ' \t\r\n')
  case $job in
  '' | *[!0-9]*) job= ;; # not an id: cancel by name
  esac
  if [ "$stopping" = 1 ]; then
    cancel 8
    exit 130
  fi
  [ "$status" = 0 ] || exit 3
  if [ -z "$job" ]; then
    printf 'sbatch printed no job id: %s\n' "$submitted" >&2
    exit 3
  fi
}

# The launcher's last line can reach this machine's view of DIR/.ferry-stdout a little after the
# job ended (NFS): waits for it up to TICKS ticks, if the launcher started at all.
await_end() {
  [ -f "$1/.ferry-node" ] || return 0
  tries=0
  while [ "$tries" -lt "$2" ] && ! tail -c 4096 "$1/.ferry-stdout" 2>/dev/null | grep -F -q "$end_marker"; do
    sleep "$tick"
    tries=$((tries + 1))
  done
}

field() {
  printf '%s\n' "$2" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1
}

final_state() {
  info=$(scontrol -o show job "$1" 2>/dev/null)
  state=$(field JobState "$info")
  code=$(field ExitCode "$info")
  nodes=$(field NodeList "$info")
  source=scontrol
  case $state in
  COMPLETED | FAILED | TIMEOUT | CANCELLED | OUT_OF_MEMORY | NODE_FAIL | BOOT_FAIL | DEADLINE | PREEMPTED) return ;;
  esac
  # Not known, or not final yet (COMPLETING: a cancelled task's node still cleans up): sacct.
  seen=$state
  tries=0
  while [ "$tries" -lt 20 ]; do
    row=$(sacct -n -P -X -j "$1" -o State,ExitCode,NodeList 2>/dev/null | head -n 1)
    state=${row%%|*}
    state=${state%% *} # "CANCELLED by 1000"
    case $state in
    COMPLETED | FAILED | TIMEOUT | CANCELLED | OUT_OF_MEMORY | NODE_FAIL | BOOT_FAIL | DEADLINE | PREEMPTED) break ;;
    esac
    sleep "$tick"
    tries=$((tries + 1))
  done
  if [ -n "$state" ]; then
    source=sacct
    rest=${row#*|}
    code=${rest%%|*}
    nodes=${rest#*|}
  elif [ -n "$seen" ]; then
    state=$seen # what scontrol said last
  else
    state=UNKNOWN
    source=none
  fi
}
