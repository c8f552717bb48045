"""Faults, hostile results and security properties (issue 6), against a real sshd."""

from __future__ import annotations

import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from ferry_harness import (ECHO_JOB, ECHO_PARAMS, SshTestCase, ferry_bin, memory_env, memory_limit_kib,  # noqa: E402
                           run_ferry, write_job)
from sshd_fixture import USER_SET, start_ssh_agent  # noqa: E402

SHELLS4 = ("bash", "zsh", "fish", "tcsh")


class Faults(SshTestCase):
    def start_ferry(self, *args):
        env = dict(os.environ, **self.env)
        return subprocess.Popen([ferry_bin(), *args, "--ssh-config", self.srv.ssh_config],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)

    def wait_for(self, predicate, timeout=15.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.05)
        return False

    def job_started(self, user):
        return any("sleep 4321" in self.cmdline(pid) for pid in self.srv.processes_of(user))

    @staticmethod
    def cmdline(pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return ""

    def test_interrupt_kills_every_remote_job_and_cleans_up(self):
        job = write_job(self.tmp, "long", "echo started\nsleep 4321\n", interpreter="sh", timeout=600)
        for sig in (signal.SIGINT, signal.SIGTERM):
            with self.subTest(signal=sig.name):
                hosts = ",".join(self.srv.alias(s) for s in SHELLS4)
                proc = self.start_ferry("run", job, "--host", hosts, "--json")
                users = [self.srv.user(s) for s in SHELLS4]
                self.assertTrue(self.wait_for(lambda: all(self.job_started(u) for u in users)),
                                "the jobs never started")
                proc.send_signal(sig)
                out, err = proc.communicate(timeout=30)
                self.assertEqual(proc.returncode, 130, err)
                records = [json.loads(line) for line in out.decode().splitlines()]
                self.assertEqual(sorted(r["status"] for r in records), ["interrupted"] * 4, records)
                for user in users:
                    self.assertEqual(self.srv.wait_no_processes(user, timeout_s=5), [],
                                     self.srv.describe_processes(user))
                    self.assertEqual(self.srv.run_dirs(user), [])
                log = run_ferry("log", "--status", "interrupted", "--json", "--limit", "100", env=self.env)
                self.assertGreaterEqual(len(log.records), 4, log)

    def test_connection_lost_mid_job(self):
        job = write_job(self.tmp, "sleepy", "echo started\nsleep 4321\n", interpreter="sh", timeout=4)
        user = self.srv.user("bash")
        proc = self.start_ferry("run", job, "--host", self.srv.alias("bash"), "--json", "--connect-timeout", "3")
        self.assertTrue(self.wait_for(lambda: self.job_started(user)), "the job never started")
        started = time.monotonic()
        self.srv.kill_connections(user)
        out, err = proc.communicate(timeout=30)
        self.assertLess(time.monotonic() - started, 3 + 5, "ferry did not notice the lost connection")
        self.assertEqual(proc.returncode, 1, err)
        rec = json.loads(out)
        self.assertEqual(rec["status"], "error")
        self.assertIn("connection lost", rec["error"])
        # The launcher's own deadline (4 s) ends the job on the host, with nobody connected.
        time.sleep(4 + 2 + 1)
        self.assertFalse(self.job_started(user), self.srv.describe_processes(user))
        # The launcher then finds nobody reading and removes its run dir; the other tests must
        # not inherit one if that cleanup is late, so wait for it, then clear what is left.
        self.wait_for(lambda: not self.srv.run_dirs(user), timeout=10)
        for leftover in self.srv.run_dirs(user):
            shutil.rmtree(leftover, ignore_errors=True)

    def test_connection_lost_while_staging_says_so(self):
        # Issue 45 item 8: the host's sshd killed while a file is being sent was reported by the
        # server's last SFTP status ("failure (a full disk or quota also shows this way)") or
        # libssh's raw "Socket error: disconnected".
        big = os.path.join(self.tmp, "big.bin")
        with open(big, "wb") as f:
            f.truncate(200 * 1024 * 1024)
        job = write_job(self.tmp, "staged", "echo never\n", interpreter="sh", timeout=10)
        user = self.srv.user("bash")
        proc = self.start_ferry("run", job, "--host", self.srv.alias("bash"), "--file", big,
                                "--json", "--connect-timeout", "3")
        self.assertTrue(self.wait_for(lambda: self.srv.run_dirs(user), timeout=30),
                        "no run directory was made")
        self.srv.kill_connections(user)
        out, err = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 1, err)
        rec = json.loads(out)
        self.assertEqual(rec["status"], "error", rec)
        self.assertIn("connection lost", rec["error"])
        self.assertNotIn("disk", rec["error"])
        for leftover in self.srv.run_dirs(user):
            shutil.rmtree(leftover, ignore_errors=True)

    def test_params_never_appear_in_a_remote_command_line(self):
        secret = "s3cr3t-" + os.urandom(6).hex()
        job = write_job(self.tmp, "peek", '''
            import json, os
            cmds = []
            for pid in os.listdir("/proc"):
                try:
                    if os.stat(f"/proc/{pid}").st_uid != os.getuid():
                        continue  # the remote user's processes only (ferry's own runs here too)
                    cmds.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode())
                except OSError:
                    pass
            json.dump(cmds, open(os.environ["FERRY_RESULT"], "w"))
            ''', params='[params.token]\ntype = "string"\n')
        for shell in SHELLS4 + ("dash",):
            with self.subTest(shell=shell):
                rec = self.ferry("run", job, "-p", f"token={secret}", "--json", shell=shell).record
                self.assertEqual(rec["status"], "ok", rec)
                mine = [c for c in rec["result"] if "ferry-" in c]
                self.assertTrue(any(c.strip().endswith("/launch.sh") and c.startswith("/bin/sh ") for c in mine), mine)
                self.assertFalse([c for c in rec["result"] if secret in c])

    def test_unsafe_remote_base_is_refused(self):
        user = self.srv.user("bash")
        home = self.srv.home(user)
        uid = int(subprocess.check_output(["id", "-u", user]))
        echo = write_job(self.tmp, "echo_base", ECHO_JOB, params=ECHO_PARAMS)
        target = os.path.join(home, "elsewhere")
        os.makedirs(target, exist_ok=True)
        os.chown(target, uid, -1)
        link = os.path.join(home, "runs-link")
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(target, link)
        rec = self.ferry("run", echo, "-p", "text=x", "--remote-base", link, "--json").record
        self.assertEqual(rec["status"], "error")
        self.assertIn("symbolic link", rec["error"])
        self.assertEqual(os.listdir(target), [], "ferry wrote through a symlink")
        shared = os.path.join(home, "shared-runs")
        os.makedirs(shared, exist_ok=True)
        os.chown(shared, uid, -1)
        os.chmod(shared, 0o777)
        rec = self.ferry("run", echo, "-p", "text=x", "--remote-base", shared, "--json").record
        self.assertEqual(rec["status"], "error")
        self.assertIn("writable by group or others", rec["error"])
        self.assertEqual(os.listdir(shared), [])
        foreign = "/var/lib/ferry-test/foreign-runs"
        os.makedirs(foreign, exist_ok=True)
        os.chmod(foreign, 0o755)
        rec = self.ferry("run", echo, "-p", "text=x", "--remote-base", foreign, "--json").record
        self.assertEqual(rec["status"], "error")
        self.assertIn(foreign, rec["error"])

    def test_full_disk_during_upload(self):
        base = f"/var/lib/ferry-test/tiny{USER_SET}"  # one per user set: the sets' tests run at once
        os.makedirs(base, exist_ok=True)
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", base],
                                 capture_output=True, text=True)
        self.assertEqual(mounted.returncode, 0, f"cannot mount a tmpfs for the test: {mounted.stderr}")
        try:
            user = self.srv.user("bash")
            os.chown(base, int(subprocess.check_output(["id", "-u", user])), -1)
            marker = os.path.join(self.tmp, "ran")
            big = write_job(self.tmp, "big", f"open({marker!r}, 'w').write('ran')\n" + "#" * 200_000 + "\n")
            rec = self.ferry("run", big, "--remote-base", base, "--json").record
            self.assertEqual(rec["status"], "error")
            self.assertRegex(rec["error"], "cannot (write|finish writing|create)")
            self.assertFalse(os.path.exists(marker), "the job ran after a failed upload")
            self.assertEqual(os.listdir(base), [], "partial files were left behind")
        finally:
            subprocess.run(["umount", base])

    def test_hostile_results_are_bounded(self):
        cases = {
            "huge": ("import os\nwith open(os.environ['FERRY_RESULT'], 'w') as f:\n"
                     "    f.write('[' + '1,' * 10)\n    for _ in range(1024): f.write('1,' * (512 * 1024))\n"
                     "    f.write('1]')\n", "larger than"),
            "invalid_utf8": ("import os\nopen(os.environ['FERRY_RESULT'], 'wb').write(b'{\"a\": \"\\xff\\xfe\"}')\n",
                             "not valid JSON"),
            "deep": ("import os\nopen(os.environ['FERRY_RESULT'], 'w').write('[' * 100000 + ']' * 100000)\n",
                     "nests"),
        }
        small = write_job(self.tmp, "small_result", 'print("[1]")\n')
        limit = memory_limit_kib(256 * 1024, lambda: self.ferry("run", small, "--json", env=memory_env()))
        for name, (body, expect) in cases.items():
            with self.subTest(case=name):
                job = write_job(self.tmp, "hostile_" + name, body, timeout=120)
                res = self.ferry("run", job, "--json", timeout=300, env=memory_env())
                rec = res.record
                self.assertEqual(rec["status"], "bad-result", rec["error"])
                self.assertIn(expect, rec["error"])
                self.assertLess(res.max_rss_kib, limit, f"peak RSS {res.max_rss_kib} KiB")
        self.assertEqual(self.srv.run_dirs(self.srv.user("bash")), [])

    def test_archive_failure_still_prints_the_result(self):
        ro = os.path.join(self.tmp, "ro")
        os.makedirs(ro, exist_ok=True)
        archive = os.path.join(ro, "archive.db")
        job = write_job(self.tmp, "answer", 'print("{\\"answer\\": 42}")\n')
        good = self.ferry("run", job, "--json", env={"FERRY_ARCHIVE": archive}).record
        self.assertEqual(good["status"], "ok")
        os.chmod(archive, 0o400)
        os.chmod(ro, 0o500)
        try:
            # root ignores modes: make it read-only for real with a read-only bind mount.
            subprocess.run(["mount", "--bind", ro, ro], check=True)
            subprocess.run(["mount", "-o", "remount,bind,ro", ro], check=True)
            res = self.ferry("run", job, "--json", env={"FERRY_ARCHIVE": archive})
            self.assertEqual(res.code, 0, res)
            self.assertEqual(res.record["result"], {"answer": 42})
            self.assertIn(archive, res.stderr.decode())
        finally:
            subprocess.run(["umount", ro])
            os.chmod(ro, 0o700)
        log = run_ferry("log", "--json", env={"FERRY_ARCHIVE": archive})
        self.assertEqual([r["run_id"] for r in log.records], [good["run_id"]], "the stored run was lost")

    def test_archive_on_a_full_filesystem(self):
        base = os.path.join(self.tmp, "full")
        os.makedirs(base, exist_ok=True)
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", base],
                                 capture_output=True, text=True)
        self.assertEqual(mounted.returncode, 0, f"cannot mount a tmpfs for the test: {mounted.stderr}")
        try:
            archive = os.path.join(base, "archive.db")
            small = write_job(self.tmp, "answer", 'print("{\\"answer\\": 42}")\n')
            good = self.ferry("run", small, "--json", env={"FERRY_ARCHIVE": archive}).record
            self.assertEqual(good["status"], "ok", good)
            # Fill what is left, then run a job whose output the archive cannot take.
            # Unbuffered: the write that finds the disk full raises here, and nothing is left in
            # a buffer for the close to fail on.
            with open(os.path.join(base, "filler"), "wb", buffering=0) as f:
                with self.assertRaises(OSError):
                    for _ in range(128):
                        f.write(b"\0" * (64 * 1024))
            loud = write_job(self.tmp, "loud", 'import sys\nsys.stderr.write("y" * 300000 + "\\n")\n'
                                               'print("{\\"answer\\": 43}")\n')
            res = self.ferry("run", loud, "--json", env={"FERRY_ARCHIVE": archive})
            self.assertEqual(res.code, 0, res)
            self.assertEqual(res.record["status"], "ok")
            self.assertEqual(res.record["result"], {"answer": 43})
            err = res.stderr.decode()
            self.assertIn(archive, err)
            self.assertRegex(err, "(?i)full|space", err)
            os.unlink(os.path.join(base, "filler"))
            log = run_ferry("log", "--json", env={"FERRY_ARCHIVE": archive})
            self.assertEqual(log.code, 0, log)
            self.assertEqual([r["run_id"] for r in log.records], [good["run_id"]], "the stored run was lost")
            # Space again: the archive takes runs again, nothing was corrupted.
            again = self.ferry("run", small, "--json", env={"FERRY_ARCHIVE": archive}).record
            self.assertEqual(again["status"], "ok")
            log = run_ferry("log", "--json", env={"FERRY_ARCHIVE": archive})
            self.assertEqual(sorted(r["run_id"] for r in log.records), sorted([good["run_id"], again["run_id"]]))
        finally:
            subprocess.run(["umount", base])

    def test_passphrase_and_agent_data_never_logged(self):
        user = self.srv.user("bash")
        passphrase = "ferry-passphrase-" + os.urandom(8).hex()
        key = os.path.join(self.tmp, "agent_key")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", "agent-test", "-f", key],
                       check=True)
        with open(key) as f:
            private_body = [line for line in f.read().splitlines() if not line.startswith("-----")]
        with open(key + ".pub") as f:
            public = f.read()
        fp = subprocess.run(["ssh-keygen", "-l", "-f", key + ".pub"], capture_output=True, text=True,
                            check=True).stdout.split()[1]
        authorized = os.path.join(self.srv.dir, "keys", user)
        with open(authorized) as f:
            saved = f.read()
        agent_dir = tempfile.mkdtemp(prefix="agent-", dir=self.tmp)
        sock = os.path.join(agent_dir, "sock")
        agent = start_ssh_agent(sock)
        try:
            with open(authorized, "a") as f:
                f.write(public)
            askpass = os.path.join(self.tmp, "askpass")
            with open(askpass, "w") as f:
                f.write(f"#!/bin/sh\necho '{passphrase}'\n")
            os.chmod(askpass, 0o700)
            added = subprocess.run(["ssh-add", key], env=dict(os.environ, SSH_AUTH_SOCK=sock, SSH_ASKPASS=askpass,
                                                              SSH_ASKPASS_REQUIRE="force", DISPLAY=":0"),
                                   stdin=subprocess.DEVNULL, capture_output=True, text=True)
            self.assertEqual(added.returncode, 0, added.stderr)
            # No ssh config: libssh offers what the agent holds (root has no keys of its own here).
            empty_config = os.path.join(self.tmp, "empty_ssh_config")
            open(empty_config, "w").close()
            archive = os.path.join(self.tmp, "agent-archive.db")
            job = write_job(self.tmp, "answer", 'print("{\\"answer\\": 42}")\n')
            accepted_before = self.srv.log_text().count(f"Accepted publickey for {user}")
            res = run_ferry("-v", "run", job, "--json", "--host", f"{user}@127.0.0.1:{self.srv.port}",
                            "--ssh-config", empty_config, "--known-hosts", self.srv.known_hosts,
                            env={"FERRY_ARCHIVE": archive, "SSH_AUTH_SOCK": sock})
            self.assertEqual(res.code, 0, res)
            self.assertEqual(res.record["result"], {"answer": 42})
            log = self.srv.log_text()
            self.assertEqual(log.count(f"Accepted publickey for {user}"), accepted_before + 1)
            self.assertIn(fp, log.split(f"Accepted publickey for {user}")[-1].splitlines()[0],
                          "the agent's key was not the one used")
            err = res.stderr.decode()
            self.assertIn("connect", err, "-v printed nothing: the check would be empty")
            shown = run_ferry("show", "last", "--json", env={"FERRY_ARCHIVE": archive})
            self.assertEqual(shown.code, 0, shown)
            with open(archive, "rb") as f:
                archived = f.read()
            places = {"stdout": res.stdout, "stderr": res.stderr, "show": shown.stdout, "archive": archived}
            secrets = {"passphrase": passphrase, **{f"private key line {i}": line
                                                    for i, line in enumerate(private_body) if line}}
            for place, data in places.items():
                for what, secret in secrets.items():
                    self.assertNotIn(secret.encode(), data, f"{what} appears in {place}")
                self.assertNotIn(sock.encode(), data, f"the agent socket appears in {place}")
            # The encrypted key alone (no agent, no prompt): refused with a message, nothing leaked.
            res = run_ferry("-v", "run", job, "--json", "--host", f"{user}@127.0.0.1:{self.srv.port}",
                            "--ssh-config", empty_config, "--known-hosts", self.srv.known_hosts,
                            "--identity", key, env={"FERRY_ARCHIVE": archive, "SSH_AUTH_SOCK": ""})
            self.assertEqual(res.code, 3, res)
            self.assertIn("authentication failed", res.record["error"])
            self.assertIn("ssh-agent", res.record["error"])
            for data in (res.stdout, res.stderr):
                self.assertNotIn(passphrase.encode(), data)
        finally:
            agent.terminate()
            agent.wait(timeout=10)
            with open(authorized, "w") as f:
                f.write(saved)

    def test_connect_timeout_from_ssh_config_unless_given(self):
        import socket
        # A listener that never accepts: TCP connects, the SSH banner never comes.
        mute = socket.socket()
        mute.bind(("127.0.0.1", 0))
        mute.listen(1)
        port = mute.getsockname()[1]
        config = os.path.join(self.tmp, "mute_config")
        with open(config, "w") as f:
            f.write(f"Host mute\n    HostName 127.0.0.1\n    Port {port}\n    ConnectTimeout 1\n")
        job = write_job(self.tmp, "answer", 'print("{\\"answer\\": 42}")\n')
        try:
            for extra, low, high in (([], 0.5, 4.5), (["--connect-timeout", "5"], 4.5, 9.5)):
                with self.subTest(extra=extra):
                    start = time.monotonic()
                    res = run_ferry("run", job, "--json", "--host", "mute", "--ssh-config", config,
                                    "--retries", "0", *extra, env=self.env)
                    took = time.monotonic() - start
                    self.assertEqual(res.code, 3, res)
                    self.assertIn("cannot connect", res.record["error"])
                    self.assertTrue(low <= took <= high, f"gave up after {took:.1f} s, expected {low}-{high} s")
        finally:
            mute.close()


if __name__ == "__main__":
    unittest.main()
