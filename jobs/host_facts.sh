#!/bin/sh
# /// ferry
# description = "Host facts: OS, kernel, CPUs, memory, free disk of the run base, python3 and nvidia-smi on PATH"
# interpreter = "sh"
# timeout = 30
#
# [params.interpreters]
# type = "list"
# items = "string"
# default = []
# program = true
# choices = ["sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "tcsh", "csh", "busybox", "python", "python3", "python3.8", "python3.9", "python3.10", "python3.11", "python3.12", "python3.13", "python3.14", "pypy3", "perl", "ruby", "node", "Rscript", "julia", "lua", "php", "tclsh"]
# help = "interpreters to look for on PATH, each with its version (`ferry check` also asks about those the jobs on the job path and the config file name)"
# ///
#
# Result:
#   {"hostname", "os", "kernel", "arch", "cpus",
#    "memory": {"total_mib", "available_mib"},
#    "disk": {"path", "mount", "total_mib", "free_mib"},
#    "tools": {"python3": {"path", "version"} | null, "nvidia-smi": {"path"} | null},
#    "interpreters": {NAME: {"path", "version"} | null, ...},
#    "user", "shell", "sh"}
# "interpreters" has one member per name the `interpreters` parameter lists (what `ferry check`
# asks about); its version is the first version-like word of `PROGRAM --version`, else null.
# ferry checks the names against the parameter's choices before the job runs (`program = true`):
# a caller cannot make it run a program of its choosing. Only `ferry check`, which asks about the
# interpreters the user's own jobs and config file name, may add to them.
# A figure this host does not offer is null. The disk is the one holding $FERRY_RUN_DIR
# (else $HOME). POSIX sh and awk only (runs under dash, busybox sh, bash, ...).

LC_ALL=C
export LC_ALL

os_name() {
    for f in /etc/os-release /usr/lib/os-release; do
        [ -r "$f" ] || continue
        # PRETTY_NAME="Debian GNU/Linux 12 (bookworm)": quoted shell-style, maybe unquoted.
        awk '/^PRETTY_NAME=/ {
            v = substr($0, 13)
            q = substr(v, 1, 1)
            if ((q == "\"" || q == "\047") && substr(v, length(v), 1) == q) {
                v = substr(v, 2, length(v) - 2)
                if (q == "\"") {
                    out = ""
                    for (i = 1; i <= length(v); i++) {
                        c = substr(v, i, 1)
                        if (c == "\\" && i < length(v)) { i++; c = substr(v, i, 1) }
                        out = out c
                    }
                    v = out
                }
            }
            print v; exit
        }' "$f"
        return
    done
    uname -s
}

first_word_number() {  # the output of a command if it is a plain number, else nothing
    case $1 in
    '' | *[!0-9]*) ;;
    *) printf '%s' "$1" ;;
    esac
}

HF_HOSTNAME=$(uname -n 2>/dev/null)
HF_OS=$(os_name)
HF_KERNEL=$(uname -sr 2>/dev/null)
HF_ARCH=$(uname -m 2>/dev/null)
HF_CPUS=$(first_word_number "$(getconf _NPROCESSORS_ONLN 2>/dev/null)")
[ -n "$HF_CPUS" ] || HF_CPUS=$(first_word_number "$(nproc 2>/dev/null)")

HF_MEMINFO=$(cat /proc/meminfo 2>/dev/null)

HF_DISK_PATH=${FERRY_RUN_DIR:-${HOME:-.}}
HF_DF=$(df -Pk "$HF_DISK_PATH" 2>/dev/null)

HF_PYTHON3=$(command -v python3 2>/dev/null)
HF_PYTHON3_VERSION=
if [ -n "$HF_PYTHON3" ]; then
    HF_PYTHON3_VERSION=$("$HF_PYTHON3" --version 2>&1 </dev/null)
fi
HF_NVIDIA_SMI=$(command -v nvidia-smi 2>/dev/null)

