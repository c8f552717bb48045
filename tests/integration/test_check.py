"""`ferry check` (issue 14, item 1): the interpreters the jobs on the job path need, each with
its path and version, found as the job would find them; "local" for this machine instead of
SSH and SFTP; exit 1 when one is missing. Locally and through a real sshd."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from ferry_harness import SshTestCase, run_ferry, write_job  # noqa: E402


def python3_version(python3: str) -> str:
    out = subprocess.run([python3, "--version"], capture_output=True, text=True, check=True)
    return (out.stdout or out.stderr).split()[1]


class CheckLocal(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ferry-check-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.jobs = os.path.join(self.tmp, "jobs")
        os.makedirs(self.jobs)
        self.env = {"TMPDIR": self.tmp, "FERRY_ARCHIVE": os.path.join(self.tmp, "archive.db"),
                    "XDG_CONFIG_HOME": os.path.join(self.tmp, "config"), "FERRY_JOBS_PATH": ""}

    def check(self, *args):
        return run_ferry("check", *args, env=self.env, cwd=self.tmp)

    def test_local_reports_interpreters_with_path_and_version_and_no_sftp(self):
        res = self.check()
        self.assertEqual(res.code, 0, res)
        line = res.stdout.decode()
        self.assertRegex(line, r"^local: ok in \d+\.\d\d s — local \(no SSH or SFTP involved\); ")
        self.assertNotIn("SFTP ok", line)
        python3 = shutil.which("python3")
        self.assertIn(f"python3 {python3_version(python3)} ({python3})", line)
        self.assertIn(f"sh ({shutil.which('sh')})", line)
        found = json.loads(self.check("--json").stdout)
        self.assertEqual(found["status"], "ok")
        by_name = {i["interpreter"]: i for i in found["interpreters"]}
        self.assertEqual(set(by_name), {"python3", "sh"})  # what the built-in jobs need
        self.assertEqual(by_name["python3"]["path"], python3)
        self.assertEqual(by_name["python3"]["version"], python3_version(python3))
        self.assertIn("kv_calc", by_name["python3"]["jobs"])
        self.assertEqual(sorted(by_name["sh"]["jobs"]), ["disk_usage", "gpu_probe", "host_facts",
                                                         "kernel_log", "memory_usage", "service_log"])

    def test_the_config_files_env_path_is_where_programs_are_found(self):
        """Issue 42.2: check looks programs up with the environment `run` gives the job."""
        self.assertIsNone(shutil.which("nvidia-smi"), "this test needs a machine without nvidia-smi")
        fake_bin = os.path.join(os.path.dirname(__file__), "..", "jobs", "fake-bin")
        fake_bin = os.path.abspath(fake_bin)
        os.makedirs(os.path.join(self.tmp, "config", "ferry"))
        with open(os.path.join(self.tmp, "config", "ferry", "config.toml"), "w") as f:
            f.write(f'[hosts.local]\nenv.PATH = "{fake_bin}:/usr/bin:/bin"\n')
        res = self.check()
        self.assertEqual(res.code, 0, res)
        self.assertIn(f"nvidia-smi {fake_bin}/nvidia-smi", res.stdout.decode())
        found = json.loads(self.check("--json").stdout)
        self.assertEqual(found["facts"]["tools"]["nvidia-smi"], {"path": f"{fake_bin}/nvidia-smi"})

    def test_a_missing_interpreter_is_named_with_its_jobs_and_exits_1(self):
        write_job(self.jobs, "needs_nothing_real", "x\n", interpreter="ferry-no-such-interpreter")
        write_job(self.jobs, "also_needs_it", "x\n", interpreter="ferry-no-such-interpreter")
        write_job(self.jobs, "perl_job", "print 1;\n", interpreter="/usr/bin/perl")
        res = self.check()
        self.assertEqual(res.code, 1, res)
        line = res.stdout.decode()
        self.assertRegex(line, r"^local: MISSING ferry-no-such-interpreter in ")
        self.assertIn("ferry-no-such-interpreter missing (needed by also_needs_it, needs_nothing_real)", line)
        perl = subprocess.run(["/usr/bin/perl", "-e", "printf '%vd', $^V"], capture_output=True, text=True).stdout
        self.assertIn(f"/usr/bin/perl {perl} (/usr/bin/perl)", line)
        found = json.loads(self.check("--json").stdout)
        self.assertEqual(found["status"], "missing")
        missing = [i for i in found["interpreters"] if not i["found"]]
        self.assertEqual([(i["interpreter"], i["path"]) for i in missing], [("ferry-no-such-interpreter", None)])

    def test_a_job_that_does_not_parse_needs_nothing_and_check_ignores_a_host_facts_on_the_path(self):
        with open(os.path.join(self.jobs, "broken.py"), "w") as f:
            f.write("# /// ferry\n# interpreter = \"ferry-broken-interp\"\n# bogus = 1\n# ///\n")
        write_job(self.jobs, "host_facts", 'print("{}")\n', interpreter="python3")
        res = self.check()
        self.assertEqual(res.code, 0, res)
        self.assertNotIn("ferry-broken-interp", res.stdout.decode())
        self.assertIn("python3", res.stdout.decode())


class CheckOverSsh(SshTestCase):
    def test_interpreters_on_the_host_and_what_was_reached(self):
        jobs = os.path.join(self.tmp, "jobs-ssh")
        os.makedirs(jobs, exist_ok=True)
        write_job(jobs, "needs_missing", "x\n", interpreter="ferry-no-such-interpreter")
        for shell in ("bash", "fish", "tcsh"):
            with self.subTest(shell=shell):
                res = self.ferry("check", shell=shell)
                self.assertEqual(res.code, 0, res)
                line = res.stdout.decode()
                self.assertRegex(line, rf"^{re.escape(self.srv.alias(shell))}: ok in [\d.]+ s — host key SHA256:\S+, "
                                       r"auth ok, SFTP ok; ")
                self.assertRegex(line, r"python3 3\.\d+\.\d+ \(/\S+/python3\)")
                res = self.ferry("--jobs-dir", jobs, "check", "--json", shell=shell)
                self.assertEqual(res.code, 1, res)
                found = json.loads(res.stdout)
                self.assertEqual(found["status"], "missing")
                self.assertEqual([i["jobs"] for i in found["interpreters"] if not i["found"]], [["needs_missing"]])


if __name__ == "__main__":
    unittest.main()
