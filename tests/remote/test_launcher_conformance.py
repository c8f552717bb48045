"""One launcher contract (issue 39 item 4): a conformance table of launch.sh and the python standby.

The host side of a run has two implementations: src/remote/launch.sh under /bin/sh, and the
python standby (src/remote/standby.py), which runs a job that declares no environment as
launch.sh would (docs/run-protocol.md, "The launcher", "Signals and deadlines", "Collect";
docs/persistence.md, "The python standby", "Staged by the python standby"). Each case of the
table below is one request (launch.sh as ferry's make_launcher writes it, the job, the login
environment, what happens while it runs) and runs it each of these ways, in the same run
directory with the same launch.sh, on this machine, without sshd:

  sh       `/bin/sh RUN_DIR/launch.sh`, as ferry's exec request runs it;
  standby  the python standby as ferry ships it (standby_script(): the loader and standby.py),
           `python3 -I -S SCRIPT ferry-standby`, given `exec /bin/sh RUN_DIR/launch.sh`; it stays
           for another run after a job it ran, and its stdin then ends;
  stage    the same standby given `stage RUN_DIR launch.sh JOB ENTRY SIZE last` and launch.sh's
           bytes: it makes the run's files itself and ends with the run.

What each way did is observed (stdout, stderr, the launcher's report as ferry's
parse_launcher_report reads it, the exit code ferry takes, the files left in the run directory,
what the job saw, the processes left) and must be the same for every way, but for the
ALLOWED_DIFFERENCES below, and what the case expects. Each job records who started it (its
parent's command name): a case the standby runs itself must have been run by it, not handed to
/bin/sh, or the table would compare launch.sh with itself.

Run by ctest as remote_launcher_conformance (FERRY_LAUNCHER_TOOL: the ferry_launcher_tool built
from tests/remote/launcher_tool.cpp). A missing prerequisite (the tool, setsid, /proc) fails.
FERRY_CONFORMANCE_CASES=REGEX runs only the cases whose names match.
"""
import ast
import concurrent.futures
import dataclasses
import fcntl
import hashlib
import importlib.util
import json
import marshal
import multiprocessing
import os
import re
import select
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from typing import Callable, Optional

# The documented differences between a job that launch.sh runs and one the python standby runs
# (docs/persistence.md, "The python standby"; docs/run-protocol.md, "Exec"). Nothing else may
# differ: each is applied by name where the table compares.
ALLOWED_DIFFERENCES = {
    "parent": "the job's parent is the standby (python3), not /bin/sh: the command name of the "
              "job's parent is only used to tell who ran the job",
    "sigign_glibc": "glibc's internal signals 32 and 33 are ignored (SigIgn) in a job the standby "
                    "starts (posix_spawn) or started ahead",
    "orig_argv": "a python3 job started ahead: sys.orig_argv is `python3 -c ...`",
    "boot_frame": "a python3 job started ahead: one frame of the boot code below the job's module "
                  "frame (sys._getframe(1) at module level is not None)",
    "stay": "after a job it ran the standby ends the run's stderr with `END_MARKER stay` and stays "
            "for the next run: ferry takes the run's exit code from the report (the standby exits "
            "0 later, when its stdin ends)",
}

SENTINEL = "ferry-start-5e9f0c1d2b3a49587a6b7c8d"
END = "ferry-end-5e9f0c1d2b3a49587a6b7c8d"
RUN_STAMP = "20261204T000000Z"
WAYS = ("sh", "standby", "stage")
PROBE = "@probe@"  # in a job's text: the directory where it leaves what it saw
# What a process of the user's wrote over a job's cache entry (layout `tampered_entry`).
TAMPERED = {"job.sh": b': >"@probe@/tampered"\n',
            "job.py": b'open("@probe@/tampered", "w").close()\n'}

# Prepended to each job: who started it (its parent's pid and command name) and its own pid.
SH_PREAMBLE = """P='@probe@'
read -r ferry_parent </proc/$PPID/comm
printf '%s %s\\n' "$PPID" "$ferry_parent" >"$P/parent"
printf 'job %s\\n' "$$" >>"$P/ids"
"""
PY_PREAMBLE = """import os as _o
with open("/proc/%d/comm" % _o.getppid()) as _f:
    _c = _f.read().strip()
with open("@probe@/parent", "w") as _f:
    _f.write("%d %s\\n" % (_o.getppid(), _c))
with open("@probe@/ids", "a") as _f:
    _f.write("job %d\\n" % _o.getpid())
del _o, _f, _c
P = "@probe@"
"""


@dataclasses.dataclass
class Case:
    """One request, and what every way must show for it. `expect` (what is not named is the
    default): code (the exit code ferry takes; else the report's, exit), cause (exit), result
    (none), result_bytes (b""), clean (removed; the run directory gone unless `files` says what
    is left), report (None: no report at all), stdout, stderr, stderr_has, probes (what the job
    left in P, by name; None: nothing), environ_names (the job's environment, in order), files
    (the run directory's entries left; None: it has gone), leftovers (processes left, by the name
    the job gave their pids in P/ids), min_elapsed (seconds)."""
    name: str
    job: str                      # the job's text (sh or python3, per `interpreter`)
    interpreter: str = "sh"       # @python3@: this machine's python3 by its absolute path
    params: bytes = b'{"x": 1}'
    timeout: int = 10
    grace: int = 1
    keep: bool = False
    frame_limit: int = 1 << 20
    declared: dict = dataclasses.field(default_factory=dict)  # the job's declared environment
    login: dict = dataclasses.field(default_factory=dict)     # over the login environment; None unsets
    raw_login: Optional[list] = None  # the whole login environment as (name, value) pairs, repeats kept
    umask: int = 0o022
    signal: Optional[int] = None  # sent to the launcher once the job has made P/ready
    streams_closed: bool = False  # nobody reads stdout and stderr (the connection has gone)
    layout: str = "run"           # how the run directory is laid out: see Table.lay_out
    ways: tuple = WAYS
    standby_runs: bool = True     # the standby runs the job itself (else it hands it to launch.sh)
    output_held: bool = False     # something outside the job's group holds the output: no stay
    # Processes of the job's group outlive it until the group's KILL: whether a standby stays is
    # then up to how soon they let go of the output (it looks twice, 20 ms apart), not asserted.
    group_left: bool = False
    expect: dict = dataclasses.field(default_factory=dict)
    check: Optional[Callable] = None  # check(test, observation) for what `expect` cannot say

    def seconds(self):
        """About how long the case takes, to start the longest first."""
        waits = self.timeout + self.grace if self.timeout < 5 else self.grace if self.signal else 0
        return 10 if "deep" in self.name else 9 if self.output_held else waits

    @property
    def job_file(self):
        return "job.py" if "python" in self.interpreter else "job.sh"

    def text(self):
        preamble = PY_PREAMBLE if self.job_file == "job.py" else SH_PREAMBLE
        return (preamble + self.job).encode()


def report(code, cause="exit", result="none", clean="removed", data=b""):
    """What stdout ends with: the end line, the result section, the clean line."""
    section = b"result %s\n" % result.encode()
    if result == "file":
        section = b"result file %d\n" % len(data) + data
    return b"%s %d %s\n" % (END.encode(), code, cause.encode()) + section + b"clean %s\n" % clean.encode()


