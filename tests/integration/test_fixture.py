"""Checks the real-sshd fixture itself with the system OpenSSH client (needs root; see
sshd_fixture.py). Missing prerequisites fail these tests; they never skip."""

import os
import socket
import subprocess
import time
import unittest

from sshd_fixture import SHELLS, SshServer, _free_port, missing_prerequisites, require_root_and_tools

SSH_TIMEOUT_S = 30


def ssh(srv, shell, *remote, **kw):
    return subprocess.run(srv.ssh_command(shell, *remote), capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=SSH_TIMEOUT_S, **kw)


def sftp_batch(srv, shell, batch):
    return subprocess.run(["sftp", "-F", srv.ssh_config, "-b", "-", srv.alias(shell)],
                          input=batch, capture_output=True, text=True, timeout=SSH_TIMEOUT_S)


class Prerequisites(unittest.TestCase):
    def test_this_machine_has_them(self):
        require_root_and_tools()

    def test_missing_ones_are_named_with_the_fix(self):
        missing = missing_prerequisites(euid=1000, which=lambda t: None if t == "fish" else "/usr/bin/" + t,
                                        exists=lambda p: False)
        text = " ".join(missing)
        for needle in ("root", "/usr/sbin/sshd", "sftp-server", "fish (package fish)"):
            self.assertIn(needle, text)
        with self.assertRaises(AssertionError) as cm:
            require_root_and_tools(euid=1000, which=lambda t: "/usr/bin/" + t, exists=lambda p: True)
        self.assertIn("setup.sh", str(cm.exception))
        self.assertIn("root", str(cm.exception))


class FreePorts(unittest.TestCase):
    def test_a_daemon_port_is_free_and_outside_the_ephemeral_range(self):
        # A port inside the ephemeral range can be taken as some outgoing connection's source
        # port before the daemon binds it (slurmctld once died so: 'Address already in use').
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:  # the kernel's, not the fixture's reading
            lo, hi = (int(x) for x in f.read().split())
        for _ in range(50):
            port = _free_port("127.0.0.1")
            self.assertFalse(lo <= port <= hi, f"port {port} is inside the ephemeral range {lo}-{hi}")
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", port))


class _EveryShell:
    sftp = "internal"

    @classmethod
    def setUpClass(cls):
        require_root_and_tools()
        cls.srv = SshServer(sftp=cls.sftp).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def tearDown(self):
        for shell in ("zsh", "bash", "fish", "tcsh"):
            self.srv.set_startup_noise(self.srv.user(shell), False)

    def test_users_have_their_login_shells(self):
        for shell in SHELLS:
            with self.subTest(shell=shell):
                path = SshServer.shell_path(shell)
                self.assertTrue(os.path.isabs(path), path)
                r = ssh(self.srv, shell, "echo $SHELL")
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(r.stdout.strip(), path)

    def test_ssh_and_sftp_work_for_every_user(self):
        for shell in SHELLS:
            with self.subTest(shell=shell):
                user = self.srv.user(shell)
                before = self.srv.count_accepted(user)
                r = ssh(self.srv, shell, "true")
                self.assertEqual((r.returncode, r.stdout), (0, ""), r.stderr)
                r = sftp_batch(self.srv, shell, "pwd\n")
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn(f"Remote working directory: {self.srv.home(user)}", r.stdout)
                self.assertEqual(self.srv.count_accepted(user), before + 2, self.srv.log_text()[-2000:])

    def test_startup_noise_reaches_exec_output(self):
        for shell in ("zsh", "bash", "fish", "tcsh"):
            with self.subTest(shell=shell):
                line = self.srv.set_startup_noise(self.srv.user(shell), True)
                r = ssh(self.srv, shell, "true")
                self.assertEqual((r.returncode, r.stdout), (0, line + "\n"), r.stderr)
                self.srv.set_startup_noise(self.srv.user(shell), False)
                self.assertEqual(ssh(self.srv, shell, "true").stdout, "")
        with self.assertRaises(ValueError):
            self.srv.set_startup_noise(self.srv.user("dash"), True)

    def test_startup_noise_and_sftp(self):
        self.srv.set_startup_noise(self.srv.user("zsh"), True)
        r = sftp_batch(self.srv, "zsh", "pwd\n")
        if self.sftp == "internal":
            self.assertEqual(r.returncode, 0, r.stderr)
        else:  # the external sftp-server is started through the noisy login shell
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertIn("Received message too long", r.stderr)


class InternalSftp(_EveryShell, unittest.TestCase):
    sftp = "internal"


class ExternalSftp(_EveryShell, unittest.TestCase):
    sftp = "external"


