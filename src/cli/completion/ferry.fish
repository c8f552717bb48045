# fish completion for ferry. Load it with `ferry completion fish | source`, or save it as
# ~/.config/fish/completions/ferry.fish. The candidates come from
# `ferry __complete -- WORDS...`: one per line (a tab, then a description, as fish takes them),
# then a directive line: ":plain", or ":files PREFIX" / ":dirs PREFIX" to have the shell list
# files for the part of the word after PREFIX.

function __ferry_complete
    set -l words (commandline -opc)
    set -l current (commandline -ct)
    set -l program $words[1]
    set -e words[1]
    for line in ($program __complete -- $words "$current" 2>/dev/null)
        if not string match -q -- ':*' $line
            printf '%s\n' $line
            continue
        end
        set -l directive (string sub -s 2 -- $line)
        set -l kind (string split -m 1 ' ' -- $directive)[1]
        set -l prefix (string replace -r '^[a-z]+ ?' '' -- $directive)
        set -l rest (string sub -s (math (string length -- "$prefix") + 1) -- "$current")
        switch $kind
            case files
                for f in (__fish_complete_path "$rest")
                    printf '%s%s\n' $prefix $f
                end
            case dirs
                for f in (__fish_complete_directories "$rest")
                    printf '%s%s\n' $prefix $f
                end
        end
    end
end

complete -c ferry -f -a '(__ferry_complete)'
