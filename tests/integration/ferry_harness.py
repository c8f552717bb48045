"""Runs the ferry binary under test and reads its JSON Lines (Python 3 stdlib only).

The binary comes from $FERRY_BIN (ctest sets it); a missing binary fails loudly."""

from __future__ import annotations

import json
import os
import pty
import pwd
import re
import select
import shutil
import signal
import subprocess
import tempfile
import textwrap
import time
import unittest
from contextlib import contextmanager

from sshd_fixture import SshServer

TIME = "/usr/bin/time"
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def ferry_bin() -> str:
    path = os.path.abspath(os.environ.get("FERRY_BIN") or os.path.join(REPO, "build", "ferry"))
    if not os.access(path, os.X_OK):
        raise AssertionError(f"ferry binary not found at {path}: build it (cmake --build build) "
                             "or set FERRY_BIN")
    return path


class Result:
    def __init__(self, proc: subprocess.CompletedProcess, max_rss_kib: int = 0):
        self.code = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.max_rss_kib = max_rss_kib

    @property
    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.stdout.decode("utf-8").splitlines() if line.strip()]

    @property
    def record(self) -> dict:
        records = self.records
        assert len(records) == 1, f"expected one run record, got {len(records)}: {self.stdout[:2000]!r}"
        return records[0]

    def __repr__(self) -> str:
        return (f"ferry exit {self.code}\n--- stdout ---\n{self.stdout[-3000:].decode(errors='replace')}"
                f"\n--- stderr ---\n{self.stderr[-3000:].decode(errors='replace')}")


# A build with -DFERRY_SANITIZE=ON sets FERRY_SANITIZED=1 for its tests. AddressSanitizer keeps
# freed memory in a quarantine (256 MB by default) and adds shadow memory and redzones, so a
# peak RSS there is not ferry's own: memory bounds are checked with the quarantine off and on
# top of the RSS of a small run through the same path (see memory_limit_kib).
SANITIZED = os.environ.get("FERRY_SANITIZED") == "1"


def memory_env() -> dict:
    """Extra environment for a run whose peak RSS is asserted."""
    if not SANITIZED:
        return {}
    return {"ASAN_OPTIONS": ":".join(filter(None, [os.environ.get("ASAN_OPTIONS", ""), "quarantine_size_mb=0"]))}


def memory_limit_kib(limit_kib: int, small_run) -> int:
    """`limit_kib`, or under the sanitizers `limit_kib` above the peak RSS of `small_run()`."""
    if not SANITIZED:
        return limit_kib
    baseline = small_run()
    if baseline.max_rss_kib <= 0:
        raise AssertionError(f"no peak RSS measured for the baseline run\n{baseline}")
    return baseline.max_rss_kib + limit_kib


def run_ferry(*args: str, env: dict | None = None, timeout: float = 120, cwd: str | None = None) -> Result:
    """Runs ferry and measures its peak RSS (wait4), without a shell in between."""
    full_env = dict(os.environ)
    full_env.setdefault("FERRY_ARCHIVE", os.path.join(tempfile.gettempdir(), "ferry-test-archive.db"))
    if env:
        full_env.update(env)
    # Peak RSS comes from /usr/bin/time, a small process that execs ferry: the rusage of a
    # child forked straight from this (large) Python process would include Python's own pages,
    # which the kernel counts in the child's high-water mark until exec.
    if not os.access(TIME, os.X_OK):
        raise AssertionError(f"{TIME} is missing: run ./setup.sh (Debian package `time`)")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile(mode="r") as rss:
        proc = subprocess.Popen([TIME, "-q", "-f", "%M", "-o", rss.name, ferry_bin(), *args], stdout=out,
                                stderr=err, stdin=subprocess.DEVNULL, env=full_env, cwd=cwd)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        out.seek(0)
        err.seek(0)
        completed = subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())
        text = rss.read().strip().splitlines()
        if SANITIZED:
            report = re.search(rb"ERROR: (AddressSanitizer|LeakSanitizer)|SUMMARY: UndefinedBehaviorSanitizer",
                               completed.stderr)
            if report or completed.returncode == 86:
                raise AssertionError("sanitizer report from ferry " + " ".join(args) + "\n"
                                     + completed.stderr[-6000:].decode(errors="replace"))
        return Result(completed, int(text[-1]) if text and text[-1].isdigit() else 0)


class SshTestCase(unittest.TestCase):
    """One real sshd for the class (`sftp`: "internal" or "external"), a temp dir holding the
    archive; self.ferry(...) runs ferry against the test user of `shell` through the fixture's
    ssh config."""

    sftp = "internal"
    srv: SshServer

    @classmethod
    def setUpClass(cls):
        cls.srv = SshServer(sftp=cls.sftp).start()
        cls.tmp = tempfile.mkdtemp(prefix="ferry-it-")
        cls.archive = os.path.join(cls.tmp, "archive.db")
        cls.env = {"FERRY_ARCHIVE": cls.archive}

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def ferry(self, *args, shell="bash", env=None, **kw):
        return run_ferry(*args, "--host", self.srv.alias(shell), "--ssh-config", self.srv.ssh_config,
                         env={**self.env, **(env or {})}, **kw)

    @classmethod
    def take_user(cls, shell: str = "bash") -> None:
        """cls.user: the test user of `shell`; cls.base: its default run base; cls.uid, cls.gid."""
        cls.user = cls.srv.user(shell)
        cls.base = os.path.join(SshServer.home(cls.user), ".cache", "ferry", "runs")
        pw = pwd.getpwnam(cls.user)
        cls.uid, cls.gid = pw.pw_uid, pw.pw_gid


