"""Reaching hosts, the parts the parity corpus does not compare (issue 12): what -v tells and
never tells (certificates, agents and proxies included), Ctrl-C during a connect, the home
directory every ssh file is under, warnings for what ferry does not honour, and targets that
cannot go wrong silently (empty hosts, repeated hosts)."""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from ferry_harness import ferry_bin, run_ferry, write_job  # noqa: E402
from sshd_fixture import SshServer  # noqa: E402
from test_ssh_parity import KEY_ROOT, Agent  # noqa: E402


class Reach(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        os.makedirs(KEY_ROOT, mode=0o755, exist_ok=True)
        cls.tmp = tempfile.mkdtemp(prefix="reach-", dir=KEY_ROOT)
        os.chmod(cls.tmp, 0o700)
        cls.passphrase = "reach-pass-" + os.urandom(8).hex()
        cls.ca = os.path.join(cls.tmp, "ca")
        cls.locked = os.path.join(cls.tmp, "locked")
        for path, passphrase in ((cls.ca, ""), (cls.locked, cls.passphrase)):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", path], check=True)
        subprocess.run(["ssh-keygen", "-q", "-s", cls.ca, "-I", "reach", "-n", SshServer.user("dash"), "-V", "-5m:+1h",
                        cls.locked + ".pub"], check=True)
        cls.srv = SshServer(extra_config=f"TrustedUserCAKeys {cls.ca}.pub").start()
        cls.srv.set_authorized_keys("dash", [])  # the certificate only
        cls.archive = os.path.join(cls.tmp, "archive.db")
        cls.job = write_job(cls.tmp, "answer", 'print("{\\"answer\\": 42}")\n')

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        subprocess.run(["rm", "-rf", cls.tmp])

    def config(self, text: str) -> str:
        path = os.path.join(self.tmp, f"config-{self.id().rsplit('.', 1)[-1]}")
        with open(path, "w") as f:
            f.write(text)
        return path

    def target_block(self, user="bash", **extra) -> str:
        lines = ["Host target", "    HostName 127.0.0.1", f"    Port {self.srv.port}", f"    User {SshServer.user(user)}",
                 f"    UserKnownHostsFile {self.srv.known_hosts}", "    GlobalKnownHostsFile /dev/null"]
        lines += [f"    {k} {v}" for k, v in extra.items()]
        return "\n".join(lines) + "\n"

    # --- -v: the story, and no secret in it ---------------------------------------------------

    def test_verbose_tells_the_story_and_no_secret(self):
        agent = Agent(self.tmp, "story")
        askpass = os.path.join(self.tmp, "askpass")
        with open(askpass, "w") as f:
            f.write(f"#!/bin/sh\necho '{self.passphrase}'\n")
        os.chmod(askpass, 0o700)
        try:
            agent.add(self.locked, askpass=askpass)  # the key and its certificate, unlocked in the agent
            cfg = self.config(self.target_block(user="dash", IdentityFile=self.locked, IdentitiesOnly="yes",
                                                ProxyJump="bastion")
                              + self.target_block().replace("Host target", "Host bastion")
                              + f"    IdentityFile {self.srv.client_key}\n    IdentitiesOnly yes\n")
            res = run_ferry("-v", "run", self.job, "--json", "--host", "target", "--ssh-config", cfg,
                            env={"FERRY_ARCHIVE": self.archive, "SSH_AUTH_SOCK": agent.sock})
            self.assertEqual(res.code, 0, res)
            self.assertEqual(res.record["result"], {"answer": 42})
            err = res.stderr.decode()
            fp = subprocess.run(["ssh-keygen", "-l", "-f", self.locked + ".pub"], capture_output=True, text=True,
                                check=True).stdout.split()[1]
            for wanted in (f"ferry: target: read ssh config {cfg}",
                           f"ferry: target: applying {cfg} line 1: host target",
                           f"ferry: target: connecting to 127.0.0.1 port {self.srv.port} as {SshServer.user('dash')} through "
                           f"ProxyJump bastion ({cfg} line 9)",
                           f"ferry: target: host key looked up as [127.0.0.1]:{self.srv.port} in {self.srv.known_hosts}",
                           "ferry: target: ssh agent from SSH_AUTH_SOCK",
                           f"ferry: target: will offer {self.locked}-cert.pub ED25519-CERT {fp} (signed by the agent)",
                           f"ferry: target: will offer {self.locked} ED25519 {fp} (signed by the agent)",
                           "ferry: target: the server allows: publickey",
                           f"ferry: target: host key ssh-ed25519 {self.srv.host_key_sha256} found in "
                           f"{self.srv.known_hosts} line 1",
                           f"ferry: target: authenticated as {SshServer.user('dash')} with {self.locked}-cert.pub",
                           "ferry: target: proxy: debug1: "):  # the jump host's ssh -v
                self.assertIn(wanted, err)
            shown = run_ferry("show", "last", "--json", env={"FERRY_ARCHIVE": self.archive})
            with open(self.archive, "rb") as f:
                archived = f.read()
            with open(self.locked) as f:
                private = [line for line in f.read().splitlines() if line and not line.startswith("-----")]
            places = {"stdout": res.stdout, "stderr": res.stderr, "show": shown.stdout, "archive": archived}
            for place, data in places.items():
                self.assertNotIn(self.passphrase.encode(), data, f"the passphrase appears in {place}")
                for i, line in enumerate(private):
                    self.assertNotIn(line.encode(), data, f"private key line {i} appears in {place}")
                self.assertNotIn(agent.sock.encode(), data, f"the agent socket appears in {place}")
        finally:
            agent.stop()

    def test_proxy_stderr_is_shown_bounded_and_safe(self):
        # A proxy that fails with a lot to say, escape sequences included.
        script = os.path.join(self.tmp, "noisy-proxy")
        with open(script, "w") as f:
            f.write("#!/bin/sh\nfor i in $(seq 1 2000); do echo \"line $i of noise\" >&2; done\n"
                    "printf 'bastion says \\033]0;owned\\007 no\\n' >&2\nexit 7\n")
        os.chmod(script, 0o755)
        cfg = self.config(self.target_block(ProxyCommand=f"{script} %h %p"))
        res = run_ferry("check", "--host", "target", "--ssh-config", cfg, "--retries", "0",
                        env={"FERRY_ARCHIVE": self.archive})
        self.assertEqual(res.code, 3, res)
        out = res.stdout + res.stderr
        self.assertIn(b"exit status 7", out)
        self.assertIn(b"bastion says \\x1b]0;owned\\x07 no", out)
        self.assertNotIn(b"\x1b", out)
        self.assertNotIn(b"line 1 of noise", out, "the whole stderr of the proxy was kept")
        self.assertLess(len(out), 16000)

    # --- Ctrl-C --------------------------------------------------------------------------------

    def interrupt_during_connect(self, cfg: str, wait_for):
        proc = subprocess.Popen([ferry_bin(), "run", self.job, "--json", "--host", "target", "--ssh-config", cfg,
                                 "--connect-timeout", "30"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=dict(os.environ, FERRY_ARCHIVE=self.archive))
        deadline = time.monotonic() + 15
        while not wait_for() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertTrue(wait_for(), "ferry never got as far as the connect")
        time.sleep(0.3)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
        self.assertEqual(proc.returncode, 130, err)
        self.assertLess(took, 1.0, f"ferry took {took:.2f} s to stop after Ctrl-C")
        self.assertEqual(json.loads(out)["status"], "interrupted")

    def test_ctrl_c_during_a_connect_ends_it_at_once(self):
        # A listener that takes the connection and never says a word: the SSH banner never comes.
        mute = socket.socket()
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        mute.settimeout(0.01)
        accepted = []

        def connected():
            try:
                accepted.append(mute.accept()[0])
            except OSError:
                pass
            return bool(accepted)

        try:
            cfg = self.config(self.target_block().replace(f"Port {self.srv.port}", f"Port {mute.getsockname()[1]}"))
            self.interrupt_during_connect(cfg, connected)
        finally:
            for conn in accepted:
                conn.close()
            mute.close()

    def test_ctrl_c_while_a_proxy_hangs(self):
        marker = "reach-proxy-" + os.urandom(4).hex()
        cfg = self.config(self.target_block(ProxyCommand=f"python3 -c 'import time; time.sleep(60)' {marker}"))

        def proxy_runs():
            return subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0

        self.interrupt_during_connect(cfg, proxy_runs)
        deadline = time.monotonic() + 5
        while proxy_runs() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(proxy_runs(), "the proxy command outlived ferry")

    # --- one home for every ssh file -----------------------------------------------------------

    def test_every_ssh_file_is_under_the_passwd_home(self):
        home = pwd.getpwuid(os.getuid()).pw_dir
        fake = tempfile.mkdtemp(prefix="fake-home-", dir=self.tmp)
        cfg = self.config(f"Host target\n    HostName 127.0.0.1\n    Port {self.srv.port}\n    User {SshServer.user('bash')}\n")
        res = run_ferry("-v", "check", "--host", "target", "--ssh-config", cfg,
                        env={"FERRY_ARCHIVE": self.archive, "HOME": fake, "SSH_AUTH_SOCK": ""})
        self.assertEqual(res.code, 3, res)
        text = (res.stdout + res.stderr).decode()
        self.assertIn(f"not in {home}/.ssh/known_hosts, {home}/.ssh/known_hosts2", text)
        self.assertNotIn(fake, text)
        ssh = subprocess.run(["ssh", "-v", "-F", cfg, "-o", "BatchMode=yes", "target", "true"], capture_output=True,
                             text=True, env=dict(os.environ, HOME=fake))
        self.assertIn(f"{home}/.ssh/known_hosts", ssh.stderr, "ssh reads another file: the rule is wrong")
        self.assertEqual(os.listdir(fake), [], "something was written under $HOME")

    # --- warnings ------------------------------------------------------------------------------

    def test_what_ferry_does_not_honour_is_named_with_file_and_line(self):
        cfg = self.config(self.target_block(IdentityFile=self.srv.client_key, IdentitiesOnly="yes",
                                            CanonicalizeHostname="yes", KnownHostsCommand="/bin/true %H"))
        res = run_ferry("check", "--host", "target", "--ssh-config", cfg, env={"FERRY_ARCHIVE": self.archive})
        self.assertEqual(res.code, 0, res)
        err = res.stderr.decode()
        self.assertIn(f"ferry: target: warning: {cfg} line 9: canonicalizehostname yes: ferry does not canonicalize",
                      err)
        self.assertIn(f"ferry: target: warning: {cfg} line 10: knownhostscommand", err)

    # --- targets -------------------------------------------------------------------------------

    def test_empty_hosts_are_refused_and_repeats_run_once(self):
        for hosts in ("", " ", "target,,target", "target,"):
            with self.subTest(hosts=hosts):
                res = run_ferry("run", self.job, "--json", "--host", hosts, env={"FERRY_ARCHIVE": self.archive})
                self.assertEqual(res.code, 2, res)
                self.assertIn(b"names an empty host", res.stderr)
                self.assertEqual(res.stdout, b"")
        hosts_file = os.path.join(self.tmp, "hosts")
        with open(hosts_file, "w") as f:
            f.write("# fleet\n\ntarget\ntarget, \n")
        res = run_ferry("run", self.job, "--hosts-file", hosts_file, env={"FERRY_ARCHIVE": self.archive})
        self.assertEqual(res.code, 2, res)
        self.assertIn(f"{hosts_file} line 4 names an empty host".encode(), res.stderr)

        cfg = self.config(self.target_block(IdentityFile=self.srv.client_key, IdentitiesOnly="yes"))
        before = self.srv.count_accepted("bash")
        res = run_ferry("run", self.job, "--json", "--host", "target,target", "--host", "target",
                        "--ssh-config", cfg, env={"FERRY_ARCHIVE": self.archive})
        self.assertEqual(res.code, 0, res)
        self.assertEqual(len(res.records), 1, res)
        self.assertIn(b"ferry: target is named more than once; it runs once", res.stderr)
        self.assertEqual(self.srv.count_accepted("bash"), before + 1)


if __name__ == "__main__":
    unittest.main()
