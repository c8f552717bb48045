"""`--gpus N` on a plain SSH host (issue 44 item 5): the launcher picks N GPUs that a fake
nvidia-smi shows free, locks them under the run base for the run's life, and gives the job
CUDA_VISIBLE_DEVICES; two runs never share one, a run that finds too few fails naming the busy
ones, `--wait-gpus` waits for a holder to end, and a killed launcher's locks are taken over."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from ferry_harness import run_ferry, write_job  # noqa: E402
from sshd_fixture import SshServer  # noqa: E402

SHELL = "dash"  # a login shell that reads no startup file: the PATH the launcher sees is sshd's

# 8 GPUs: GPU 3 runs a compute process, GPU 5 has 30000 MiB used, so 6 are free; and a line no
# nvidia-smi prints (control bytes, shell text) that must be refused, never run or shown.
FAKE_NVIDIA_SMI = r"""#!/bin/sh
case "$*" in
*--query-gpu=index,uuid,memory.used*)
  for i in 0 1 2 3 4 5 6 7; do
    mem=3
    [ "$i" = 5 ] && mem=30000
    printf '%s, GPU-0000000%s-aaaa-bbbb-cccc-ddddeeeeffff, %s\n' "$i" "$i" "$mem"
  done
  printf '8, GPU-\033[31m$(touch /tmp/ferry-gpus-pwned);x, 0\n'
  ;;
*--query-compute-apps=gpu_uuid*)
  printf 'GPU-00000003-aaaa-bbbb-cccc-ddddeeeeffff\n'
  ;;
*)
  echo "fake nvidia-smi: unexpected arguments: $*" >&2
  exit 9
  ;;
