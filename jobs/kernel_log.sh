#!/bin/sh
# /// ferry
# description = "The last kernel messages (dmesg, else the journal's kernel log), read-only"
# interpreter = "sh"
# timeout = 30
#
# [params.lines]
# type = "int"
# default = 50
# choices = [20, 50, 100, 200, 500]
# help = "how many of the last messages"
# ///
#
# Result: {"source": "dmesg" | "journal" | null, "lines": [...], "note"?}. dmesg needs a right
# many hosts do not give (kernel.dmesg_restrict): then the journal's kernel log (journalctl -k),
# and when neither is readable, no lines and a note saying why; that is an answer, exit 0.
# Bytes outside printable ASCII are shown as '?'. Part of the read-only diagnostics set
# (docs/job-file.md, "Built-in jobs"). POSIX sh and awk only.

LC_ALL=C
export LC_ALL

# The `lines` parameter as ferry wrote it (compact JSON); ferry allows only its choices.
KL_LINES=$(awk '{ text = text $0 } END {
    if (match(text, /"lines":[0-9]+/)) print substr(text, RSTART + 8, RLENGTH - 8) }' \
    "${FERRY_PARAMS:-/dev/null}" 2>/dev/null)
case $KL_LINES in '' | *[!0-9]*) KL_LINES=50 ;; esac

KL_SOURCE= KL_TEXT= KL_NOTE=
if kl_out=$(dmesg 2>&1) && [ -n "$kl_out" ]; then
    KL_SOURCE=dmesg
    KL_TEXT=$(printf '%s\n' "$kl_out" | tail -n "$KL_LINES")
else
    kl_why="dmesg: $(printf '%s\n' "$kl_out" | head -n 1)"
    if ! command -v journalctl >/dev/null 2>&1; then
        KL_NOTE="kernel messages are not readable here ($kl_why; no journalctl)"
    elif kl_out=$(journalctl -k -n "$KL_LINES" --no-pager -q -o short-iso 2>&1); then
        KL_SOURCE=journal
        KL_TEXT=$kl_out
        [ -n "$KL_TEXT" ] || KL_NOTE="the journal holds no kernel messages ($kl_why)"
    else
        KL_NOTE="kernel messages are not readable here ($kl_why; journalctl: $(printf '%s\n' "$kl_out" | head -n 1))"
    fi
fi
export KL_SOURCE KL_TEXT KL_NOTE

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
    BEGIN {
        n = ENVIRON["KL_TEXT"] == "" ? 0 : split(ENVIRON["KL_TEXT"], lines, "\n")
        if (mode == "text") {
            for (i = 1; i <= n; i++) { s = lines[i]; gsub(/[^\t -~]/, "?", s); print s }
            if (ENVIRON["KL_NOTE"] != "") print "note: " ENVIRON["KL_NOTE"]
            exit
        }
        out = ""
        for (i = 1; i <= n; i++) out = out (i == 1 ? "" : ",\n  ") jstr(lines[i])
        source = ENVIRON["KL_SOURCE"] == "" ? "null" : jstr(ENVIRON["KL_SOURCE"])
        note = ENVIRON["KL_NOTE"] == "" ? "" : ", \"note\": " jstr(ENVIRON["KL_NOTE"])
        printf "{\"source\": %s, \"lines\": [%s]%s}\n", source, out, note
    }'
}

if [ -n "${FERRY_RESULT:-}" ]; then
    report json >"$FERRY_RESULT" || exit 1
    report text
else
    report json
fi