class FaultsAndState(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        require_root_and_tools()
        cls.srv = SshServer().start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def test_rotate_host_key_changes_the_fingerprint(self):
        old = self.srv.host_key_sha256
        self.assertRegex(old, r"^SHA256:[A-Za-z0-9+/]{43}$")
        port = self.srv.port
        self.assertEqual(ssh(self.srv, "bash", "true").returncode, 0)
        new = self.srv.rotate_host_key()
        self.assertNotEqual(new, old)
        self.assertEqual((self.srv.host_key_sha256, self.srv.previous_host_key_sha256), (new, old))
        self.assertEqual(self.srv.port, port)
        r = ssh(self.srv, "bash", "true")
        self.assertEqual(r.returncode, 255)
        self.assertIn("REMOTE HOST IDENTIFICATION HAS CHANGED", r.stderr)
        self.srv.refresh_known_hosts()
        self.assertEqual(ssh(self.srv, "bash", "true").returncode, 0)

    def test_kill_connections_and_processes_of(self):
        user = self.srv.user("dash")
        self.assertEqual(self.srv.processes_of(user), [])
        client = subprocess.Popen(self.srv.ssh_command("dash", "sleep 60"), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            self.assertTrue(_eventually(lambda: any("sleep 60" in line for line in
                                                    self.srv.describe_processes(user).splitlines())))
            self.assertTrue(self.srv.processes_of(user))
            killed = self.srv.kill_connections(user)
            self.assertTrue(killed)
            self.assertEqual(client.wait(10), 255)
            # the command outlives its connection: that is what the fault tests look for
            self.assertIn("sleep 60", self.srv.describe_processes(user))
        finally:
            client.kill()
            client.communicate()
            self.srv.kill_user_processes(user)
        self.assertEqual(self.srv.wait_no_processes(user), [], self.srv.describe_processes(user))

    def test_no_processes_left_after_a_plain_session(self):
        user = self.srv.user("tcsh")
        self.assertEqual(ssh(self.srv, "tcsh", "true").returncode, 0)
        self.assertEqual(self.srv.wait_no_processes(user), [], self.srv.describe_processes(user))

    def test_run_dirs(self):
        user = self.srv.user("fish")
        self.assertEqual(self.srv.run_dirs(user), [])
        entry = "ferry-job-" + "0" * 64 + ".py"
        r = ssh(self.srv, "fish", f"mkdir -p .cache/ferry/runs/ferry-x; and touch .cache/ferry/runs/{entry}")
        self.assertEqual(r.returncode, 0, r.stderr)
        # The job cache's files are not run directories: they stay by design.
        self.assertEqual(self.srv.run_dirs(user),
                         [os.path.join(self.srv.home(user), ".cache/ferry/runs/ferry-x")])
        self.assertEqual(list(self.srv.job_cache(user)), [entry])

    def test_two_instances_at_once(self):
        with SshServer(sftp="external", listen="127.0.0.2", reset_users=False) as other:
            self.assertNotEqual(other.host_key_sha256, self.srv.host_key_sha256)
            for srv in (self.srv, other):
                r = ssh(srv, "zsh", "true")
                self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(f"[127.0.0.2]:{other.port} ssh-ed25519 ", _read(other.known_hosts))
            self.assertEqual(other.count_accepted(SshServer.user("zsh")), 1)
            fixture_dir = other.dir
        self.assertFalse(os.path.exists(fixture_dir))

    def test_one_instance_on_several_addresses(self):
        # The benchmark's 256 hosts are 16 daemons on 16 addresses each.
        also = ["127.3.0.2", "127.3.0.3"]
        with SshServer(listen="127.3.0.1", also_listen=also, reset_users=False) as srv:
            for address in ["127.3.0.1", *also]:
                r = subprocess.run(["ssh", "-F", srv.ssh_config, "-o", f"HostName={address}",
                                    "-o", "HostKeyAlias=[127.3.0.1]:%d" % srv.port, srv.alias("dash"), "true"],
                                   capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=SSH_TIMEOUT_S)
                self.assertEqual(r.returncode, 0, f"{address}: {r.stderr}")
            self.assertEqual(srv.known_hosts_line(also[0]).split()[0], f"[{also[0]}]:{srv.port}")
            self.assertEqual(srv.count_accepted(SshServer.user("dash")), 3)
        with self.assertRaises(ValueError):
            SshServer(also_listen=[f"127.3.1.{i}" for i in range(1, 17)])


def _read(path):
    with open(path) as f:
        return f.read()


def _eventually(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


if __name__ == "__main__":
    unittest.main()
