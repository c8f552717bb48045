#!/bin/sh
# /// ferry
# description = "A systemd service's state and its last journal lines, read-only"
# interpreter = "sh"
# timeout = 30
#
# [params.service]
# type = "string"
# required = true
# pattern = "[A-Za-z0-9][A-Za-z0-9@._:-]{0,127}"
# help = "the unit: ssh, nginx.service, getty@tty1 (a unit name, never a path or an option)"
#
# [params.lines]
# type = "int"
# default = 50
# choices = [20, 50, 100, 200, 500]
# help = "how many of the last journal lines"
# ///
#
# Result: {"service", "state": "active" | "inactive" | "failed" | ... | null, "lines": [...],
# "note"?}: `systemctl is-active` and `journalctl -u SERVICE -n LINES`. A host without systemd or
# a journal gives no lines and a note; that is an answer, exit 0. Bytes outside printable ASCII
# are shown as '?'. ferry checks `service` against its pattern before the job runs; the job
# checks it again. Part of the read-only diagnostics set (docs/job-file.md, "Built-in jobs").
# POSIX sh and awk only.

LC_ALL=C
export LC_ALL

param() {  # param NAME: a string or number member of params.json (ferry writes it compact)
    awk -v key="\"$1\":" '{ text = text $0 } END {
        i = index(text, key); if (i == 0) exit
        rest = substr(text, i + length(key))
        if (substr(rest, 1, 1) == "\"") { rest = substr(rest, 2); print substr(rest, 1, index(rest, "\"") - 1) }
        else if (match(rest, /^[0-9]+/)) print substr(rest, 1, RLENGTH)
    }' "${FERRY_PARAMS:-/dev/null}" 2>/dev/null
}

SL_SERVICE=$(param service)
SL_LINES=$(param lines)
case $SL_LINES in '' | *[!0-9]*) SL_LINES=50 ;; esac
case $SL_SERVICE in
'' | [!A-Za-z0-9]* | *[!A-Za-z0-9@._:-]*)
    echo "service_log: the service must be a unit name made of [A-Za-z0-9@._:-]" >&2
    exit 2 ;;
esac

SL_STATE= SL_TEXT= SL_NOTE=
if command -v systemctl >/dev/null 2>&1; then
    SL_STATE=$(systemctl is-active "$SL_SERVICE" 2>/dev/null | head -n 1)
    case $SL_STATE in *[!a-z-]*) SL_STATE= ;; esac
fi
if ! command -v journalctl >/dev/null 2>&1; then
    SL_NOTE="no journalctl on this host"
elif sl_out=$(journalctl -u "$SL_SERVICE" -n "$SL_LINES" --no-pager -q -o short-iso 2>&1); then
    SL_TEXT=$sl_out
    [ -n "$SL_TEXT" ] || SL_NOTE="the journal holds no lines of $SL_SERVICE"
else
    SL_NOTE="journalctl: $(printf '%s\n' "$sl_out" | head -n 1)"
fi
export SL_SERVICE SL_STATE SL_TEXT SL_NOTE

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
        n = ENVIRON["SL_TEXT"] == "" ? 0 : split(ENVIRON["SL_TEXT"], lines, "\n")
        state = ENVIRON["SL_STATE"]
        if (mode == "text") {
            printf "%s: %s\n", ENVIRON["SL_SERVICE"], state == "" ? "state unknown" : state
            for (i = 1; i <= n; i++) { s = lines[i]; gsub(/[^\t -~]/, "?", s); print s }
            if (ENVIRON["SL_NOTE"] != "") print "note: " ENVIRON["SL_NOTE"]
            exit
        }
        out = ""
        for (i = 1; i <= n; i++) out = out (i == 1 ? "" : ",\n  ") jstr(lines[i])
        note = ENVIRON["SL_NOTE"] == "" ? "" : ", \"note\": " jstr(ENVIRON["SL_NOTE"])
        printf "{\"service\": %s, \"state\": %s, \"lines\": [%s]%s}\n", jstr(ENVIRON["SL_SERVICE"]),
               state == "" ? "null" : jstr(state), out, note
    }'
}

if [ -n "${FERRY_RESULT:-}" ]; then
    report json >"$FERRY_RESULT" || exit 1
    report text
else
    report json
fi
