"""A hostile host, a hostile job and an unlucky operator (issue 11): nothing hangs, nothing is
left behind, nothing a host or job sends repaints the terminal. Real sshd, real shells."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

from ferry_harness import SshTestCase, ferry_bin, run_ferry, run_in_pty, write_job
from sshd_fixture import SshServer, require_root_and_tools
import test_persist  # not `from ... import Persistence`: unittest would run its tests here too
from test_persist import alive, parent_of

# Control sequences a hostile job or host might send: a clipboard write (OSC 52), a title
# change, clear screen, a C1 CSI, DEL, a right-to-left override.
HOSTILE_BYTES = "\x1b]52;c;ZXZpbA==\x07\x1b]0;pwned\x07\x1b[2J\x1b[32mok\x1b[0m\u009b31m\x7f\u202eevil"
FORBIDDEN = [b"\x1b", b"\x07", b"\xc2\x9b", b"\x7f", "\u202e".encode()]


def popen_ferry(*args, env=None):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.Popen([ferry_bin(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=full_env)


def wait_for(predicate, timeout_s: float, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    return predicate()


def blocked_in_fifo(pid: int) -> bool:
    """Whether the process waits in a FIFO's open (for a partner that never comes)."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            return f.read() in ("fifo_open", "wait_for_partner")
    except OSError:
        return False


def read_cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read().replace("\0", " ")
    except OSError:
        return ""


