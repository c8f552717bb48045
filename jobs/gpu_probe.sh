#!/bin/sh
# /// ferry
# description = "GPUs on this host: name, memory total/used/free (MiB), driver, CUDA version"
# interpreter = "sh"
# timeout = 30
# ///
#
# Result: {"gpus": [{"index", "name", "memory_total_mib", "memory_used_mib",
# "memory_free_mib", "driver", "cuda"}]}; a memory figure nvidia-smi reports as [N/A] is null.
# A host without nvidia-smi, or whose driver does not answer, gives {"gpus": [], "note": "..."}
# and still exits 0: "no GPU here" is an answer, not a failure.
# POSIX sh and awk only (runs under dash, busybox sh, bash, ...).

LC_ALL=C
export LC_ALL

QUERY=index,name,memory.total,memory.used,memory.free,driver_version

# emit JSON TEXT: JSON to $FERRY_RESULT and TEXT to stdout, or JSON alone to stdout.
emit() {
    if [ -n "${FERRY_RESULT:-}" ]; then
        printf '%s\n' "$1" >"$FERRY_RESULT" || exit 1
        printf '%s\n' "$2"
    else
        printf '%s\n' "$1"
    fi
}

# JSON string literal of the text on stdin (lines joined by single spaces, ends trimmed).
json_note() {
    awk '
    BEGIN { for (i = 1; i < 32; i++) ctl[sprintf("%c", i)] = sprintf("\\u%04x", i)
            ctl["\t"] = "\\t" }
    { sub(/\r$/, ""); gsub(/^[ \t]+|[ \t]+$/, ""); if ($0 != "") s = (s == "" ? $0 : s " " $0) }
    END {
        out = ""
        for (i = 1; i <= length(s); i++) {
            c = substr(s, i, 1)
            if (c == "\\" || c == "\"") out = out "\\" c
            else if (c in ctl) out = out ctl[c]
            else out = out c
        }
        printf "\"%s\"", out
    }'
}

no_gpus() {  # no_gpus NOTE [EXTRA_JSON_MEMBERS]
    note=$(printf '%s\n' "$1" | json_note)
    emit "{\"gpus\": [], \"note\": $note$2}" "no GPUs: $1"
    exit 0
}

if ! command -v nvidia-smi >/dev/null 2>&1; then  # (no awk needed on this path)
    note="nvidia-smi not found on PATH; no NVIDIA GPU or driver visible on this host"
    emit "{\"gpus\": [], \"note\": \"$note\"}" "no GPUs: $note"
    exit 0
fi

rows=$(nvidia-smi --query-gpu=$QUERY --format=csv,noheader,nounits 2>&1)
rc=$?
if [ "$rc" -ne 0 ]; then
    [ -n "$rows" ] || rows="nvidia-smi exited with status $rc and printed nothing"
    no_gpus "$rows" ", \"nvidia_smi_exit\": $rc"
fi

# The CUDA version the driver supports: `nvidia-smi --version` (newer drivers) has a line
# "CUDA Version        : 12.8"; older ones only print it in the header of plain `nvidia-smi`
# ("| NVIDIA-SMI 535.129.03   Driver Version: 535.129.03   CUDA Version: 12.2 |").
cuda_of() {
    awk 'match($0, /CUDA Version[ \t]*:[ \t]*[0-9][0-9.]*/) {
             v = substr($0, RSTART, RLENGTH); sub(/^[^:]*:[ \t]*/, "", v); print v; exit
         }'
}
cuda=$(nvidia-smi --version 2>/dev/null | cuda_of)
[ -n "$cuda" ] || cuda=$(nvidia-smi 2>/dev/null | cuda_of)

# One CSV row per GPU: "0, NVIDIA H200, 143771, 0, 143165, 570.133.20". The name is whatever
# lies between the index and the last four fields, so a name with ", " in it survives; rows
# that do not look like that (warnings nvidia-smi mixes in) are skipped.
parse() {  # parse json|text
    printf '%s\n' "$rows" | awk -v mode="$1" -v cuda="$cuda" '
    function jstr(s,   out, i, c) {
        out = ""
        for (i = 1; i <= length(s); i++) {
            c = substr(s, i, 1)
            if (c == "\\" || c == "\"") out = out "\\" c
            else if (c in ctl) out = out ctl[c]
            else out = out c
        }
        return "\"" out "\""
    }
    function trim(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
    function jnum(s) { return s ~ /^[0-9]+$/ ? sprintf("%.0f", s) : "null" }  # %.0f: no 1e+09 forms
    function mib(s) { return s ~ /^[0-9]+$/ ? s " MiB" : "?" }
    BEGIN { for (i = 1; i < 32; i++) ctl[sprintf("%c", i)] = sprintf("\\u%04x", i)
            ctl["\t"] = "\\t"; ctl["\n"] = "\\n"; ctl["\r"] = "\\r"; n = 0 }
    {
        sub(/\r$/, "")
        k = split($0, f, /, /)
        if (k < 6) next
        for (i = 1; i <= k; i++) f[i] = trim(f[i])
        if (f[1] !~ /^[0-9]+$/) next
        name = f[2]
        for (i = 3; i <= k - 4; i++) name = name ", " f[i]
        idx[n] = f[1] + 0; nm[n] = name
        tot[n] = f[k - 3]; used[n] = f[k - 2]; free[n] = f[k - 1]; drv[n] = f[k]
        n++
    }
    END {
        if (mode == "count") { print n; exit }
        if (mode == "text") {
            for (i = 0; i < n; i++)
                printf "GPU %d: %s, %s total, %s used, %s free (driver %s, CUDA %s)\n",
                       idx[i], nm[i], mib(tot[i]), mib(used[i]), mib(free[i]), drv[i],
                       cuda == "" ? "unknown" : cuda
            exit
        }
        printf "{\"gpus\": ["
        for (i = 0; i < n; i++) {
            printf "%s\n  {\"index\": %d, \"name\": %s, \"memory_total_mib\": %s, " \
                   "\"memory_used_mib\": %s, \"memory_free_mib\": %s, \"driver\": %s, " \
                   "\"cuda\": %s}", (i ? "," : ""), idx[i], jstr(nm[i]), jnum(tot[i]),
                   jnum(used[i]), jnum(free[i]), jstr(drv[i]),
                   cuda == "" ? "null" : jstr(cuda)
        }
        printf "%s]}\n", (n ? "\n" : "")
    }'
}

if [ "$(parse count)" -eq 0 ]; then
    [ -n "$rows" ] || rows="(nothing)"
    no_gpus "nvidia-smi listed no GPU: $rows"
fi
emit "$(parse json)" "$(parse text)"