# Waits to be stopped (P/ready: it waits); on TERM it makes P/term, then exits 7 or goes on
# waiting. Python rather than sh: a sh's child that TERM killed has the shell say "Terminated", or
# not, as the signal found it.
# A stop's TERM comes twice (to the job's group, then to the job): a job that exits on the first
# is not to see the second in its interpreter's shutdown ("Exception ignored in: <module
# 'threading'>"), which would come or not by the two signals' timing.
PY_WAIT = """import signal, time
def on_term(signum, frame):
    if @exit@:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(P + "/term", "w").close()
    if @exit@:
        raise SystemExit(7)
signal.signal(signal.SIGTERM, on_term)
open(P + "/ready", "w").close()
while True:
    time.sleep(0.1)
"""
PY_DIE_ON_TERM = PY_WAIT.replace("@exit@", "True")
PY_IGNORE_TERM = PY_WAIT.replace("@exit@", "False")
SH_WAIT = ': >"$P/ready"\nsleep 30\n'
# After `setsid PROGRAM &`: waits until it has a session of its own (else the job's end could
# come first, and the group's KILL with it).
SH_ESCAPED = """e=$!
printf 'escapee %s\\n' "$e" >>"$P/ids"
until read -r s </proc/$e/stat && set -- ${s##*)} && [ "$4" = "$e" ]; do sleep 0.01; done
"""
ENVIRON = 'cat /proc/$$/environ >"$P/environ"\n'
LOGIN_ORDER = ["PATH", "HOME", "USER", "LANG", "TERM", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "LC_TIME",
               "LC_COLLATE", "LC_MONETARY", "LC_MESSAGES", "LC_PAPER", "LC_NAME", "LC_ADDRESS",
               "LC_TELEPHONE", "LC_MEASUREMENT", "LC_IDENTIFICATION"]
FERRY_ORDER = ["FERRY_RUN_DIR", "FERRY_PARAMS", "FERRY_RESULT", "FERRY_JOB"]
PARAMS_HOSTILE = ('{"s": "it\'s $(touch /tmp/x) `id` \\"q\\" \\u00e9 \u65e5\u672c"}\nexit 0\n'
                  '# not a comment\n').encode() + b"\x00\xff\xfe no final newline"
PY_WORLD = """import sys, os
world = {
    "argv": sys.argv, "path0": sys.path[0], "file": __file__, "cached": __cached__,
    "loader": type(__loader__).__name__, "spec": repr(__spec__), "name": __name__,
    "globals": sorted(globals()), "modules": sorted(sys.modules), "flags": repr(sys.flags),
    "fs_encoding": sys.getfilesystemencoding(), "stdout_encoding": sys.stdout.encoding,
    "stdin": repr((sys.stdin.isatty(), sys.stdin.read())), "cwd": os.getcwd(),
    "umask": os.umask(0o022), "executable": sys.executable,
    "environ": list(os.environ.items()), "prefix": sys.prefix,
}
import signal
world["handlers"] = {s.name: str(signal.getsignal(s)) for s in signal.valid_signals()
                     if isinstance(s, signal.Signals)}
with open(P + "/world", "w") as f:
    f.write(repr(world))
with open(P + "/orig_argv", "w") as f:
    f.write(repr(sys.orig_argv))
with open(P + "/boot_frame", "w") as f:
    f.write(repr(sys._getframe(0).f_back is None))
with open("/proc/self/status") as f:
    open(P + "/status", "w").write("".join(l for l in f if l.startswith(("SigBlk", "SigIgn"))))
"""
PY_DESCRIPTORS = """import os, re
seen = []
for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
    try:
        seen.append("%d %s" % (fd, re.sub(r":\\[\\d+\\]", "", os.readlink("/proc/self/fd/%d" % fd))))
    except OSError:
        pass  # the listing's own descriptor
open(P + "/fds", "w").write("\\n".join(seen))
"""
# A file the run directory's removal cannot take: immutable where this process may make it so
# (root, a file system that has the flag), else a directory without write permission.
PY_STUCK = """import fcntl, os, struct
os.mkdir("stuck")
open("stuck/file", "w").close()
try:
    fd = os.open("stuck/file", os.O_RDONLY)
    flags = struct.unpack("i", fcntl.ioctl(fd, 0x80086601, struct.pack("i", 0)))[0]
    fcntl.ioctl(fd, 0x40086602, struct.pack("i", flags | 0x10))
    os.close(fd)
except OSError:
    if os.getuid() == 0:
        open(P + "/no-blocker", "w").close()
    os.chmod("stuck", 0o500)
"""


def case(name, job, **kw):
    return Case(name=name, job=job, **kw)


