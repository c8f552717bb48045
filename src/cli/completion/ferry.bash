# bash completion for ferry. Load it with `source <(ferry completion bash)`, or save it as
# /etc/bash_completion.d/ferry. The candidates come from `ferry __complete -- WORDS...`: one
# per line (a tab, then a description), then a directive line: ":plain", or ":files PREFIX" /
# ":dirs PREFIX" to have the shell list files for the part of the word after PREFIX.

_ferry() {
    local line=${COMP_LINE:0:COMP_POINT} word gap rest pos=0 i
    local -a words=()
    # bash splits "tp=8" and "host:22" at COMP_WORDBREAKS; ferry wants the words as typed, so
    # pieces with no blank between them in the line are joined again.
    for ((i = 0; i <= COMP_CWORD; i++)); do
        word=${COMP_WORDS[i]}
        rest=${line:pos}
        gap=${rest%%[![:blank:]]*}
        pos=$((pos + ${#gap}))
        if ((i == COMP_CWORD)); then
            word=${line:pos}
        fi
        if ((i > 0 && ${#gap} == 0)); then
            words[${#words[@]} - 1]+=$word
        else
            words+=("$word")
        fi
        pos=$((pos + ${#word}))
    done
    local full=${words[${#words[@]} - 1]}
    # What readline will not replace: the word up to its last COMP_WORDBREAKS character, less
    # that character when it is $ or @ (readline's special prefixes, which it replaces with the
    # text after them). Not COMP_WORDS' last piece: for "mode=" that piece is "=" itself, while
    # readline replaces the empty text after it.
    local keep=
    if [[ -n $COMP_WORDBREAKS ]]; then
        keep=${full%"${full##*[$COMP_WORDBREAKS]}"}
        case $keep in
        *@ | *\$) keep=${keep%?} ;;
        esac
    fi

    local out directive=plain c
    local -a candidates=()
    out=$("${COMP_WORDS[0]}" __complete -- "${words[@]:1}" 2>/dev/null) || return 0
    while IFS= read -r c; do
        case $c in
        :*) directive=${c#:} ;;
        *) candidates+=("${c%%$'\t'*}") ;;
        esac
    done <<<"$out"

    local kind=${directive%% *} prefix=
    [[ $directive == *' '* ]] && prefix=${directive#* }
    if [[ $kind == files || $kind == dirs ]]; then
        local f flag=-f
        [[ $kind == dirs ]] && flag=-d
        while IFS= read -r f; do
            [[ -d $f ]] && f+=/
            candidates+=("$prefix$f")
        done < <(compgen "$flag" -- "${full#"$prefix"}")
    fi

    COMPREPLY=()
    local nospace=
    for c in "${candidates[@]}"; do
        [[ $c == "$full"* ]] || continue
        COMPREPLY+=("${c#"$keep"}")
        [[ $c == *[=,/@] ]] && nospace=1
    done
    [[ -n $nospace ]] && compopt -o nospace 2>/dev/null
    return 0
}

complete -F _ferry ferry