class HostileJobsOverSsh(SshTestCase):
    def test_result_that_is_a_fifo_dir_or_link_is_named_never_opened(self):
        cases = {
            "fifo": ("mkfifo \"$FERRY_RESULT\"\n", "is a FIFO, socket or device"),
            "dir": ("mkdir \"$FERRY_RESULT\"\n", "is a directory"),
            "link": ("ln -s /etc/shadow \"$FERRY_RESULT\"\n", "is a symbolic link"),
        }
        for name, (body, said) in cases.items():
            with self.subTest(case=name):
                job = write_job(self.tmp, "result_" + name, body, interpreter="sh")
                start = time.monotonic()
                res = self.ferry("run", job, "--json", timeout=60)
                self.assertLess(time.monotonic() - start, 20, res)
                self.assertEqual(res.code, 1, res)
                rec = res.record
                self.assertEqual(rec["status"], "bad-result", rec)
                self.assertIn(said, rec["error"])
                self.assertIsNone(rec["result"])
                self.assertNoRunDirs("bash")

    def test_run_dir_deeper_than_anything_is_removed(self):
        job = write_job(self.tmp, "deep", 'p="$FERRY_RUN_DIR"\nfor i in $(seq 60); do p="$p/d"; done\n'
                        'mkdir -p "$p" && echo x > "$p/f"\n', interpreter="sh")
        res = self.ferry("run", job, "--json")
        self.assertEqual(res.code, 0, res)
        self.assertNoRunDirs("bash")

    def test_a_huge_leftover_run_dir_costs_each_run_a_bounded_cleanup(self):
        # Issue 45 item 5: a run directory left with tens of thousands of files made later,
        # unrelated runs fail (the sweep removed it in one step, which outlived its bound). Now
        # each run's sweep removes what it can in a bounded time, every run is ok, and the
        # leftover is gone after a few runs.
        job = write_job(self.tmp, "plain", "echo hi\n", interpreter="sh")
        user = self.srv.user("bash")
        first = self.ferry("run", job, "--json")
        self.assertEqual(first.code, 0, first)
        base = os.path.join(self.srv.home(user), ".cache", "ferry", "runs")
        leftover = os.path.join(base, "ferry-20200101T000000Z-" + "ab" * 16)
        os.makedirs(os.path.join(leftover, "many"))
        for i in range(40000):
            with open(os.path.join(leftover, "many", str(i)), "w"):
                pass
        subprocess.run(["chown", "-R", f"{user}:{user}", leftover], check=True)
        os.utime(leftover, (0, 0))  # long unstarted: stale to the sweep
        statuses = []
        for _ in range(15):
            res = self.ferry("run", job, "--json", "--connect-timeout", "2")
            statuses.append(res.record["status"] if res.records else res.stderr.decode())
            if not os.path.exists(leftover):
                break
        self.assertEqual(set(statuses), {"ok"}, statuses)
        self.assertFalse(os.path.exists(leftover), f"still there after {len(statuses)} runs")

    def test_launcher_cleans_up_after_every_lost_connection(self):
        # The connection goes while the job runs; the launcher's deadline then stops the job
        # (dash reports it on the dead stderr) and the launcher must still remove its run dir.
        job = write_job(self.tmp, "lost", 'echo started\nsleep 30\n', interpreter="sh", timeout=2)
        user = self.srv.user("dash")
        runs = 10
        procs = [popen_ferry("run", job, "--host", self.srv.alias("dash"), "--ssh-config",
                             self.srv.ssh_config, "--no-archive", env=self.env) for _ in range(runs)]

        def sleeping():
            return sum(1 for p in self.srv.processes_of(user)
                       if "sleep 30" in read_cmdline(p))

        self.assertTrue(wait_for(lambda: sleeping() == runs, 40), f"{sleeping()} of {runs} jobs started")
        for proc in procs:
            proc.kill()
            proc.communicate()
        gone = wait_for(lambda: not self.srv.run_dirs(user) and not self.srv.processes_of(user), 20)
        self.assertTrue(gone, f"left behind: {self.srv.run_dirs(user)}\n{self.srv.describe_processes(user)}")

    def test_deadline_holds_when_no_marker_can_be_written(self):
        # The job removes its own run directory (no marker file possible), then overruns.
        job = write_job(self.tmp, "unmarked", 'rm -rf "$FERRY_RUN_DIR"\necho gone\nsleep 40\n',
                        interpreter="sh", timeout=3)
        user = self.srv.user("bash")
        proc = popen_ferry("run", job, "--host", self.srv.alias("bash"), "--ssh-config",
                           self.srv.ssh_config, env=self.env)
        started = time.monotonic()
        self.assertTrue(wait_for(lambda: any("sleep 40" in read_cmdline(p)
                                             for p in self.srv.processes_of(user)), 20))
        proc.kill()
        proc.communicate()
        # Nobody is connected; the launcher's own deadline (3 s + 2 s grace) ends the job.
        self.assertEqual(self.srv.wait_no_processes(user, timeout_s=12), [],
                         self.srv.describe_processes(user))
        self.assertLess(time.monotonic() - started, 15)

    def test_a_job_that_kills_its_launcher_still_meets_its_deadline(self):
        # Issue 45 item 6: a job that killed its launcher escaped its timeout.
        job = write_job(self.tmp, "parricide", 'kill -9 "$PPID"\necho killed\nsleep 60\n',
                        interpreter="sh", timeout=3)
        user = self.srv.user("bash")
        started = time.monotonic()
        res = self.ferry("run", job, "--json", "--persist", "0", timeout=40)
        self.assertLess(time.monotonic() - started, 15, res)
        self.assertNotEqual(res.record["status"], "ok", res.record)
        # Its deadline (3 s) and grace (2 s) past, nothing of the job is left.
        self.assertEqual(self.srv.wait_no_processes(user, timeout_s=12), [],
                         self.srv.describe_processes(user))
        self.assertLess(time.monotonic() - started, 20)

    def test_job_output_on_a_terminal_cannot_repaint_it(self):
        job = write_job(self.tmp, "painter", f'''
            import json, os, sys
            evil = {HOSTILE_BYTES!r}
            print("stdout " + evil)
            print("stderr " + evil, file=sys.stderr)
            json.dump({{"k" + evil: evil}}, open(os.environ["FERRY_RESULT"], "w"))
            sys.exit(3)
            ''')
        env = {**os.environ, **self.env, "NO_COLOR": "1"}
        argv = [ferry_bin(), "run", job, "--host", self.srv.alias("zsh"), "--ssh-config",
                self.srv.ssh_config]
        code, shown = run_in_pty(argv, env)
        self.assertEqual(code, 1, shown)
        self.assertIn(b"stdout", shown)
        for forbidden in FORBIDDEN:
            self.assertNotIn(forbidden, shown, shown)
        self.assertIn(b"\\x1b]52;c;", shown)  # shown, escaped
        # --raw-output passes the job's own bytes through; ferry's own lines stay escaped.
        code, raw = run_in_pty(argv + ["--raw-output"], env)
        self.assertEqual(code, 1, raw)
        self.assertIn(b"stdout \x1b]52;c;", raw)
        summary = [line for line in raw.split(b"\r\n") if b"painter @" in line]
        self.assertEqual(len(summary), 1, raw)
        self.assertNotIn(b"\x1b", summary[0])
        # Piped, the job's bytes stay exact; ferry's own summary line is escaped.
        res = self.ferry("run", job, shell="zsh")
        self.assertIn(("stdout " + HOSTILE_BYTES).encode(), res.stdout)
        own = [line for line in res.stdout.splitlines() if b"painter @" in line]
        self.assertEqual(len(own), 1, res)
        for forbidden in FORBIDDEN:
            self.assertNotIn(forbidden, own[0])
        # `show` escapes what the archive holds, params and result included.
        page = run_ferry("show", "last", env=self.env)
        self.assertEqual(page.code, 0, page)
        for forbidden in FORBIDDEN:
            self.assertNotIn(forbidden, page.stdout, page)

    def test_startup_file_noise_is_escaped_in_the_warning(self):
        user = self.srv.user("zsh")
        self.srv.set_startup_script(user, "printf '\\033]0;owned\\007hi\\n'\n")
        try:
            job = write_job(self.tmp, "quiet", "print('ok')\n")
            res = self.ferry("run", job, shell="zsh")
            self.assertEqual(res.code, 0, res)
            self.assertIn(b"login shell printed", res.stdout)
            self.assertNotIn(b"\x1b", res.stdout)
            self.assertNotIn(b"\x07", res.stdout)
        finally:
            self.srv.set_startup_script(user, None)

    def test_hanging_login_shell_is_named_not_a_timeout(self):
        user = self.srv.user("zsh")
        self.srv.set_startup_script(user, "sleep 1000\n")
        try:
            job = write_job(self.tmp, "never", "print('never runs')\n", timeout=300)
            start = time.monotonic()
            res = self.ferry("run", job, "--json", "--connect-timeout", "3", shell="zsh", timeout=60)
            self.assertLess(time.monotonic() - start, 30, res)
            rec = res.record
            self.assertEqual(rec["status"], "error", rec)
            self.assertIn("did not start ferry's launcher", rec["error"])
            self.assertIn("startup files", rec["error"])
        finally:
            self.srv.set_startup_script(user, None)
        self.assertNoRunDirs("zsh")

    def test_accounts_that_run_no_command_are_named(self):
        for shell_path in ("/usr/sbin/nologin", "/bin/false"):
            with self.subTest(shell=shell_path), SshServer.login_shell(self.srv.user("bash"), shell_path):
                job = write_job(self.tmp, "refused", "print('x')\n")
                rec = self.ferry("run", job, "--json").record
                self.assertEqual(rec["status"], "error", rec)
                self.assertIn("did not run ferry's launcher", rec["error"])
                self.assertIn("nologin", rec["error"])

    def test_sigterm_during_a_run_ends_ferry_in_seconds_and_archives_it(self):
        job = write_job(self.tmp, "long", "import time\nprint('up', flush=True)\ntime.sleep(100)\n", timeout=200)
        user = self.srv.user("bash")
        proc = popen_ferry("run", job, "--host", self.srv.alias("bash"), "--ssh-config",
                           self.srv.ssh_config, env=self.env)
        self.assertTrue(wait_for(lambda: self.srv.run_dirs(user) and len(self.srv.processes_of(user)) > 3, 20))
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        self.assertLess(time.monotonic() - sent, 8)
        self.assertEqual(proc.returncode, 130)
        log = run_ferry("log", "--json", "--limit", "1", env=self.env)
        self.assertEqual(log.records[0]["status"], "interrupted")
        self.assertEqual(self.srv.wait_no_processes(user, 10), [], self.srv.describe_processes(user))
        self.assertNoRunDirs("bash")

    def assertNoRunDirs(self, shell: str):
        user = self.srv.user(shell)
        left = wait_for(lambda: not self.srv.run_dirs(user), 5)
        self.assertTrue(left, self.srv.run_dirs(user))


