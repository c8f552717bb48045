"""Fleet behaviour (issue 5), not timed: one SSH session per host for several jobs, at most
-j sessions at once, per-host failures isolated, whole output blocks."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from ferry_harness import ferry_bin, run_ferry, run_in_pty, write_job  # noqa: E402
from sshd_fixture import SshServer, _free_port  # noqa: E402

HOSTS = 16
SHELL = "bash"

# A probe whose result differs on the host reached as the zsh user: what a fleet operator sees
# when one GPU node has another driver.
PROBE_JOB = '''
import json, os, time
time.sleep(0.3)
odd = os.environ["USER"].endswith("zsh")
with open(os.environ["FERRY_RESULT"], "w") as f:
    json.dump({"driver": "535.154" if odd else "550.54", "gpus": 8}, f)
'''


def ferry_in_pty(args: list[str], env: dict) -> tuple[int, str]:
    """ferry with stdout and stderr on one pseudo-terminal; everything it showed there."""
    code, shown = run_in_pty([ferry_bin(), *args], {**os.environ, **env})
    return code, shown.decode(errors="replace")


PROGRESS = re.compile(r"\r\x1b\[K|\d+/\d+ done, \d+ failed, \d+ running")


class Fleet(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.servers = []
        try:
            for i in range(HOSTS):
                cls.servers.append(SshServer(listen=f"127.0.0.{i + 2}", reset_users=(i == 0)).start())
        except Exception:
            for srv in cls.servers:
                srv.stop()
            raise
        cls.tmp = tempfile.mkdtemp(prefix="ferry-fleet-")
        os.chmod(cls.tmp, 0o755)
        cls.config = os.path.join(cls.tmp, "ssh_config")
        blocks = []
        for i, srv in enumerate(cls.servers):
            blocks.append(f"Host fleet-{i + 1:02}\n    HostName {srv.listen}\n    Port {srv.port}\n"
                          f"    User {srv.user(SHELL)}\n    IdentityFile {srv.client_key}\n"
                          f"    UserKnownHostsFile {srv.known_hosts}\n")
        with open(cls.config, "w") as f:
            f.write("\n".join(blocks))
        cls.hosts_file = os.path.join(cls.tmp, "hosts")
        with open(cls.hosts_file, "w") as f:
            f.write("# the fleet\n" + "".join(f"fleet-{i + 1:02}  # host {i + 1}\n" for i in range(HOSTS)))
        cls.env = {"FERRY_ARCHIVE": os.path.join(cls.tmp, "archive.db")}

    @classmethod
    def tearDownClass(cls):
        for srv in cls.servers:
            srv.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def ferry(self, *args, **kw):
        return run_ferry(*args, "--ssh-config", self.config, env=self.env, **kw)

    def test_several_jobs_share_one_session(self):
        jobs = [write_job(self.tmp, f"j{i}", f"print('job {i}')\n") for i in range(3)]
        before = self.servers[0].count_accepted()
        res = self.ferry("run", *jobs, "--host", "fleet-01", "--json")
        self.assertEqual(res.code, 0, res)
        self.assertEqual([r["stdout"] for r in res.records], ["job 0\n", "job 1\n", "job 2\n"])
        self.assertEqual(self.servers[0].count_accepted() - before, 1, "three jobs should use one session")
        self.assertEqual(self.servers[0].run_dirs(self.servers[0].user(SHELL)), [])

    def test_parallelism_is_bounded_by_j(self):
        spans = tempfile.mkdtemp(dir=self.tmp)
        os.chmod(spans, 0o1777)
        job = write_job(self.tmp, "span", '''
            import json, os, time
            d = json.load(open(os.environ["FERRY_PARAMS"]))["dir"]
            start = time.time(); time.sleep(0.6); end = time.time()
            with open(os.path.join(d, os.path.basename(os.environ["FERRY_RUN_DIR"])), "w") as f:
                json.dump([start, end], f)
            ''', params='[params.dir]\ntype = "string"\nrequired = true\n')
        res = self.ferry("run", job, "--hosts-file", self.hosts_file, "-j", "4", "-p", f"dir={spans}", "--json",
                         timeout=120)
        self.assertEqual(res.code, 0, res)
        self.assertEqual(len(res.records), HOSTS)
        self.assertEqual({r["status"] for r in res.records}, {"ok"})
        events = []
        for name in os.listdir(spans):
            with open(os.path.join(spans, name)) as f:
                start, end = json.load(f)
            events += [(start, 1), (end, -1)]
        self.assertEqual(len(events), 2 * HOSTS)
        running = peak = 0
        for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
            running += delta
            peak = max(peak, running)
        self.assertLessEqual(peak, 4, "more than -j 4 hosts ran at once")
        self.assertGreaterEqual(peak, 3, "hosts did not run in parallel")

    def test_one_host_down_does_not_stop_the_others(self):
        # A port nobody listens on (refused) and a listener that never speaks SSH (silent).
        refused_port = _free_port("127.0.0.1")  # outside the ephemeral range: no bind(0) takes it
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        hosts = os.path.join(self.tmp, "hosts-down")
        with open(hosts, "w") as f:
            f.write("".join(f"fleet-{i + 1:02}\n" for i in range(HOSTS - 1)))
            f.write(f"127.0.0.1:{refused_port}\n127.0.0.1:{silent.getsockname()[1]}\n")
        try:
            start = time.monotonic()
            res = self.ferry("run", "host_facts", "--hosts-file", hosts, "-j", "16", "--connect-timeout", "2",
                             "--json", timeout=60)
            elapsed = time.monotonic() - start
        finally:
            silent.close()
        self.assertEqual(res.code, 3, res)
        statuses = [r["status"] for r in res.records]
        self.assertEqual(statuses.count("ok"), HOSTS - 1, res)
        self.assertEqual(statuses.count("error"), 2, res)
        errors = " | ".join(r["error"] for r in res.records if r["status"] == "error")
        self.assertIn("cannot connect", errors)
        self.assertLess(elapsed, 2 * 2 + 5, "a dead host held the run past --connect-timeout")

    def test_human_output_blocks_are_whole(self):
        job = write_job(self.tmp, "chatty", '''
            import os, sys, time
            me = os.environ["FERRY_RUN_DIR"][-6:]
            for i in range(200):
                sys.stdout.write(f"{me} line {i:03}\\n")
                if i % 50 == 0:
                    sys.stdout.flush(); time.sleep(0.01)
            ''')
        res = self.ferry("run", job, "--hosts-file", self.hosts_file, "-j", "16", timeout=120)
        self.assertEqual(res.code, 0, res)
        text = res.stdout.decode()
        blocks = re.split(r"^== chatty @ (fleet-\d\d) ==\n", text, flags=re.M)
        self.assertEqual(len(blocks), 1 + 2 * HOSTS, text[:2000])
        hosts_seen = set()
        for host, body in zip(blocks[1::2], blocks[2::2]):
            hosts_seen.add(host)
            lines = body.splitlines()
            me = lines[0].split()[0]
            self.assertEqual(lines[:200], [f"{me} line {i:03}" for i in range(200)])
            self.assertRegex(lines[200], rf"^chatty @ {host}: ok in [0-9.]+ s$")
        self.assertEqual(len(hosts_seen), HOSTS)
        # The summary closes the output, folded (more than 4 hosts): every run ok, without a result.
        self.assertEqual(text.splitlines()[-2:], ["chatty on 16 hosts:", "  fleet-[01-16] (16 hosts): ok — -"])

    def six_hosts(self) -> str:
        """An ssh config naming fold-1..fold-6 on six of the fleet's servers; fold-4 logs in as
        the zsh user, so its probe's result differs."""
        path = os.path.join(self.tmp, "ssh_config_fold")
        blocks = []
        for i, srv in enumerate(self.servers[:6]):
            user = srv.user("zsh" if i == 3 else SHELL)
            blocks.append(f"Host fold-{i + 1}\n    HostName {srv.listen}\n    Port {srv.port}\n"
                          f"    User {user}\n    IdentityFile {srv.client_key}\n"
                          f"    UserKnownHostsFile {srv.known_hosts}\n")
        with open(path, "w") as f:
            f.write("\n".join(blocks))
        return path

    def test_summary_folds_hosts_by_their_result_and_names_what_differs(self):
        config = self.six_hosts()
        job = write_job(self.tmp, "probe", PROBE_JOB, result="required")
        refused = [_free_port("127.0.0.1"), _free_port("127.0.0.1")]
        hosts = ",".join([f"fold-{i}" for i in range(1, 7)] + [f"127.0.0.1:{p}" for p in refused])
        args = ["run", job, "--host", hosts, "--connect-timeout", "5"]
        res = run_ferry(*args, "--ssh-config", config, env=self.env, timeout=120)
        self.assertEqual(res.code, 3, res)
        text = res.stdout.decode()
        summary = text[text.rindex("probe on 8 hosts:"):].splitlines()
        self.assertEqual(summary[1], '  fold-[1-3,5-6] (5 hosts): ok — {"driver":"550.54","gpus":8}', text)
        self.assertEqual(summary[2], '  fold-4: ok — driver "535.154" instead of "550.54"', text)
        # Both refused hosts in one line, their error told once with the host-specific parts generic.
        self.assertRegex(summary[3], r"^  127\.0\.0\.1:\[\d+(,|-)\d+\] \(2 hosts\): error — "
                                     r"\{address\}: cannot connect to \{address\}: ", text)
        # Then the runs that were not ok, by class (issue 43 item 2).
        self.assertRegex(summary[4], r"^2 failed: 2 unreachable \(127\.0\.0\.1:\[\d+(,|-)\d+\]\)$", text)
        self.assertEqual(len(summary), 5, text)
        self.assertNotIn("HOST  JOB", text)
        # --no-fold: one row per host; --json: the records as ever, nothing folded.
        res = run_ferry(*args, "--no-fold", "--ssh-config", config, env=self.env, timeout=120)
        self.assertEqual(res.code, 3, res)
        self.assertIn("\nHOST ", res.stdout.decode(), "--no-fold: the table, one row per run")
        rows = res.stdout.decode().split("\nHOST ")[1].splitlines()[1:]
        self.assertRegex(rows.pop(), r"^2 failed: 2 unreachable ")
        self.assertEqual(sorted(r.split()[0] for r in rows),
                         sorted([f"fold-{i}" for i in range(1, 7)] + [f"127.0.0.1:{p}" for p in refused]))
        self.assertNotIn("hosts):", res.stdout.decode())
        res = run_ferry(*args, "--json", "--ssh-config", config, env=self.env, timeout=120)
        self.assertEqual(len(res.records), 8, res)
        self.assertEqual(sum(r.get("result") == {"driver": "535.154", "gpus": 8} for r in res.records), 1)

    def test_few_hosts_keep_a_row_each_unless_fold_is_asked(self):
        config = self.six_hosts()
        job = write_job(self.tmp, "probe4", PROBE_JOB, result="required")
        args = ["run", job, "--host", "fold-1,fold-2,fold-3,fold-4", "--ssh-config", config]
        res = run_ferry(*args, env=self.env, timeout=120)
        self.assertEqual(res.code, 0, res)
        self.assertIn("\nHOST ", res.stdout.decode())
        res = run_ferry(*args, "--fold", env=self.env, timeout=120)
        self.assertEqual(res.code, 0, res)
        self.assertIn('  fold-4: ok — driver "535.154" instead of "550.54"\n', res.stdout.decode())

    def test_progress_line_on_a_terminal_only(self):
        config = self.six_hosts()
        job = write_job(self.tmp, "probe_p", PROBE_JOB, result="required")
        args = ["run", job, "--host", ",".join(f"fold-{i}" for i in range(1, 7)), "-j", "2",
                "--ssh-config", config]
        # Whole blocks on a terminal: the progress line is drawn and cleared in place on stderr.
        env = {**self.env, "NO_COLOR": "1"}
        code, shown = ferry_in_pty([*args, "--no-stream"], env)
        self.assertEqual(code, 0, shown)
        counts = re.findall(r"(\d+)/6 done, (\d+) failed, (\d+) running", shown)
        self.assertTrue(counts, shown)
        self.assertTrue(all(int(running) <= 2 and failed == "0" for _, failed, running in counts), counts)
        self.assertIn("\r\x1b[K", shown)
        # ... and cleared before anything else is written: every summary line starts a line.
        self.assertRegex(shown, r"(^|\n)probe_p @ fold-1: ok")
        self.assertNotRegex(shown, r"\d running(?!\r\x1b\[K)")
        # Streaming (the default for up to 8 hosts on a terminal) and --json draw none.
        for extra in ([], ["--json"]):
            code, shown = ferry_in_pty([*args, *extra], env)
            self.assertEqual(code, 0, shown)
            self.assertIsNone(PROGRESS.search(shown), (extra, shown))
        # Piped: none either.
        res = run_ferry(*args, "--no-stream", env=self.env, timeout=120)
        self.assertEqual(res.code, 0, res)
        self.assertIsNone(PROGRESS.search(res.stdout.decode() + res.stderr.decode()), res)

    def test_a_hostlist_and_a_group_run_on_the_expanded_hosts(self):
        # Issue 43 item 3: the names come from the test's ssh config only, never a resolver.
        xdg = tempfile.mkdtemp(dir=self.tmp)
        os.makedirs(os.path.join(xdg, "ferry"))
        with open(os.path.join(xdg, "ferry", "config.toml"), "w") as f:
            f.write('[groups]\npair = ["fleet-[04-05]", "fleet-02"]\n')
        env = {**self.env, "XDG_CONFIG_HOME": xdg}
        res = run_ferry("run", "host_facts", "--ssh-config", self.config, "--host", "fleet-[01-03]",
                        "--host", "@pair", "--json", env=env, timeout=60)
        self.assertEqual(res.code, 0, res)
        self.assertEqual(sorted(r["target"]["host"] for r in res.records),
                         ["fleet-01", "fleet-02", "fleet-03", "fleet-04", "fleet-05"])
        self.assertEqual({r["status"] for r in res.records}, {"ok"})
        self.assertIn("fleet-02 is named more than once; it runs once", res.stderr.decode())
        # A bad range or an unknown group: exit 2 before any host is contacted.
        before = [srv.count_accepted() for srv in self.servers]
        for spec, message in [("fleet-[05-01]", "bad host range 'fleet-[05-01]': '05-01' runs backwards"),
                              ("fleet-[a-b]", "bad host range 'fleet-[a-b]': 'a' is not a number"),
                              ("fleet-[01-03", "bad host range 'fleet-[01-03': a '[' is not closed"),
                              ("fleet-01,@gone", "no group @gone; groups are defined in the [groups] "
                                                 f"table of {xdg}/ferry/config.toml (known: @pair)")]:
            res = run_ferry("run", "host_facts", "--ssh-config", self.config, "--host", spec, env=env)
            self.assertEqual(res.code, 2, res)
            self.assertIn(message, res.stderr.decode())
        self.assertEqual([srv.count_accepted() for srv in self.servers], before, "a host was contacted")


if __name__ == "__main__":
    unittest.main()
