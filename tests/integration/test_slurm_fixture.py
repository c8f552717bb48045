"""Checks the Slurm fixture itself (slurm_fixture.py) with the real Slurm clients, run by the
sshd fixture's test users on the login node. Needs root; missing prerequisites fail, never skip.
Timings measured along the way are printed to stderr ("slurm timing: ...")."""

import json
import os
import re
import subprocess
import sys
import time
import unittest

import slurm_fixture
from slurm_fixture import (ETC_SLURM_CONF, GPUS_PER_NODE, ISOLATED_NODE, NODES, SAVED_SLURM_CONF,
                           SlurmCluster, SlurmFixtureError, alive, missing_prerequisites,
                           require_prerequisites)
from sshd_fixture import HOME_BASE, SshServer, require_root_and_tools

SSH_TIMEOUT_S = 60
# A 1-minute limit is the shortest; slurmctld checks limits every 30 s and a controller
# restart resets that clock, so the job ends 60-90 s after it starts (+ a few s of slack).
TIMEOUT_MIN_S, TIMEOUT_MAX_S = 60, 100


def timing(what: str, seconds: float) -> None:
    print(f"slurm timing: {what}: {seconds:.2f} s", file=sys.stderr)


def ssh(srv, shell, command):
    return subprocess.run(srv.ssh_command(shell, command), capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=SSH_TIMEOUT_S)


def submit(srv, shell, options: str) -> int:
    """`sbatch --parsable OPTIONS` as that shell's user on the login node; the job id."""
    r = ssh(srv, shell, f"sbatch --parsable {options}")
    if r.returncode != 0 or not re.fullmatch(r"\d+(;\S+)?\n", r.stdout):
        raise AssertionError(f"sbatch under {shell} failed ({r.returncode}): {r.stdout!r} {r.stderr!r}")
    return int(r.stdout.split(";")[0])


class Prerequisites(unittest.TestCase):
    def test_this_machine_has_them(self):
        require_prerequisites(accounting=True)

    def test_missing_ones_are_named_with_the_package_and_the_fix(self):
        missing = missing_prerequisites(True, euid=1000,
                                        which=lambda t: None if t in ("slurmd", "mariadbd") else "/x/" + t)
        text = " ".join(missing)
        for needle in ("root", "slurmd (package slurmd)", "mariadbd (package mariadb-server-core)"):
            self.assertIn(needle, text)
        self.assertNotIn("mariadbd", " ".join(missing_prerequisites(False, euid=0,
                                                                    which=lambda t: None)))
        with self.assertRaises(AssertionError) as cm:
            require_prerequisites(False, euid=0, which=lambda t: None if t == "munged" else "/x/" + t)
        self.assertIn("munged (package munge)", str(cm.exception))
        self.assertIn("setup.sh", str(cm.exception))


class _ClusterTest(unittest.TestCase):
    accounting = False
    isolated_node = True

    @classmethod
    def setUpClass(cls):
        require_root_and_tools()
        require_prerequisites(cls.accounting)
        cls.cluster = SlurmCluster(accounting=cls.accounting, isolated_node=cls.isolated_node).start()
        try:
            cls.srv = SshServer().start()
        except BaseException:
            cls.cluster.stop()
            raise
        cls.keep: tuple[int, ...] = ()
        for key, value in cls.cluster.timings.items():
            timing(f"cluster {key} (accounting={cls.accounting})", value)

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        cls.cluster.stop()
        timing(f"cluster stop (accounting={cls.accounting})", cls.cluster.timings["stop_s"])

    def tearDown(self):
        self.cluster.cancel_all(keep=self.keep)
        self.cluster.assert_idle(keep=self.keep)