class HostileHostExternalSftp(SshTestCase):
    sftp = "external"

    def test_sftp_that_never_starts_is_bounded_and_sigterm_ends_it(self):
        user = self.srv.user("zsh")
        self.srv.set_startup_script(user, "sleep 1000\n")
        try:
            job = write_job(self.tmp, "stuck", "print('x')\n")
            start = time.monotonic()
            res = self.ferry("run", job, "--json", "--connect-timeout", "3", shell="zsh", timeout=60)
            self.assertLess(time.monotonic() - start, 25, res)
            rec = res.record
            self.assertEqual(rec["status"], "error", rec)
            self.assertIn("SFTP did not start", rec["error"])
            self.assertIn("took longer than 6 s", rec["error"])
            # SIGTERM while it hangs: ferry ends within seconds, the run archived as interrupted.
            proc = popen_ferry("run", job, "--host", self.srv.alias("zsh"), "--ssh-config",
                               self.srv.ssh_config, env=self.env)
            time.sleep(2)
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
            self.assertLess(time.monotonic() - sent, 6)
            self.assertEqual(proc.returncode, 130)
            log = run_ferry("log", "--json", "--limit", "1", env=self.env)
            self.assertEqual(log.records[0]["status"], "interrupted", log.records[0])
        finally:
            self.srv.set_startup_script(user, None)
            SshServer.kill_user_processes(user)

    def test_an_account_that_runs_no_command_is_named_for_sftp_too(self):
        with SshServer.login_shell(self.srv.user("bash"), "/usr/sbin/nologin"):
            job = write_job(self.tmp, "nosftp", "print('x')\n")
            rec = self.ferry("run", job, "--json").record
            self.assertEqual(rec["status"], "error", rec)
            self.assertIn("runs no command", rec["error"])
            self.assertIn("nologin", rec["error"])


class MaxSessionsOne(unittest.TestCase):
    def test_a_host_that_allows_one_channel_runs_jobs(self):
        with SshServer(extra_config="MaxSessions 1") as srv, tempfile.TemporaryDirectory() as tmp:
            job = write_job(tmp, "one", "import json, os\nprint('hi')\n"
                            "json.dump({'x': 1}, open(os.environ['FERRY_RESULT'], 'w'))\n")
            env = {"FERRY_ARCHIVE": os.path.join(tmp, "a.db")}
            res = run_ferry("-v", "run", job, job, "--host", srv.alias("bash"), "--ssh-config", srv.ssh_config,
                            "--json", env=env)
            self.assertEqual(res.code, 0, res)
            self.assertEqual([r["result"] for r in res.records], [{"x": 1}, {"x": 1}])
            self.assertEqual(srv.run_dirs(srv.user("bash")), [])
            # -v says why SFTP went away and came back.
            self.assertIn("refused a second channel (MaxSessions 1?)", res.stderr.decode())


class NoSftp(unittest.TestCase):
    def test_a_host_without_the_sftp_subsystem_is_named_with_the_fix(self):
        # Issue 45 item 8: a host with no sftp subsystem gave libssh's raw error.
        with SshServer(sftp="none") as srv, tempfile.TemporaryDirectory() as tmp:
            job = write_job(tmp, "one", "print('hi')\n")
            env = {"FERRY_ARCHIVE": os.path.join(tmp, "a.db")}
            res = run_ferry("run", job, "--host", srv.alias("bash"), "--ssh-config", srv.ssh_config,
                            "--json", "--persist", "0", env=env)
            self.assertEqual(res.code, 1, res)
            self.assertEqual(res.record["status"], "error", res.record)
            self.assertIn("ferry needs the sftp subsystem enabled", res.record["error"])
            self.assertIn("Subsystem sftp internal-sftp", res.record["error"])


# Rewrites another job's entry in the host's job cache (its name: the honest bytes' sha256) with
# bytes of the same size, mode and owner, as a process of the user's can: only their content
# tells.
REWRITE_ENTRY = """
import os
entry = os.path.join(os.path.dirname(os.environ["FERRY_RUN_DIR"]), "ferry-job-@sha@.py")
size = os.path.getsize(entry)
evil = b'open(os.path.expanduser("~/evil-ran"), "w").close()\\nprint("evil")\\n'
evil = b"import os\\n" + evil
evil += b"#" * (size - len(evil) - 1) + b"\\n"
os.chmod(entry, 0o600)
with open(entry, "wb") as f:
    f.write(evil)
os.chmod(entry, 0o400)
print("rewrote", entry)
"""

