"""A fleet's connects (issue 43 item 2): paced past a daemon's MaxStartups, and every host that
could not be reached given its class of failure, without stopping the others."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from ferry_harness import run_ferry, write_job  # noqa: E402
from sshd_fixture import SshServer, _free_port  # noqa: E402

ADDRESSES = [f"127.4.0.{i}" for i in range(1, 17)]
SHELL = "bash"
# sshd refuses every connection past two unauthenticated ones: 16 hosts behind it at -j 16
# all start their handshakes at once.
SMALL_MAX_STARTUPS = "MaxStartups 2:100:2\n"


class FleetReach(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = SshServer(listen=ADDRESSES[0], also_listen=ADDRESSES[1:],
                            extra_config=SMALL_MAX_STARTUPS).start()
        cls.tmp = tempfile.mkdtemp(prefix="ferry-reach-")
        os.chmod(cls.tmp, 0o755)
        cls.known = os.path.join(cls.tmp, "known_hosts")
        with open(cls.known, "w") as f:
            f.write("".join(cls.srv.known_hosts_line(a) + "\n" for a in ADDRESSES))
        cls.env = {"FERRY_ARCHIVE": os.path.join(cls.tmp, "archive.db"), "SSH_AUTH_SOCK": ""}

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def block(self, alias: str, address: str, port: int | None = None, key: str | None = None,
              known: str | None = None) -> str:
        return (f"Host {alias}\n    HostName {address}\n    Port {port or self.srv.port}\n"
                f"    User {self.srv.user(SHELL)}\n    IdentityFile {key or self.srv.client_key}\n"
                f"    IdentitiesOnly yes\n    UserKnownHostsFile {known or self.known}\n"
                f"    GlobalKnownHostsFile {self.srv.global_known_hosts}\n"
                f"    StrictHostKeyChecking yes\n    BatchMode yes\n")

    def config(self, name: str, blocks: list[str]) -> str:
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write("\n".join(blocks))
        return path

    def drops(self) -> int:
        return len(re.findall(r"drop connection #\d+ .*past MaxStartups", self.srv.log_text()))

    def test_handshakes_past_a_small_max_startups_are_paced_and_retried(self):
        config = self.config("ssh_config_pace", [self.block(f"pace-{i + 1:02}", a) for i, a in enumerate(ADDRESSES)])
        job = write_job(self.tmp, "hello", "print('hello')\n")
        drops_before = self.drops()
        res = run_ferry("run", job, "--host", "pace-[01-16]", "-j", "16", "--ssh-config", config, "--json", "-v",
                        env=self.env, timeout=120)
        self.assertEqual(res.code, 0, res)
        self.assertEqual(sorted(r["target"]["host"] for r in res.records if r["status"] == "ok"),
                         [f"pace-{i:02}" for i in range(1, 17)], res)
        # The daemon did refuse handshakes (else this test proves nothing), and ferry said so.
        self.assertGreater(self.drops() - drops_before, 0, self.srv.log_text()[-3000:])
        self.assertRegex(res.stderr.decode(), r"pace-\d\d: the server dropped the connection before its banner "
                                              r"\(sshd MaxStartups\?\); again in \d+\.\d s")

    def test_a_handshake_past_the_bound_waits_and_v_says_so(self):
        # A server that accepts and never speaks holds each host's handshake slot for the 3 s
        # connect timeout: nine hosts behind it at -j 9 take the process's eight slots and the
        # ninth must wait, unless its thread started 3 s after the others. (The drops of a real
        # sshd, above, free a slot in milliseconds: on a busy machine the hosts' threads may
        # never overlap enough to wait, as a CI run once showed.)
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        hosts = [f"mute-{i}" for i in range(1, 10)]
        config = self.config("ssh_config_mute", [self.block(h, "127.0.0.1", port=silent.getsockname()[1])
                                                 for h in hosts])
        try:
            res = run_ferry("run", "host_facts", "--host", "mute-[1-9]", "-j", "9", "--connect-timeout", "3",
                            "--retries", "0", "--ssh-config", config, "--json", "-v", env=self.env, timeout=60)
        finally:
            silent.close()
        self.assertEqual(res.code, 3, res)
        self.assertEqual({r["target"]["host"]: r.get("failure") for r in res.records},
                         {h: "timeout" for h in hosts}, res)
        self.assertRegex(res.stderr.decode(), r"mute-\d: pacing: waits, 8 handshakes in flight")

    def test_each_host_that_was_not_reached_gets_its_class(self):
        nobody = _free_port("127.0.0.1")  # outside the ephemeral range: no bind(0) takes it
        silent = socket.socket()  # accepts (the kernel does) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        stranger = os.path.join(self.tmp, "stranger")
        if not os.path.exists(stranger):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", stranger], check=True)
        empty_known = os.path.join(self.tmp, "known_hosts_empty")
        open(empty_known, "w").close()
        config = self.config("ssh_config_reach", [
            self.block("good", ADDRESSES[0]),
            self.block("down", "127.0.0.1", port=nobody),
            self.block("wrongkey", ADDRESSES[1], key=stranger),
            self.block("newkey", ADDRESSES[2], known=empty_known),
            self.block("blackhole", "127.0.0.1", port=silent.getsockname()[1]),
        ])
        hosts = "good,down,wrongkey,newkey,blackhole"
        try:
            res = run_ferry("run", "host_facts", "--host", hosts, "-j", "5", "--connect-timeout", "1",
                            "--retries", "0", "--ssh-config", config, "--json", env=self.env, timeout=60)
            human = run_ferry("run", "host_facts", "--host", hosts, "-j", "5", "--connect-timeout", "1",
                              "--retries", "0", "--ssh-config", config, "--no-fold", env=self.env, timeout=60)
        finally:
            silent.close()
        self.assertEqual(res.code, 3, res)
        got = {r["target"]["host"]: (r["status"], r.get("failure")) for r in res.records}
        self.assertEqual(got, {"good": ("ok", None), "down": ("error", "unreachable"),
                               "wrongkey": ("error", "auth"), "newkey": ("error", "host-key"),
                               "blackhole": ("error", "timeout")}, res)
        self.assertEqual(human.code, 3, human)
        self.assertIn("4 failed: 1 unreachable (down), 1 connect timeout (blackhole), 1 host-key (newkey), "
                      "1 auth (wrongkey)", human.stdout.decode(), human)


if __name__ == "__main__":
    unittest.main()