esac
"""

FREE = {0, 1, 2, 4, 6, 7}

# Waits (up to 30 s) for $HOME/gpu-go, then reports what it was given.
JOB = r"""
n=0
while [ ! -e "$HOME/gpu-go" ] && [ "$n" -lt 300 ]; do sleep 0.1; n=$((n + 1)); done
printf '{"cvd": "%s", "order": "%s"}\n' "${CUDA_VISIBLE_DEVICES-unset}" "${CUDA_DEVICE_ORDER-unset}" >"$FERRY_RESULT"
"""


def uuid(index: int) -> str:
    return f"GPU-0000000{index}-aaaa-bbbb-cccc-ddddeeeeffff"


class Gpus(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="ferry-gpus-")
        os.chmod(cls.tmp, 0o755)
        cls.fakebin = os.path.join(cls.tmp, "bin")
        os.mkdir(cls.fakebin, 0o755)
        fake = os.path.join(cls.fakebin, "nvidia-smi")
        with open(fake, "w") as f:
            f.write(FAKE_NVIDIA_SMI)
        os.chmod(fake, 0o755)
        user = SshServer.user(SHELL)
        # sshd's SetEnv comes after its default PATH: the fake is first on the launcher's PATH.
        cls.srv = SshServer(extra_config=f"Match User {user}\n"
                                         f"    SetEnv PATH={cls.fakebin}:/usr/local/bin:/usr/bin:/bin\n").start()
        cls.user = user
        cls.home = SshServer.home(user)
        pw = pwd.getpwnam(user)
        cls.uid = pw.pw_uid
        cls.locks = os.path.join(cls.home, ".cache", "ferry", "runs", f"ferry-gpus-{pw.pw_uid}")
        cls.go = os.path.join(cls.home, "gpu-go")
        cls.job = write_job(cls.tmp, "gpu_job", JOB, interpreter="sh", timeout=60)
        cls.env = {"FERRY_ARCHIVE": os.path.join(cls.tmp, "archive.db")}

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        if os.path.exists(self.go):
            os.unlink(self.go)

    def tearDown(self):
        open(self.go, "w").close()  # no job stays waiting
        if SshServer.wait_no_processes(self.user, 2):
            SshServer.kill_user_processes(self.user)  # a killed launcher's watchdog

    def ferry(self, *args, env=None):
        return run_ferry("run", self.job, "--host", self.srv.alias(SHELL), "--ssh-config",
                         self.srv.ssh_config, "--json", *args, env={**self.env, **(env or {})}, timeout=90)

    def in_background(self, *args):
        box = {}
        thread = threading.Thread(target=lambda: box.setdefault("res", self.ferry(*args)))
        thread.start()
        return thread, box

    def held(self) -> dict[str, str]:
        """The GPU locks on the host: UUID -> its owner line."""
        held = {}
        for name in os.listdir(self.locks) if os.path.isdir(self.locks) else []:
            try:
                with open(os.path.join(self.locks, name, "owner")) as f:
                    held[name] = f.read().strip()
            except OSError:
                held[name] = ""
        return held

    def wait_held(self, count: int):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            held = self.held()
            if len(held) >= count and all(held.values()):
                return held
            time.sleep(0.05)
        self.fail(f"{count} GPU locks never appeared under {self.locks}: {self.held()}")

    def assertGot(self, res, count: int) -> set[int]:
        rec = res.record
        self.assertEqual((res.code, rec["status"]), (0, "ok"), f"{rec['error']}\n{res}")
        indices = [gpu["index"] for gpu in rec["gpus"]]
        self.assertEqual(len(indices), count, rec["gpus"])
        self.assertEqual([gpu["uuid"] for gpu in rec["gpus"]], [uuid(i) for i in indices])
        self.assertEqual(rec["result"], {"cvd": ",".join(map(str, indices)), "order": "PCI_BUS_ID"})
        self.assertLessEqual(set(indices), FREE)
        self.assertEqual(rec["options"]["gpus"], count)
        return set(indices)

    def test_runs_get_disjoint_gpus_a_third_is_refused_and_a_waiting_one_gets_them(self):
        a, a_box = self.in_background("--gpus", "3")
        b, b_box = self.in_background("--gpus", "3")
        self.wait_held(6)
        # All 6 free GPUs are held: a run that asks for 1 fails at once, naming every busy GPU.
        refused = self.ferry("--gpus", "1")
        rec = refused.record
        self.assertEqual((refused.code, rec["status"], rec["exit_code"]), (1, "failed", 75), refused)
        self.assertIn("the job did not start: not enough free GPUs: 0 of 8 free, 1 wanted", rec["error"])
        self.assertIn(f"GPU 3 ({uuid(3)}): 1 compute process", rec["error"])
        self.assertIn(f"GPU 5 ({uuid(5)}): 30000 MiB used", rec["error"])
        for index in FREE:
            self.assertRegex(rec["error"], rf"GPU {index} \({uuid(index)}\): held by ferry run ferry-\d{{8}}T\d{{6}}Z-[0-9a-f]{{32}} \(launcher pid \d+\)")
        self.assertIn("a line of nvidia-smi's that ferry cannot read", rec["error"])
        self.assertNotIn(b"\x1b", refused.stdout + refused.stderr)
        self.assertFalse(os.path.exists("/tmp/ferry-gpus-pwned"))
        self.assertNotIn("gpus", rec)
        # One that may wait gets its GPUs once the holders end.
        # Through a connection holder: the request travels in the launcher's fields to it.
        d, d_box = self.in_background("--gpus", "2", "--wait-gpus", "30", "--persist", "5")
        time.sleep(3)
        self.assertTrue(d.is_alive(), "the waiting run ended while every free GPU was held")
        open(self.go, "w").close()
        for thread in (a, b, d):
            thread.join(60)
        got_a, got_b = self.assertGot(a_box["res"], 3), self.assertGot(b_box["res"], 3)
        self.assertEqual(got_a & got_b, set(), "two runs were given the same GPU")
        self.assertGot(d_box["res"], 2)
        self.assertEqual(self.held(), {}, "GPU locks left after the runs ended")

    def test_a_killed_launchers_locks_are_taken_over(self):
        e, e_box = self.in_background("--gpus", "6")
        held = self.wait_held(6)
        launcher = int(next(iter(held.values())).split()[0])
        # One lock names a live process of the user whose start time is not the one recorded (its
        # launcher's pid reused): stale as well.
        reused = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: os.setuid(self.uid))
        try:
            with open(os.path.join(self.locks, uuid(0), "owner"), "w") as f:
                f.write(f"{reused.pid} 12345 ferry-20261205T000000Z-{'0' * 32}\n")
            os.kill(launcher, signal.SIGKILL)
            e.join(60)
            self.assertEqual(e_box["res"].record["status"], "failed", e_box["res"])
            self.assertEqual(len(self.held()), 6, "the killed launcher's locks are not left as they were")
            open(self.go, "w").close()
            self.assertEqual(self.assertGot(self.ferry("--gpus", "6"), 6), FREE)
            self.assertIsNone(reused.poll(), "the reused pid's process did not live through the pick")
        finally:
            reused.kill()
            reused.wait()
        self.assertEqual(self.held(), {})

    def test_no_nvidia_smi_is_named(self):
        path = "/usr/bin:/bin"
        if shutil.which("nvidia-smi", path=path):
            self.fail(f"this case needs a machine without nvidia-smi on {path}")
        res = run_ferry("run", self.job, "--local", "--gpus", "1", "--json",
                        env={**self.env, "PATH": path})
        rec = res.record
        self.assertEqual((res.code, rec["status"], rec["exit_code"]), (1, "failed", 75), res)
        self.assertIn("nvidia-smi not found on this host", rec["error"])

    def test_bad_gpu_counts_are_usage_errors(self):
        for bad in ("0", "65", "a100:2", "-1"):
            with self.subTest(bad=bad):
                res = run_ferry("run", self.job, "--local", "--gpus=" + bad, env=self.env)
                self.assertEqual(res.code, 2, res)
                self.assertIn(b"--gpus", res.stderr)


if __name__ == "__main__":
    unittest.main()