# Leaves a process (a session of its own, its output closed, so the standby stays) that opens the
# python standby's stdin through /proc and reads from it what comes for 8 s: the next run's line
# and launch.sh's bytes. What it got, or why it got nothing, goes to ~/stolen.
STEAL_STDIN = """
import os, time
standby = os.getppid()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        out = os.path.expanduser("~/stolen")
        fds = sorted(os.listdir("/proc/self/fd"))
        for fd in (0, 1, 2):
            os.close(fd)
        log = open(out + ".log", "w")
        log.write("fds %s\\n" % fds)
        got = b""
        try:
            pipe = os.open("/proc/%d/fd/0" % standby, os.O_RDWR | os.O_NONBLOCK)
            log.write("opened\\n")
        except OSError as e:
            pipe = None
            log.write("denied %s\\n" % e.strerror)
        log.flush()
        until = time.monotonic() + 8
        while pipe is not None and time.monotonic() < until:
            try:
                got += os.read(pipe, 65536)
            except BlockingIOError:
                time.sleep(0.01)
        with open(out, "wb") as f:
            f.write(got)
        log.write("done\\n")
        log.close()
    os._exit(0)
os.wait()
print("left a reader of", standby)
"""


# Rewrites the python standby's script in the job cache (same name, size, mode and owner: only the
# content tells) with bytes that leave ~/evil-ran, as a process of the user's can.
REWRITE_STANDBY = """
import os
base = os.path.dirname(os.environ["FERRY_RUN_DIR"])
evil = b'open(__import__("posix").environ[b"HOME"].decode() + "/evil-ran", "w").close()\\n'
for name in os.listdir(base):
    path = os.path.join(base, name)
    if name.startswith("ferry-job-") and name.endswith(".py"):
        with open(path, "rb") as f:
            if not f.read(64).startswith(b"# ferry's python standby"):
                continue
        size = os.path.getsize(path)
        os.chmod(path, 0o600)
        with open(path, "wb") as f:
            f.write(evil + b"#" * (size - len(evil) - 1) + b"\\n")
        os.chmod(path, 0o400)
        print("rewrote", name)
"""

# Leaves a process that, once the run has ended and the standby stayed, rewrites the standby's
# compiled code in the job cache (`ferry-job-SHA256.TAG`: this python's magic number, then code
# that leaves ~/evil-ran; mode 0400, the user's) and kills the standby, so that the holder starts
# another, which would load that code.
REWRITE_COMPILED = """
import importlib.util, marshal, os, signal, time
base = os.path.dirname(os.environ["FERRY_RUN_DIR"])
standby = os.getppid()
tags = [n for n in os.listdir(base) if n.startswith("ferry-job-") and n.endswith(".cpython%d%d" % __import__("sys").version_info[:2])]
print("compiled code:", len(tags))
if os.fork() == 0:
    os.setsid()
    for fd in (0, 1, 2):
        os.close(fd)
    time.sleep(1)
    evil = compile('open(__import__("posix").environ[b"HOME"].decode() + "/evil-ran", "w").close()', "evil", "exec")
    for name in tags:
        path = os.path.join(base, name)
        os.chmod(path, 0o600)
        with open(path, "wb") as f:
            f.write(importlib.util.MAGIC_NUMBER + marshal.dumps(evil))
        os.chmod(path, 0o400)
    os.kill(standby, signal.SIGKILL)
    os._exit(0)
"""

# Leaves a process (a session of its own, its output closed, so the standby stays) that looks for
# the interpreter the python standby starts ahead for the next run and opens its descriptor 3,
# where that run is told to it, and the standby's stdin. What it could open goes to ~/stolen.log.
OPEN_AHEAD = """
import os, time
standby, job = os.getppid(), os.getpid()
if os.fork() == 0:
    os.setsid()
    between = os.getpid()
    if os.fork() == 0:
        for fd in (0, 1, 2):
            os.close(fd)
        log = open(os.path.expanduser("~/stolen.log"), "w")
        mine, uid = {job, between, os.getpid()}, os.getuid()
        until = time.monotonic() + 40  # started once the host is not crowded
        found = None
        while found is None and time.monotonic() < until:
            for name in os.listdir("/proc"):
                if not name.isdigit() or int(name) in mine:
                    continue
                try:
                    if os.stat("/proc/" + name).st_uid != uid:
                        continue
                    with open("/proc/%s/cmdline" % name, "rb") as f:
                        if f.read().startswith(b'python3\\0-c\\0exec(__import__("os").read(3,'):
                            found = int(name)
                            break
                except OSError:
                    continue
            time.sleep(0.01)
        log.write("ahead %s\\n" % found)
        for what, path in (("fd3", "/proc/%s/fd/3" % found), ("stdin", "/proc/%d/fd/0" % standby)):
            try:
                os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))
                log.write("%s opened\\n" % what)
            except OSError as e:
                log.write("%s denied %s\\n" % (what, e.strerror))
        log.write("done\\n")
        log.close()
    os._exit(0)
os.wait()
print("left a looker")
"""

