"""`ferry run --local` and the command line itself (issue 2): the same launcher contract as
over SSH, and validation that refuses bad input before anything runs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from ferry_harness import ECHO_JOB, ECHO_PARAMS, HOSTILE, REPO, run_ferry, write_job  # noqa: E402


def live_processes_with(marker: str) -> list[str]:
    """Processes (not zombies) whose command line contains `marker`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z" and "unittest" not in cmdline:
            found.append(f"{pid} [{state}] {cmdline}")
    return found


class LocalRun(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="ferry-local-")
        cls.env = {"FERRY_ARCHIVE": os.path.join(cls.tmp, "archive.db"), "TMPDIR": cls.tmp}
        cls.echo = write_job(cls.tmp, "echo_params", ECHO_JOB, params=ECHO_PARAMS)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def ferry(self, *args, env=None, **kw):
        return run_ferry(*args, env={**self.env, **(env or {})}, **kw)

    def run_dirs(self):
        return [d for d in os.listdir(self.tmp) if d.startswith("ferry-")]

    def test_params_come_back_byte_identical(self):
        params_file = os.path.join(self.tmp, "hostile.json")
        with open(params_file, "w", encoding="utf-8") as f:
            json.dump({"items": HOSTILE, "blob": HOSTILE}, f)
        for text in HOSTILE:
            with self.subTest(text=text[:40]):
                res = self.ferry("run", self.echo, "--local", "-p", "text=" + text, "--params", params_file, "--json")
                self.assertEqual(res.code, 0, res)
                rec = res.record
                self.assertEqual(rec["status"], "ok")
                self.assertEqual(rec["target"], {"local": True})
                self.assertEqual(rec["result"]["params"], {"text": text, "items": HOSTILE, "blob": HOSTILE})
                self.assertEqual(rec["result"]["stdin"], "")
                self.assertEqual(rec["result"]["cwd"], rec["result"]["run_dir"])
        self.assertEqual(self.run_dirs(), [])

    def test_no_target_means_local(self):
        rec = self.ferry("run", self.echo, "-p", "text=x", "--json").record
        self.assertEqual(rec["target"], {"local": True})

    def test_timeout_kills_the_job_and_its_children(self):
        job = write_job(self.tmp, "stubborn", '''
            import signal, subprocess, time
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            subprocess.Popen(["sleep", "987"])
            print("started", flush=True)
            time.sleep(987)
            ''')
        start = time.monotonic()
        res = self.ferry("run", job, "--timeout", "2", "--json")
        self.assertLess(time.monotonic() - start, 12)
        self.assertEqual(res.code, 1, res)
        rec = res.record
        self.assertEqual(rec["status"], "timeout")
        self.assertEqual(rec["exit_code"], 124)
        self.assertEqual(rec["stdout"], "started\n")
        deadline = time.monotonic() + 5
        while live_processes_with("987") and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertEqual(live_processes_with("987"), [])
        self.assertEqual(self.run_dirs(), [])

    def test_the_watchdogs_sleep_never_outlives_the_run(self):
        # The launcher's watchdog sleeps until the job's deadline and is stopped, with its sleep,
        # once the job ends. A TERM that reaches the sleep's process between its fork and its
        # exec is caught by the shell's handler it still has, and lost (seen once in CI: a
        # `sleep 60` left on the host): so the sleep is killed with KILL. Here a `sleep` first on
        # the PATH that ignores TERM stands for one whose TERM was lost.
        shim = os.path.join(self.tmp, "shim")
        os.makedirs(shim, exist_ok=True)
        with open(os.path.join(shim, "sleep"), "w") as f:
            f.write("#!/bin/sh\ntrap '' TERM\nexec /bin/sleep \"$@\"\n")
        os.chmod(os.path.join(shim, "sleep"), 0o755)
        job = write_job(self.tmp, "quick", "print('done')\n", timeout=57)

        def sleeps():
            found = []
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if f.read() == b"/bin/sleep\x0057\x00":
                            found.append(int(pid))
                except OSError:
                    pass
            return found
        try:
            rec = self.ferry("run", job, "--json",
                             env={"PATH": shim + ":" + os.environ.get("PATH", "/usr/bin:/bin")}).record
            self.assertEqual(rec["status"], "ok", rec)
            deadline = time.monotonic() + 3
            while sleeps() and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertEqual(sleeps(), [], "the watchdog's sleep outlived the run")
        finally:
            for pid in sleeps():
                os.kill(pid, signal.SIGKILL)

    def test_failed_job_reports_status_and_stderr(self):
        job = write_job(self.tmp, "fails", "echo partial; echo 'boom: it broke' >&2; exit 3\n", interpreter="sh")
        res = self.ferry("run", job, "--json")
        self.assertEqual(res.code, 1, res)
        rec = res.record
        self.assertEqual((rec["status"], rec["exit_code"]), ("failed", 3))
        self.assertEqual(rec["stdout"], "partial\n")
        self.assertEqual(rec["stderr"], "boom: it broke\n")
        self.assertIn("boom: it broke", rec["error"])

    def test_human_output(self):
        job = write_job(self.tmp, "hello", 'print(f"{1216348:,.0f} tokens (FP8):")\n')
        res = self.ferry("run", job, "--no-archive")
        self.assertEqual(res.code, 0, res)
        lines = res.stdout.decode().splitlines()
        self.assertEqual(lines[0], "1,216,348 tokens (FP8):")
        self.assertRegex(lines[1], r"^hello @ local: ok in [0-9.]+ s$")

    def test_builtin_jobs_run(self):
        rec = self.ferry("run", "host_facts", "--json").record
        self.assertEqual(rec["status"], "ok", rec)
        self.assertIn("kernel", rec["result"])
        rec = self.ferry("run", "gpu_probe", "--json", env={**self.env, "PATH": "/usr/bin:/bin"}).record
        self.assertEqual(rec["status"], "ok", rec)
        self.assertIsInstance(rec["result"]["gpus"], list)


