"""`ferry run --slurm --detach` on the real Slurm cluster of slurm_fixture.py (issue 44 items 1
and 3): the run returns once sbatch has said the job's id, the job staying queued; `ps` reads its
state from the login node; `attach` follows it and records it as a live --slurm run would; `stop`
cancels it; a sweep is one job array whose points are detached runs of their own; a finished run
waits for --keep-for, then the run base's sweep removes it. Needs root; a missing prerequisite
fails, never skips."""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

from ferry_harness import ferry_bin, run_ferry, write_job
from slurm_fixture import SlurmCluster, require_prerequisites
from sshd_fixture import SshServer, require_root_and_tools
from test_slurm import SLEEP_JOB, wait_for

NODE_JOB = """
node=$(hostname)
printf '{"node": "%s", "slurm_job": "%s"}\\n' "$node" "$SLURM_JOB_ID" >"$FERRY_RESULT"
echo "hello from $node"
"""

# A sweep point: point 1 runs until stopped, point 2 for a while, then leaves a result.
POINT_JOB = """
n=$(sed -n 's/.*"n": *\\([0-9]*\\).*/\\1/p' "$FERRY_PARAMS")
echo "point $n"
if [ "$n" = 1 ]; then sleep 300; fi
sleep 30
printf '{"n": %s, "task": "%s"}\\n' "$n" "$SLURM_ARRAY_TASK_ID" >"$FERRY_RESULT"
"""