CASES = [
    # Sentinels and output.
    case("sentinels_first_on_both_streams", "printf 'out\\n'; printf 'err\\n' >&2\n",
         expect={"stdout": SENTINEL.encode() + b"\nout\n" + report(0),
                 "stderr": SENTINEL.encode() + b"\nerr\n"}),
    case("output_without_a_final_newline_meets_the_end_line", "printf 'partial'\n",
         expect={"stdout": SENTINEL.encode() + b"\npartial" + report(0)}),
    case("python_traceback_shows_the_jobs_frames_only",
         "print('before', flush=True)\ndef inner():\n    raise ValueError('boom')\ninner()\n",
         interpreter="python3", expect={"code": 1, "stderr_has": b"ValueError: boom"}),
    case("python_syntax_error", "x = (\n", interpreter="python3",
         expect={"code": 1, "stderr_has": b"SyntaxError"}),
    # params.json: from launch.sh's tail, byte for byte, mode 0600 whatever the umask.
    case("params_byte_exact", 'cat "$FERRY_PARAMS" >"$P/params"; stat -c %a "$FERRY_PARAMS" >"$P/mode"\n',
         params=PARAMS_HOSTILE, expect={"probes": {"params": PARAMS_HOSTILE, "mode": b"600\n"}}),
    case("params_empty", 'wc -c <"$FERRY_PARAMS" >"$P/size"\n', params=b"",
         expect={"probes": {"size": b"0\n"}}),
    case("params_large", 'cat "$FERRY_PARAMS" >"$P/params"\n',
         params=bytes((i * 7919) % 256 for i in range(200_000)),
         check=lambda t, o: t.assertEqual(o["probes"]["params"],
                                          bytes((i * 7919) % 256 for i in range(200_000)))),
    case("params_and_state_file_0600_under_umask_0",
         'stat -c %a "$FERRY_PARAMS" .ferry-launcher >"$P/modes"; umask >"$P/umask"; : >made-by-job\n',
         umask=0, keep=True,
         expect={"probes": {"modes": b"600\n600\n", "umask": b"0000\n"}, "clean": "kept",
                 "files": ["job.sh l", "launch.sh f 600", "made-by-job f 666", "params.json f 600"]}),
    case("state_file_names_the_launcher_and_the_most_seconds", 'cat .ferry-launcher >"$P/state"\n',
         timeout=10, grace=1, expect={"probes": {"state": b"LAUNCHER +11\n"}}),
    # The environment: PATH HOME USER LANG TERM LC_* that are set, then FERRY_*, nothing else.
    case("environment_is_the_contracts_set_in_its_order", ENVIRON,
         expect={"environ_names": ["PATH", "HOME", "USER", "LANG", "TERM", "LC_TIME"] + FERRY_ORDER}),
    case("environment_of_a_python_job_in_its_order",
         'import os\nopen(P + "/environ", "w").write(repr(list(os.environ.items())))\n',
         interpreter="python3",
         check=lambda t, o: t.assertEqual(
             [n for n, _ in ast.literal_eval(o["probes"]["environ"].decode())],
             ["PATH", "HOME", "USER", "LANG", "TERM", "LC_TIME"] + FERRY_ORDER)),
    case("environment_every_locale_category", ENVIRON,
         login={n: "C" for n in LOGIN_ORDER if n.startswith("LC_")},
         expect={"environ_names": LOGIN_ORDER + FERRY_ORDER}),
    case("environment_of_a_bare_login", ENVIRON,
         login={"HOME": None, "USER": None, "LANG": None, "TERM": None, "LC_TIME": None},
         expect={"environ_names": ["PATH"] + FERRY_ORDER}),
    case("environment_c_locale_python_coerces_lc_ctype_after_ferry",
         'import os\nopen(P + "/environ", "w").write(repr(list(os.environ.items())))\n',
         interpreter="python3", login={"LANG": None, "LC_TIME": None},
         check=lambda t, o: t.assertEqual(
             [n for n, _ in ast.literal_eval(o["probes"]["environ"].decode())],
             ["PATH", "HOME", "USER", "TERM"] + FERRY_ORDER + ["LC_CTYPE"])),
    case("environment_odd_values_verbatim", ENVIRON,
         login={"LANG": "", "USER": "\u00fc $(id) 'q' \"d\"\nline"},
         check=lambda t, o: t.assertIn(
             "USER=\u00fc $(id) 'q' \"d\"\nline".encode(), o["probes"]["environ"].split(b"\0"))),
    case("environment_a_repeated_name_is_the_last_as_sh_reads_it", ENVIRON,
         raw_login=[("LANG", "C"), ("PATH", "@path@"), ("LANG", "C.UTF-8"), ("HOME", "@home@")],
         check=lambda t, o: t.assertEqual(
             [e for e in o["probes"]["environ"].split(b"\0") if e.startswith(b"LANG=")],
             [b"LANG=C.UTF-8"])),
    case("declared_environment_is_left_to_launch_sh", ENVIRON,
         declared={"MY_VAR": "declared value"}, standby_runs=False,
         check=lambda t, o: t.assertIn(b"MY_VAR=declared value", o["probes"]["environ"].split(b"\0"))),
    case("slurm_allocation_is_left_to_launch_sh", ENVIRON,
         login={"SLURM_JOB_ID": "7", "SLURM_NODEID": "0", "CUDA_VISIBLE_DEVICES": "1"},
         standby_runs=False,
         check=lambda t, o: t.assertIn(b"SLURM_JOB_ID=7", o["probes"]["environ"].split(b"\0"))),
    # Where and how the job runs.
    case("working_directory_is_the_run_directory", 'pwd -P >"$P/cwd"\n',
         check=lambda t, o: t.assertEqual(o["probes"]["cwd"], o["run_dir"].encode() + b"\n")),
    case("stdin_is_dev_null", 'readlink /proc/$$/fd/0 >"$P/stdin"; cat >"$P/read"\n',
         expect={"probes": {"stdin": b"/dev/null\n", "read": b""}}),
    case("job_leads_a_session_and_group_of_its_own",
         'read -r s </proc/$$/stat; set -- ${s##*)}; echo "$3 $4" >"$P/group"\n',
         expect={"probes": {"group": b"job job\n"}}),
    case("job_opens_only_0_1_2", PY_DESCRIPTORS, interpreter="python3",
         expect={"probes": {"fds": b"0 /dev/null\n1 pipe\n2 pipe"}}),
    # Read by the shell's builtins: a grep it forks would race the shell, which blocks every
    # signal around a fork (dash: all but KILL, STOP and glibc's 32 and 33, seen once in CI).
    case("job_signal_dispositions_and_mask",
         'while IFS= read -r l; do case $l in Sig[BI]*) printf "%s\\n" "$l";; esac; done'
         ' </proc/$$/status >"$P/status"\n',
         expect={"probes": {"status": b"SigBlk:\t0000000000000000\nSigIgn:\t0000000000000006\n"}}),
    case("python_job_sees_the_world_of_python3_run_dir_job", PY_WORLD, interpreter="python3",
         umask=0o027),
    case("job_on_a_path_without_setsid_shares_the_launchers_group",
         'read -r s </proc/$$/stat; set -- ${s##*)}; echo "$3 $4" >"$P/group"\n',
         login={"PATH": "@nosetsid@"}, standby_runs=False,
         expect={"probes": {"group": b"LAUNCHER LAUNCHER\n"}}),
    # Exit codes pass through; a job killed by a signal is 128 + its number.
    case("exit_0", "exit 0\n", expect={"code": 0}),
    case("exit_3", "exit 3\n", expect={"code": 3}),
    case("exit_255", "exit 255\n", expect={"code": 255}),
    case("exit_124_of_the_jobs_own_is_no_timeout", "exit 124\n", expect={"code": 124, "cause": "exit"}),
    case("python_exit_3", "import sys\nsys.exit(3)\n", interpreter="python3", expect={"code": 3}),
    case("job_killed_by_a_signal", "kill -KILL $$\n", expect={"code": 137}),
    case("python_job_killed_by_term_is_no_stop", "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n",
         interpreter="python3", expect={"code": 143, "cause": "exit"}),
    # The job's process group is killed at its end; a session of its own escapes it.
    case("group_killed_at_the_jobs_end", "sleep 30 &\nprintf 'child %s\\n' $! >>\"$P/ids\"\n",
         group_left=True, expect={"code": 0, "leftovers": []}),
    case("group_killed_at_the_jobs_end_ignoring_term",
         "(trap '' TERM HUP INT; exec sleep 30) &\nprintf 'child %s\\n' $! >>\"$P/ids\"\n",
         group_left=True, expect={"code": 0, "leftovers": []}),
    case("a_session_of_its_own_escapes_the_group",
         "setsid sleep 30 </dev/null >/dev/null 2>&1 &\n" + SH_ESCAPED,
         expect={"code": 0, "leftovers": ["escapee"]}),
    case("a_session_of_its_own_holding_the_output_ends_the_standby", "setsid sleep 3 &\n" + SH_ESCAPED,
         output_held=True, expect={"code": 0}),
    # The deadline: TERM to the job's group, KILL after the grace, 124 `timeout`.
    case("deadline_stops_the_job", 'sleep 30\n', timeout=1, group_left=True,
         expect={"code": 124, "cause": "timeout", "stdout": SENTINEL.encode() + b"\n" + report(124, "timeout"),
                 "min_elapsed": 1}),
    case("deadline_leaves_its_marker", ': >"$P/ready"; sleep 30\n', timeout=1, keep=True, group_left=True,
         expect={"code": 124, "cause": "timeout", "clean": "kept",
                 "files": [".ferry-timeout f 644", "job.sh l", "launch.sh f 600", "params.json f 600"]}),
    case("deadline_kills_after_the_grace_a_job_ignoring_term", PY_IGNORE_TERM, interpreter="python3",
         timeout=1, grace=1,
         expect={"code": 124, "cause": "timeout", "probes": {"term": b""}, "leftovers": [],
                 "min_elapsed": 2}),
    case("deadline_kills_a_child_left_in_the_group",
         "(trap '' TERM; exec sleep 30) &\nprintf 'child %s\\n' $! >>\"$P/ids\"\nwait\n", timeout=1,
         group_left=True,
         expect={"code": 124, "cause": "timeout", "leftovers": []}),
    case("deadline_with_a_result", "printf '{\"partial\": 1}' >\"$FERRY_RESULT\"\nsleep 30\n", timeout=1,
         group_left=True,
         expect={"code": 124, "cause": "timeout", "result": "file", "result_bytes": b'{"partial": 1}'}),
    case("python_job_past_its_deadline", "import time\ntime.sleep(30)\n", interpreter="python3",
         timeout=1, expect={"code": 124, "cause": "timeout", "leftovers": []}),
    # TERM, INT and HUP to the launcher: the job's group TERMed, KILLed after the grace.
    case("term_stops_143", PY_DIE_ON_TERM, interpreter="python3", signal=signal.SIGTERM,
         expect={"code": 143, "cause": "stopped", "probes": {"term": b""}, "leftovers": []}),
    case("int_stops_130", PY_DIE_ON_TERM, interpreter="@python3@", signal=signal.SIGINT,
         expect={"code": 130, "cause": "stopped", "probes": {"term": b""}, "leftovers": []}),
    case("hup_stops_129", PY_DIE_ON_TERM, interpreter="python3", signal=signal.SIGHUP,
         expect={"code": 129, "cause": "stopped", "probes": {"term": b""}, "leftovers": []}),
    case("stop_kills_after_the_grace_a_job_ignoring_term", PY_IGNORE_TERM, interpreter="@python3@",
         signal=signal.SIGTERM,
         grace=1, expect={"code": 143, "cause": "stopped", "probes": {"term": b""}, "leftovers": [],
                          "min_elapsed": 1}),
    case("stop_kills_a_child_left_in_the_group",
         "(trap '' TERM; exec sleep 30) &\nprintf 'child %s\\n' $! >>\"$P/ids\"\n" + SH_WAIT,
         signal=signal.SIGTERM, expect={"code": 143, "cause": "stopped", "leftovers": []}),
    case("usr1_is_the_deadline", SH_WAIT, signal=signal.SIGUSR1, group_left=True,
         expect={"code": 124, "cause": "timeout", "leftovers": []}),
    # The result section: its kind, a regular file's bytes framed by their size.
    case("result_file", "printf '{\"a\": 1}' >\"$FERRY_RESULT\"\n",
         expect={"result": "file", "result_bytes": b'{"a": 1}'}),
    case("result_bytes_like_the_end_line_and_the_clean_line",
         "printf '%s 0 exit\\nresult none\\nclean removed\\n' '" + END + "' >\"$FERRY_RESULT\"\n",
         expect={"result": "file",
                 "result_bytes": END.encode() + b" 0 exit\nresult none\nclean removed\n"}),
    case("result_binary_without_a_final_newline",
         'open("result.json", "wb").write(b"\\0\\xff{\\n}\\0clean removed")\n', interpreter="python3",
         expect={"result": "file", "result_bytes": b"\0\xff{\n}\0clean removed"}),
    case("result_empty_file", ': >"$FERRY_RESULT"\n', expect={"result": "file", "result_bytes": b""}),
    case("result_at_the_frame_limit_is_framed", "printf '%064d' 0 >\"$FERRY_RESULT\"\n", frame_limit=64,
         expect={"result": "file", "result_bytes": b"0" * 64, "clean": "removed"}),
    case("result_over_the_frame_limit_is_left_to_fetch", "printf '%065d' 0 >\"$FERRY_RESULT\"\n",
         frame_limit=64, expect={"result": "fetch", "clean": "kept",
                                 "files": ["job.sh l", "launch.sh f 600", "params.json f 600",
                                           "result.json f 644"]}),
    case("result_link_is_never_followed", 'ln -s /dev/zero "$FERRY_RESULT"\n', expect={"result": "link"}),
    case("result_directory", 'mkdir "$FERRY_RESULT"\n', expect={"result": "directory"}),
    case("result_fifo_is_never_opened", 'mkfifo "$FERRY_RESULT"\n', expect={"result": "special"}),
    case("result_socket", 'import socket\nsocket.socket(socket.AF_UNIX).bind("result.json")\n',
         interpreter="python3", expect={"result": "special"}),
    # The clean line.
    case("clean_kept_with_keep_run_dir", "printf '{}' >\"$FERRY_RESULT\"; : >other\n", keep=True,
         expect={"result": "file", "result_bytes": b"{}", "clean": "kept",
                 "files": ["job.sh l", "launch.sh f 600", "other f 644", "params.json f 600",
                           "result.json f 644"]}),
    case("clean_failed_when_the_directory_cannot_go", PY_STUCK, interpreter="python3",
         expect={"clean": "failed", "probes": {"no-blocker": None},
                 "files": ["stuck d", "stuck/file f 644"]}),
    case("clean_removes_a_deep_tree", 'd=d; i=1\nwhile [ $i -lt 1200 ]; do d=$d/d; i=$((i + 1)); done\nmkdir -p "$d"\n',
         expect={"code": 0, "clean": "removed", "files": None}),
    case("clean_removes_a_tree_longer_than_a_path_may_be",
         'import os\nfor _ in range(25):\n    os.mkdir("d" * 200)\n    os.chdir("d" * 200)\n',
         interpreter="python3", expect={"code": 0, "clean": "removed", "files": None}),
    # Refusals: no job runs.
    case("interpreter_not_found_127", "exit 0\n", interpreter="no-such-interpreter-ferry",
         standby_runs=False,
         expect={"code": 127, "report": None, "stderr_has": b"ferry-launcher: interpreter no-such-interpreter-ferry not found",
                 "files": [".ferry-launcher f 600", "job.sh l", "launch.sh f 600", "params.json f 600"]}),
    case("interpreter_absolute_path_not_found_127", "exit 0\n", interpreter="/nonexistent/python3",
         standby_runs=False,
         expect={"code": 127, "report": None, "stderr_has": b"ferry-launcher: interpreter /nonexistent/python3"}),
    # --gpus (docs/run-protocol.md, "GPUs") on a machine without nvidia-smi: launch.sh's picker
    # refuses before the job starts; such a run is always launch.sh's (a declared variable).
    case("gpus_without_nvidia_smi_75", ': >"$P/ran"\n', declared={"FERRY_GPUS": "1 0"},
         standby_runs=False,
         expect={"code": 75, "report": None, "stderr_has": b"ferry-launcher: GPUs: nvidia-smi not found on this host"}),
    case("run_dir_missing_125", "exit 0\n", layout="run_dir_missing",
         expect={"code": 125, "report": None, "stdout": SENTINEL.encode() + b"\n"}),
    case("params_unwritable_125", "exit 0\n", layout="params_is_a_directory", ways=("sh", "standby"),
         expect={"code": 125, "report": None, "stderr_has": b"ferry-launcher: cannot write "}),
    case("launch_sh_missing_is_the_shells_own_error", "exit 0\n", layout="no_launch_sh",
         ways=("sh", "standby"), expect={"code": 2, "report": None}),
    # A job cache entry rewritten since ferry put it there (a process of the user's): launch.sh
    # hashes it, the standby hashes it and leaves the run to launch.sh, and neither runs a byte.
    case("tampered_cache_entry_is_refused_sh", ': >"$P/honest"\n', layout="tampered_entry",
         standby_runs=False,
         expect={"code": 125, "report": None, "probes": {"honest": None, "tampered": None},
                 "stderr_has": b"ferry-launcher: the job cache entry ",
                 "files": [".ferry-launcher f 600", "job.sh l", "launch.sh f 600", "params.json f 600"]},
         check=lambda test, seen: test.assertIn(b" does not match its sha256\n", seen["stderr"])),
    case("tampered_cache_entry_is_refused_python", 'open(P + "/honest", "w").close()\n',
         interpreter="python3", layout="tampered_entry", standby_runs=False,
         expect={"code": 125, "report": None, "probes": {"honest": None, "tampered": None},
                 "stderr_has": b" does not match its sha256\n",
                 "files": [".ferry-launcher f 600", "job.py l", "launch.sh f 600", "params.json f 600"]}),
    # Nobody reads (the connection has gone): the job runs, the run directory goes all the same.
    case("nobody_reading_runs_the_job_and_removes_the_run_directory", ': >"$P/ran"\nexit 5\n',
         streams_closed=True, expect={"code": 5, "report": None, "probes": {"ran": b""}, "files": None}),
]


