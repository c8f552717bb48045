#compdef ferry
# zsh completion for ferry. Load it with `source <(ferry completion zsh)` after compinit, or
# save it as _ferry in a directory of $fpath. The candidates come from
# `ferry __complete -- WORDS...`: one per line (a tab, then a description), then a directive
# line: ":plain", or ":files PREFIX" / ":dirs PREFIX" to have the shell list files for the part
# of the word after PREFIX.

_ferry() {
  local -a lines words_done spaced spaced_shown tight tight_shown
  local line word shown directive=plain kind prefix
  lines=("${(@f)$(${words[1]} __complete -- "${(@)words[2,CURRENT]}" 2>/dev/null)}")
  for line in "${lines[@]}"; do
    if [[ $line == :* ]]; then
      directive=${line#:}
      continue
    fi
    [[ -n $line ]] || continue
    word=${line%%$'\t'*}
    shown=$word
    [[ $line == *$'\t'* ]] && shown="$word  -- ${line#*$'\t'}"
    # No space after "KEY=", "host1," or "@": the word goes on.
    if [[ $word == *[=,@/] ]]; then
      tight+=("$word"); tight_shown+=("$shown")
    else
      spaced+=("$word"); spaced_shown+=("$shown")
    fi
  done
  (( ${#spaced} )) && compadd -l -d spaced_shown -a spaced
  (( ${#tight} )) && compadd -S '' -l -d tight_shown -a tight
  kind=${directive%% *}
  prefix=
  [[ $directive == *' '* ]] && prefix=${directive#* }
  if [[ $kind == files || $kind == dirs ]]; then
    [[ -n $prefix ]] && compset -P "${(b)prefix}"
    if [[ $kind == dirs ]]; then
      _files -/
    else
      _files
    fi
  fi
  return 0
}

if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
  _ferry "$@"
else
  compdef _ferry ferry
fi