# Writes a result too large for the launcher's report (8 MiB frame), so that ferry fetches it over
# SFTP, and leaves a process (a session of its own, its output closed) that swaps result.json for
# a FIFO and back, again and again, for 6 s or until the run directory goes: the swap lands
# before the fetch's lstat, or between it and the open.
SWAP_RESULT_FOR_FIFO = """
import json, os, time
run_dir = os.environ["FERRY_RUN_DIR"]
with open(os.environ["FERRY_RESULT"], "w") as f:
    json.dump({"pad": "x" * (9 << 20)}, f)
os.link(os.environ["FERRY_RESULT"], run_dir + "/keep.json")
if os.fork() == 0:
    os.setsid()
    for fd in (0, 1, 2):
        os.close(fd)
    until = time.monotonic() + 6
    try:
        while time.monotonic() < until:
            os.mkfifo(run_dir + "/f", @mode@)
            os.rename(run_dir + "/f", run_dir + "/result.json")
            os.link(run_dir + "/keep.json", run_dir + "/r")
            os.rename(run_dir + "/r", run_dir + "/result.json")
    except OSError:
        pass
    os._exit(0)
print("swapping")
"""


class RunsKeptApart(unittest.TestCase):
    """Issue 45 item 3: a job cannot reach another run's bytes. Persistence on, as users get it."""

    standbys = test_persist.Persistence.standbys
    held = test_persist.Persistence.held
    holder = test_persist.Persistence.holder
    python_standby = test_persist.Persistence.python_standby
    _booted = test_persist.Persistence._booted

    @classmethod
    def setUpClass(cls):
        require_root_and_tools()
        cls.srv = SshServer().start()
        cls.addClassCleanup(cls.srv.stop)
        cls.tmp = tempfile.mkdtemp(prefix="ferry-apart-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        cls.env = test_persist.persistence_env(cls.tmp)
        cls.job = write_job(cls.tmp, "hello", "import json, os\nprint('hi')\n"
                            "json.dump({'pid': os.getpid()}, open(os.environ['FERRY_RESULT'], 'w'))\n")
        cls.user = cls.srv.user("bash")
        cls.home = cls.srv.home(cls.user)
        cls.base = os.path.join(cls.home, ".cache", "ferry", "runs")

    def setUp(self):
        for name in ("evil-ran", "stolen", "stolen.log"):
            if os.path.exists(os.path.join(self.home, name)):
                os.unlink(os.path.join(self.home, name))

    def tearDown(self):
        run_ferry("disconnect", "--all", env=self.env)
        self.srv.kill_user_processes(self.user)
        self.srv.wait_no_processes(self.user, timeout_s=5)

    def ferry(self, *args, env=None, **kw):
        return run_ferry(*args, "--host", self.srv.alias("bash"), "--ssh-config", self.srv.ssh_config,
                         env={**self.env, **(env or {})}, **kw)

    def honest_job(self, name):
        path = write_job(self.tmp, name, "print('honest')\n")
        with open(path, "rb") as f:
            return path, hashlib.sha256(f.read()).hexdigest()

    def assert_honest_run_after_rewrite(self, job, sha, *persist):
        res = self.ferry("run", job, "--json", *persist)
        self.assertEqual(res.code, 0, res)
        rewrite = write_job(self.tmp, "rewrite_" + sha[:8], REWRITE_ENTRY.replace("@sha@", sha))
        res = self.ferry("run", rewrite, "--json", *persist)
        self.assertEqual(res.code, 0, res)
        self.assertIn("rewrote", res.record["stdout"])
        res = self.ferry("run", job, "--json", *persist)
        self.assertFalse(os.path.exists(os.path.join(self.home, "evil-ran")), "the rewritten bytes ran")
        self.assertEqual(res.code, 0, res)
        self.assertEqual(res.record["status"], "ok", res.record)
        self.assertEqual(res.record["stdout"], "honest\n")
        self.assertEqual(res.record["job_sha256"], sha)
        warnings = [w for w in res.record.get("warnings", []) if w["code"] == "job-cache-refused"]
        self.assertEqual(len(warnings), 1, res.record)
        entry = os.path.join(self.base, f"ferry-job-{sha}.py")
        self.assertIn(self.srv.alias("bash"), warnings[0]["message"])
        self.assertIn(entry, warnings[0]["message"])
        self.assertIn("no longer matches the job's sha256", warnings[0]["message"])
        # The next run puts the honest bytes back in the cache and uses them, without a word.
        res = self.ferry("run", job, "--json", *persist)
        self.assertEqual((res.code, res.record["stdout"], res.record.get("warnings", [])), (0, "honest\n", []), res)
        with open(entry, "rb") as f:
            self.assertEqual(hashlib.sha256(f.read()).hexdigest(), sha)

    def test_a_rewritten_cache_entry_is_refused_and_sent_again_by_launch_sh(self):
        # The job cache without the python standby's script (an earlier test's holder put it
        # there): a direct only run would then go to a standby without SFTP, which checks the
        # entry's sha256 itself and makes it anew (test_trust.py's rows for that path).
        aside = []
        for script in glob.glob(os.path.join(self.base, "ferry-job-*.py")):
            with open(script, "rb") as f:
                if f.read(40).startswith(b"# ferry's python standby"):
                    os.rename(script, os.path.join(self.base, f"aside-{len(aside)}"))
                    aside.append(script)
        for note in glob.glob(os.path.join(self.env["XDG_RUNTIME_DIR"], "ferry", "*.standby")):
            os.unlink(note)
        try:
            job, sha = self.honest_job("honest_direct")
            self.assert_honest_run_after_rewrite(job, sha, "--persist", "0")
        finally:
            for i, script in enumerate(aside):
                os.rename(os.path.join(self.base, f"aside-{i}"), script)

    def test_a_rewritten_cache_entry_is_refused_and_sent_again_by_the_python_standby(self):
        job, sha = self.honest_job("honest_held")
        self.python_standby()
        self.assert_honest_run_after_rewrite(job, sha)
        self.assertEqual(len(self.held()), 1)

    def test_an_entry_changed_on_the_host_is_made_anew_with_a_warning_on_a_held_session(self):
        # Issue 45 item 3: a held session staging the run over SFTP removed an entry that was not
        # as ferry leaves it and made it anew without a word (the launcher and the python
        # standby say what they refuse). The holder starts after the change, so that its sweep
        # sees it (what a session listed it trusts for 10 minutes; the launcher hashes it anyway).
        for damage in ("mode", "size"):
            with self.subTest(damage=damage):
                job, sha = self.honest_job("remade_" + damage)
                res = self.ferry("run", job, "--json", "--persist", "0")
                self.assertEqual(res.code, 0, res)
                entry = os.path.join(self.base, f"ferry-job-{sha}.py")
                if damage == "mode":
                    os.chmod(entry, 0o666)
                else:
                    os.chmod(entry, 0o600)
                    with open(entry, "ab") as f:
                        f.write(b"#\n")
                    os.chmod(entry, 0o400)
                res = run_ferry("connect", self.srv.alias("bash"), "--ssh-config", self.srv.ssh_config,
                                env=self.env)
                self.assertEqual(res.code, 0, res)
                res = self.ferry("-v", "run", job, "--json")
                self.assertIn(b"using the connection held", res.stderr, res)
                self.assertEqual((res.code, res.record["status"], res.record["stdout"]), (0, "ok", "honest\n"), res)
                self.assertEqual([w["message"] for w in res.record.get("warnings", [])], [
                    f"{self.srv.alias('bash')}: the job cache entry {entry} was not as ferry leaves it, "
                    "a regular file of yours of mode 0400 and of the job's size (a process on the host "
                    "that runs as you changed it); ferry discarded it and sent the job again"], res.record)
                self.assertEqual(res.record["warnings"][0]["code"], "job-cache-refused")
                st = os.lstat(entry)
                self.assertEqual((st.st_mode & 0o170777, st.st_uid), (0o100400, os.lstat(self.base).st_uid))
                with open(entry, "rb") as f:
                    self.assertEqual(hashlib.sha256(f.read()).hexdigest(), sha)
                run_ferry("disconnect", "--all", env=self.env)

    def test_a_job_cannot_read_or_write_the_python_standbys_stdin(self):
        standby = self.python_standby()
        thief = write_job(self.tmp, "thief", STEAL_STDIN)
        res = self.ferry("run", thief, "--json")
        self.assertEqual(res.code, 0, res)
        log = os.path.join(self.home, "stolen.log")
        self.assertTrue(wait_for(lambda: os.path.exists(log) and os.path.getsize(log) > 0, 10),
                        self.srv.describe_processes(self.user))
        self.assertEqual(self.standbys(self.user, ("python",)), [standby],
                         "the python standby did not stay for the next run")
        secret = "s3cret-" + os.urandom(8).hex()
        sh_job = write_job(self.tmp, "uses_env", 'printf "%s\\n" "${TOKEN:+set}"\n', interpreter="sh")
        res = self.ferry("run", sh_job, "--json", "--env", f"TOKEN={secret}")
        self.assertEqual(res.code, 0, res)
        self.assertEqual(res.record["status"], "ok", res.record)
        self.assertEqual(res.record["stdout"], "set\n")
        res = self.ferry("run", self.job, "--json")
        self.assertEqual((res.code, res.record["stdout"]), (0, "hi\n"), res)
        def said():
            with open(log) as f:
                return f.read()
        self.assertTrue(wait_for(lambda: "done" in said(), 15), said())
        with open(os.path.join(self.home, "stolen"), "rb") as f:
            stolen = f.read()
        self.assertNotIn(secret.encode(), stolen)
        self.assertEqual(stolen, b"", said())
        self.assertIn("denied Permission denied", said())
        self.assertIn("fds ['0', '1', '2', '3']", said())  # 3: the listing's own

    def test_a_rewritten_standby_script_is_refused_and_sent_again(self):
        # Issue 45 item 3: the python standby's own script in the job cache was run unchecked.
        self.python_standby()
        rewrite = write_job(self.tmp, "rewrite_standby", REWRITE_STANDBY)
        res = self.ferry("run", rewrite, "--json")
        self.assertEqual(res.code, 0, res)
        self.assertIn("rewrote", res.record["stdout"])
        run_ferry("disconnect", "--all", env=self.env)
        res = self.ferry("run", self.job, "--json")
        self.assertEqual((res.code, res.record["stdout"]), (0, "hi\n"), res)
        records = [res.record]
        # The new holder's python standby refuses the script, which is then sent again (a
        # python standby's process shows before it has checked anything: the script's return
        # is waited for first).
        def honest_script():
            for name in os.listdir(self.base):
                if name.startswith("ferry-job-") and name.endswith(".py"):
                    with open(os.path.join(self.base, name), "rb") as f:
                        if f.read(64).startswith(b"# ferry's python standby"):
                            return True
            return False
        # The refusal comes as the holder readies its standby (the script may be back at once);
        # the script goes back at the latest at its next look, once it is idle after the next run.
        wait_for(lambda: (not honest_script() and self.standbys(self.user, ("sh",)))
                 or honest_script(), 20)
        res = self.ferry("run", self.job, "--json")
        self.assertEqual((res.code, res.record["stdout"]), (0, "hi\n"), res)
        records.append(res.record)
        back = wait_for(honest_script, 20)
        self.assertFalse(os.path.exists(os.path.join(self.home, "evil-ran")), "the rewritten script ran")
        self.assertTrue(back, f"the script was not sent again: {os.listdir(self.base)}")
        # Issue 45 item 3: the refusal is a warning in the record of the run that came after it
        # (before, a `-v` line only), once.
        warned = [w["message"] for r in records for w in r.get("warnings", [])
                  if w["code"] == "job-cache-refused"]
        self.assertEqual(len(warned), 1, records)
        self.assertIn(self.srv.alias("bash"), warned[0])
        self.assertIn("ferry's python standby, no longer matched its sha256", warned[0])
        self.assertIn(self.base + "/ferry-job-", warned[0])
        self.assertEqual([r["status"] for r in records], ["ok", "ok"], records)

    def test_rewritten_compiled_standby_code_is_not_run(self):
        # Issue 45 item 3: the compiled code kept beside the script was run when its owner, mode
        # and magic number were right.
        standby = self.python_standby()
        rewrite = write_job(self.tmp, "rewrite_compiled", REWRITE_COMPILED)
        res = self.ferry("run", rewrite, "--json")
        self.assertEqual(res.code, 0, res)
        self.assertIn("compiled code: 1", res.record["stdout"])
        self.assertTrue(wait_for(lambda: not alive(standby), 10), "the standby was not killed")
        ready = []
        for _ in range(2):
            res = self.ferry("run", self.job, "--json")
            self.assertEqual((res.code, res.record["stdout"]), (0, "hi\n"), res)
            ready.append(wait_for(lambda: self.standbys(self.user, ("python",)), 20))
        self.assertFalse(os.path.exists(os.path.join(self.home, "evil-ran")), "the rewritten code ran")
        self.assertTrue(all(ready), self.srv.describe_processes(self.user))
        self.assertEqual(len(self.held()), 1)

    def test_a_job_that_kills_the_python_standby_still_meets_its_deadline(self):
        # Issue 45 item 6: a job that killed its launcher escaped its timeout; launch.sh has a
        # watchdog, and so must the python standby, the launcher of a held python job.
        standby = self.python_standby()
        job = write_job(self.tmp, "standby_killer", """
            import os, signal, time
            with open(os.path.expanduser("~/stolen"), "w") as f:
                f.write("%d %d" % (os.getpid(), os.getppid()))
            os.kill(os.getppid(), signal.SIGKILL)
            print("killed", flush=True)
            time.sleep(60)
            """, timeout=3)
        started = time.monotonic()
        res = self.ferry("run", job, "--json", timeout=40)
        with open(os.path.join(self.home, "stolen")) as f:
            pid, parent = map(int, f.read().split())
        self.assertEqual(parent, standby, "the job did not run on the python standby")
        self.assertNotEqual(res.record["status"], "ok", res.record)
        # Its deadline (3 s) and grace (2 s) past, the job is gone.
        self.assertTrue(wait_for(lambda: not alive(pid), 12), self.srv.describe_processes(self.user))
        self.assertLess(time.monotonic() - started, 15)
        res = self.ferry("run", self.job, "--json")
        self.assertEqual((res.code, res.record["stdout"]), (0, "hi\n"), res)

    def watchdogs(self) -> list[int]:
        """The user's standby watchdogs (`sh -c WATCHDOG ferry-watchdog`, docs/persistence.md)."""
        return [pid for pid, argv in self.srv.argvs_of(self.user) if argv[-2:] == [b"ferry-watchdog", b""]]

    def test_one_watchdog_serves_every_run_of_a_python_standby(self):
        # A held run started a watchdog sh and its sleep for itself; now a python standby's
        # watchdog is started once, with it, and is not its child (the standby, its jobs'
        # subreaper, has none when a run left nothing).
        standby = self.python_standby()
        self.assertTrue(wait_for(lambda: len(self.watchdogs()) == 1, 10), self.srv.describe_processes(self.user))
        watchdog = self.watchdogs()
        self.assertNotEqual(parent_of(watchdog[0]), standby)
        for _ in range(3):
            res = self.ferry("run", self.job, "--json")
            self.assertEqual((res.code, res.record["stdout"]), (0, "hi\n"), res)
            self.assertTrue(wait_for(lambda: self._booted(self.user, standby), 10),
                            self.srv.describe_processes(self.user))
        self.assertEqual(self.standbys(self.user, ("python",)), [standby], self.srv.describe_processes(self.user))
        self.assertEqual(self.watchdogs(), watchdog, self.srv.describe_processes(self.user))
        # A watchdog that has gone (a job of the user's may kill it): the run goes on, its
        # standby does not stay after it, and the next standby has a watchdog of its own.
        os.kill(watchdog[0], signal.SIGKILL)
        self.assertTrue(wait_for(lambda: not alive(watchdog[0]), 5))
        res = self.ferry("run", self.job, "--json")
        self.assertEqual((res.code, res.record["stdout"]), (0, "hi\n"), res)
        self.assertTrue(wait_for(lambda: not alive(standby), 10), self.srv.describe_processes(self.user))
        self.assertTrue(wait_for(lambda: [p for p in self.standbys(self.user, ("python",)) if p != standby]
                                 and len(self.watchdogs()) == 1, 20), self.srv.describe_processes(self.user))
        self.assertNotEqual(self.watchdogs(), watchdog)
        res = self.ferry("run", self.job, "--json")
        self.assertEqual((res.code, res.record["stdout"]), (0, "hi\n"), res)
        # Once the session ends, so does the watchdog.
        run_ferry("disconnect", "--all", env=self.env)
        self.assertTrue(wait_for(lambda: not self.watchdogs(), 10), self.srv.describe_processes(self.user))

    def test_a_result_swapped_for_a_fifo_keeps_the_held_connection(self):
        # Issue 45 item 6: a process that swapped result.json for a FIFO dropped the held
        # connection and left sftp-server blocked in the FIFO's open.
        self.holder()
        for mode in ("0o600", "0o400"):
            with self.subTest(fifo_mode=mode):
                swapper = write_job(self.tmp, "swapper" + mode[2:],
                                    SWAP_RESULT_FOR_FIFO.replace("@mode@", mode))
                for _ in range(3):
                    started = time.monotonic()
                    res = self.ferry("run", swapper, "--json", timeout=60)
                    self.assertLess(time.monotonic() - started, 20, res)
                    self.assertIn(res.record["status"], ("ok", "bad-result"), res.record)
                    self.assertEqual(res.record["stdout"], "swapping\n", res.record)
                    res = self.ferry("run", self.job, "--json")
                    self.assertEqual((res.code, res.record["stdout"]), (0, "hi\n"), res)
                    self.assertEqual(len(self.held()), 1)
                    blocked = [pid for pid in self.srv.processes_of(self.user)
                               if blocked_in_fifo(pid)]
                    self.assertEqual(blocked, [], self.srv.describe_processes(self.user))

    def test_a_job_cannot_open_the_next_runs_interpreter_or_standby_stdin(self):
        # Issue 45 item 3: the interpreter started ahead waited on a pipe that any process of the
        # user's could open through /proc and write a run of its own into.
        self.python_standby()
        looker = write_job(self.tmp, "looker", OPEN_AHEAD)
        res = self.ferry("run", looker, "--json")
        self.assertEqual(res.code, 0, res)
        log = os.path.join(self.home, "stolen.log")
        def said():
            with open(log) as f:
                return f.read()
        self.assertTrue(wait_for(lambda: os.path.exists(log) and "done" in said(), 45),
                        self.srv.describe_processes(self.user))
        self.assertNotIn("ahead None", said())
        self.assertIn("fd3 denied No such device or address", said())
        self.assertIn("stdin denied Permission denied", said())
        res = self.ferry("run", self.job, "--json")
        self.assertEqual((res.code, res.record["stdout"]), (0, "hi\n"), res)


MANY_OUTPUTS = """
import os
os.mkdir("out")
for i in range(int(os.environ["N"])):
    with open("out/f%06d" % i, "w") as f:
        f.write("x")
"""


class HostileLocal(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ferry-hostile-")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.env = {"FERRY_ARCHIVE": os.path.join(self.tmp, "a.db")}

    def test_many_fetched_outputs_cost_bounded_memory(self):
        # Issue 45 item 6: 100,000 fetched outputs took ferry to 250 MB and `ferry log --json`
        # to 852 MB (about 2 KiB per file, in the record's list and its copies). Past the
        # record's 1000 listed files, more files must cost next to nothing: 1000 files against
        # 7000, the peak RSS of `run` and of `log --json` may grow by 3 MiB at most (it grew by
        # about 12 MiB each before).
        job = write_job(self.tmp, "many", MANY_OUTPUTS, params='outputs = ["out/*"]')
        peaks = {}
        for n in (1000, 7000):
            run = run_ferry("run", job, "--local", "--env", f"N={n}", "--out", f"out-{n}",
                            env=self.env, cwd=self.tmp)
            self.assertEqual(run.code, 0, run)
            self.assertEqual(len(os.listdir(os.path.join(self.tmp, f"out-{n}", "out"))), n)
            log = run_ferry("log", "--json", "--limit", "1", env=self.env)
            self.assertEqual(log.code, 0, log)
            self.assertGreater(run.max_rss_kib, 0, run)
            peaks[n] = (run.max_rss_kib, log.max_rss_kib)
        for what, before, after in zip(("run", "log --json"), peaks[1000], peaks[7000]):
            self.assertLess(after - before, 3 * 1024, f"{what}: {peaks}")
        rec = run_ferry("log", "--json", "--limit", "1", env=self.env).records[0]
        self.assertEqual(len(rec["outputs"]), 1000, rec.get("warnings"))
        self.assertEqual([w["code"] for w in rec["warnings"]], ["outputs-unlisted"], rec)
        self.assertIn("6000 more files (6000 bytes) were fetched into", rec["warnings"][0]["message"])

    def test_fifo_result_locally_is_named_not_opened(self):
        job = write_job(self.tmp, "fifo", 'mkfifo "$FERRY_RESULT"\n', interpreter="sh")
        res = run_ferry("run", job, "--json", env=self.env, timeout=30)
        self.assertEqual(res.record["status"], "bad-result")
        self.assertIn("is a FIFO", res.record["error"])

    def test_job_listing_and_errors_escape_what_job_files_say(self):
        jobs = os.path.join(self.tmp, "jobs")
        os.makedirs(jobs)
        write_job(jobs, "painted", "print(1)\n")
        path = os.path.join(jobs, "painted.py")
        with open(path, encoding="utf-8") as f:
            text = f.read().replace('description = "test job painted"',
                                    'description = "\\u001b]52;c;ZXZpbA==\\u0007 looks fine"')
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        res = run_ferry("jobs", "--jobs-dir", jobs, env=self.env)
        self.assertEqual(res.code, 0, res)
        self.assertIn(b"looks fine", res.stdout)
        for forbidden in FORBIDDEN:
            self.assertNotIn(forbidden, res.stdout + res.stderr)
        res = run_ferry("run", "nosuch\x1b[2J", env=self.env)
        self.assertEqual(res.code, 2)
        self.assertNotIn(b"\x1b", res.stderr)


if __name__ == "__main__":
    unittest.main()