class CommandLine(unittest.TestCase):
    """Bad input: exit 2 with a message naming the thing, before any host is contacted."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="ferry-cli-")
        cls.env = {"FERRY_ARCHIVE": os.path.join(cls.tmp, "archive.db")}
        cls.echo = write_job(cls.tmp, "echo_params", ECHO_JOB, params=ECHO_PARAMS)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def refused(self, *args, expect):
        # An unroutable TEST-NET host: if ferry tried to connect, it would hang or exit 3.
        res = run_ferry(*args, env=self.env, timeout=20)
        self.assertEqual(res.code, 2, res)
        self.assertIn(expect, res.stderr.decode(), res)
        self.assertEqual(res.stdout, b"")

    def test_validation_happens_before_contact(self):
        host = ["--host", "192.0.2.1", "--connect-timeout", "30"]
        self.refused("run", self.echo, *host, "-p", "items=a", expect="needs parameter 'text'")
        self.refused("run", self.echo, *host, "-p", "text=x", "-p", "nope=1", expect="no parameter 'nope'")
        self.refused("run", self.echo, *host, "-p", "text=x", "-p", "blob={", expect="'blob' expects a JSON value")
        self.refused("run", "no_such_job", *host, expect="no job named 'no_such_job'")
        self.refused("run", self.echo, "--host", "a@b:99999", "-p", "text=x", expect="port must be a number")
        self.refused("run", self.echo, "--host", "x", "--local", "-p", "text=x", expect="exclude each other")
        bad = os.path.join(self.tmp, "bad.json")
        with open(bad, "w") as f:
            f.write("{not json")
        self.refused("run", self.echo, *host, "--params", bad, expect="not valid JSON")

    def test_job_without_block_shows_the_block(self):
        plain = os.path.join(self.tmp, "plain.py")
        with open(plain, "w") as f:
            f.write("print(1)\n")
        self.refused("run", plain, expect="# /// ferry")

    def test_bad_interpreter_refused_at_load(self):
        job = write_job(self.tmp, "badinterp", "print(1)\n", interpreter="python3 -u")
        self.refused("run", job, expect="interpreter must be")

    def test_jobs_lists_builtins_and_shows_parameters(self):
        res = run_ferry("jobs", "--json", env=self.env, cwd=self.tmp)
        self.assertEqual(res.code, 0, res)
        names = {json.loads(l)["name"]: json.loads(l) for l in res.stdout.decode().splitlines()}
        for name in ("kv_calc", "gpu_probe", "host_facts"):
            self.assertEqual(names[name]["source"], "built-in")
        res = run_ferry("jobs", "kv_calc", "--json", env=self.env, cwd=self.tmp)
        info = json.loads(res.stdout)
        params = {p["name"]: p for p in info["params"]}
        self.assertEqual(params["tp"]["type"], "int")
        self.assertEqual(params["kv_dtype"]["items"], "string")
        res = run_ferry("jobs", "kv_calc", env=self.env, cwd=self.tmp)
        self.assertIn("tp (int)", res.stdout.decode())

    def test_new_writes_a_runnable_job_and_never_overwrites(self):
        work = tempfile.mkdtemp(dir=self.tmp)
        for lang in ("python", "sh"):
            name = f"probe_{lang}"
            res = run_ferry("new", name, "--lang", lang, env=self.env, cwd=work)
            self.assertEqual(res.code, 0, res)
            rec = run_ferry("run", name, "--json", env=self.env, cwd=work).record
            self.assertEqual(rec["status"], "ok", rec)
            self.assertEqual(rec["result"]["greeting" if lang == "python" else "params"],
                             "hello" if lang == "python" else {"greeting": "hello"})
            again = run_ferry("new", name, "--lang", lang, env=self.env, cwd=work)
            self.assertEqual(again.code, 2)
            self.assertIn("never overwrites", again.stderr.decode())

    def test_job_path_order(self):
        work = tempfile.mkdtemp(dir=self.tmp)
        first = os.path.join(work, "first")
        os.makedirs(first)
        write_job(first, "host_facts", 'print("{\\"mine\\": true}")\n')
        rec = run_ferry("run", "host_facts", "--jobs-dir", first, "--json", env=self.env, cwd=work).record
        self.assertEqual(rec["result"], {"mine": True})
        rec = run_ferry("run", "host_facts", "--json", env={**self.env, "FERRY_JOBS_PATH": first}, cwd=work).record
        self.assertEqual(rec["result"], {"mine": True})
        rec = run_ferry("run", "host_facts", "--json", env=self.env, cwd=work).record
        self.assertIn("kernel", rec["result"])

    def test_version_and_help(self):
        self.assertEqual(run_ferry("--version").code, 0)
        res = run_ferry("run", "--help")
        self.assertEqual(res.code, 0)
        self.assertIn("Examples:", res.stdout.decode())


if __name__ == "__main__":
    unittest.main()