class Table:
    """The table's world: directories, the launchers ferry's make_launcher writes, the standby."""

    def __init__(self, tool: str):
        self.tool = tool
        self.root = os.path.realpath(tempfile.mkdtemp(prefix="ferry-conformance-"))
        os.chmod(self.root, 0o755)
        self.bin = self.dir("bin")
        self.python3 = os.path.join(self.bin, "python3")
        os.symlink(os.path.realpath(sys.executable), self.python3)
        self.nosetsid = self.dir("bin-nosetsid")
        for d in ("/usr/bin", "/bin"):
            for name in os.listdir(d):
                target = os.path.join(self.nosetsid, name)
                if name != "setsid" and not os.path.lexists(target):
                    os.symlink(os.path.join(d, name), target)
        self.home = self.dir("home")
        self.base = self.dir("base", 0o700)
        self.probes = self.dir("probes")
        self.launchers = self.dir("launchers")
        self.make_launchers()
        with open(os.path.join(self.launchers, "standby.py"), "rb") as f:
            script = f.read()
        self.standby = os.path.join(self.base, "ferry-job-%s.py" % hashlib.sha256(script).hexdigest())
        write(self.standby, script, 0o400)

    def dir(self, name, mode=0o755):
        path = os.path.join(self.root, name)
        os.mkdir(path, mode)
        return path

    def run_dir(self, c: Case):
        return os.path.join(self.base, "ferry-%s-%s" % (RUN_STAMP, hashlib.md5(c.name.encode()).hexdigest()))

    def spec_run_dir(self, c: Case):
        return self.run_dir(c) + "-gone" if c.layout == "run_dir_missing" else self.run_dir(c)

    def make_launchers(self):
        specs = {}
        for c in CASES:
            specs[c.name] = {
                "run_dir": self.spec_run_dir(c).encode().hex(), "job_file": c.job_file.encode().hex(),
                "job_name": ("conformance/" + c.name).encode().hex(),
                "interpreter": c.interpreter.replace("@python3@", self.python3).encode().hex(), "timeout_s": c.timeout, "grace_s": c.grace,
                "sentinel": SENTINEL.encode().hex(), "end_marker": END.encode().hex(),
                "params": c.params.hex(), "result_frame_limit": c.frame_limit, "keep_run_dir": c.keep,
                "env": {k: v.encode().hex() for k, v in c.declared.items()},
                "job_sha256": hashlib.sha256(self.honest_text(c)).hexdigest()}
        done = subprocess.run([self.tool, "launchers", self.launchers], input=json.dumps(specs).encode(),
                              capture_output=True)
        if done.returncode != 0:
            raise RuntimeError("ferry_launcher_tool launchers: %s" % done.stderr.decode(errors="replace"))

    def launcher(self, c: Case) -> bytes:
        with open(os.path.join(self.launchers, c.name + ".sh"), "rb") as f:
            return f.read()

    def honest_text(self, c: Case) -> bytes:
        return c.text().replace(PROBE.encode(), self.probe(c).encode())

    def entry(self, c: Case) -> str:
        """The job's file in the job cache (the run directory's job file links to it). Layout
        `tampered_entry`: another process of the user's has rewritten it since (TAMPERED, the same
        interpreter's text), its name still the honest bytes' sha256."""
        text = self.honest_text(c)
        path = os.path.join(self.base, "ferry-job-%s.%s" % (hashlib.sha256(text).hexdigest(),
                                                            c.job_file.rsplit(".", 1)[1]))
        if c.layout == "tampered_entry":
            text = TAMPERED[c.job_file].replace(PROBE.encode(), self.probe(c).encode())
        if not os.path.exists(path):
            write(path, text, 0o400)
        return path

    def probe(self, c: Case):
        return os.path.join(self.probes, c.name)

    def login(self, c: Case, tag: str):
        """The login environment the launcher (or the standby) starts with: what launch.sh passes
        on, in another order, and variables it must not pass on."""
        env = {"FERRY_CONFORMANCE": tag, "FOO": "not the job's", "PYTHONPATH": "/nonexistent",
               "ENV": "/nonexistent", "BASH_ENV": "/nonexistent", "SSH_CONNECTION": "127.0.0.1 1 127.0.0.1 22",
               "CUDA_VISIBLE_DEVICES": "0", "SLURM_NODEID": "3", "TERM": "dumb-" + tag, "LC_TIME": "C",
               "LANG": "C.UTF-8", "USER": "conformer", "HOME": self.home,
               "PATH": "%s:/usr/bin:/bin" % self.bin}
        for name, value in c.login.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value.replace("@nosetsid@", "%s:%s" % (self.bin, self.nosetsid))
        if c.raw_login is not None:
            subst = {"@path@": env["PATH"], "@home@": self.home}
            return [("FERRY_CONFORMANCE", tag), ("TERM", "dumb-" + tag)] + [
                (n, subst.get(v, v)) for n, v in c.raw_login]
        return list(env.items())

    def lay_out(self, c: Case, way: str):
        """The run directory as ferry's SFTP steps leave it (0700, the job a link to its cache
        entry, launch.sh 0600); a `stage` line makes it itself. Layouts: `run_dir_missing`:
        launch.sh names a run directory that is not there; `params_is_a_directory`: params.json
        cannot be written; `no_launch_sh`: the exec names a launch.sh that is not there."""
        run_dir = self.run_dir(c)
        if way == "stage" or c.layout == "no_launch_sh":
            return
        os.mkdir(run_dir, 0o700)
        os.symlink(self.entry(c), os.path.join(run_dir, c.job_file))
        write(os.path.join(run_dir, "launch.sh"), self.launcher(c), 0o600)
        if c.layout == "params_is_a_directory":
            os.mkdir(os.path.join(run_dir, "params.json"))