class SlurmDetach(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        require_root_and_tools()
        require_prerequisites(True)
        # The sshd fixture first: it makes the homes' base, which n3 is not to see.
        cls.srv = SshServer().start()
        try:
            cls.cluster = SlurmCluster(accounting=True).start()
            cls.tmp = tempfile.mkdtemp(prefix="ferry-slurm-detach-")
            cls.env = {"FERRY_ARCHIVE": f"{cls.tmp}/archive.db",
                       "XDG_CONFIG_HOME": f"{cls.tmp}/config"}
            cls.node_job = write_job(cls.tmp, "node_probe", NODE_JOB, interpreter="sh",
                                     params="[params.n]\ntype = \"int\"\ndefault = 0")
            cls.sleep_job = write_job(cls.tmp, "sleeper", SLEEP_JOB, interpreter="sh", timeout=600)
            cls.point_job = write_job(cls.tmp, "pointer", POINT_JOB, interpreter="sh", timeout=600,
                                      params="[params.n]\ntype = \"int\"")
            cls.quick_job = write_job(cls.tmp, "quick", "echo quick\n", interpreter="sh")
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "cluster", None) is not None:
            cls.cluster.stop()
        cls.srv.stop()
        shutil.rmtree(getattr(cls, "tmp", ""), ignore_errors=True)

    def setUp(self):
        # An archive of its own: what one test leaves detached is not the next one's.
        self.env = {**self.env, "FERRY_ARCHIVE": tempfile.mktemp(prefix="archive-", dir=self.tmp)}

    def tearDown(self):
        self.cluster.cancel_all()
        self.cluster.assert_idle()
        left = self.srv.run_dirs("bash")
        for path in left:  # so that one failure does not fail the next test too
            shutil.rmtree(path, ignore_errors=True)
        self.assertEqual(left, [], "run directories left")

    def ferry(self, *args, timeout=60):
        return run_ferry(*args, "--ssh-config", self.srv.ssh_config, env=self.env, timeout=timeout)

    def detach(self, job, *args):
        t0 = time.monotonic()
        r = self.ferry("run", job, "--slurm", self.srv.alias("bash"), "--detach", "--json", *args)
        self.assertEqual(r.code, 0, r)
        rec = r.record
        self.assertEqual(rec["status"], "running", rec)
        job_id = rec["target"]["slurm"]["job_id"]
        self.assertRegex(job_id, r"^\d+$")
        return rec, int(job_id), time.monotonic() - t0

    def ps(self):
        r = self.ferry("ps", "--json")
        self.assertEqual(r.code, 0, r)
        rows = [json.loads(line) for line in r.stdout.decode().splitlines() if line.strip()]
        return {row["run_id"]: row["detail"] for row in rows}  # the state, and why if unreachable

    def test_detach_returns_while_queued_then_ps_and_attach_collect_it(self):
        with self.cluster.busy("n1"):
            rec, job, took = self.detach(self.node_job, "--gres", "gpu:8",
                                         "--slurm-arg=--nodelist=n1")
            # Back at once, the job still queued behind the one that holds n1's GPUs.
            self.assertLess(took, 20)
            self.assertEqual(self.cluster.squeue_state(job), "PENDING")
            self.assertEqual(self.ps(), {rec["run_id"]: "pending"})
        self.cluster.wait_job(job, timeout_s=30)
        self.assertEqual(self.ps(), {rec["run_id"]: "finished"})
        r = self.ferry("attach", rec["run_id"].rsplit("-", 1)[1][:6], "--json")
        self.assertEqual(r.code, 0, r)
        done = r.record
        self.assertEqual((done["run_id"], done["status"]), (rec["run_id"], "ok"), done)
        self.assertEqual(done["result"], {"node": "n1", "slurm_job": str(job)})
        self.assertEqual(done["stdout"], "hello from n1\n")
        slurm = done["target"]["slurm"]
        self.assertEqual((slurm["job_id"], slurm["node"], slurm["state"], slurm["exit_code"]),
                         (str(job), "n1", "COMPLETED", 0), slurm)
        self.assertEqual(self.ps(), {})
        # The archive holds the collected run in place of the detached one.
        shown = run_ferry("show", rec["run_id"], "--json", env=self.env)
        self.assertEqual(shown.code, 0, shown)
        self.assertEqual(json.loads(shown.stdout)["status"], "ok", shown)

    def test_ctrl_c_detaches_again_and_stop_cancels_the_job_and_records_it_interrupted(self):
        rec, job, _ = self.detach(self.sleep_job)
        self.assertTrue(wait_for(lambda: self.cluster.job_processes(job), 30),
                        self.cluster.squeue_state(job))
        self.assertEqual(self.ps(), {rec["run_id"]: "running"})
        # Ctrl-C while attached detaches again: the job runs on, uncancelled.
        with tempfile.TemporaryFile() as out:
            attach = subprocess.Popen([ferry_bin(), "attach", "last", "--ssh-config",
                                       self.srv.ssh_config], stdout=out, stderr=subprocess.PIPE,
                                      stdin=subprocess.DEVNULL, env={**os.environ, **self.env})
            self.addCleanup(lambda: attach.poll() is None and attach.kill())
            self.assertTrue(wait_for(lambda: out.seek(0) == 0 and b"started" in out.read(), 30))
            attach.send_signal(signal.SIGINT)
            _, err = attach.communicate(timeout=30)
            self.assertEqual(attach.returncode, 130, err)
        time.sleep(2)
        self.assertEqual(self.cluster.squeue_state(job), "RUNNING")
        self.assertEqual(self.ps(), {rec["run_id"]: "running"})
        t0 = time.monotonic()
        r = self.ferry("stop", "last", "--json")
        self.assertEqual(r.code, 0, r)
        self.assertLess(time.monotonic() - t0, 20)  # nothing the attach left holds it up
        self.assertEqual(r.record["status"], "interrupted", r.record)
        self.assertIn("ferry stop", r.record["error"])
        self.assertEqual(r.record["stdout"], "started\n")
        self.assertEqual(self.cluster.wait_job(job, timeout_s=20)["JobState"], "CANCELLED")
        self.assertTrue(wait_for(lambda: not self.cluster.job_processes(job), 15))
        self.assertEqual(self.ps(), {})

    def test_a_job_slurm_ends_is_recorded_as_a_live_run_records_it(self):
        rec, job, _ = self.detach(self.sleep_job)
        self.assertTrue(wait_for(lambda: self.cluster.job_processes(job), 30))
        self.cluster.run(["scancel", str(job)])
        self.cluster.wait_job(job, timeout_s=20)
        r = self.ferry("attach", "last", "--json")
        self.assertEqual(r.code, 1, r)
        self.assertEqual(r.record["status"], "failed", r.record)
        self.assertIn("cancelled outside ferry", r.record["error"])
        self.assertEqual(r.record["target"]["slurm"]["state"], "CANCELLED")

    def test_a_sweep_is_one_job_array_of_detached_points_each_stopped_and_attached_alone(self):
        r = self.ferry("run", self.point_job, "--slurm", self.srv.alias("bash"), "--detach",
                       "--json", "--sweep", "n=1,2")
        self.assertEqual(r.code, 0, r)
        recs = [json.loads(line) for line in r.stdout.decode().splitlines() if line.strip()]
        self.assertEqual(len(recs), 2, r)
        self.assertEqual(len({rec["run_id"] for rec in recs}), 2, recs)
        self.assertEqual(len({rec["invocation"] for rec in recs}), 1, recs)
        by_n = {rec["params"]["n"]: rec for rec in recs}
        slurm = {n: rec["target"]["slurm"] for n, rec in by_n.items()}
        array = slurm[1]["array_job_id"]
        self.assertRegex(array, r"^\d+$", slurm)
        for n, s in slurm.items():  # one sbatch: one array, a task for each point
            self.assertEqual(by_n[n]["status"], "running", by_n[n])
            self.assertEqual((s["array_job_id"], s["array_size"]), (array, 2), s)
            self.assertEqual(s["job_id"], f"{array}_{s['array_task_id']}", s)
        self.assertEqual(sorted(s["array_task_id"] for s in slurm.values()), [0, 1])
        one, two = by_n[1]["run_id"], by_n[2]["run_id"]
        self.assertTrue(wait_for(lambda: self.ps() == {one: "running", two: "running"}, 60, 1),
                        self.ps())
        # Stopping point 1 cancels its task alone: point 2's goes on.
        r = self.ferry("stop", one, "--json")
        self.assertEqual(r.code, 0, r)
        self.assertEqual((r.record["status"], r.record["stdout"]), ("interrupted", "point 1\n"),
                         r.record)
        self.assertEqual(r.record["target"]["slurm"]["state"], "CANCELLED", r.record)
        self.assertEqual(self.cluster.squeue_state(slurm[2]["job_id"]), "RUNNING")
        self.assertEqual(self.ps(), {two: "running"})
        r = self.ferry("attach", two, "--json", timeout=90)
        self.assertEqual(r.code, 0, r)
        done = r.record
        self.assertEqual((done["run_id"], done["status"], done["stdout"]),
                         (two, "ok", "point 2\n"), done)
        self.assertEqual(done["result"], {"n": 2, "task": str(slurm[2]["array_task_id"])})
        got = done["target"]["slurm"]
        self.assertEqual((got["job_id"], got["state"], got["array_job_id"], got["array_task_id"]),
                         (slurm[2]["job_id"], "COMPLETED", array, slurm[2]["array_task_id"]), got)
        self.assertEqual(self.ps(), {})

    def test_keep_for_passes_then_the_sweep_removes_the_run_and_attach_says_it_is_gone(self):
        detached_at = time.monotonic()
        short, short_job, _ = self.detach(self.node_job, "--keep-for", "1s", "--timeout", "3")
        kept, kept_job, _ = self.detach(self.node_job)
        for rec, job, keep_for in ((short, short_job, 1), (kept, kept_job, 7 * 86400)):
            self.cluster.wait_job(job, timeout_s=30)
            # Once the launcher ended, its state file gives the run base's sweep the --keep-for.
            state = os.path.join(rec["detached"]["run_dir"], ".ferry-launcher")
            self.assertTrue(wait_for(lambda: os.path.exists(state), 10), state)
            with open(state) as f:
                self.assertRegex(f.read(), rf"^\d+ \+{keep_for}\n$")
        self.assertEqual(self.ps()[short["run_id"]], "finished")
        # Both finished two minutes ago, as the sweep sees it: past 1 s, not past 7 days. The
        # sweep of the next run on the login node's base (here an SSH run) removes the first.
        past = time.time() - 120
        for rec in (short, kept):
            os.utime(rec["detached"]["run_dir"], (past, past))
        swept = self.ferry("run", self.quick_job, "--host", self.srv.alias("bash"), "--json")
        self.assertEqual(swept.code, 0, swept)
        self.assertFalse(os.path.exists(short["detached"]["run_dir"]), "the expired run stayed")
        self.assertTrue(os.path.exists(kept["detached"]["run_dir"]), "a run within --keep-for went")
        # `ps` says expired once the run's timeout, grace and --keep-for have passed since it started.
        time.sleep(max(0.0, detached_at + 6.3 - time.monotonic()))
        self.assertEqual(self.ps(), {short["run_id"]: "expired", kept["run_id"]: "finished"})
        gone = self.ferry("attach", short["run_id"])
        self.assertEqual(gone.code, 1, gone)
        self.assertIn(b"is gone from", gone.stderr)
        self.assertIn(b"removed by the host's sweep after --keep-for 1 s", gone.stderr)
        r = self.ferry("attach", kept["run_id"], "--json")
        self.assertEqual((r.code, r.record["status"]), (0, "ok"), r)

    def test_nodes_are_not_detached_under_slurm(self):
        r = self.ferry("run", self.node_job, "--slurm", self.srv.alias("bash"), "--detach",
                       "--nodes", "2")
        self.assertEqual(r.code, 2, r)
        self.assertRegex(r.stderr.decode(), r"--detach with --slurm is for jobs of one node each "
                                            r".*not an allocation of 2 --nodes: run it without "
                                            r"--detach")


if __name__ == "__main__":
    unittest.main()