def run_in_pty(argv: list[str], env: dict, timeout_s: float = 60,
               on_output=None) -> tuple[int, bytes]:
    """argv with stdout and stderr on one pseudo-terminal, its controlling terminal (/dev/tty):
    (exit code, what the terminal got). `on_output(fd, shown)`, if given, is called after each
    read with all that was shown so far (it may type into the terminal through fd). Past
    timeout_s the process is killed."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(argv[0], argv, env)
    shown = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not select.select([fd], [], [], 0.2)[0]:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
        if on_output is not None:
            on_output(fd, shown)
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), shown


def write_job(directory: str, name: str, body: str, interpreter: str = "python3", timeout: int = 60,
              params: str = "", result: str = "optional") -> str:
    """A job file with a `/// ferry` block; `params` is extra TOML (already without '# ').

    `result` is "optional" here unless a test says otherwise: most test jobs print and exit
    without a result, which a job must declare (the product's default is "required")."""
    ext = ".py" if "python" in interpreter else ".sh"
    extra = textwrap.dedent(params).strip().splitlines() if params else []
    meta = [f'description = "test job {name}"', f'interpreter = "{interpreter}"', f"timeout = {timeout}"]
    if not any(line.replace(" ", "").startswith("result=") for line in extra):
        meta.append(f'result = "{result}"')  # unless the test's own lines say
    meta += extra
    header = "# /// ferry\n" + "".join(f"# {line}\n" if line else "#\n" for line in meta) + "# ///\n"
    path = os.path.join(directory, name + ext)
    with open(path, "w", encoding="utf-8") as f:
        f.write(header + textwrap.dedent(body).lstrip("\n"))
    os.chmod(path, 0o644)
    return path


ECHO_JOB = '''
import json, os
with open(os.environ["FERRY_PARAMS"], encoding="utf-8") as f:
    params = json.load(f)
with open(os.environ["FERRY_RESULT"], "w", encoding="utf-8") as f:
    json.dump({"params": params, "job": os.environ["FERRY_JOB"], "cwd": os.getcwd(),
               "run_dir": os.environ["FERRY_RUN_DIR"], "stdin": os.read(0, 100).decode()}, f)
print("echoed", len(params), "params")
'''

ECHO_PARAMS = '''
[params.text]
type = "string"
required = true
[params.items]
type = "list"
default = []
[params.blob]
type = "json"
'''

# Every character class that a shell might reinterpret, plus bytes that stress encodings.
HOSTILE = [
    "( ) \" ' \\ $HOME ${PATH} `id` $(id) *.py [a-z]* {a,b} ~root !! ; | & < > #",
    "line1\nline2\n\ttabbed\r\nCR\rend",
    "'\"'\"'\\''",
    "\\\\server\\share\\n\\t",
    "%s %d %n {} {0} %(x)s",
    "-n", "-e \\x41", "--", "*", "~", "!", "#comment", "a\\", "$", "\"", "'",
    "".join(chr(c) for c in range(1, 32) if c not in (0,)) + "\x7f",
    "日本語 emoji 🚀🔥 RTL \u202e override zero\u200bwidth BOM \ufeff combining e\u0301",
    "x" * 100_000,
]


def mode(path: str) -> int:
    return os.stat(path).st_mode & 0o7777


@contextmanager
def python3_first_on_path(user: str, script: str):
    """A `python3` first on the PATH of USER's login environment: SCRIPT (a sh script) as
    ~/wrap/python3, the directory put first by ~/.bashrc (Debian's bash reads it when sshd runs
    it); ~/.bashrc is put back afterwards. Yields the directory."""
    home = SshServer.home(user)
    pw = pwd.getpwnam(user)
    wrap, bashrc = os.path.join(home, "wrap"), os.path.join(home, ".bashrc")
    saved = open(bashrc, "rb").read() if os.path.exists(bashrc) else None
    os.mkdir(wrap, 0o755)
    with open(os.path.join(wrap, "python3"), "w") as f:
        f.write(script)
    os.chmod(f.name, 0o755)
    with open(bashrc, "w") as f:
        f.write('PATH="$HOME/wrap:$PATH"\n' + (saved or b"").decode())
    for path in (wrap, os.path.join(wrap, "python3"), bashrc):
        os.chown(path, pw.pw_uid, pw.pw_gid)
    try:
        yield wrap
    finally:
        if saved is None:
            os.unlink(bashrc)
        else:
            with open(bashrc, "wb") as f:
                f.write(saved)
            os.chown(bashrc, pw.pw_uid, pw.pw_gid)
        shutil.rmtree(wrap)