def write(path, data, mode):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


# Starts the launcher with a login environment in which a name may repeat (os.execve takes a
# mapping): argv and the pairs as JSON in argv[1], signals as a fresh process has them.
EXEC_RAW = """import ctypes, json, signal, sys
argv, env = json.loads(sys.argv[1])
for s in (signal.SIGPIPE, signal.SIGXFSZ):
    signal.signal(s, signal.SIG_DFL)
def strings(items):
    return (ctypes.c_char_p * (len(items) + 1))(*[i.encode() for i in items], None)
libc = ctypes.CDLL(None, use_errno=True)
libc.execve(argv[0].encode(), strings(argv), strings(["%s=%s" % tuple(p) for p in env]))
sys.exit("execve: %d" % ctypes.get_errno())
"""


def read_all(fd, into: list):
    with os.fdopen(fd, "rb") as f:
        into.append(f.read())


def proc_stat(pid: int):
    """(state, session, comm) of a process, or None when it has gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    comm = data[data.index(b"(") + 1:data.rindex(b")")].decode(errors="replace")
    fields = data[data.rindex(b")") + 2:].split()
    return fields[0], int(fields[3]), comm


def processes_left(tag: bytes, sessions: set):
    """The live processes that carry the case's tag in their environment (the launcher's, the
    standby's, the job's: the login environment's TERM) or are in the job's session."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        st = proc_stat(pid)
        if st is None or st[0] in (b"Z", b"X"):
            continue
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                environ = f.read()
        except OSError:
            environ = b""
        if tag in environ or st[1] in sessions:
            found.append(pid)
    return found


