"""`ferry run` over a real OpenSSH sshd, under every login shell, with internal-sftp and with
the external sftp-server (issue 2). Runs as root (the fixture creates users and starts sshd)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from ferry_harness import (ECHO_JOB, ECHO_PARAMS, HOSTILE, SshTestCase, memory_env, memory_limit_kib,  # noqa: E402
                           run_ferry, write_job)  # noqa: E402

SEED_LINE = "1,216,348 tokens (FP8):"
SEED_EXPR = 'print(f"{1216348:,.0f} tokens (FP8):")'


class SshRunBase(SshTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.echo = write_job(cls.tmp, "echo_params", ECHO_JOB, params=ECHO_PARAMS)

    def assertNoRunDirs(self, shell):
        self.assertEqual(self.srv.run_dirs(self.srv.user(shell)), [],
                         f"run directories left on the host for {shell}")

    def assertRun(self, res, status="ok", code=0):
        rec = res.record
        self.assertEqual(res.code, code, f"status {rec['status']}, error: {rec['error']}\n{res}")
        self.assertEqual(rec["status"], status, f"error: {rec['error']}\n{res}")
        return rec


class InternalSftp(SshRunBase):
    sftp = "internal"

    def test_params_come_back_byte_identical_under_every_shell(self):
        params_file = os.path.join(self.tmp, "hostile.json")
        with open(params_file, "w", encoding="utf-8") as f:
            json.dump({"items": HOSTILE, "blob": {"nested": HOSTILE, "n": [1, 2.5, None, True]}}, f)
        for shell in self.srv.shells:
            for text in HOSTILE:
                with self.subTest(shell=shell, text=text[:40]):
                    res = self.ferry("run", self.echo, "-p", "text=" + text, "--params", params_file,
                                     "--json", shell=shell)
                    rec = self.assertRun(res)
                    got = rec["result"]["params"]
                    self.assertEqual(got["text"], text)
                    self.assertEqual(got["items"], HOSTILE)
                    self.assertEqual(got["blob"]["nested"], HOSTILE)
                    self.assertEqual(got["blob"]["n"], [1, 2.5, None, True])
                    self.assertEqual(rec["result"]["job"], "echo_params")
                    self.assertEqual(rec["result"]["cwd"], rec["result"]["run_dir"])
                    self.assertEqual(rec["result"]["stdin"], "")
                    self.assertEqual(rec["stdout"], "echoed 3 params\n")
                    self.assertEqual(rec["target"]["user"], self.srv.user(shell))
                    self.assertEqual(rec["target"]["port"], self.srv.port)
                    self.assertEqual(rec["target"]["host_key_sha256"], self.srv.host_key_sha256)
            self.assertNoRunDirs(shell)

    def test_a_connection_ends_with_a_disconnect_message(self):
        # As ssh's do: sshd then ends the connection's processes at once ("Received
        # disconnect"), where a connection that only drops ("Connection closed by") makes it
        # take its whole teardown. libssh 0.10 left the message unsent after any write.
        def ends(since):
            # How each connection made since `since` ended, by its client port (None: not yet).
            text = self.srv.log_text()[since:]
            return {port: "disconnect" if f"Received disconnect from 127.0.0.1 port {port}:" in text
                    else "closed" if re.search(rf"Connection closed by .*\bport {port}\b", text)
                    else "reset" if re.search(rf"Connection reset by .*\bport {port}\b", text)
                    else None
                    for port in re.findall(r"Connection from 127\.0\.0\.1 port (\d+) ", text)}
        since = len(self.srv.log_text())
        rec = self.assertRun(self.ferry("run", self.echo, "-p", "text=x", "--persist", "0", "--json"))
        self.assertEqual(rec["stdout"], "echoed 3 params\n")
        deadline = time.monotonic() + 15
        while None in ends(since).values() and time.monotonic() < deadline:
            time.sleep(0.1)
        ended = ends(since)
        self.assertEqual(list(ended.values()), ["disconnect"], self.srv.log_text()[since:])

    def test_list_parameter_elements_survive_commas_only_as_separators(self):
        res = self.ferry("run", self.echo, "-p", "text=x", "-p", "items=$(id),`id`,*,;", "--json")
        rec = self.assertRun(res)
        self.assertEqual(rec["result"]["params"]["items"], ["$(id)", "`id`", "*", ";"])

    def test_seed_trap_reproduced_with_plain_ssh_and_beaten_by_ferry(self):
        job = write_job(self.tmp, "seed", SEED_EXPR + "\n")
        for shell in self.srv.shells:
            with self.subTest(shell=shell):
                # What people paste today: the remote login shell re-parses the command.
                naive = subprocess.run(["ssh", "-F", self.srv.ssh_config, self.srv.alias(shell),
                                        "python3", "-c", SEED_EXPR],
                                       capture_output=True, text=True, timeout=30)
                self.assertNotIn(SEED_LINE, naive.stdout,
                                 f"the naive ssh one-liner unexpectedly worked under {shell}")
                res = self.ferry("run", job, "--json", shell=shell)
                rec = self.assertRun(res)
                self.assertEqual(rec["stdout"], SEED_LINE + "\n")
                self.assertIsNone(rec["result"])  # no result file, stdout is not JSON

    def test_human_output_is_the_jobs_stdout_then_a_summary_line(self):
        job = write_job(self.tmp, "seed_human", SEED_EXPR + "\n")
        res = self.ferry("run", job, "--no-archive", shell="zsh")
        self.assertEqual(res.code, 0, res)
        lines = res.stdout.decode().splitlines()
        self.assertEqual(lines[0], SEED_LINE)
        self.assertRegex(lines[1], rf"^seed_human @ {self.srv.alias('zsh')}: ok in [0-9.]+ s$")

    def test_run_dir_is_private_while_the_job_runs(self):
        job = write_job(self.tmp, "modes", '''
            import json, os, stat, sys
            d = os.environ["FERRY_RUN_DIR"]
            modes = {name: stat.S_IMODE(os.lstat(os.path.join(d, name)).st_mode) for name in os.listdir(d)}
            job = sys.argv[0]  # the path the launcher gave python
            json.dump({"dir": stat.S_IMODE(os.stat(d).st_mode), "files": modes,
                       "job_target": stat.S_IMODE(os.stat(job).st_mode),
                       "base": stat.S_IMODE(os.stat(os.path.dirname(d)).st_mode),
                       "name": os.path.basename(d)}, open(os.environ["FERRY_RESULT"], "w"))
            ''')
        for shell in self.srv.shells:
            with self.subTest(shell=shell):
                rec = self.assertRun(self.ferry("run", job, "--json", shell=shell))
                result = rec["result"]
                self.assertEqual(result["dir"], 0o700)
                self.assertEqual(result["base"], 0o700)
                # What ferry uploaded, and the launcher's state ("PID +SECONDS") for the sweep.
                self.assertEqual(sorted(result["files"]),
                                 [".ferry-launcher", "launch.sh", "modes.py", "params.json"])
                # The job is a link to its entry in the job cache (read-only, in the 0700 base).
                job_link = result["files"].pop("modes.py")
                self.assertEqual(job_link, 0o777, "the job file is not a link")
                self.assertEqual(result["job_target"], 0o400)
                self.assertTrue(all(m == 0o600 for m in result["files"].values()), result["files"])
                # ferry-<UTC time>-<128-bit random hex>
                self.assertRegex(result["name"], r"^ferry-\d{8}T\d{6}Z-[0-9a-f]{32}$")
                self.assertNoRunDirs(shell)

    def test_keep_remote_keeps_the_run_dir_and_says_where(self):
        res = self.ferry("run", self.echo, "-p", "text=x", "--keep-remote", "--json")
        rec = self.assertRun(res)
        kept = [w["message"] for w in rec.get("warnings", []) if w["code"] == "kept-remote"]
        self.assertEqual(len(kept), 1, rec)
        dirs = self.srv.run_dirs(self.srv.user("bash"))
        self.assertEqual(len(dirs), 1)
        self.assertIn(dirs[0], kept[0])
        shutil.rmtree(dirs[0])

    def test_timeout_kills_the_whole_process_group(self):
        job = write_job(self.tmp, "stubborn", '''
            import os, signal, subprocess, time
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            child = subprocess.Popen(["sleep", "1000"])
            print("started", child.pid, flush=True)
            time.sleep(1000)
            ''')
        for shell in ("zsh", "fish"):
            with self.subTest(shell=shell):
                start = time.monotonic()
                res = self.ferry("run", job, "--timeout", "2", "--json", shell=shell)
                elapsed = time.monotonic() - start
                rec = self.assertRun(res, status="timeout", code=1)
                self.assertEqual(rec["exit_code"], 124)
                self.assertIn("2 s timeout", rec["error"])
                self.assertIn("started", rec["stdout"])
                self.assertLess(elapsed, 12, "the timeout took far longer than timeout + grace")
                left = self.srv.wait_no_processes(self.srv.user(shell), timeout_s=5)
                self.assertEqual(left, [], self.srv.describe_processes(self.srv.user(shell)))
                self.assertNoRunDirs(shell)

    def test_missing_interpreter_is_named(self):
        job = write_job(self.tmp, "nopython", "print(1)\n", interpreter="python9")
        for shell in ("tcsh", "dash"):
            with self.subTest(shell=shell):
                rec = self.assertRun(self.ferry("run", job, "--json", shell=shell), status="failed", code=1)
                self.assertIn("python9", rec["error"])
                self.assertIn("not found", rec["error"])
                self.assertNoRunDirs(shell)

    def test_result_file_missing_invalid_or_stdout_json(self):
        cases = {
            "no_result": ("print('just text')\n", "no-result", None),
            "no_result_optional": ("print('just text')\n", "ok", None),
            "bad_result": ("open(__import__('os').environ['FERRY_RESULT'], 'w').write('{not json')\n",
                           "bad-result", None),
            "stdout_json": ("print('  {\"a\": [1, 2], \"b\": \"\\u65e5\"}  ')\n", "ok", {"a": [1, 2], "b": "日"}),
            "stdout_two_docs": ("print('{}'); print('{}')\n", "no-result", None),
        }
        for name, (body, status, result) in cases.items():
            with self.subTest(case=name):
                job = write_job(self.tmp, name, body,
                                result="optional" if name.endswith("optional") else "required")
                res = self.ferry("run", job, "--json")
                rec = self.assertRun(res, status=status, code=0 if status == "ok" else 1)
                self.assertEqual(rec["result"], result)
                if status == "bad-result":
                    self.assertIn("not valid JSON", rec["error"])
                if status == "no-result":
                    self.assertIn("the job wrote no result", rec["error"])
                    self.assertIn("result.json", rec["error"])
        self.assertNoRunDirs("bash")

    def test_huge_output_is_capped_with_bounded_memory(self):
        def flood(size):
            return write_job(self.tmp, f"flood{size}", f'''
                (yes 'out out out out out out out' | head -c {size}) &
                (yes 'err err err err err err err' | head -c {size} >&2) &
                wait
                echo '{{"done": true}}' > "$FERRY_RESULT"
                ''', interpreter="sh", timeout=120)
        limit = memory_limit_kib(64 * 1024, lambda: self.ferry("run", flood(1000000), "--json", env=memory_env()))
        res = self.ferry("run", flood(200000000), "--json", timeout=180, env=memory_env())
        rec = self.assertRun(res)
        self.assertTrue(rec["stdout_truncated"])
        self.assertTrue(rec["stderr_truncated"])
        self.assertEqual(len(rec["stdout"]), 16 << 20)
        self.assertEqual(len(rec["stderr"]), 16 << 20)
        self.assertEqual(rec["result"], {"done": True})
        self.assertLess(res.max_rss_kib, limit, f"peak RSS {res.max_rss_kib} KiB")
        self.assertNoRunDirs("bash")

    def test_login_shell_noise_does_not_corrupt_the_result(self):
        user = self.srv.user("zsh")
        line = self.srv.set_startup_noise(user, True)
        try:
            res = self.ferry("run", self.echo, "-p", "text={\"x\": 1}", "--json", shell="zsh")
            rec = self.assertRun(res)
            self.assertEqual(rec["result"]["params"]["text"], "{\"x\": 1}")
            self.assertEqual(rec["stdout"], "echoed 3 params\n")
            self.assertNotIn(line, rec["stdout"] + rec["stderr"])
            codes = [w["code"] for w in rec.get("warnings", [])]
            self.assertIn("login-shell-output", codes)
            stdout_json = write_job(self.tmp, "noisy_stdout", "print('{\"a\": 1}')\n")
            rec = self.assertRun(self.ferry("run", stdout_json, "--json", shell="zsh"))
            self.assertEqual(rec["result"], {"a": 1})
        finally:
            self.srv.set_startup_noise(user, False)
        self.assertNoRunDirs("zsh")


class ExternalSftp(SshRunBase):
    sftp = "external"

    def test_params_come_back_byte_identical_under_every_shell(self):
        for shell in self.srv.shells:
            for text in HOSTILE:
                with self.subTest(shell=shell, text=text[:40]):
                    rec = self.assertRun(self.ferry("run", self.echo, "-p", "text=" + text, "--json",
                                                    shell=shell))
                    self.assertEqual(rec["result"]["params"]["text"], text)
            self.assertNoRunDirs(shell)

    def test_seed_trap_beaten(self):
        job = write_job(self.tmp, "seed", SEED_EXPR + "\n")
        for shell in self.srv.shells:
            with self.subTest(shell=shell):
                rec = self.assertRun(self.ferry("run", job, "--json", shell=shell))
                self.assertEqual(rec["stdout"], SEED_LINE + "\n")

    def test_login_shell_noise_is_explained(self):
        user = self.srv.user("zsh")
        self.srv.set_startup_noise(user, True)
        try:
            res = self.ferry("run", self.echo, "-p", "text=x", "--json", shell="zsh")
            rec = self.assertRun(res, status="error", code=1)
            self.assertIn("prints text when it starts", rec["error"])
            self.assertIn("internal-sftp", rec["error"])
            self.assertIn(".zshenv", rec["error"])
        finally:
            self.srv.set_startup_noise(user, False)
        self.assertNoRunDirs("zsh")

    def test_timeout_leaves_nothing(self):
        job = write_job(self.tmp, "sleeper", "trap '' TERM\nsleep 1000 &\nsleep 1000\n", interpreter="sh")
        rec = self.assertRun(self.ferry("run", job, "--timeout", "1", "--json", shell="tcsh"),
                             status="timeout", code=1)
        self.assertEqual(rec["exit_code"], 124)
        user = self.srv.user("tcsh")
        self.assertEqual(self.srv.wait_no_processes(user, timeout_s=5), [], self.srv.describe_processes(user))
        self.assertNoRunDirs("tcsh")


class HostKeys(SshRunBase):
    def known_hosts(self, content=""):
        path = os.path.join(self.tmp, f"known_hosts-{time.monotonic_ns()}")
        with open(path, "w") as f:
            f.write(content)
        return path

    def test_unknown_key_refused_and_nothing_uploaded(self):
        shutil.rmtree(os.path.join(self.srv.home(self.srv.user("bash")), ".cache"), ignore_errors=True)
        empty = self.known_hosts()
        res = self.ferry("run", self.echo, "-p", "text=x", "--known-hosts", empty, "--json")
        rec = self.assertRun(res, status="error", code=3)
        self.assertIn("host key unknown", rec["error"])
        self.assertIn(self.srv.host_key_sha256, rec["error"])
        self.assertIn("--accept-new-host-key", rec["error"])
        home = self.srv.home(self.srv.user("bash"))
        self.assertFalse(os.path.exists(os.path.join(home, ".cache", "ferry")), "something was uploaded")
        with open(empty) as f:
            self.assertEqual(f.read(), "")

    def test_accept_new_records_the_key(self):
        empty = self.known_hosts()
        rec = self.assertRun(self.ferry("run", self.echo, "-p", "text=x", "--known-hosts", empty,
                                        "--accept-new-host-key", "--json"))
        self.assertEqual(rec["target"]["host_key_sha256"], self.srv.host_key_sha256)
        with open(empty) as f:
            self.assertIn(f"[127.0.0.1]:{self.srv.port}", f.read())
        # Recorded: the next run needs no flag.
        self.assertRun(self.ferry("run", self.echo, "-p", "text=x", "--known-hosts", empty, "--json"))

    def test_changed_key_refused_even_with_accept_new(self):
        with open(self.srv.known_hosts) as f:
            recorded = self.known_hosts(f.read())
        old = self.srv.host_key_sha256
        self.srv.rotate_host_key()
        try:
            for extra in ([], ["--accept-new-host-key"]):
                with self.subTest(extra=extra):
                    res = self.ferry("run", self.echo, "-p", "text=x", "--known-hosts", recorded,
                                     "--json", *extra)
                    rec = self.assertRun(res, status="error", code=3)
                    self.assertIn("host key changed", rec["error"])
                    self.assertIn(old, rec["error"])
                    self.assertIn(self.srv.host_key_sha256, rec["error"])
                    self.assertIn(recorded, rec["error"])
                    self.assertIn("line 1", rec["error"])
            self.assertEqual(self.srv.run_dirs(self.srv.user("bash")), [])
        finally:
            self.srv.refresh_known_hosts()

    # --- known_hosts as OpenSSH reads it: hashed names, @revoked, @cert-authority -------------

    def key_fields(self):
        host, keytype, blob = self.srv.known_hosts_line().split()
        return host, keytype, blob

    def other_key(self):
        path = os.path.join(self.tmp, f"other-{time.monotonic_ns()}")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path], check=True)
        with open(path + ".pub") as f:
            return f.read().split()[:2]

    def hashed(self, content):
        path = self.known_hosts(content)
        subprocess.run(["ssh-keygen", "-q", "-H", "-f", path], check=True, capture_output=True)
        os.unlink(path + ".old")
        with open(path) as f:
            self.assertTrue(f.read().startswith("|1|"), "ssh-keygen -H did not hash the name")
        return path

    def openssh_accepts(self, known_hosts):
        """What OpenSSH's own client decides for the same file: ferry must agree."""
        res = subprocess.run(["ssh", "-F", self.srv.ssh_config, "-o", f"UserKnownHostsFile={known_hosts}",
                              self.srv.alias("bash"), "true"], capture_output=True, text=True, timeout=60)
        return res.returncode == 0

    def test_hashed_known_hosts_accepted_and_changed_key_located(self):
        host, keytype, blob = self.key_fields()
        good = self.hashed(f"{host} {keytype} {blob}\n")
        self.assertTrue(self.openssh_accepts(good))
        rec = self.assertRun(self.ferry("run", self.echo, "-p", "text=x", "--known-hosts", good, "--json"))
        self.assertEqual(rec["result"]["params"]["text"], "x")
        other_type, other_blob = self.other_key()
        bad = self.hashed(f"{host} {other_type} {other_blob}\n")
        self.assertFalse(self.openssh_accepts(bad))
        rec = self.assertRun(self.ferry("run", self.echo, "-p", "text=x", "--known-hosts", bad, "--json",
                                        "--accept-new-host-key"), status="error", code=3)
        self.assertIn("host key changed", rec["error"])
        self.assertIn(f"{bad} line 1", rec["error"])

    def test_revoked_key_refused_whatever_else_the_file_says(self):
        host, keytype, blob = self.key_fields()
        plain = f"{host} {keytype} {blob}\n"
        cases = {
            "revoked then plain": f"@revoked {host} {keytype} {blob}\n{plain}",
            "plain then revoked": f"{plain}@revoked {host} {keytype} {blob}\n",
            "revoked for every host": f"@revoked * {keytype} {blob}\n{plain}",
            "revoked only": f"@revoked {host} {keytype} {blob}\n",
        }
        for name, content in cases.items():
            for extra in ([], ["--accept-new-host-key"]):
                with self.subTest(case=name, extra=extra):
                    path = self.known_hosts(content)
                    self.assertFalse(self.openssh_accepts(path), "OpenSSH accepted it: the case is wrong")
                    rec = self.assertRun(self.ferry("run", self.echo, "-p", "text=x", "--known-hosts", path,
                                                    "--json", *extra), status="error", code=3)
                    self.assertIn("REVOKED", rec["error"])
                    self.assertIn(self.srv.host_key_sha256, rec["error"])
                    self.assertIn(path, rec["error"])
                    with open(path) as f:
                        self.assertEqual(f.read(), content, "known_hosts was changed")
        self.assertEqual(self.srv.run_dirs(self.srv.user("bash")), [], "something ran")

    def test_revoked_line_for_another_host_or_key_does_not_block(self):
        host, keytype, blob = self.key_fields()
        other_type, other_blob = self.other_key()
        content = (f"@revoked {host} {other_type} {other_blob}\n"
                   f"@revoked gpu-elsewhere {keytype} {blob}\n"
                   f"@revoked *,!{host} {keytype} {blob}\n"
                   f"{host} {keytype} {blob}\n")
        path = self.known_hosts(content)
        self.assertTrue(self.openssh_accepts(path))
        self.assertRun(self.ferry("run", self.echo, "-p", "text=x", "--known-hosts", path, "--json"))

    def test_revoked_in_the_global_known_hosts_from_ssh_config(self):
        host, keytype, blob = self.key_fields()
        with open(self.srv.global_known_hosts, "w") as f:
            f.write(f"@revoked * {keytype} {blob}\n")
        try:
            rec = self.assertRun(self.ferry("run", self.echo, "-p", "text=x", "--json"), status="error", code=3)
            self.assertIn("REVOKED", rec["error"])
            self.assertIn(self.srv.global_known_hosts, rec["error"])
        finally:
            open(self.srv.global_known_hosts, "w").close()
        self.assertRun(self.ferry("run", self.echo, "-p", "text=x", "--json"))

    def test_cert_authority_line_does_not_admit_a_plain_key(self):
        host, keytype, blob = self.key_fields()
        ca_type, ca_blob = self.other_key()
        only_ca = self.known_hosts(f"@cert-authority * {ca_type} {ca_blob}\n")
        self.assertFalse(self.openssh_accepts(only_ca))
        rec = self.assertRun(self.ferry("run", self.echo, "-p", "text=x", "--known-hosts", only_ca, "--json"),
                             status="error", code=3)
        self.assertIn("host key unknown", rec["error"])
        self.assertIn(f"{only_ca} line 1 trusts a certificate authority", rec["error"])
        # The CA's own key is not the host's: listing it as @cert-authority is not a "change".
        both = self.known_hosts(f"@cert-authority * {ca_type} {ca_blob}\n{host} {keytype} {blob}\n")
        self.assertTrue(self.openssh_accepts(both))
        self.assertRun(self.ferry("run", self.echo, "-p", "text=x", "--known-hosts", both, "--json"))


if __name__ == "__main__":
    unittest.main()
