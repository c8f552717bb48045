"""ferry's Slurm target against a real Slurm 22.05 cluster (slurm_fixture.py): the sshd fixture is
the login node, slurmd n1/n2 share the run base with it, n3 (partition `isolated`) cannot see it.
Needs root; a missing prerequisite fails, never skips. The whole file stays under ~4 minutes: the
one slow case (a Slurm TIMEOUT takes 60-90 s) runs in the background from the start, on n3,
and is checked last."""

import json
import os
import pwd
import re
import shutil
import socket
import signal
import subprocess
import tempfile
import time
import unittest

from ferry_harness import ECHO_JOB, ECHO_PARAMS, HOSTILE, ferry_bin, run_ferry, write_job
from slurm_fixture import ISOLATED_NODE, NODES, ROOT, SlurmCluster, require_prerequisites
from sshd_fixture import SshServer, require_root_and_tools

# A run base outside the sshd fixture's homes, which n3 cannot see: for the TIMEOUT run on n3.
SCRATCH = os.path.join(ROOT, "slurm-scratch")
TIMEOUT_MIN_S, TIMEOUT_MAX_S = 55, 110

NODE_JOB = """
# Which node ran this, and a failure on n2 when asked.
node=$(hostname)
printf '{"node": "%s", "slurm_job": "%s", "cvd": "%s", "slurmd_node": "%s"}\\n' "$node" "$SLURM_JOB_ID" "$CUDA_VISIBLE_DEVICES" "${SLURMD_NODENAME-unset}" >"$FERRY_RESULT"
echo "hello from $node"
if [ "$node" = "n2" ] && grep -q true "$FERRY_PARAMS"; then exit 3; fi
"""

# A sweep point: says which array task ran it; point 3 fails.
POINT_JOB = """
import json, os, sys
with open(os.environ["FERRY_PARAMS"], encoding="utf-8") as f:
    n = json.load(f)["n"]
with open(os.environ["FERRY_RESULT"], "w", encoding="utf-8") as f:
    json.dump({"n": n, "array_job": os.environ.get("SLURM_ARRAY_JOB_ID"),
               "array_task": os.environ.get("SLURM_ARRAY_TASK_ID")}, f)
print("point", n)
sys.exit(5 if n == 3 else 0)
"""

SLEEP_JOB = """
echo started
sleep 300
"""