def entries(top: str, depth: int = 8):
    """(relative path, lstat) under `top`, sorted, to `depth` levels (a deep tree is cut short)."""
    found = []
    pending = [""]
    while pending:
        rel = pending.pop()
        for name in sorted(os.listdir(os.path.join(top, rel))):
            path = os.path.join(rel, name)
            st = os.lstat(os.path.join(top, path))
            found.append((path, st))
            if stat.S_ISDIR(st.st_mode) and path.count("/") < depth:
                pending.append(path)
    return sorted(found, key=lambda e: e[0])


def clear_blockers(path):
    """Undoes PY_STUCK so that the run directory can go."""
    for rel, st in entries(path):
        full = os.path.join(path, rel)
        if stat.S_ISDIR(st.st_mode):
            os.chmod(full, 0o700)
        elif stat.S_ISREG(st.st_mode):
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                fcntl.ioctl(fd, 0x40086602, struct.pack("i", 0))
            except OSError:
                pass
            os.close(fd)


def listing(run_dir: str):
    """The run directory's entries: `path type [mode]`; None when it has gone."""
    if not os.path.lexists(run_dir):
        return None
    shown = []
    for rel, st in entries(run_dir):
        kind = ("l" if stat.S_ISLNK(st.st_mode) else "d" if stat.S_ISDIR(st.st_mode) else
                "f" if stat.S_ISREG(st.st_mode) else "p" if stat.S_ISFIFO(st.st_mode) else "s")
        shown.append(rel + " " + kind if kind in "ld" else "%s %s %o" % (rel, kind, stat.S_IMODE(st.st_mode)))
    return shown


def remove(path):
    if os.path.lexists(path):
        clear_blockers(path)
        subprocess.run(["rm", "-rf", "--", path], check=True)


