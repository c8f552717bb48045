#!/bin/sh
# /// ferry
# description = "Disk usage of every mounted filesystem (df -P): size, used, free and use in MiB and %, read-only"
# interpreter = "sh"
# timeout = 30
# ///
#
# Result: {"filesystems": [{"filesystem", "mount", "total_mib", "used_mib", "free_mib",
# "used_percent"}]}, in df's order. Part of the read-only diagnostics set (docs/job-file.md,
# "Built-in jobs"): it takes no parameters and changes nothing. POSIX sh and awk only.

LC_ALL=C
export LC_ALL

# df may print nothing for a filesystem it cannot stat (exit 1): what it printed still counts.
DU_DF=$(df -Pk 2>/dev/null)
export DU_DF

report() {  # report json|text
    awk -v mode="$1" '
    function jstr(s,   out, i, c) {
        gsub(/[^\t -~]/, "?", s)  # bytes outside printable ASCII: JSON stays valid UTF-8
        out = ""
        for (i = 1; i <= length(s); i++) {
            c = substr(s, i, 1)
            if (c == "\\" || c == "\"") out = out "\\" c
            else if (c == "\t") out = out "\\t"
            else out = out c
        }
        return "\"" out "\""
    }
    function mib(kib) { return sprintf("%.0f", int(kib / 1024)) }
    BEGIN {
        n = split(ENVIRON["DU_DF"], lines, "\n")
        out = ""
        for (l = 2; l <= n; l++) {
            # "Filesystem 1024-blocks Used Available Capacity Mounted on": the filesystem and the
            # mount point may hold spaces, so find the three numbers before "NN%".
            k = split(lines[l], f, /[ \t]+/)
            for (i = 2; i + 3 <= k; i++) {
                if (f[i] ~ /^[0-9]+$/ && f[i + 1] ~ /^[0-9]+$/ && f[i + 2] ~ /^[0-9]+$/ && f[i + 3] ~ /^[0-9]+%$/) {
                    fs = f[1]; for (j = 2; j < i; j++) fs = fs " " f[j]
                    mount = f[i + 4]; for (j = i + 5; j <= k; j++) mount = mount " " f[j]
                    pct = substr(f[i + 3], 1, length(f[i + 3]) - 1)
                    if (mode == "text")
                        printf "%-30s %10s MiB total %10s MiB free  %3s%% used  %s\n", mount, mib(f[i]), mib(f[i + 2]), pct, fs
                    else
                        out = out (out == "" ? "" : ",\n  ") "{\"filesystem\": " jstr(fs) ", \"mount\": " jstr(mount) \
                              ", \"total_mib\": " mib(f[i]) ", \"used_mib\": " mib(f[i + 1]) ", \"free_mib\": " mib(f[i + 2]) \
                              ", \"used_percent\": " pct "}"
                    break
                }
            }
        }
        if (mode == "json") printf "{\"filesystems\": [%s]}\n", out
    }'
}

if [ -n "${FERRY_RESULT:-}" ]; then
    report json >"$FERRY_RESULT" || exit 1
    report text
else
    report json
fi
