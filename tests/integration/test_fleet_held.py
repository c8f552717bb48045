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

    def fleet_config(self, other: SshServer, alias: str) -> str:
        """One config for the fleet's hosts (self.srv's) and `alias`, other's bash user."""
        cfg = os.path.join(self.tmp, f"ssh_config_{alias}")
        with open(cfg, "w") as f:
            f.write(f"Include {self.srv.ssh_config}\n")
            f.write(f"Host {alias}\n")
            with open(other.ssh_config) as src:
                block = src.read().split(f"Host {other.alias('bash')}\n", 1)[1].split("\nHost ", 1)[0]
            f.write(block + "\n")
        return cfg

    def test_a_host_that_allows_one_channel_inside_a_held_fleet(self):
        with SshServer(extra_config="MaxSessions 1", reset_users=False) as one:
            cfg = self.fleet_config(one, "one-channel")
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

    def test_a_host_whose_key_changes_while_held(self):
        """A host re-keyed while held (its server restarted with a new key on the same address and
        port), then a known_hosts entry changed under a held host: that host is refused (host-key)
        and the others of the same fan-out run on their held sessions, in the same holder."""
        others = ("zsh", "bash", "dash")
        with SshServer(reset_users=False) as rekeyed:
            cfg = self.fleet_config(rekeyed, "rekeyed")
            fleet = [*self.hosts(self.srv, others), "--host", "rekeyed"]

            def run(*hosts):
                return run_ferry("-v", "run", self.job, *hosts, "--ssh-config", cfg, "--json", "-j", "8",
                                 env=self.env, timeout=60)

            def records(res):
                return {r["target"]["host"]: r for r in res.records}

            first = run(*fleet)
            self.assertEqual(first.code, 0, first)
            held = wait_until(lambda: len(self.held()) == 4 and self.held(), 15)
            self.assertTrue(held, f"not every host held: {self.held()}")
            holder = {h["pid"] for h in held}
            self.assertEqual(len(holder), 1, held)
            accepted = {s: self.srv.count_accepted(self.srv.user(s)) for s in others}

            def refused_while_the_others_run_held(res, why):
                self.assertEqual(res.code, 3, res)
                got = records(res)
                self.assertEqual(sorted(got), sorted([*(self.srv.alias(s) for s in others), "rekeyed"]), res)
                bad = got["rekeyed"]
                self.assertEqual((bad["status"], bad.get("failure")), ("error", "host-key"), f"{why}: {bad}")
                self.assertIn(f"rekeyed: host key changed: the server offers {rekeyed.host_key_sha256} but "
                              f"{rekeyed.known_hosts} line 1 records ", bad["error"])
                self.assertIn(f"ssh-keygen -R '[{rekeyed.listen}]:{rekeyed.port}' -f {rekeyed.known_hosts}",
                              bad["error"])
                for s in others:
                    self.assertEqual(got[self.srv.alias(s)]["status"], "ok", f"{why}: {got[self.srv.alias(s)]}")
                # The others' sessions served it (no new login), in the same holder.
                self.assertEqual(res.stderr.count(b"using the connection held by process %d" % min(holder)),
                                 len(others), f"{why}: {res.stderr.decode(errors='replace')}")
                self.assertEqual({s: self.srv.count_accepted(self.srv.user(s)) for s in others}, accepted, why)
                now = self.held()
                self.assertEqual(sorted(h["host"] for h in now), sorted(self.srv.alias(s) for s in others),
                                 f"{why}: {now}")
                self.assertEqual({h["pid"] for h in now}, holder, f"{why}: {now}")
                # A later run of the others: still theirs.
                later = run(*self.hosts(self.srv, others))
                self.assertEqual([r["status"] for r in later.records], ["ok"] * len(others), f"{why}: {later}")
                self.assertEqual(later.stderr.count(b"using the connection held by process %d" % min(holder)),
                                 len(others), f"{why}: {later.stderr.decode(errors='replace')}")

            # (a) The server restarts with a new host key on the same address and port: its held
            # connection drops, the next run connects anew and sees the new key.
            rekeyed.rotate_host_key()
            refused_while_the_others_run_held(run(*fleet), "re-keyed server")

            # (b) Trusted again, held again; then the user's known_hosts entry for it changes.
            rekeyed.refresh_known_hosts()
            again = run(*fleet)
            self.assertEqual([r["status"] for r in again.records], ["ok"] * 4, again)
            self.assertTrue(wait_until(lambda: len(self.held()) == 4, 15), self.held())
            other_key = os.path.join(self.tmp, "other_host_key")
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", other_key], check=True)
            with open(other_key + ".pub") as f:
                keytype, blob = f.read().split()[:2]
            with open(rekeyed.known_hosts, "w") as f:
                f.write(f"[{rekeyed.listen}]:{rekeyed.port} {keytype} {blob}\n")
            refused_while_the_others_run_held(run(*fleet), "known_hosts changed under a held host")


if __name__ == "__main__":
    unittest.main()