class Runner:
    def __init__(self, table: Table):
        self.t = table

    def run(self, c: Case, way: str) -> dict:
        """Runs case `c` one way; what it did, as the table compares it."""
        t = self.t
        probe = t.probe(c)
        shutil.rmtree(probe, ignore_errors=True)
        os.mkdir(probe, 0o777)
        run_dir = t.run_dir(c)
        t.lay_out(c, way)
        tag = "fc%sz" % hashlib.md5((t.root + c.name).encode()).hexdigest()[:12]
        env = t.login(c, tag)
        launch = os.path.join(run_dir, "launch.sh")
        if way == "sh":
            argv, given = ["/bin/sh", launch], b"stray input the job must not see\n"
        else:
            argv = [t.python3, "-I", "-S", t.standby, "ferry-standby"]
            if way == "standby":
                given = b"exec /bin/sh %s\n" % launch.encode()
            else:
                payload = t.launcher(c)
                given = b"stage %s launch.sh %s %s %d last\n" % (
                    run_dir.encode(), c.job_file.encode(), t.entry(c).encode(), len(payload)) + payload
        started = time.monotonic()
        obs = self.spawn(c, argv, env, given)
        obs["elapsed"] = time.monotonic() - started
        obs["way"] = way
        obs["run_dir"] = run_dir
        self.observe(c, obs, probe, tag.encode(), run_dir)
        return obs

    def spawn(self, c: Case, argv, env, given: bytes) -> dict:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        if c.streams_closed:
            os.close(out_r)
            os.close(err_r)
        if c.raw_login is not None:
            argv, env = [self.t.python3, "-I", "-S", "-c", EXEC_RAW, json.dumps([argv, env])], {}
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out_w, stderr=err_w,
                                env=dict(env) if c.raw_login is None else env, cwd=self.t.home,
                                start_new_session=True, umask=c.umask)
        os.close(out_w)
        os.close(err_w)
        out, err, readers = [], [], []
        if not c.streams_closed:
            readers = [threading.Thread(target=read_all, args=(out_r, out)),
                       threading.Thread(target=read_all, args=(err_r, err))]
        writer = threading.Thread(target=self.feed, args=(proc, given))
        for th in readers + [writer]:
            th.start()
        problems = []
        if c.signal is not None:
            if wait_for(lambda: os.path.exists(os.path.join(self.t.probe(c), "ready")), 20):
                proc.send_signal(c.signal)
            else:
                problems.append("the job never made P/ready")
        try:
            code = proc.wait(timeout=c.timeout + c.grace + 20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
            problems.append("the launcher did not end in %d s" % (c.timeout + c.grace + 20))
        for th in readers + [writer]:
            th.join(20)
            if th.is_alive():
                problems.append("its output stayed open 20 s after it ended")
        return {"pid": proc.pid, "process_exit": code, "stdout": b"".join(out), "stderr": b"".join(err),
                "problems": problems}

    @staticmethod
    def feed(proc, given: bytes):
        try:
            proc.stdin.write(given)
            proc.stdin.close()
        except OSError:
            pass  # the launcher does not read its stdin, and may be gone

    def observe(self, c: Case, obs: dict, probe: str, tag: bytes, run_dir: str):
        names = {obs["pid"]: "LAUNCHER"}
        ids = read_probe(probe, "ids") or b""
        for line in ids.decode().splitlines():
            name, pid = line.split()
            names[int(pid)] = name
        sessions = {pid for pid, name in names.items() if name == "job"}
        # A process killed a moment ago may not be gone yet: looked for again, for 3 s at most,
        # until only those the case expects to outlive the job are left.
        expected = set(c.expect.get("leftovers", []))
        left = processes_left(tag, sessions)
        until = time.monotonic() + 3
        while {names.get(pid) for pid in left} - expected and time.monotonic() < until:
            time.sleep(0.05)
            left = processes_left(tag, sessions)
        obs["leftovers"] = sorted(names.get(pid, "pid %d (%s)" % (pid, (proc_stat(pid) or "??")[-1]))
                                  for pid in left)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        obs["probes"] = {}
        for name in sorted(os.listdir(probe)):
            data = read_probe(probe, name)
            for pid, word in sorted(names.items(), key=lambda p: -len(str(p[0]))):
                data = re.sub(rb"\b%d\b" % pid, word.encode(), data)
            obs["probes"][name] = data
        parent = obs["probes"].pop("parent", None)
        obs["parent"] = parent  # "PID COMM": who ran the job
        obs["files"] = listing(run_dir)
        remove(run_dir)
        obs["probes"].pop("ids", None)
        obs["probes"].pop("ready", None)


def read_probe(probe, name):
    try:
        with open(os.path.join(probe, name), "rb") as f:
            return f.read()
    except OSError:
        return None


def wait_for(predicate, timeout_s):
    until = time.monotonic() + timeout_s
    while time.monotonic() < until:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


RUNNER = None  # the Runner of the table being run, inherited by the worker processes


def run_case(name: str) -> dict:
    """Runs the case named `name` every way (in a worker process): {way: what it did}."""
    c = next(c for c in CASES if c.name == name)
    return {way: RUNNER.run(c, way) for way in c.ways}


def parse_reports(tool: str, stdouts: dict) -> dict:
    """The reports as ferry's parse_launcher_report reads them: the bytes after the end marker."""
    texts = {}
    for key, out in stdouts.items():
        at = out.find(END.encode() + b" ")
        texts[key] = out[at + len(END) + 1:].hex() if at >= 0 else None
    done = subprocess.run([tool, "reports"], input=json.dumps({k: v for k, v in texts.items() if v is not None}).encode(),
                          capture_output=True)
    if done.returncode != 0:
        raise RuntimeError("ferry_launcher_tool reports: %s" % done.stderr.decode(errors="replace"))
    parsed = json.loads(done.stdout)
    return {k: parsed.get(k) for k in texts}


def prerequisites():
    tool = os.environ.get("FERRY_LAUNCHER_TOOL")
    missing = []
    if not tool or not os.access(tool, os.X_OK):
        missing.append("FERRY_LAUNCHER_TOOL (run through ctest: remote_launcher_conformance)")
    if not shutil.which("setsid"):
        missing.append("setsid (util-linux)")
    if not os.path.exists("/proc/self/environ"):
        missing.append("/proc")
    for tool_name in ("stat", "mkfifo", "readlink"):
        if not shutil.which(tool_name):
            missing.append(tool_name)
    if missing:
        raise AssertionError("the launcher conformance table needs: " + ", ".join(missing))
    return tool


class LauncherConformance(unittest.TestCase):
    maxDiff = 4000

    @classmethod
    def setUpClass(cls):
        cls.tool = prerequisites()
        cls.table = Table(cls.tool)
        cls.addClassCleanup(remove, cls.table.root)
        started = time.monotonic()
        # Cases run side by side in processes of their own, not threads: a process this one
        # forks holds every descriptor of this one's until its exec, and a standby that saw
        # another case's child holding its output would take it for a process the job left.
        global RUNNER
        RUNNER = Runner(cls.table)
        fork = multiprocessing.get_context("fork")
        names = [c.name for c in sorted(CASES, key=lambda c: -c.seconds())]  # the longest first
        with concurrent.futures.ProcessPoolExecutor(max_workers=8, mp_context=fork) as pool:
            cls.results = dict(zip(names, pool.map(run_case, names)))
        reports = parse_reports(cls.tool, {"%s %s" % (n, w): o["stdout"] for n, ways in cls.results.items()
                                           for w, o in ways.items()})
        cls.seen, cls.taken = {}, {}
        for name, ways in cls.results.items():
            for way, obs in ways.items():
                obs["report"] = reports["%s %s" % (name, way)]
                cls.seen[name, way], cls.taken[name, way] = normalise(obs)
        sys.stderr.write("conformance table: %d cases, %d runs in %.1f s; the slowest:\n" % (
            len(CASES), sum(len(c.ways) for c in CASES), time.monotonic() - started))
        runs = sorted(((o["elapsed"], n, w) for n, ways in cls.results.items() for w, o in ways.items()),
                      reverse=True)
        for elapsed, name, way in runs[:6]:
            sys.stderr.write("  %5.2f s  %s (%s)\n" % (elapsed, name, way))

    def conform(self, c: Case):
        ways = self.results[c.name]
        seen = {way: self.seen[c.name, way] for way in ways}
        for way, obs in ways.items():
            with self.subTest(way=way):
                self.assertEqual(obs["problems"], [], "%s: %s" % (way, obs["problems"]))
                self.meets(c, way, seen[way])
        for way in c.ways[1:]:
            with self.subTest(compared="sh/" + way):
                for key in seen["sh"]:
                    if key in ("runner", "stayed"):
                        continue  # who ran the job, and whether a standby stayed: checked in meets()
                    self.assertEqual(seen[way][key], seen["sh"][key],
                                     "%s differs between sh and %s" % (key, way))

    def meets(self, c: Case, way: str, seen: dict):
        e = c.expect
        ran = seen["runner"] is not None
        if ran:
            expected = "python" if way != "sh" and c.standby_runs else "sh"
            self.assertEqual(seen["runner"], expected, "who ran the job (%s)" % way)
            self.assertEqual(seen["probes"]["parent_pid"], b"LAUNCHER",
                             "the job's parent is the process ferry started")
        stays = way == "standby" and c.standby_runs and not c.output_held and \
            (seen["report"] or {}).get("cause") in ("exit", "timeout")
        if not (c.group_left and stays):
            self.assertEqual(seen["stayed"], stays, "whether the standby stayed for another run")
        rep = seen["report"]
        if "report" in e and e["report"] is None:
            self.assertIsNone(rep, "a report")
        elif not c.streams_closed:
            self.assertIsNotNone(rep, "no launcher report; stdout ends %r, stderr %r" % (
                seen["stdout"][-300:], seen["stderr"][-1500:]))
            self.assertEqual(rep["code"], seen["code"], "the report's code is the exit code")
            self.assertEqual(rep["cause"], e.get("cause", "exit"))
            self.assertEqual(rep["result"], e.get("result", "none"))
            self.assertEqual(bytes.fromhex(rep["bytes"]), e.get("result_bytes", b""))
            self.assertEqual(rep["removed"], e.get("clean", "removed") == "removed")
            self.assertTrue(rep["whole"], "the report is whole")
            self.assertTrue(seen["stdout"].endswith(b"clean %s\n" % e.get("clean", "removed").encode()))
        if not c.streams_closed and c.layout != "no_launch_sh":
            self.assertTrue(seen["stdout"].startswith(SENTINEL.encode() + b"\n"), "stdout's first line")
            self.assertTrue(seen["stderr"].startswith(SENTINEL.encode() + b"\n"), "stderr's first line")
        for key in ("code", "stdout", "stderr", "leftovers"):
            if key in e:
                self.assertEqual(seen[key], e[key], key)
        if "stderr_has" in e:
            self.assertIn(e["stderr_has"], seen["stderr"])
        if "files" in e:
            self.assertEqual(seen["files"], e["files"], "the files left in the run directory")
        elif e.get("clean", "removed") == "removed" and "report" not in e:
            self.assertIsNone(seen["files"], "the run directory is gone")
        for name, data in e.get("probes", {}).items():
            self.assertEqual(seen["probes"].get(name), data, "what the job saw: %s" % name)
        if "environ_names" in e:
            names = [entry.split(b"=", 1)[0].decode() for entry in seen["probes"]["environ"].split(b"\0")
                     if entry]
            self.assertEqual(names, e["environ_names"], "the job's environment, in order")
        if "min_elapsed" in e:
            self.assertGreaterEqual(self.results[c.name][way]["elapsed"], e["min_elapsed"] * 0.95)
        if c.check is not None:
            c.check(self, seen)


    def test_each_allowed_difference_is_met(self):
        # An allowed difference that no case shows any more is one the table no longer needs.
        shown = set()
        for c in CASES:
            for name in ALLOWED_DIFFERENCES:
                values = [repr(self.taken[c.name, way].get(name)) for way in c.ways]
                if len(set(values)) > 1:
                    shown.add(name)
        self.assertEqual(shown, set(ALLOWED_DIFFERENCES))


class StandbyVerifier(unittest.TestCase):
    """The python standby as ferry starts it (standby_boot_line): a standby channel's `/bin/sh -s`
    given one line runs the script in the job cache only when its bytes match ferry's sha256, and
    the compiled code kept beside it only when that matches the sum its last start reported."""

    @classmethod
    def setUpClass(cls):
        cls.tool = prerequisites()
        cls.table = Table(cls.tool)
        cls.addClassCleanup(remove, cls.table.root)
        cls.evil = os.path.join(cls.table.root, "evil-ran")
        cls.compiled = cls.table.standby[:-3] + "." + "".join(
            c for c in sys.implementation.cache_tag if c.isalnum())

    def boot(self, tag="-"):
        """(exit code, stdout, stderr) of a standby given its line, then the end of its stdin."""
        line = subprocess.run([self.tool, "boot", self.table.standby, tag], check=True,
                              capture_output=True).stdout
        env = {"PATH": self.table.bin + ":/usr/bin:/bin", "HOME": self.table.home}
        done = subprocess.run(["/bin/sh", "-s"], input=line, capture_output=True, env=env,
                              cwd=self.table.home, timeout=30)
        return done.returncode, done.stdout, done.stderr

    def rewrite(self, path, data):
        os.chmod(path, 0o600)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, 0o400)

    def ready_tag(self, stdout):
        self.assertRegex(stdout, rb"^ferry-standby-ready (-|[0-9a-f]{64})\n$")
        return stdout.split()[1].decode()

    def test_only_verified_bytes_run(self):
        with open(self.table.standby, "rb") as f:
            honest = f.read()
        self.addCleanup(self.rewrite, self.table.standby, honest)
        code, out, err = self.boot()
        self.assertEqual(code, 0, err)
        tag = self.ready_tag(out)
        with open(self.compiled, "rb") as f:
            self.assertEqual(hashlib.sha256(f.read()).hexdigest(), tag)
        # Told that sum, the next start loads that code.
        code, out, err = self.boot(tag)
        self.assertEqual((code, self.ready_tag(out)), (0, tag), err)
        # Compiled code rewritten (mode, owner and magic number kept): compiled afresh.
        evil = 'open(%r, "w").close()' % self.evil
        self.rewrite(self.compiled, importlib.util.MAGIC_NUMBER + marshal.dumps(compile(evil, "e", "exec")))
        code, out, err = self.boot(tag)
        self.assertEqual(code, 0, err)
        self.ready_tag(out)
        self.assertFalse(os.path.exists(self.evil), "the rewritten compiled code ran")
        # The script rewritten (same size): refused, nothing of it runs.
        evil_script = (evil + "\n").encode()
        self.rewrite(self.table.standby, evil_script + b"#" * (len(honest) - len(evil_script) - 1) + b"\n")
        code, out, err = self.boot(tag)
        self.assertEqual((code, out), (4, b""), err)
        self.assertIn(b"does not match its sha256", err)
        self.assertFalse(os.path.exists(self.evil), "the rewritten script ran")