class ClusterWithAccounting(_ClusterTest):
    """One cluster with slurmdbd for every test here. A TIMEOUT needs 60-90 s, so its job is
    submitted first and checked by the last test (names run in alphabetical order)."""
    accounting = True

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        try:
            # On n3: keeps n1 and n2 idle for the other tests (n3 has a second CPU for its own).
            # As root: a test user's processes die whenever an sshd fixture (of any test run
            # on this machine) resets the users, and this job has to live for 60-90 s.
            out = cls.cluster.run(["sbatch", "--parsable", "-p", "isolated", "-w", ISOLATED_NODE,
                                   "--time=1", "--chdir=/", "-o", "/dev/null", "--wrap",
                                   "exec sleep 300"])
            cls.timeout_job = int(out.stdout)
            cls.keep = (cls.timeout_job,)
            cls.cluster.wait_job(cls.timeout_job, {"RUNNING"})
        except BaseException:
            cls.tearDownClass()
            raise

    def test_sinfo_shows_two_idle_nodes_with_8_gpus(self):
        nodes = self.cluster.nodes()
        for node in NODES:
            self.assertEqual(nodes[node]["state"], "idle", nodes)
            self.assertEqual(nodes[node]["gres"], f"gpu:{GPUS_PER_NODE}", nodes)
            self.assertIn("debug", nodes[node]["partitions"])
        r = ssh(self.srv, "zsh", "sinfo -h -p debug -t idle -o '%D %G'")
        self.assertEqual((r.returncode, r.stdout), (0, f"2 gpu:{GPUS_PER_NODE}\n"), r.stderr)

    def test_sbatch_under_zsh_and_fish_login_shells_completes(self):
        for shell in ("zsh", "fish"):
            with self.subTest(shell=shell):
                t0 = time.monotonic()
                job = submit(self.srv, shell, f"--gres=gpu:{GPUS_PER_NODE} --wrap 'echo "
                                              "\"$SLURMD_NODENAME $(hostname) $CUDA_VISIBLE_DEVICES\"'")
                timing(f"sbatch through ssh ({shell})", time.monotonic() - t0)
                t0 = time.monotonic()
                started = self.cluster.wait_job(job, {"RUNNING", "COMPLETING", "COMPLETED"})
                timing(f"submit to start ({shell})", time.monotonic() - t0)
                info = self.cluster.wait_job(job)
                timing(f"submit to end ({shell})", time.monotonic() - t0)
                self.assertEqual((info["JobState"], info["ExitCode"]), ("COMPLETED", "0:0"), info)
                self.assertIn(started["NodeList"], NODES)
                out_path = os.path.join(self.srv.home(shell), f"slurm-{job}.out")
                with open(out_path) as f:
                    node = info["NodeList"]
                    self.assertEqual(f.read(), f"{node} {node} 0,1,2,3,4,5,6,7\n")
                self.assertEqual(self.cluster.wait_sacct_state(job), ("COMPLETED", "0:0"))

    def test_failed_job_reports_its_exit_code(self):
        job = submit(self.srv, "fish", "-o /dev/null --wrap 'exit 3'")
        info = self.cluster.wait_job(job)
        self.assertEqual((info["JobState"], info["ExitCode"], info["Reason"]),
                         ("FAILED", "3:0", "NonZeroExitCode"), info)
        self.assertEqual(self.cluster.squeue_state(job), "FAILED")
        self.assertEqual(self.cluster.wait_sacct_state(job), ("FAILED", "3:0"))
        r = ssh(self.srv, "fish", f"sacct -n -P -X -j {job} -o State,ExitCode")
        self.assertEqual((r.returncode, r.stdout), (0, "FAILED|3:0\n"), r.stderr)

    def test_scancel_ends_in_cancelled_and_leaves_no_process(self):
        job = submit(self.srv, "zsh", "-o /dev/null --wrap 'sleep 300 & sleep 300; wait'")
        self.cluster.wait_job(job, {"RUNNING"})
        self.assertTrue(_wait(lambda: len(self.cluster.job_processes(job)) >= 3, 10),
                        self.cluster.describe_processes(self.cluster.job_processes(job)))
        t0 = time.monotonic()
        r = ssh(self.srv, "zsh", f"scancel {job}")
        self.assertEqual(r.returncode, 0, r.stderr)
        info = self.cluster.wait_job(job)
        self.assertEqual(info["JobState"], "CANCELLED", info)
        self.assertTrue(_wait(lambda: not self.cluster.job_processes(job), 10),
                        self.cluster.describe_processes(self.cluster.job_processes(job)))
        timing("scancel to no job process", time.monotonic() - t0)
        self.assertEqual(self.cluster.wait_sacct_state(job)[0], "CANCELLED")

    def test_second_gpu8_job_pends_on_resources_until_the_first_ends(self):
        with self.cluster.busy("n1") as holder:
            self.assertEqual(self.cluster.job(holder)["JobState"], "RUNNING")
            job = submit(self.srv, "fish", f"-w n1 --gres=gpu:{GPUS_PER_NODE} -o /dev/null --wrap true")
            seen = []

            def pending_on_resources():
                r = ssh(self.srv, "fish", f"squeue -h -j {job} -o '%T %r'")
                seen.append(r.stdout.strip() or r.stderr.strip())
                return seen[-1] == "PENDING Resources"
            self.assertTrue(_wait(pending_on_resources, 15), seen)
        info = self.cluster.wait_job(job)
        self.assertEqual((info["JobState"], info["NodeList"]), ("COMPLETED", "n1"), info)

    def test_srun_on_two_nodes_prints_both(self):
        t0 = time.monotonic()
        r = ssh(self.srv, "zsh", "srun -N2 hostname")
        timing("srun -N2 hostname through ssh", time.monotonic() - t0)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(sorted(r.stdout.split()), sorted(NODES))
        r = ssh(self.srv, "fish", "srun -N2 printenv SLURMD_NODENAME")
        self.assertEqual(sorted(r.stdout.split()), sorted(NODES), r.stderr)

    def test_controller_down_fails_squeue_with_a_message_and_start_recovers(self):
        self.cluster.stop_controller()
        try:
            t0 = time.monotonic()
            r = ssh(self.srv, "zsh", "squeue")
            timing("squeue failing with the controller down (MessageTimeout=10)", time.monotonic() - t0)
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertIn("Unable to contact slurm controller", r.stderr)
        finally:
            self.cluster.start_controller()
        timing("controller restart", self.cluster.timings["controller_start_s"])
        r = ssh(self.srv, "zsh", "squeue -h -o '%i %T'")
        self.assertEqual((r.returncode, r.stdout), (0, f"{self.timeout_job} RUNNING\n"), r.stderr)
        self.cluster.wait_nodes_idle(NODES)
        info = self.cluster.wait_job(submit(self.srv, "zsh", "-o /dev/null --wrap true"))
        self.assertEqual(info["JobState"], "COMPLETED", info)

    def test_isolated_node_cannot_see_the_shared_run_base(self):
        here = "test -d $HOME && test -d " + HOME_BASE
        self.assertTrue(os.path.isdir(self.srv.home("bash")))
        shared = self.cluster.wait_job(submit(self.srv, "bash", f"-o /dev/null --wrap '{here}'"))
        self.assertEqual((shared["JobState"], shared["ExitCode"]), ("COMPLETED", "0:0"), shared)
        hidden = self.cluster.wait_job(submit(self.srv, "bash", f"-p isolated -o /dev/null "
                                                              f"--wrap '{here}'"))
        self.assertEqual((hidden["JobState"], hidden["ExitCode"], hidden["NodeList"]),
                         ("FAILED", "1:0", ISOLATED_NODE), hidden)
        # Default output file in the (hidden) submit directory: the step cannot start at all.
        no_out = self.cluster.wait_job(submit(self.srv, "bash", "-p isolated --wrap true"))
        self.assertEqual((no_out["JobState"], no_out["Reason"]), ("FAILED", "JobLaunchFailure"), no_out)

    def test_timeout_state_after_the_time_limit(self):
        job = self.timeout_job
        info = self.cluster.wait_job(job, timeout_s=TIMEOUT_MAX_S + 30)
        h, m, s = (int(x) for x in info["RunTime"].split(":"))
        runtime = h * 3600 + m * 60 + s
        timing("TIMEOUT of a --time=1 job (run time)", runtime)
        self.assertEqual((info["JobState"], info["Reason"]), ("TIMEOUT", "TimeLimit"), info)
        self.assertTrue(TIMEOUT_MIN_S <= runtime <= TIMEOUT_MAX_S, info["RunTime"])
        self.assertEqual(self.cluster.wait_sacct_state(job)[0], "TIMEOUT")
        self.assertTrue(_wait(lambda: not self.cluster.job_processes(job), 10),
                        self.cluster.describe_processes(self.cluster.job_processes(job)))
        type(self).keep = ()


