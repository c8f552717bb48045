"""A held fleet (issue 43, "Reliability"): one holder serving every host of a fan-out, against
real sshd. The holder killed while every host's job runs: each run ends with a clear status,
nothing is left on the hosts after their deadlines, and the next fan-out works through a new
holder. A host that allows one channel (MaxSessions 1) inside a held fleet: every fan-out ok.
The five test users of one sshd (login shells zsh, fish, tcsh, bash, dash) stand for five hosts."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import unittest

from ferry_harness import ferry_bin, run_ferry, write_job
from sshd_fixture import SshServer, require_root_and_tools
from test_persist import JOB, alive, persistence_env, wait_until

SHELLS = ("zsh", "fish", "tcsh", "bash", "dash")


class HeldFleet(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        require_root_and_tools()
        cls.srv = SshServer().start()
        cls.addClassCleanup(cls.srv.stop)
        cls.tmp = tempfile.mkdtemp(prefix="ferry-held-fleet-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        cls.env = persistence_env(cls.tmp)
        cls.job = write_job(cls.tmp, "hello", JOB)

    def tearDown(self):
        held = self.held()
        run_ferry("disconnect", "--all", env=self.env)
        for pid in {h["pid"] for h in held}:
            if not wait_until(lambda: not alive(pid), 10):
                os.kill(pid, signal.SIGKILL)
        for shell in SHELLS:
            self.srv.wait_no_processes(self.srv.user(shell), timeout_s=5)

    def held(self) -> list:
        res = run_ferry("disconnect", "--list", "--json", env=self.env)
        self.assertEqual(res.code, 0, res)
        return json.loads(res.stdout)

    def hosts(self, srv: SshServer, shells=SHELLS) -> list[str]:
        return [a for s in shells for a in ("--host", srv.alias(s))]

    def test_holder_killed_mid_fan_out(self):
        first = run_ferry("run", self.job, *self.hosts(self.srv), "--ssh-config", self.srv.ssh_config,
                          "--json", env=self.env, timeout=120)
        self.assertEqual(first.code, 0, first)
        held = wait_until(lambda: len(self.held()) == len(SHELLS) and self.held(), 15)
        self.assertTrue(held, f"not every host held: {self.held()}")
        pids = {h["pid"] for h in held}
        self.assertEqual(len(pids), 1, f"one holder for every host: {held}")
        holder = pids.pop()
        sleepy = write_job(self.tmp, "sleepy", "echo started\nsleep 4321\n", interpreter="sh", timeout=4)
        argv = [ferry_bin(), "run", sleepy, *self.hosts(self.srv), "--ssh-config", self.srv.ssh_config,
                "--json", "-j", str(len(SHELLS))]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, **self.env})
        self.addCleanup(lambda: proc.poll() is None and (proc.kill(), proc.wait()))
        users = [self.srv.user(s) for s in SHELLS]
        running = wait_until(lambda: all("sleep 4321" in self.srv.describe_processes(u) for u in users), 20)
        self.assertTrue(running, "not every host's job started: "
                        + "; ".join(self.srv.describe_processes(u) for u in users))
        os.kill(holder, signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 1, err)
        records = [json.loads(line) for line in out.splitlines() if line.strip()]
        self.assertEqual(sorted(r["target"]["host"] for r in records),
                         sorted(self.srv.alias(s) for s in SHELLS), out)
        for r in records:
            self.assertEqual(r["status"], "error", r)
            self.assertIn("connection holder", r["error"], r)
        # Nothing is left on any host once the jobs' own 4 s deadlines have passed.
        for u in users:
            self.assertEqual(self.srv.wait_no_processes(u, timeout_s=4 + 2 + 5), [],
                             self.srv.describe_processes(u))
            self.assertTrue(wait_until(lambda: self.srv.run_dirs(u) == [], 5), self.srv.run_dirs(u))
        # The next fan-out works, through one new holder.
        again = run_ferry("run", self.job, *self.hosts(self.srv), "--ssh-config", self.srv.ssh_config,
                          "--json", env=self.env, timeout=120)
        self.assertEqual(again.code, 0, again)
        self.assertEqual([r["status"] for r in again.records], ["ok"] * len(SHELLS), again)
        now = wait_until(lambda: len(self.held()) == len(SHELLS) and self.held(), 15)
        self.assertTrue(now, f"not every host held again: {self.held()}")
        self.assertEqual({h["pid"] for h in now} - {holder}, {h["pid"] for h in now})
        self.assertEqual(len({h["pid"] for h in now}), 1, now)

    def test_a_host_that_allows_one_channel_inside_a_held_fleet(self):
        with SshServer(extra_config="MaxSessions 1", reset_users=False) as one:
            cfg = os.path.join(self.tmp, "ssh_config")
            # Both servers' aliases in one config: the fleet's hosts and the one-channel host.
            with open(cfg, "w") as f:
                f.write(f"Include {self.srv.ssh_config}\n")
                f.write("Host one-channel\n")
                with open(one.ssh_config) as src:
                    block = src.read().split(f"Host {one.alias('bash')}\n", 1)[1].split("\nHost ", 1)[0]
                f.write(block + "\n")
            hosts = [*self.hosts(self.srv, ("zsh", "bash", "dash")), "--host", "one-channel"]
            sh_job = write_job(self.tmp, "one_sh", 'printf \'{"sh": 1}\\n\'\n', interpreter="sh")
            for i, jobs in enumerate([[self.job], [self.job, sh_job], [sh_job, self.job, self.job]]):
                res = run_ferry("-v", "run", *jobs, *hosts, "--ssh-config", cfg, "--json", "-j", "8",
                                env=self.env, timeout=120)
                self.assertEqual(res.code, 0, f"fan-out {i + 1}: {res}")
                self.assertEqual([r["status"] for r in res.records], ["ok"] * 4 * len(jobs), res)
                if i == 0:
                    self.assertTrue(wait_until(lambda: len(self.held()) == 4, 15), self.held())
                else:
                    self.assertEqual(res.stderr.count(b"using the connection held"), 4, res.stderr)
            run_ferry("disconnect", "--all", env=self.env)
            self.assertEqual(one.run_dirs(self.srv.user("bash")), [])


if __name__ == "__main__":
    unittest.main()