# The names in params.json's "interpreters" list (ferry writes it compact). Only names made of
# [A-Za-z0-9/._-] not starting with '-' are taken: they are safe to split and to run.
interpreter_names() {
    [ -r "${FERRY_PARAMS:-}" ] || return 0
    awk '{ text = text $0 }
    END {
        i = index(text, "\"interpreters\":[")
        if (i == 0) exit
        rest = substr(text, i + 16)
        n = split(substr(rest, 1, index(rest, "]") - 1), parts, ",")
        for (k = 1; k <= n; k++)
            if (parts[k] ~ /^[ \t]*"[A-Za-z0-9\/._][A-Za-z0-9\/._-]*"[ \t]*$/) {
                p = parts[k]
                gsub(/^[ \t]*"|"[ \t]*$/, "", p)
                print p
            }
    }' "$FERRY_PARAMS"
}

version_of() {  # the first version-like word `PROGRAM --version` prints, if any
    if command -v timeout >/dev/null 2>&1; then
        hf_out=$(timeout 5 "$1" --version </dev/null 2>&1)
    else
        hf_out=$("$1" --version </dev/null 2>&1)
    fi
    printf '%s\n' "$hf_out" |
        awk 'match($0, /[0-9]+\.[0-9]+[.0-9A-Za-z+]*/) { print substr($0, RSTART, RLENGTH); exit }'
}

# One "NAME<tab>PATH<tab>VERSION" line per interpreter asked about (PATH empty: not found).
HF_INTERPRETERS=
for hf_name in $(interpreter_names); do
    hf_path=$(command -v "$hf_name" 2>/dev/null) || hf_path=
    hf_version=
    [ -z "$hf_path" ] || hf_version=$(version_of "$hf_path")
    HF_INTERPRETERS="$HF_INTERPRETERS$hf_name	$hf_path	$hf_version
"
done

HF_USER=$(id -un 2>/dev/null)
[ -n "$HF_USER" ] || HF_USER=${USER:-${LOGNAME:-}}
# ferry gives jobs no $SHELL (only a fixed set of variables): the account's entry tells it.
HF_SHELL=${SHELL:-$( (getent passwd "$HF_USER" || cat /etc/passwd) 2>/dev/null |
    awk -F: -v u="$HF_USER" '$1 == u { print $7; exit }')}
# Which program `sh` is here (dash, bash, busybox, ...), resolved through symlinks.
HF_SH=$(command -v sh 2>/dev/null)
if [ -n "$HF_SH" ]; then
    HF_SH=$(readlink -f "$HF_SH" 2>/dev/null || printf '%s' "$HF_SH")
fi

export HF_HOSTNAME HF_OS HF_KERNEL HF_ARCH HF_CPUS HF_MEMINFO HF_DISK_PATH HF_DF \
    HF_PYTHON3 HF_PYTHON3_VERSION HF_NVIDIA_SMI HF_INTERPRETERS HF_USER HF_SHELL HF_SH

