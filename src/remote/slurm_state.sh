# The final state of a Slurm job (src/remote/slurm_state.sh; part of submit.sh and
# follow_array.sh, which ferry fills it into): `final_state JOB` sets state, code, nodes and
# source (scontrol once the job has ended there, else sacct, a moment behind; UNKNOWN
# and none when neither says). `tick` is the caller's pause between sacct's tries.
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
