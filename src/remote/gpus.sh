# ferry's GPU picker (generated; part of launch.sh, docs/run-protocol.md "GPUs"): the source is
# src/remote/gpus.sh, which make_launcher puts into launch.sh for a run with --gpus only.
# --gpus (docs/run-protocol.md, "GPUs"): @gpu_count@ GPUs that nvidia-smi shows free (no compute
# process, under @gpu_memory_free@ MiB used) and that no other ferry run of this user holds, locked
# before the job starts: a directory per GPU, GPU_ROOT/UUID, made with mkdir (atomic: of two
# launchers one gets it) under the run base, holding `PID START RUN` of its launcher (START: field
# 22 of /proc/PID/stat, so that a reused pid is not taken for it). finish() removes them; a lock
# whose launcher is gone (killed) is stale and the next picker takes it over, by renaming it away
# (atomic too) and checking that what it renamed is what it judged stale. Nothing nvidia-smi prints
# is run or evaluated: its fields are read into variables and used only once they are checked
# (digits, a UUID of [A-Za-z0-9-]).
gpu_root=
gpu_held=
gpu_me=
# The start time of process $1 (field 22 of /proc/PID/stat: after the command name, which may
# hold anything, only numbers and a state letter follow); empty where there is no /proc.
gpu_start_of() {
  gpu_stat=
  { read -r gpu_stat </proc/"$1"/stat; } 2>/dev/null || gpu_stat=
  gpu_stat=${gpu_stat##*) }
  set -f
  # shellcheck disable=SC2086 # split on purpose: the kernel's numbers
  set -- $gpu_stat
  set +f
  if [ $# -ge 20 ]; then printf '%s' "${20}"; fi
}
gpu_release() {
  for gpu_uuid in $gpu_held; do rm -rf "${gpu_root:?}/$gpu_uuid" 2>/dev/null; done
  gpu_held=
}
gpu_refuse() {
  gpu_release
  printf '@gpus_refused_prefix@%s\n' "$1" >&2
  exit @gpus_refused_exit@
}
# The lock directory: the run base's ferry-gpus-UID (a local run's base is the shared temporary
# directory), ours, a real directory, 0700.
gpu_root_ready() {
  gpu_root=${FERRY_RUN_DIR%/*}/ferry-gpus-$(id -u 2>/dev/null)
  (umask 077 && mkdir "$gpu_root") 2>/dev/null
  [ -d "$gpu_root" ] && [ ! -L "$gpu_root" ] && [ -O "$gpu_root" ] && chmod 700 "$gpu_root" 2>/dev/null
}
# Takes GPU $1's lock; false (with gpu_why set) when a live launcher holds it.
gpu_lock() {
  gpu_lock_dir=$gpu_root/$1
  if mkdir "$gpu_lock_dir" 2>/dev/null; then
    printf '%s\n' "$gpu_me" >"$gpu_lock_dir/owner" 2>/dev/null
    gpu_held="$gpu_held $1"
    return 0
  fi
  gpu_owner=
  { read -r gpu_owner <"$gpu_lock_dir/owner"; } 2>/dev/null || gpu_owner=
  if [ -z "$gpu_owner" ]; then
    sleep 1 # its launcher writes the owner right after its mkdir: one that never did is gone
    { read -r gpu_owner <"$gpu_lock_dir/owner"; } 2>/dev/null || gpu_owner=
  fi
  gpu_pid=${gpu_owner%% *}
  gpu_rest=${gpu_owner#* }
  gpu_when=${gpu_rest%% *}
  gpu_run=${gpu_rest#* }
  case $gpu_pid in '' | *[!0-9]*) gpu_pid= ;; esac
  case $gpu_run in '' | *[!A-Za-z0-9._-]*) gpu_run='?' ;; esac
  if [ -n "$gpu_pid" ] && kill -0 "$gpu_pid" 2>/dev/null &&
    { [ "$gpu_when" = - ] || [ "$(gpu_start_of "$gpu_pid")" = "$gpu_when" ]; }; then
    gpu_why="held by ferry run $gpu_run (launcher pid $gpu_pid)"
    return 1
  fi
  # Stale: renamed away first, so that two pickers that both judged it stale cannot both take it.
  gpu_gone=$gpu_root/.gone-$$-$1
  rm -rf "$gpu_gone" 2>/dev/null
  gpu_why="held by another ferry run"
  mv "$gpu_lock_dir" "$gpu_gone" 2>/dev/null || return 1
  gpu_now=
  { read -r gpu_now <"$gpu_gone/owner"; } 2>/dev/null || gpu_now=
  if [ "$gpu_now" != "$gpu_owner" ]; then # another picker took it meanwhile: it goes back
    mkdir "$gpu_lock_dir" 2>/dev/null && mv "$gpu_gone/owner" "$gpu_lock_dir/owner" 2>/dev/null
    rm -rf "$gpu_gone" 2>/dev/null
    return 1
  fi
  rm -rf "$gpu_gone" 2>/dev/null
  gpu_lock "$1"
}
# One look: locks @gpu_count@ free GPUs (gpu_ids, gpu_report) or none (gpu_busy says why).
gpu_pick() {
  if ! gpu_list=$(nvidia-smi --query-gpu=index,uuid,memory.used --format=csv,noheader,nounits 2>/dev/null); then
    gpu_refuse "nvidia-smi --query-gpu failed on this host; is the NVIDIA driver loaded?"
  fi
  gpu_apps=$(nvidia-smi --query-compute-apps=gpu_uuid --format=csv,noheader 2>/dev/null) ||
    gpu_refuse "nvidia-smi --query-compute-apps failed on this host"
  gpu_ids=
  gpu_report=
  gpu_busy=
  gpu_got=0
  gpu_seen=0
  while IFS=', ' read -r gpu_index gpu_uuid gpu_mem gpu_extra; do
    [ -z "$gpu_index$gpu_uuid" ] && continue
    case $gpu_index in '' | *[!0-9]*) gpu_index= ;; esac
    case $gpu_uuid in '' | -* | *[!A-Za-z0-9-]*) gpu_uuid= ;; esac
    case $gpu_mem in '[N/A]') gpu_mem=0 ;; '' | *[!0-9]*) gpu_mem= ;; ??????????*) gpu_mem=999999999 ;; esac
    if [ -z "$gpu_index" ] || [ -z "$gpu_uuid" ] || [ -z "$gpu_mem" ] || [ -n "$gpu_extra" ]; then
      gpu_busy="$gpu_busy; a line of nvidia-smi's that ferry cannot read"
      continue
    fi
    gpu_seen=$((gpu_seen + 1))
    [ "$gpu_got" -ge @gpu_count@ ] && continue
    gpu_procs=0
    while IFS=' ' read -r gpu_app; do
      [ "$gpu_app" = "$gpu_uuid" ] && gpu_procs=$((gpu_procs + 1))
    done <<EOF
$gpu_apps
EOF
    gpu_name="GPU $gpu_index ($gpu_uuid)"
    if [ "$gpu_procs" -gt 0 ]; then
      gpu_busy="$gpu_busy; $gpu_name: $gpu_procs compute process(es)"
    elif [ "$gpu_mem" -ge @gpu_memory_free@ ]; then
      gpu_busy="$gpu_busy; $gpu_name: $gpu_mem MiB used"
    elif gpu_lock "$gpu_uuid"; then
      gpu_got=$((gpu_got + 1))
      gpu_ids=${gpu_ids:+$gpu_ids,}$gpu_index
      gpu_report="$gpu_report $gpu_index $gpu_uuid"
    else
      gpu_busy="$gpu_busy; $gpu_name: $gpu_why"
    fi
  done <<EOF
$gpu_list
EOF
  [ "$gpu_got" -ge @gpu_count@ ] && return 0
  gpu_release
  gpu_busy="$gpu_got of $gpu_seen free, @gpu_count@ wanted${gpu_busy:+:}${gpu_busy#;}"
  return 1
}
if ! command -v nvidia-smi >/dev/null 2>&1; then
  gpu_refuse "nvidia-smi not found on this host (PATH=$PATH); --gpus needs NVIDIA's driver tools"
fi
gpu_root_ready || gpu_refuse "cannot make $gpu_root, a directory of this user's (mode 0700), for GPU locks"
gpu_when=$(gpu_start_of $$)
gpu_me="$$ ${gpu_when:--} ${FERRY_RUN_DIR##*/}" # no /proc: `-`, the pid alone then decides
gpu_waited=0
until gpu_pick; do
  if [ "$gpu_waited" -ge @wait_gpus@ ]; then
    [ "$gpu_waited" -gt 0 ] && gpu_busy="$gpu_busy (after waiting $gpu_waited s)"
    gpu_refuse "not enough free GPUs: $gpu_busy"
  fi
  sleep 2 </dev/null >/dev/null 2>&1
  gpu_waited=$((gpu_waited + 2))
done