def wait_for(predicate, timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True


class Background:
    """ferry started with Popen: its stdout and stderr go to files, read while it runs."""

    def __init__(self, args, env):
        self.dir = tempfile.mkdtemp(prefix="ferry-slurm-bg-")
        self.out_path = os.path.join(self.dir, "out")
        self.err_path = os.path.join(self.dir, "err")
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen([ferry_bin(), *args], stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, env={**os.environ, **env})

    def stderr(self) -> str:
        with open(self.err_path, errors="replace") as f:
            return f.read()

    def finish(self, timeout_s: float):
        self.proc.wait(timeout_s)
        with open(self.out_path, "rb") as f:
            out = f.read()
        records = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
        return self.proc.returncode, records, self.stderr()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class SlurmTarget(unittest.TestCase):
    accounting = True

    @classmethod
    def setUpClass(cls):
        require_root_and_tools()
        require_prerequisites(cls.accounting)
        cls.cluster = SlurmCluster(accounting=cls.accounting).start()
        cls.timeout_run = None
        try:
            cls.srv = SshServer().start()
            cls.tmp = tempfile.mkdtemp(prefix="ferry-slurm-it-")
            cls.env = {"FERRY_ARCHIVE": os.path.join(cls.tmp, "archive.db"),
                       "XDG_CONFIG_HOME": os.path.join(cls.tmp, "config")}
            cls.node_job = write_job(cls.tmp, "node_probe", NODE_JOB, interpreter="sh",
                                     params="[params.fail_on_n2]\ntype = \"bool\"\ndefault = false")
            cls.sleep_job = write_job(cls.tmp, "sleeper", SLEEP_JOB, interpreter="sh", timeout=600)
            cls.echo_job = write_job(cls.tmp, "echo", ECHO_JOB, params=ECHO_PARAMS)
            cls._start_timeout_run()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def _start_timeout_run(cls):
        """The Slurm TIMEOUT case: --time 1 on a job that sleeps far longer, on n3 with a run base
        n3 can see, so it overlaps every other test."""
        user = cls.srv.user("bash")
        pw = pwd.getpwnam(user)
        base = os.path.join(SCRATCH, user)
        shutil.rmtree(base, ignore_errors=True)
        os.makedirs(SCRATCH, mode=0o755, exist_ok=True)
        os.mkdir(base, 0o700)
        os.chown(base, pw.pw_uid, pw.pw_gid)
        cls.scratch = base
        cls.timeout_started = time.monotonic()
        cls.timeout_run = Background(
            ["run", cls.sleep_job, "--slurm", cls.srv.alias("bash"), "--ssh-config",
             cls.srv.ssh_config, "--partition", "isolated", "--time", "1", "--remote-base", base,
             "--json"], cls.env)

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "timeout_run", None) is not None:
            cls.timeout_run.kill()
        if getattr(cls, "srv", None) is not None:
            cls.srv.stop()
        cls.cluster.stop()
        shutil.rmtree(getattr(cls, "tmp", ""), ignore_errors=True)
        shutil.rmtree(SCRATCH, ignore_errors=True)

    def setUp(self):
        self.t0 = time.monotonic()

    def tearDown(self):
        keep = tuple(j["id"] for j in self.cluster.queue() if j["partition"] == "isolated"
                     and self.timeout_run is not None and self.timeout_run.proc.poll() is None)
        self.cluster.cancel_all(keep=keep)
        self.cluster.assert_idle(keep=keep)
        for shell in ("bash", "zsh", "fish"):
            self.assertEqual(self.srv.run_dirs(shell), [], f"run directories left for {shell}")

    # --- helpers ------------------------------------------------------------------------------

    def ferry(self, *args, shell="bash", timeout=120):
        return run_ferry(*args, "--slurm", self.srv.alias(shell), "--ssh-config",
                         self.srv.ssh_config, env=self.env, timeout=timeout)

    def background(self, *args, shell="bash"):
        run = Background([*args, "--slurm", self.srv.alias(shell), "--ssh-config",
                          self.srv.ssh_config], self.env)
        self.addCleanup(run.kill)
        return run

    def job_id(self, record) -> str:
        slurm = record["target"]["slurm"]
        self.assertRegex(slurm.get("job_id", ""), r"^\d+$", record)
        return slurm["job_id"]

    # --- the tests ----------------------------------------------------------------------------

    def test_a_job_runs_on_a_node_and_its_record_says_where(self):
        r = self.ferry("run", self.node_job, "--json", "--gres", "gpu:8")
        self.assertEqual(r.code, 0, r)
        rec = r.record
        self.assertEqual(rec["status"], "ok", rec)
        slurm = rec["target"]["slurm"]
        node = rec["result"]["node"]
        self.assertIn(node, NODES)
        self.assertEqual(rec["result"]["slurm_job"], self.job_id(rec))
        self.assertEqual(rec["result"]["cvd"], "0,1,2,3,4,5,6,7")
        # Issue 43 item 6: the job sees the variables slurmd gives it, SLURMD_NODENAME among them.
        self.assertEqual(rec["result"]["slurmd_node"], node, rec["result"])
        self.assertEqual((slurm["node"], slurm["nodes"], slurm["state"], slurm["exit_code"]),
                         (node, node, "COMPLETED", 0), slurm)
        self.assertEqual(slurm["login"], self.srv.alias("bash"))
        self.assertEqual(slurm["options"], {"gres": "gpu:8", "nodes": 1})
        self.assertEqual(slurm["time_limit_min"], 2)  # the job's 60 s timeout, rounded up
        self.assertEqual(slurm["state_source"], "scontrol")
        self.assertEqual(rec["target"]["host"], node)
        self.assertEqual(rec["stdout"], f"hello from {node}\n")
        self.assertNotIn("ferry-", rec["stdout"] + rec["stderr"])
        # The notes on stderr: the id as soon as it is known.
        self.assertIn(f"submitted as Slurm job {self.job_id(rec)}", r.stderr.decode())

    def test_exit_code_and_failed_state_come_back(self):
        job = write_job(self.tmp, "seven", "echo oops >&2\nexit 7\n", interpreter="sh")
        r = self.ferry("run", job, "--json")
        self.assertEqual(r.code, 1, r)
        rec = r.record
        self.assertEqual((rec["status"], rec["exit_code"]), ("failed", 7), rec)
        self.assertIn("exited with status 7: oops", rec["error"])
        slurm = rec["target"]["slurm"]
        self.assertEqual((slurm["state"], slurm["exit_code"]), ("FAILED", 7), slurm)

    def test_ferrys_own_timeout_stops_the_job_on_the_node(self):
        r = self.ferry("run", self.sleep_job, "--timeout", "2", "--json")
        self.assertEqual(r.code, 1, r)
        rec = r.record
        self.assertEqual((rec["status"], rec["exit_code"]), ("timeout", 124), rec)
        self.assertEqual(rec["stdout"], "started\n")
        self.assertEqual(rec["target"]["slurm"]["time_limit_min"], 1)
        self.assertLess(rec["duration_s"], 40)

    def test_two_nodes_give_one_record_each_from_one_allocation(self):
        r = self.ferry("run", self.node_job, "--nodes", "2", "-p", "fail_on_n2=true")
        self.assertEqual(r.code, 1, r)
        text = r.stdout.decode()
        ids = set(re.findall(r"== node_probe @ slurm:(\d+)/(n[12]) ==", text))
        self.assertEqual(len(ids), 2, text)
        self.assertEqual(len({i for i, _ in ids}), 1, f"one allocation: {text}")
        self.assertEqual(sorted(n for _, n in ids), ["n1", "n2"], text)
        self.assertIn("hello from n1", text)
        self.assertIn("hello from n2", text)
        self.assertRegex(text, r"node_probe @ slurm:\d+/n2: failed")
        self.assertRegex(text, r"node_probe @ slurm:\d+/n1: ok")
        # gpu_probe over every node of an allocation: the showcase.
        r = self.ferry("run", "gpu_probe", "--nodes", "2", "--json")
        self.assertEqual(r.code, 0, r)
        records = r.records
        self.assertEqual(sorted(rec["target"]["slurm"]["node"] for rec in records), ["n1", "n2"])
        self.assertEqual(len({rec["target"]["slurm"]["job_id"] for rec in records}), 1)
        self.assertTrue(all(rec["status"] == "ok" and rec["result"]["gpus"] == [] for rec in records))

    def test_a_sweep_is_one_job_array_and_every_point_its_own_record(self):
        # Issue 43 item 6: a sweep's points are staged first and submitted by one sbatch
        # --array=0-3; each point is still its own run and record, and a failing point (n=3)
        # fails only its own.
        job = write_job(self.tmp, "point", POINT_JOB, params="[params.n]\ntype = \"int\"")
        r = self.ferry("run", job, "--sweep", "n=1,2,3,4", "--json")
        self.assertEqual(r.code, 1, r)
        records = sorted(r.records, key=lambda rec: rec["params"]["n"])
        self.assertEqual([rec["params"]["n"] for rec in records], [1, 2, 3, 4], r)
        slurm = [rec["target"]["slurm"] for rec in records]
        arrays = {s.get("array_job_id") for s in slurm}
        self.assertEqual(len(arrays), 1, f"one sbatch, one array job: {slurm}")
        array = arrays.pop()
        self.assertRegex(array or "", r"^\d+$", slurm)
        tasks = sorted(s["array_task_id"] for s in slurm)
        self.assertEqual(tasks, [0, 1, 2, 3], slurm)
        self.assertEqual(len({rec["invocation"] for rec in records}), 1, records)
        for rec, s in zip(records, slurm):
            n, task = rec["params"]["n"], s["array_task_id"]
            self.assertEqual(s["job_id"], f"{array}_{task}", s)
            self.assertEqual(s["array_size"], 4, s)
            self.assertEqual(rec["target"]["host"], s["node"], rec)
            self.assertIn(f"submitted as Slurm job {array}_{task}", r.stderr.decode())
            self.assertEqual(rec["stdout"], f"point {n}\n", rec)
            self.assertEqual(rec["result"], {"n": n, "array_job": array, "array_task": str(task)})
            want = ("failed", "FAILED", 5) if n == 3 else ("ok", "COMPLETED", 0)
            self.assertEqual((rec["status"], s["state"], s["exit_code"]), want, rec)
        # Slurm knows one array job with four tasks, and no other job of this test's.
        # (sacct lags a job's end by a few seconds; the cluster's accounting starts with the class.)
        def point_jobs():
            out = self.cluster.run(["sacct", "-a", "-n", "-P", "-X", "-o", "JobID,JobName"]).stdout
            return sorted(line.split("|")[0] for line in out.splitlines()
                          if line.split("|")[-1].startswith("ferry-point-"))
        wait_for(lambda: len(point_jobs()) >= 4, 10, 0.5)
        self.assertEqual(point_jobs(), [f"{array}_{t}" for t in range(4)])

    def array_tasks(self, name: str) -> list[dict]:
        return [j for j in self.cluster.queue() if j["name"].startswith(f"ferry-{name}-")]

    def test_ctrl_c_cancels_a_sweeps_whole_array_and_every_point_is_interrupted(self):
        # Issue 43 item 6: one follower for the whole array; SIGINT cancels the array
        # (scancel ARRAY), every point's record says interrupted, nothing stays on the nodes.
        job = write_job(self.tmp, "array_nap", "echo started\nsleep 300\n", interpreter="sh",
                        timeout=600, params="[params.n]\ntype = \"int\"")
        run = self.background("run", job, "--sweep", "n=1,2,3", "--json")
        running = lambda: [t for t in self.array_tasks("array_nap") if t["state"] == "RUNNING"]
        self.assertTrue(wait_for(lambda: len(running()) == 3 and run.stderr().count(" running") >= 3,
                                 30), (self.array_tasks("array_nap"), run.stderr()))
        array = running()[0]["id"].split("_")[0]
        jobs = [int(self.cluster.job(f"{array}_{k}")["JobId"]) for k in range(3)]
        on_nodes = lambda: [p for j in jobs for p in self.cluster.job_processes(j)]
        self.assertTrue(wait_for(lambda: all(self.cluster.job_processes(j) for j in jobs), 10))
        t0 = time.monotonic()
        run.proc.send_signal(signal.SIGINT)
        code, records, stderr = run.finish(40)
        took = time.monotonic() - t0
        self.assertEqual(code, 130, stderr)
        self.assertLess(took, 15, stderr)
        self.assertEqual(sorted(r["params"]["n"] for r in records), [1, 2, 3], records)
        for r in records:
            slurm = r["target"]["slurm"]
            self.assertEqual((r["status"], slurm["array_job_id"], slurm.get("state")),
                             ("interrupted", array, "CANCELLED"), r)
        self.assertTrue(wait_for(lambda: not self.array_tasks("array_nap"), 10),
                        self.array_tasks("array_nap"))
        self.assertTrue(wait_for(lambda: not on_nodes(), 15),
                        self.cluster.describe_processes(on_nodes()))

    def test_an_array_sweep_takes_one_channel_however_many_points(self):
        # Issue 43 item 6: a login node that allows 3 channels (SFTP and two more) and a sweep of
        # 4 points: one follower script follows every task of the array, so no point waits for a
        # channel and all are done promptly.
        job = write_job(self.tmp, "array_quick", 'echo "point $(cat "$FERRY_PARAMS")"\nsleep 1\n',
                        interpreter="sh", params="[params.n]\ntype = \"int\"")
        user = self.srv.user("bash")
        followers, most = 0, 0
        with SshServer(extra_config="MaxSessions 3", reset_users=False) as narrow:
            run = Background(["run", job, "--sweep", "n=1,2,3,4", "--json", "--slurm",
                              narrow.alias("bash"), "--ssh-config", narrow.ssh_config], self.env)
            self.addCleanup(run.kill)
            t0 = time.monotonic()
            while run.proc.poll() is None and time.monotonic() - t0 < 60:
                ps = subprocess.run(["ps", "-u", user, "-o", "args="], capture_output=True,
                                    text=True).stdout.splitlines()
                # One script per path (its subshells show the same command line); the class's
                # TIMEOUT run on n3 has its submit script under SCRATCH.
                now = {a for a in ps if re.search(r"\.ferry-(submit|follow-array)\.sh", a)
                       and SCRATCH not in a}
                followers, most = followers + bool(now), max(most, len(now))
                time.sleep(0.05)
            code, records, stderr = run.finish(30)
            took = time.monotonic() - t0
        self.assertEqual(code, 0, stderr)
        self.assertGreater(followers, 0, "no follower script was ever seen on the login node")
        self.assertEqual(most, 1, "the sweep's points were followed by scripts of their own")
        self.assertEqual(sorted(r["params"]["n"] for r in records), [1, 2, 3, 4], records)
        for r in records:
            self.assertEqual((r["status"], r["stdout"].startswith("point {")), ("ok", True), r)
            self.assertIn(f'"n":{r["params"]["n"]}}}', r["stdout"], r)
        self.assertEqual(len({r["target"]["slurm"]["array_job_id"] for r in records}), 1, records)
        self.assertLess(took, 30, stderr)

    def test_one_squeue_call_a_tick_serves_every_run_on_the_login_node(self):
        # Issue 43 item 6: the submit scripts of runs under way at once on a login node share
        # one squeue call per tick (a state file under the run base), instead of one each.
        job = write_job(self.tmp, "nap", "sleep 5\necho rested\n", interpreter="sh")
        base = os.path.join(self.srv.home(self.srv.user("bash")), ".cache", "ferry", "runs")
        state = os.path.join(base, ".ferry-squeue", socket.gethostname(), "state")
        runs = [self.background("run", job, "--json") for _ in range(3)]
        most_asked, generations, t0 = 0, [], time.monotonic()
        while any(r.proc.poll() is None for r in runs) and time.monotonic() - t0 < 90:
            try:
                with open(state) as f:
                    lines = f.read().splitlines()
                generations.append((time.monotonic(), int(lines[0])))
                most_asked = max(most_asked, len([i for i in lines[2].split(",") if i]))
            except (OSError, IndexError, ValueError):
                pass
            time.sleep(0.1)
        for r in runs:
            code, records, err = r.finish(30)
            self.assertEqual((code, records[0]["status"], records[0]["stdout"]), (0, "ok", "rested\n"),
                             err)
        self.assertGreaterEqual(most_asked, 2, "the three runs' jobs were never asked about at once")
        self.assertGreater(len(generations), 1, f"no shared queue state at {state}")
        (t_first, g_first), (t_last, g_last) = generations[0], generations[-1]
        # About one call a second for all of them (measured ~0.7 a second); one each would be ~3
        # a second, and every script asking whenever it looks, the lock alone keeping them one at
        # a time, ~1.8.
        self.assertLessEqual(g_last - g_first, 1.1 * (t_last - t_first) + 2, generations[-5:])

    def test_hostile_parameters_under_zsh_and_fish_login_shells(self):
        params = {"text": HOSTILE[0], "items": HOSTILE, "blob": {"all": HOSTILE, "n": 1.5}}
        path = os.path.join(self.tmp, "hostile.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(params, f)
        self.srv.set_startup_noise("fish", True)
        try:
            for shell in ("zsh", "fish"):
                with self.subTest(shell=shell):
                    r = self.ferry("run", self.echo_job, "--params", path, "--json", shell=shell)
                    self.assertEqual(r.code, 0, r)
                    rec = r.record
                    self.assertEqual(rec["result"]["params"], params)
                    self.assertEqual(rec["result"]["stdin"], "")
                    self.assertEqual(rec["stdout"], "echoed 3 params\n")
                    self.assertEqual(rec["result"]["cwd"], rec["result"]["run_dir"])
                    noise = [w for w in rec.get("warnings", []) if w["code"] == "login-shell-output"]
                    self.assertEqual(bool(noise), shell == "fish", rec.get("warnings"))
        finally:
            self.srv.set_startup_noise("fish", False)

    def test_pending_on_resources_is_shown_while_the_job_waits(self):
        with self.cluster.busy("n1") as holder:
            run = self.background("run", self.node_job, "--gres", "gpu:8",
                                  "--slurm-arg=--nodelist=n1", "--json")
            seen = wait_for(lambda: "pending: Resources" in run.stderr(), 30)
            self.assertTrue(seen, run.stderr())
            self.assertEqual(self.cluster.job(holder)["JobState"], "RUNNING")
        code, records, stderr = run.finish(60)
        self.assertEqual(code, 0, stderr)
        self.assertEqual(records[0]["target"]["slurm"]["node"], "n1")
        self.assertRegex(stderr, rf"slurm:{SshServer.user('bash')} node_probe: job \d+ pending: Resources")
        self.assertRegex(stderr, r"job \d+ running")

    def test_ctrl_c_cancels_the_job_and_leaves_nothing(self):
        run = self.background("run", self.sleep_job, "--json")
        self.assertTrue(wait_for(lambda: re.search(r"job \d+ running", run.stderr()), 30),
                        run.stderr())
        job = int(re.search(r"job (\d+) running", run.stderr()).group(1))
        self.assertTrue(wait_for(lambda: self.cluster.job_processes(job), 10))
        t0 = time.monotonic()
        run.proc.send_signal(signal.SIGINT)
        code, records, stderr = run.finish(30)
        self.assertEqual(code, 130, stderr)
        self.assertLess(time.monotonic() - t0, 10)
        self.assertEqual(records[0]["status"], "interrupted", records)
        self.assertEqual(self.cluster.wait_job(job)["JobState"], "CANCELLED")
        self.assertTrue(wait_for(lambda: not self.cluster.job_processes(job), 15),
                        self.cluster.describe_processes(self.cluster.job_processes(job)))

    def test_a_lost_connection_cancels_the_job_and_removes_the_run_directory(self):
        run = self.background("run", self.sleep_job, "--json")
        self.assertTrue(wait_for(lambda: re.search(r"job \d+ running", run.stderr()), 30),
                        run.stderr())
        job = int(re.search(r"job (\d+) running", run.stderr()).group(1))
        run.proc.kill()  # the connection drops; nobody cancels from this side
        run.proc.wait()
        self.assertEqual(self.cluster.wait_job(job, timeout_s=20)["JobState"], "CANCELLED")
        self.assertTrue(wait_for(lambda: not self.srv.run_dirs("bash"), 20),
                        self.srv.run_dirs("bash"))

    def test_an_invalid_partition_is_a_clear_error_and_leaves_nothing(self):
        r = self.ferry("run", self.node_job, "--partition", "nope", "--json")
        self.assertEqual(r.code, 1, r)
        rec = r.record
        self.assertEqual(rec["status"], "error", rec)
        self.assertIn("sbatch did not submit the job", rec["error"])
        self.assertIn("invalid partition", rec["error"].lower())

    def test_bad_slurm_options_are_refused_before_anything_is_contacted(self):
        # Counted for zsh's user only: the background TIMEOUT run logs in as bash's meanwhile.
        accepted = self.srv.count_accepted("zsh")
        for args, needle in ((["--partition", "a;b"], "--partition 'a;b'"),
                             (["--slurm-arg=--output=/tmp/x"], "does not pass --output"),
                             (["--gres", "gpu:8", "--gpus", "2"], "exclude each other"),
                             (["--nodes", "0"], "--nodes 0")):
            with self.subTest(args=args):
                r = self.ferry("run", self.node_job, *args, shell="zsh")
                self.assertEqual(r.code, 2, r)
                self.assertIn(needle, r.stderr.decode())
        r = run_ferry("run", self.node_job, "--partition", "gpu", env=self.env)
        self.assertEqual(r.code, 2, r)
        self.assertIn("need --slurm LOGIN", r.stderr.decode())
        self.assertEqual(self.srv.count_accepted("zsh"), accepted)

    def test_options_come_from_the_job_and_the_config_file_and_the_command_line_wins(self):
        job = write_job(self.tmp, "tabled", NODE_JOB, interpreter="sh",
                        params='[params.fail_on_n2]\ntype = "bool"\ndefault = false\n'
                               '[slurm]\npartition = "gpu"\ntime = 3\nargs = ["--qos=normal"]')
        config = os.path.join(self.env["XDG_CONFIG_HOME"], "ferry")
        os.makedirs(config, exist_ok=True)
        with open(os.path.join(config, "config.toml"), "w") as f:
            f.write('[slurm]\npartition = "debug"\ngres = "gpu:2"\n')
        try:
            r = self.ferry("run", job, "--json", "--time", "4")
            self.assertEqual(r.code, 0, r)
            slurm = r.record["target"]["slurm"]
            self.assertEqual(slurm["options"], {"partition": "gpu", "gres": "gpu:2", "time": 4,
                                                "args": ["--qos=normal"], "nodes": 1})
            self.assertEqual(r.record["result"]["cvd"], "0,1")
            # sacct is a moment behind the controller: its row fills in shortly after the end.
            def sacct_info():
                return self.cluster.run(["sacct", "-n", "-P", "-X", "-j", slurm["job_id"], "-o",
                                         "Partition,Timelimit"]).stdout.strip()
            wait_for(lambda: sacct_info() not in ("", "|"), 10, 0.2)
            self.assertEqual(sacct_info(), "gpu|00:04:00")
            with open(os.path.join(config, "config.toml"), "w") as f:
                f.write('[slurm]\npartition = "a b"\n')
            r = self.ferry("run", job)
            self.assertEqual(r.code, 2, r)
            self.assertIn("config.toml:2: slurm.partition 'a b'", r.stderr.decode())
        finally:
            os.unlink(os.path.join(config, "config.toml"))

    def test_archive_and_replay_resubmit_with_the_archived_options(self):
        r = self.ferry("run", "gpu_probe", "--json", "--partition", "gpu", "--gres", "gpu:1")
        self.assertEqual(r.code, 0, r)
        original = r.record
        replay = run_ferry("replay", original["run_id"], "--ssh-config", self.srv.ssh_config,
                           "--json", env=self.env)
        self.assertEqual(replay.code, 0, replay)
        rec = replay.record
        self.assertEqual(rec["replay_of"], original["run_id"])
        self.assertEqual((rec["status"], rec["compare"]["identical"]), ("ok", True), rec)
        self.assertEqual(rec["target"]["slurm"]["options"],
                         {"partition": "gpu", "gres": "gpu:1", "nodes": 1})
        self.assertEqual(rec["target"]["slurm"]["login"], self.srv.alias("bash"))
        self.assertNotEqual(self.job_id(rec), self.job_id(original))
        shown = run_ferry("show", original["run_id"], "--json", env=self.env)
        self.assertEqual(json.loads(shown.stdout)["target"], original["target"])
        log = run_ferry("log", "--host", original["target"]["host"], "--json", env=self.env)
        self.assertIn(original["run_id"], log.stdout.decode())

    def test_check_reports_the_cluster_and_whether_the_run_base_is_shared(self):
        r = self.ferry("check")
        self.assertEqual(r.code, 0, r)
        text = r.stdout.decode()
        self.assertRegex(text, r"Slurm 22\.05\.\d+")
        self.assertIn("partitions debug* gpu isolated", text)
        self.assertIn("GPU gres n1 gpu:8, n2 gpu:8", text)
        self.assertRegex(text, r"remote base shared with node n[12]")
        r = self.ferry("check", "--partition", "isolated", "--json")
        self.assertEqual(r.code, 1, r)
        line = json.loads(r.stdout)
        self.assertEqual(line["status"], "failed")
        self.assertFalse(line["target"]["slurm"]["run_dir_shared"])
        self.assertIn(f"node {ISOLATED_NODE} cannot see the run directory", line["error"])
        self.assertIn("--remote-base", line["error"])

    def test_controller_down_is_exit_3_with_the_reason(self):
        self.cluster.stop_controller()
        try:
            r = self.ferry("run", self.node_job, "--json")
        finally:
            self.cluster.start_controller()
        self.assertEqual(r.code, 3, r)
        rec = r.record
        self.assertEqual(rec["status"], "error")
        self.assertIn("Slurm controller does not answer", rec["error"])
        self.assertIn("DOWN", rec["error"])
        self.cluster.wait_nodes_idle(tuple(NODES))

    def test_z_slurm_timeout_is_read_from_the_scheduler(self):
        code, records, stderr = self.timeout_run.finish(TIMEOUT_MAX_S + 60)
        elapsed = time.monotonic() - self.timeout_started
        self.assertEqual(code, 1, stderr)
        rec = records[0]
        self.assertEqual(rec["status"], "timeout", rec)
        self.assertIn("Slurm stopped the job at its time limit (--time 1 min", rec["error"])
        slurm = rec["target"]["slurm"]
        self.assertEqual((slurm["state"], slurm["node"]), ("TIMEOUT", ISOLATED_NODE), slurm)
        self.assertEqual(rec["stdout"], "started\n")
        self.assertTrue(TIMEOUT_MIN_S <= elapsed <= TIMEOUT_MAX_S + 30, elapsed)
        self.assertEqual(os.listdir(self.scratch), [])


class SlurmWithoutAccounting(unittest.TestCase):
    """No slurmdbd: squeue and scontrol alone give the state."""

    def test_a_run_works_and_its_state_comes_from_scontrol(self):
        require_root_and_tools()
        require_prerequisites(False)
        with SlurmCluster(accounting=False, isolated_node=False) as cluster, SshServer() as srv:
            tmp = tempfile.mkdtemp(prefix="ferry-slurm-it-")
            try:
                job = write_job(tmp, "fails", "exit 5\n", interpreter="sh")
                r = run_ferry("run", job, "--slurm", srv.alias("dash"), "--ssh-config",
                              srv.ssh_config, "--json",
                              env={"FERRY_ARCHIVE": os.path.join(tmp, "a.db")})
                self.assertEqual(r.code, 1, r)
                slurm = r.record["target"]["slurm"]
                self.assertEqual((slurm["state"], slurm["exit_code"], slurm["state_source"]),
                                 ("FAILED", 5, "scontrol"), slurm)
                cluster.assert_idle()
                self.assertEqual(srv.run_dirs("dash"), [])
            finally:
                shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
