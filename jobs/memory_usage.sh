#!/bin/sh
# /// ferry
# description = "Memory and swap in MiB (/proc/meminfo) and the 10 processes using the most memory, read-only"
# interpreter = "sh"
# timeout = 30
# ///
#
# Result: {"total_mib", "available_mib", "swap_total_mib", "swap_free_mib",
# "top": [{"pid", "rss_mib", "command"}]}; a figure this host does not offer is null. Part of the
# read-only diagnostics set (docs/job-file.md, "Built-in jobs"): no parameters, changes nothing.
# POSIX sh and awk only.

LC_ALL=C
export LC_ALL

MU_MEMINFO=$(cat /proc/meminfo 2>/dev/null)
# "PID RSS(KiB) COMMAND" for every process; the command may hold spaces.
MU_PS=$(ps -eo pid= -o rss= -o comm= 2>/dev/null)
export MU_MEMINFO MU_PS

report() {  # report json|text
    awk -v mode="$1" '
    function jstr(s,   out, i, c) {
        gsub(/[^\t -~]/, "?", s)
        out = ""
        for (i = 1; i <= length(s); i++) {
            c = substr(s, i, 1)
            if (c == "\\" || c == "\"") out = out "\\" c
            else if (c == "\t") out = out "\\t"
            else out = out c
        }
        return "\"" out "\""
    }
    function mib(kib) { return kib == "" ? "null" : sprintf("%.0f", int(kib / 1024)) }
    function meminfo(key,   n, lines, i, f) {  # KiB from a "Key:  123456 kB" line
        n = split(ENVIRON["MU_MEMINFO"], lines, "\n")
        for (i = 1; i <= n; i++) {
            split(lines[i], f, /[: \t]+/)
            if (f[1] == key && f[2] ~ /^[0-9]+$/) return f[2]
        }
        return ""
    }
    BEGIN {
        n = split(ENVIRON["MU_PS"], lines, "\n")
        count = 0
        for (i = 1; i <= n; i++) {
            line = lines[i]; sub(/^[ \t]+/, "", line)
            if (split(line, f, /[ \t]+/) < 3 || f[1] !~ /^[0-9]+$/ || f[2] !~ /^[0-9]+$/) continue
            cmd = line; sub(/^[0-9]+[ \t]+[0-9]+[ \t]+/, "", cmd)
            count++; pid[count] = f[1]; rss[count] = f[2] + 0; comm[count] = cmd
        }
        for (t = 1; t <= 10 && t <= count; t++) {  # the ten largest, a selection at a time
            best = t
            for (i = t + 1; i <= count; i++) if (rss[i] > rss[best]) best = i
            p = pid[t]; pid[t] = pid[best]; pid[best] = p
            r = rss[t]; rss[t] = rss[best]; rss[best] = r
            c = comm[t]; comm[t] = comm[best]; comm[best] = c
        }
        total = meminfo("MemTotal"); avail = meminfo("MemAvailable")
        swap = meminfo("SwapTotal"); swap_free = meminfo("SwapFree")
        if (mode == "text") {
            printf "memory: %s MiB total, %s MiB available; swap %s MiB, %s MiB free\n", mib(total), mib(avail), mib(swap), mib(swap_free)
            for (t = 1; t <= 10 && t <= count; t++) printf "%8s MiB  pid %-8s %s\n", mib(rss[t]), pid[t], comm[t]
            exit
        }
        top = ""
        for (t = 1; t <= 10 && t <= count; t++)
            top = top (top == "" ? "" : ", ") "{\"pid\": " pid[t] ", \"rss_mib\": " mib(rss[t]) ", \"command\": " jstr(comm[t]) "}"
        printf "{\"total_mib\": %s, \"available_mib\": %s, \"swap_total_mib\": %s, \"swap_free_mib\": %s,\n \"top\": [%s]}\n", \
               mib(total), mib(avail), mib(swap), mib(swap_free), top
    }'
}

if [ -n "${FERRY_RESULT:-}" ]; then
    report json >"$FERRY_RESULT" || exit 1
    report text
else
    report json
fi