# Values travel through ENVIRON, not -v, which would interpret backslashes in them.
facts() {  # facts json|text
    awk -v mode="$1" '
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
    function jopt(s) { return s == "" ? "null" : jstr(s) }
    function jnum(s) { return s ~ /^[0-9]+$/ ? sprintf("%.0f", s) : "null" }  # %.0f: no 1e+09 forms
    function mib(kib) { return sprintf("%.0f", int(kib / 1024)) }  # as text: mawk prints 3e9 as 3e+09
    function or_q(s) { return s == "" ? "?" : s }
    function interpreters(mode,   n, lines, i, f, out) {  # from HF_INTERPRETERS, as JSON or text
        n = split(ENVIRON["HF_INTERPRETERS"], lines, "\n")
        out = ""
        for (i = 1; i <= n; i++) {
            if (split(lines[i], f, "\t") < 1 || f[1] == "") continue
            if (mode == "json")
                out = out (out == "" ? "" : ", ") jstr(f[1]) ": " (f[2] == "" ? "null" : \
                      "{\"path\": " jstr(f[2]) ", \"version\": " jopt(f[3]) "}")
            else
                out = out (out == "" ? "" : ", ") f[1] " " (f[2] == "" ? "not found" : \
                      f[2] (f[3] == "" ? "" : " (" f[3] ")"))
        }
        return out
    }
    function meminfo(key,   n, lines, i, f) {  # MiB from a "Key:  123456 kB" line
        n = split(ENVIRON["HF_MEMINFO"], lines, "\n")
        for (i = 1; i <= n; i++) {
            split(lines[i], f, /[: \t]+/)
            if (f[1] == key && f[2] ~ /^[0-9]+$/) return mib(f[2])
        }
        return ""
    }
    BEGIN {
        for (i = 1; i < 32; i++) ctl[sprintf("%c", i)] = sprintf("\\u%04x", i)
        ctl["\t"] = "\\t"; ctl["\n"] = "\\n"; ctl["\r"] = "\\r"

        mem_total = meminfo("MemTotal"); mem_avail = meminfo("MemAvailable")

        # df -Pk: "Filesystem 1024-blocks Used Available Capacity Mounted on"; the filesystem
        # and the mount point may hold spaces, so find the three numbers before "NN%".
        n = split(ENVIRON["HF_DF"], lines, "\n")
        disk_total = disk_free = mount = ""
        if (n >= 2) {
            k = split(lines[n], f, /[ \t]+/)
            for (i = 2; i + 3 <= k; i++)
                if (f[i] ~ /^[0-9]+$/ && f[i + 1] ~ /^[0-9]+$/ && f[i + 2] ~ /^[0-9]+$/ && f[i + 3] ~ /%$/) {
                    disk_total = mib(f[i]); disk_free = mib(f[i + 2])
                    mount = f[i + 4]
                    for (j = i + 5; j <= k; j++) mount = mount " " f[j]
                    break
                }
        }

        py = ENVIRON["HF_PYTHON3"]; pyv = ENVIRON["HF_PYTHON3_VERSION"]
        if (match(pyv, /[0-9]+\.[0-9]+[.0-9A-Za-z+]*/)) pyv = substr(pyv, RSTART, RLENGTH); else pyv = ""
        smi = ENVIRON["HF_NVIDIA_SMI"]

        if (mode == "text") {
            printf "host:       %s (%s, %s, %s)\n", or_q(ENVIRON["HF_HOSTNAME"]), or_q(ENVIRON["HF_OS"]),
                   or_q(ENVIRON["HF_KERNEL"]), or_q(ENVIRON["HF_ARCH"])
            printf "cpus:       %s\n", or_q(ENVIRON["HF_CPUS"])
            printf "memory:     %s MiB total, %s MiB available\n", or_q(mem_total), or_q(mem_avail)
            printf "disk:       %s MiB free of %s MiB at %s (mount %s)\n", or_q(disk_free),
                   or_q(disk_total), ENVIRON["HF_DISK_PATH"], or_q(mount)
            printf "python3:    %s\n", py == "" ? "not found" : py " (" or_q(pyv) ")"
            printf "nvidia-smi: %s\n", smi == "" ? "not found" : smi
            if (ENVIRON["HF_INTERPRETERS"] != "") printf "interpreters: %s\n", interpreters("text")
            printf "user:       %s, shell %s, sh is %s\n", or_q(ENVIRON["HF_USER"]),
                   or_q(ENVIRON["HF_SHELL"]), or_q(ENVIRON["HF_SH"])
            exit
        }
        printf "{\"hostname\": %s, \"os\": %s, \"kernel\": %s, \"arch\": %s, \"cpus\": %s,\n",
               jopt(ENVIRON["HF_HOSTNAME"]), jopt(ENVIRON["HF_OS"]), jopt(ENVIRON["HF_KERNEL"]),
               jopt(ENVIRON["HF_ARCH"]), jnum(ENVIRON["HF_CPUS"])
        printf " \"memory\": {\"total_mib\": %s, \"available_mib\": %s},\n", jnum(mem_total), jnum(mem_avail)
        printf " \"disk\": {\"path\": %s, \"mount\": %s, \"total_mib\": %s, \"free_mib\": %s},\n",
               jstr(ENVIRON["HF_DISK_PATH"]), jopt(mount), jnum(disk_total), jnum(disk_free)
        printf " \"tools\": {\"python3\": %s, \"nvidia-smi\": %s},\n",
               py == "" ? "null" : "{\"path\": " jstr(py) ", \"version\": " jopt(pyv) "}",
               smi == "" ? "null" : "{\"path\": " jstr(smi) "}"
        printf " \"interpreters\": {%s},\n", interpreters("json")
        printf " \"user\": %s, \"shell\": %s, \"sh\": %s}\n", jopt(ENVIRON["HF_USER"]),
               jopt(ENVIRON["HF_SHELL"]), jopt(ENVIRON["HF_SH"])
    }'
}

if [ -n "${FERRY_RESULT:-}" ]; then
    facts json >"$FERRY_RESULT" || exit 1
    facts text
else
    facts json
fi
