"""Detached runs (issue 44 items 1-3; docs/record.md, "The life of a run"): `ferry run --detach`
returns at once with the run's id, the job runs on apart from ferry, and `ferry attach` (another
ferry process) follows and collects it as a run that was never detached: killed or stopped
attaching clients lose nothing, `ferry stop` stops the job, `ferry ps` lists what waits, and a
finished run that waits past --keep-for is removed by the host's sweep."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from ferry_harness import ferry_bin, run_ferry, write_job  # noqa: E402
from sshd_fixture import SshServer  # noqa: E402

SHELL = "dash"
FLEET = ["dash", "bash", "zsh"]

# Prints, waits for $1 seconds' worth of ticks, leaves an output and a result.
JOB = r"""
echo "start $FERRY_JOB"
echo "to stderr" >&2
sleep 2
mkdir -p out
echo "fetched bytes" >out/a.txt
printf '{"n": 7}\n' >"$FERRY_RESULT"
echo end
"""

QUICK = r"""
echo quick
"""

LONG = r"""
echo long
sleep 30
"""

# Rewrites its own launch.sh (a new file renamed over it: the running launcher reads on in the
# old one) into a script that leaves a marker wherever it runs, then runs on.
HIJACK = r"""
printf 'touch %s\nprintf "stop gone\\n"\n' "$MARKER" >"$FERRY_RUN_DIR/launch.sh.new"
mv -f "$FERRY_RUN_DIR/launch.sh.new" "$FERRY_RUN_DIR/launch.sh"
echo hijacked
sleep 20
"""

# Leads its own process group (the launcher's setsid): its pid is the group's.
GROUP = r"""
echo $$ >"$FERRY_RUN_DIR/job.pid"
echo before the kill
sleep 30
"""

# Writes 3 MiB to stdout, well past a 1 MiB --output-cap, and a last line.
FLOOD = r"""
head -c 3145728 /dev/zero | tr '\000' a
echo
echo last line
echo err line >&2
"""


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class Detach(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = SshServer().start()
        cls.tmp = tempfile.mkdtemp(prefix="ferry-detach-")
        os.chmod(cls.tmp, 0o755)
        cls.env = {"FERRY_ARCHIVE": os.path.join(cls.tmp, "archive.db"), "FERRY_PERSIST": "0"}
        cls.job = write_job(cls.tmp, "detached_job", JOB, interpreter="sh", timeout=30,
                            params='outputs = ["out/*"]')
        cls.quick = write_job(cls.tmp, "quick_job", QUICK, interpreter="sh", timeout=30)
        cls.long = write_job(cls.tmp, "long_job", LONG, interpreter="sh", timeout=60)
        cls.group = write_job(cls.tmp, "group_job", GROUP, interpreter="sh", timeout=60)
        cls.flood = write_job(cls.tmp, "flood_job", FLOOD, interpreter="sh", timeout=60)
        cls.out = os.path.join(cls.tmp, "out")

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def tearDown(self):
        for shell in FLEET:
            SshServer.kill_user_processes(SshServer.user(shell))

    def ssh(self):
        return ["--ssh-config", self.srv.ssh_config]

    def ferry(self, *args, timeout=60):
        return run_ferry(*args, env=self.env, timeout=timeout)

    def detach(self, job, *args, shells=(SHELL,)):
        hosts = [a for s in shells for a in ("--host", self.srv.alias(s))]
        started = time.monotonic()
        res = self.ferry("run", job, *hosts, *self.ssh(), "--detach", "--json", "--out",
                         self.out + "/{run_id}", *args)
        self.assertEqual(res.code, 0, res)
        records = res.records
        self.assertEqual(len(records), len(shells), res)
        for rec in records:
            self.assertEqual(rec["status"], "running", rec)
            self.assertTrue(os.path.isdir(rec["detached"]["run_dir"]), rec)
        return records, time.monotonic() - started

    def attach_argv(self, run_id):
        return [ferry_bin(), "attach", run_id, "--json", *self.ssh()]

    def popen_attach(self, run_id):
        return subprocess.Popen(self.attach_argv(run_id), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, env={**os.environ, **self.env})

    def attach_then(self, run_id, act, timeout=30):
        """`ferry -v attach RUN`, `act()` once it says it is authenticated (its handlers are in
        place by then: a fixed 0.7 s was too short for the ASan build under load), then its end:
        (exit status, stdout, stderr)."""
        with tempfile.TemporaryFile() as said:
            attach = subprocess.Popen([ferry_bin(), "-v", *self.attach_argv(run_id)[1:]],
                                      stdout=subprocess.PIPE, stderr=said, stdin=subprocess.DEVNULL,
                                      env={**os.environ, **self.env})
            self.addCleanup(lambda: attach.poll() is None and attach.kill())
            wait_for(lambda: said.seek(0) == 0 and b"authenticated as" in said.read(), 30,
                     "attach to reach the host")
            act(attach)
            out, _ = attach.communicate(timeout=timeout)
            said.seek(0)
            return attach.returncode, out, said.read()

    def ps(self) -> dict[str, str]:
        res = self.ferry("ps", "--json", *self.ssh())
        self.assertEqual(res.code, 0, res)
        return {row["run_id"]: row["state"] for row in (json.loads(line) for line in res.stdout.splitlines())}

    def assertCollected(self, rec, run_dir):
        self.assertEqual(rec["status"], "ok", rec)
        self.assertNotIn("detached", rec)
        self.assertEqual(rec["result"], {"n": 7})
        self.assertIn("start detached_job\n", rec["stdout"])
        self.assertTrue(rec["stdout"].endswith("end\n"), rec["stdout"])
        self.assertEqual(rec["stderr"], "to stderr\n")
        self.assertEqual([o["path"] for o in rec["outputs"]], ["out/a.txt"], rec)
        with open(os.path.join(self.out, rec["run_id"], "out", "a.txt")) as f:
            self.assertEqual(f.read(), "fetched bytes\n")
        self.assertFalse(os.path.exists(run_dir), f"{run_dir} was not removed")
        shown = self.ferry("show", rec["run_id"], "--json")
        self.assertEqual((shown.code, json.loads(shown.stdout)["status"]), (0, "ok"), shown)

    def test_detach_then_attach_from_another_process(self):
        (rec,), took = self.detach(self.job)
        self.assertLess(took, 2, "ferry run --detach waited for the job")
        self.assertEqual(self.ps().get(rec["run_id"]), "running")
        res = self.ferry("attach", rec["run_id"][-8:], "--json", *self.ssh())
        self.assertEqual(res.code, 0, res)
        self.assertCollected(res.record, rec["detached"]["run_dir"])
        self.assertEqual(res.record["invocation"], rec["invocation"])
        self.assertNotIn(rec["run_id"], self.ps())

    def test_killed_then_stopped_attach_loses_nothing(self):
        (rec,), _ = self.detach(self.job)
        first = self.popen_attach(rec["run_id"])
        time.sleep(0.7)
        first.send_signal(signal.SIGKILL)
        first.communicate()
        # issue 44: the second client is stopped (SIGSTOP) for 30 s while it follows the run, and
        # the job finishes meanwhile. On SIGCONT it collects the run, or (its connection dropped
        # meanwhile) fails clearly with the run still in `ps`, and the next attach collects it.
        run_dir = rec["detached"]["run_dir"]

        def stop_for_30_s(attach):
            attach.send_signal(signal.SIGSTOP)
            stopped_at = time.monotonic()
            wait_for(lambda: os.path.exists(os.path.join(run_dir, ".ferry-done")), 10,
                     "the detached job to finish")
            time.sleep(max(0.0, stopped_at + 30 - time.monotonic()))
            self.assertTrue(os.path.isdir(run_dir), "the run directory went while attach was stopped")
            attach.send_signal(signal.SIGCONT)
        code, out, err = self.attach_then(rec["run_id"], stop_for_30_s, timeout=60)
        if code != 0:
            self.assertNotIn(code, (130,), err)
            self.assertEqual(out, b"", "attach printed a record for a run it did not collect")
            self.assertIn(f"`ferry attach {rec['run_id']}`".encode(), err)
            self.assertIn(rec["run_id"], self.ps())
            res = self.ferry("attach", rec["run_id"], "--json", *self.ssh())
            self.assertEqual(res.code, 0, res)
            out = res.stdout
        self.assertCollected(json.loads(out), run_dir)
        self.assertNotIn(rec["run_id"], self.ps())

    def test_a_lost_connection_during_attach_loses_nothing(self):
        # The SSH connection (not ferry) dies while attach follows the run: attach fails, the job
        # goes on, the run still waits in `ps`, and the next attach collects it whole.
        job = write_job(self.tmp, "slow_job", JOB.replace("sleep 2", "sleep 6"), interpreter="sh",
                        timeout=30, params='outputs = ["out/*"]')
        (rec,), _ = self.detach(job)
        user = SshServer.user(SHELL)
        code, out, err = self.attach_then(
            rec["run_id"], lambda _: self.assertTrue(self.srv.kill_connections(user), "no connection to kill"))
        self.assertNotIn(code, (0, 130), err)
        self.assertEqual(out, b"", "attach printed a record for a run it did not collect")
        self.assertIn(rec["run_id"], self.ps())
        res = self.ferry("attach", rec["run_id"], "--json", *self.ssh())
        self.assertEqual(res.code, 0, res)
        self.assertEqual(res.record["status"], "ok", res.record)
        self.assertEqual(res.record["result"], {"n": 7})
        self.assertIn("start slow_job\n", res.record["stdout"])
        self.assertTrue(res.record["stdout"].endswith("end\n"), res.record["stdout"])
        self.assertFalse(os.path.exists(rec["detached"]["run_dir"]))
        self.assertNotIn(rec["run_id"], self.ps())

    def test_ctrl_c_detaches_again_and_stop_stops_the_job(self):
        (rec,), _ = self.detach(self.long)
        code, _, err = self.attach_then(rec["run_id"], lambda attach: attach.send_signal(signal.SIGINT),
                                        timeout=10)
        self.assertEqual(code, 130, err)
        self.assertEqual(self.ps().get(rec["run_id"]), "running")
        user = SshServer.user(SHELL)
        started = time.monotonic()
        res = self.ferry("stop", "last", "--json", *self.ssh())
        self.assertEqual(res.code, 0, res)
        self.assertLess(time.monotonic() - started, 10)
        self.assertEqual(res.record["status"], "interrupted", res)
        self.assertIn("long\n", res.record["stdout"])
        self.assertFalse(os.path.exists(rec["detached"]["run_dir"]))
        self.assertEqual(SshServer.wait_no_processes(user, 5), [], SshServer.describe_processes(user))
        self.assertNotIn(rec["run_id"], self.ps())

    def test_stop_runs_nothing_the_job_could_rewrite(self):
        # issue 45's rule: `ferry stop` executes no file of the run directory, where the job can
        # write; it still stops the job and records it interrupted.
        marker = f"/tmp/ferry-hijack-{os.getpid()}-{time.monotonic_ns()}"
        self.addCleanup(lambda: os.path.exists(marker) and os.unlink(marker))
        job = write_job(self.tmp, "hijack_job", HIJACK.replace("$MARKER", marker), interpreter="sh",
                        timeout=60)
        (rec,), _ = self.detach(job)
        run_dir = rec["detached"]["run_dir"]
        def rewritten():
            with open(os.path.join(run_dir, "launch.sh"), "rb") as f:
                return b"touch" in f.read()
        wait_for(rewritten, 10, "the job to rewrite its launch.sh")
        res = self.ferry("stop", rec["run_id"], "--json", *self.ssh())
        self.assertFalse(os.path.exists(marker), "ferry stop ran the bytes the job wrote into launch.sh")
        self.assertEqual(res.code, 0, res)
        self.assertEqual(res.record["status"], "interrupted", res)
        self.assertIn("hijacked\n", res.record["stdout"])
        self.assertFalse(os.path.exists(run_dir))
        user = SshServer.user(SHELL)
        self.assertEqual(SshServer.wait_no_processes(user, 5), [], SshServer.describe_processes(user))

    def test_a_killed_launcher_is_lost_and_attach_records_it_failed(self):
        # The host as after a reboot: the launcher and the job's group SIGKILLed, no done file.
        (rec,), _ = self.detach(self.group)
        run_dir = rec["detached"]["run_dir"]
        state, pid_file = os.path.join(run_dir, ".ferry-launcher"), os.path.join(run_dir, "job.pid")
        wait_for(lambda: os.path.exists(state) and os.path.exists(pid_file) and os.path.getsize(pid_file) > 0,
                 10, "the job to start")
        with open(state) as f:
            launcher = int(f.read().split()[0])
        with open(pid_file) as f:
            job = int(f.read())
        self.assertEqual(self.ps().get(rec["run_id"]), "running")
        os.kill(launcher, signal.SIGKILL)
        os.killpg(job, signal.SIGKILL)
        self.assertEqual(self.ps().get(rec["run_id"]), "lost")
        res = self.ferry("attach", rec["run_id"], "--json", *self.ssh())
        self.assertEqual(res.code, 1, res)
        self.assertEqual(res.record["status"], "failed", res)
        self.assertIn("died without an exit status", res.record["error"])
        self.assertIn("before the kill\n", res.record["stdout"])
        self.assertFalse(os.path.exists(run_dir))
        self.assertNotIn(rec["run_id"], self.ps())

    def test_output_is_capped_on_the_host(self):
        (rec,), _ = self.detach(self.flood, "--output-cap", "1")
        run_dir = rec["detached"]["run_dir"]
        wait_for(lambda: os.path.exists(os.path.join(run_dir, ".ferry-done")), 20, "the job to end")
        size = os.path.getsize(os.path.join(run_dir, ".ferry-stdout"))
        self.assertLess(size, (1 << 20) + 4096, "the host kept more than the output cap")
        res = self.ferry("attach", rec["run_id"], "--json", *self.ssh())
        self.assertEqual(res.code, 0, res)
        out = res.record["stdout"]
        self.assertTrue(res.record["stdout_truncated"], res.record["warnings"])
        self.assertEqual(len(out), 1 << 20)
        self.assertTrue(out.startswith("aaaa") and out.endswith("a\nlast line\n"), out[-40:])
        self.assertEqual(res.record["stderr"], "err line\n")
        self.assertFalse(res.record["stderr_truncated"])
        warned = [w["message"] for w in res.record["warnings"] if w["code"] == "output-truncated"]
        self.assertEqual(len(warned), 1, res.record["warnings"])
        self.assertIn(f"{3145728 + 1 + 10 - (1 << 20)} bytes of stdout", warned[0])

    def test_a_finished_run_waits_for_keep_for_then_the_sweep_removes_it(self):
        detached_at = time.monotonic()
        (short,), _ = self.detach(self.quick, "--keep-for", "1s", "--timeout", "1")
        (kept,), _ = self.detach(self.quick)
        for rec in (short, kept):
            done = os.path.join(rec["detached"]["run_dir"], ".ferry-done")
            wait_for(lambda: os.path.exists(done), 10, f"{done}")
        self.assertEqual(self.ps()[short["run_id"]], "finished")
        # Both finished two minutes ago, as the sweep sees it: past 1 s, not past 7 days.
        past = time.time() - 120
        for rec in (short, kept):
            os.utime(rec["detached"]["run_dir"], (past, past))
        swept = self.ferry("run", self.quick, "--host", self.srv.alias(SHELL), *self.ssh(), "--json")
        self.assertEqual(swept.code, 0, swept)
        self.assertFalse(os.path.exists(short["detached"]["run_dir"]), "the expired run was not swept")
        self.assertTrue(os.path.exists(kept["detached"]["run_dir"]), "a run within --keep-for was swept")
        # `ps` says expired once the run's timeout, grace and --keep-for have passed since it started.
        time.sleep(max(0.0, detached_at + 4.3 - time.monotonic()))
        self.assertEqual(self.ps()[short["run_id"]], "expired")
        gone = self.ferry("attach", short["run_id"], *self.ssh())
        self.assertEqual(gone.code, 1, gone)
        self.assertIn(b"is gone from", gone.stderr)
        res = self.ferry("attach", kept["run_id"], "--json", *self.ssh())
        self.assertEqual((res.code, res.record["stdout"]), (0, "quick\n"), res)

    def test_a_fleet_detaches_with_one_id_per_run_and_each_is_attached(self):
        records, _ = self.detach(self.job, shells=FLEET)
        self.assertEqual(len({r["run_id"] for r in records}), 3)
        self.assertEqual(len({r["invocation"] for r in records}), 1)
        for rec in records:
            res = self.ferry("attach", rec["run_id"], "--json", *self.ssh())
            self.assertEqual(res.code, 0, res)
            self.assertCollected(res.record, rec["detached"]["run_dir"])
            self.assertEqual(res.record["target"]["host"], rec["target"]["host"])

    def test_local_detach_and_attach(self):
        res = self.ferry("run", self.job, "--local", "--detach", "--json", "--out", self.out + "/{run_id}")
        self.assertEqual(res.code, 0, res)
        rec = res.record
        self.assertEqual((rec["status"], rec["target"]), ("running", {"local": True}))
        self.assertEqual(self.ps().get(rec["run_id"]), "running")
        done = self.ferry("attach", rec["run_id"], "--json")
        self.assertEqual(done.code, 0, done)
        self.assertCollected(done.record, rec["detached"]["run_dir"])

    def test_two_attaches_at_once_collect_the_run_once(self):
        # One collector per run on this machine: the second attach waits for the first and
        # prints the final record it archived; the run is archived once, its directory removed.
        job = write_job(self.tmp, "twice_job", JOB.replace("sleep 2", "sleep 4"), interpreter="sh",
                        timeout=30, params='outputs = ["out/*"]')
        (rec,), _ = self.detach(job)
        attaches = [self.popen_attach(rec["run_id"]) for _ in range(2)]
        ends = [a.communicate(timeout=60) for a in attaches]
        for attach, (out, err) in zip(attaches, ends):
            self.assertEqual(attach.returncode, 0, err)
            got = json.loads(out)
            self.assertEqual((got["run_id"], got["status"]), (rec["run_id"], "ok"), got)
            self.assertIn("start twice_job\n", got["stdout"])
            self.assertEqual(got["result"], {"n": 7})
        waited = [err for _, err in ends if b"another ferry on this machine is collecting" in err]
        self.assertEqual(len(waited), 1, [err for _, err in ends])
        self.assertFalse(os.path.exists(rec["detached"]["run_dir"]))
        logged = self.ferry("log", "--json")
        self.assertEqual(logged.code, 0, logged)
        ids = [json.loads(line)["run_id"] for line in logged.stdout.splitlines()]
        self.assertEqual(ids.count(rec["run_id"]), 1, ids)
        shown = self.ferry("show", rec["run_id"], "--json")
        self.assertEqual((shown.code, json.loads(shown.stdout)["status"]), (0, "ok"), shown)
        self.assertNotIn(rec["run_id"], self.ps())


if __name__ == "__main__":
    unittest.main()