class StandbyLeftovers(unittest.TestCase):
    """The python standby is its jobs' subreaper (docs/persistence.md, "The python standby"): a
    process a job leaves behind, in a session of its own, becomes the standby's child once the job
    has ended, so that after a run the standby's children alone say whether anything was left (a
    look through /proc, every process of the host, only when something was). One that holds
    nothing of the output lets the standby stay; one that holds it does not (the table's cases
    a_session_of_its_own_*)."""

    @classmethod
    def setUpClass(cls):
        cls.tool = prerequisites()
        cls.table = Table(cls.tool)
        cls.addClassCleanup(remove, cls.table.root)

    def test_a_leftover_becomes_the_standbys_child_and_the_standby_stays(self):
        t = self.table
        c = next(c for c in CASES if c.name == "a_session_of_its_own_escapes_the_group")
        probe = t.probe(c)
        os.mkdir(probe, 0o777)
        t.lay_out(c, "standby")
        proc = subprocess.Popen([t.python3, "-I", "-S", t.standby, "ferry-standby"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=dict(t.login(c, "leftover")), cwd=t.home, start_new_session=True)
        escapee = None
        try:
            proc.stdin.write(b"exec /bin/sh %s\n" % os.path.join(t.run_dir(c), "launch.sh").encode())
            proc.stdin.flush()
            stay, err = b"%s stay\n" % END.encode(), b""
            until = time.monotonic() + 20
            while not err.endswith(stay) and time.monotonic() < until:
                if not select.select([proc.stderr], [], [], max(0, until - time.monotonic()))[0]:
                    break
                chunk = os.read(proc.stderr.fileno(), 65536)
                if not chunk:
                    break
                err += chunk
            ids = dict(line.split() for line in (read_probe(probe, "ids") or b"").decode().splitlines())
            escapee = int(ids["escapee"])
            self.assertTrue(err.endswith(stay), "the standby did not stay: %r" % err[-500:])
            with open("/proc/%d/stat" % escapee, "rb") as f:
                parent = int(f.read().rsplit(b")", 1)[1].split()[1])
            self.assertEqual(parent, proc.pid, "the job's leftover is not the standby's child")
        finally:
            if escapee is not None:
                os.kill(escapee, signal.SIGKILL)
            proc.stdin.close()
            code = proc.wait(20)
            proc.stdout.close()
            proc.stderr.close()
        self.assertEqual(code, 0, "the standby, its stdin ended")


def normalise(obs: dict):
    """What the table compares of one way's run, and the ALLOWED_DIFFERENCES taken out of it,
    each by its name: {name: the value taken out}."""
    seen = {k: obs[k] for k in ("stdout", "stderr", "report", "files", "leftovers", "run_dir")}
    probes = dict(obs["probes"])
    taken = {}
    # "stay": the standby's last line on stderr; the exit code is the report's.
    stay = b"%s stay\n" % END.encode()
    seen["stayed"] = taken["stay"] = seen["stderr"].endswith(stay)
    if seen["stayed"]:
        seen["stderr"] = seen["stderr"][:-len(stay)]
        seen["code"] = obs["report"]["code"] if obs["process_exit"] == 0 else \
            "the standby stayed, then exited %s" % obs["process_exit"]
    else:
        seen["code"] = obs["process_exit"]
    # "parent": the command name of the job's parent tells who ran the job, no more; that the
    # parent is the process started for the run is compared.
    seen["runner"] = None
    if obs["parent"] is not None:
        ppid, comm = obs["parent"].decode().strip().split(" ", 1)
        taken["parent"] = comm
        seen["runner"] = "python" if comm.startswith("python") else comm
        probes["parent_pid"] = ppid.encode()
    # "sigign_glibc": SigIgn without signals 32 and 33 (its bits 31 and 32).
    if "status" in probes:
        taken["sigign_glibc"] = re.findall(rb"SigIgn:\t([0-9a-f]+)", probes["status"])
        probes["status"] = re.sub(rb"SigIgn:\t([0-9a-f]+)", lambda m: b"SigIgn:\t%016x" % (
            int(m.group(1), 16) & ~(3 << 31)), probes["status"])
    # "orig_argv", "boot_frame": as the job saw them, not compared.
    for name in ("orig_argv", "boot_frame"):
        if name in probes:
            taken[name] = probes.pop(name)
    seen["probes"] = probes
    return seen, taken


# FERRY_CONFORMANCE_CASES=REGEX runs only the cases whose names match (to look into one).
if os.environ.get("FERRY_CONFORMANCE_CASES"):
    CASES = [c for c in CASES if re.search(os.environ["FERRY_CONFORMANCE_CASES"], c.name)]
    del LauncherConformance.test_each_allowed_difference_is_met
for _case in CASES:
    setattr(LauncherConformance, "test_" + _case.name, lambda self, c=_case: self.conform(c))


if __name__ == "__main__":
    unittest.main()