class ClusterWithoutAccounting(_ClusterTest):
    isolated_node = False

    def test_sacct_is_refused_but_scontrol_and_squeue_report_the_state(self):
        job = submit(self.srv, "fish", "-o /dev/null --wrap 'exit 7'")
        info = self.cluster.wait_job(job)
        self.assertEqual((info["JobState"], info["ExitCode"]), ("FAILED", "7:0"), info)
        r = ssh(self.srv, "fish", f"squeue -h -t all -j {job} -o %T")
        self.assertEqual((r.returncode, r.stdout), (0, "FAILED\n"), r.stderr)
        r = ssh(self.srv, "fish", f"sacct -n -X -j {job}")
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("accounting storage is disabled", r.stderr)
        self.assertEqual(sorted(self.cluster.nodes()), sorted(NODES))


class Lifecycle(unittest.TestCase):
    def setUp(self):
        require_root_and_tools()
        require_prerequisites(accounting=False)

    def test_stop_removes_everything_restores_slurm_conf_and_start_works_again(self):
        # A slurm.conf of this machine's own must come back as it was; without one, use a stand-in.
        had_one = os.path.exists(ETC_SLURM_CONF)
        if not had_one:
            with open(ETC_SLURM_CONF, "w") as f:
                f.write("# an administrator's slurm.conf\n")
        with open(ETC_SLURM_CONF) as f:
            foreign = f.read()
        try:
            for round_ in (1, 2):
                with self.subTest(round=round_):
                    cluster = SlurmCluster(isolated_node=False).start()
                    try:
                        pids, directory = cluster.daemon_pids(), cluster.dir
                        with open(ETC_SLURM_CONF) as f:
                            self.assertTrue(f.readline().startswith(slurm_fixture.MARKER))
                        job = int(cluster.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap",
                                               "sleep 300"]).stdout)
                        cluster.wait_job(job, {"RUNNING"})
                        pids += cluster.job_processes(job)
                    finally:
                        cluster.stop()
                    self.assertEqual(alive(pids), [])
                    self.assertFalse(os.path.exists(directory), directory)
                    with open(ETC_SLURM_CONF) as f:
                        self.assertEqual(f.read(), foreign)
                    self.assertFalse(os.path.exists(SAVED_SLURM_CONF))
        finally:
            if not had_one:
                os.unlink(ETC_SLURM_CONF)

    def test_a_killed_test_run_leaves_no_process_and_the_next_start_cleans_up(self):
        before = _read_or_none(ETC_SLURM_CONF)
        child = subprocess.Popen([sys.executable, "-c", _KILLED_RUN], cwd=os.path.dirname(__file__),
                                 stdout=subprocess.PIPE, text=True)
        with child:
            try:
                line = child.stdout.readline()
            finally:
                child.kill()
        try:
            self.assertTrue(line.startswith("{"), f"the child run printed {line!r}")
            started = json.loads(line)
            self.assertGreaterEqual(len(started["jobs"]), 3, started)
            # The reapers go down with the test process and take the daemons and jobs along.
            pids = started["daemons"] + started["jobs"]
            self.assertTrue(_wait(lambda: not alive(pids), 15), alive(pids))
            self.assertTrue(os.path.isdir(started["dir"]))
        finally:
            SlurmCluster(isolated_node=False).start().stop()  # and the next start cleans up
        self.assertFalse(os.path.exists(started["dir"]), started["dir"])
        self.assertEqual(_read_or_none(ETC_SLURM_CONF), before)

    def test_a_cluster_that_cannot_start_fails_with_the_daemon_log(self):
        before = _read_or_none(ETC_SLURM_CONF)
        cluster = SlurmCluster(isolated_node=False, extra_config="NoSuchParameter=1")
        with self.assertRaises(SlurmFixtureError) as cm:
            cluster.start()
        self.assertIn("slurmctld exited at start", str(cm.exception))
        self.assertIn("NoSuchParameter", str(cm.exception))
        self.assertEqual(cluster.daemons, {})
        self.assertEqual(_read_or_none(ETC_SLURM_CONF), before)


# A test run that is killed outright (SIGKILL) while a job runs, one process of which
# has detached (setsid): prints the instance dir and the pids, then waits to be killed.
_KILLED_RUN = """
import json, time
from slurm_fixture import SlurmCluster
cluster = SlurmCluster(isolated_node=False).start()
job = int(cluster.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap",
                       "sleep 300 & setsid sleep 301 & wait"]).stdout)
cluster.wait_job(job, {"RUNNING"})
deadline = time.monotonic() + 10
while len(cluster.job_processes(job)) < 4 and time.monotonic() < deadline:
    time.sleep(0.1)
print(json.dumps({"dir": cluster.dir, "daemons": cluster.daemon_pids(),
                  "jobs": cluster.job_processes(job)}), flush=True)
time.sleep(120)
"""


def _read_or_none(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def _wait(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


if __name__ == "__main__":
    unittest.main()
