"""Several jobs on one host at once (issue 16): runs for the same host go on concurrent channels
of its one SSH session, bounded by -j and by the server's MaxSessions (learnt from a refused
channel), and their records and output come back whole and in the order of the plan.

Each job records, on the host (this machine), when it started and ended; overlapping intervals
show that runs shared the session at once, and the most that overlap at any instant shows the
bound. The jobs write no result file of their own beyond the one read here.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from ferry_harness import run_ferry, write_job  # noqa: E402
from sshd_fixture import SshServer, require_root_and_tools  # noqa: E402

JOBS = 6
SLEEP_S = 1.5

BODY = '''
import json, os, time
start = time.time()
print("begin", os.environ["FERRY_JOB"], flush=True)
time.sleep({sleep})
print("end", os.environ["FERRY_JOB"], flush=True)
with open(os.environ["FERRY_RESULT"], "w") as f:
    json.dump({{"job": os.environ["FERRY_JOB"], "start": start, "end": time.time()}}, f)
'''


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


class ConcurrentChannels(unittest.TestCase):
    def setUp(self):
        require_root_and_tools()
        self.tmp = tempfile.mkdtemp(prefix="ferry-channels-")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.env = {"FERRY_ARCHIVE": os.path.join(self.tmp, "a.db")}
        self.jobs = [write_job(self.tmp, f"lane{i}", BODY.format(sleep=SLEEP_S)) for i in range(JOBS)]

    def run_all(self, srv: SshServer, *extra: str):
        res = run_ferry("run", *self.jobs, "--host", srv.alias("bash"), "--ssh-config", srv.ssh_config,
                        "--json", *extra, env=self.env, timeout=120)
        self.assertEqual(res.code, 0, res)
        records = res.records
        # Records in the order of the plan, each with its own output, whole.
        self.assertEqual([r["job"] for r in records], [f"lane{i}" for i in range(JOBS)], res)
        for r in records:
            self.assertEqual(r["status"], "ok", r)
            self.assertEqual(r["stdout"], f"begin {r['job']}\nend {r['job']}\n", r)
            self.assertEqual(r["result"]["job"], r["job"])
        self.assertEqual(srv.run_dirs(srv.user("bash")), [])
        return [(r["result"]["start"], r["result"]["end"]) for r in records]

    def test_jobs_of_one_host_share_its_session_bounded_by_parallel(self):
        with SshServer() as srv:
            peak = most_at_once(self.run_all(srv, "-j", "3"))
        self.assertEqual(peak, 3, "with -j 3, three jobs of the one host should run at once")

    def test_a_refused_channel_lowers_the_bound_to_what_the_server_allows(self):
        # MaxSessions 3: the SFTP channel and two execs at once.
        with SshServer(extra_config="MaxSessions 3") as srv:
            peak = most_at_once(self.run_all(srv, "-j", "6"))
        self.assertGreaterEqual(peak, 2, "two jobs should still have run at once")
        self.assertLessEqual(peak, 2, "the server allows only two exec channels next to SFTP")

    def test_one_at_a_time_with_parallel_one(self):
        with SshServer() as srv:
            peak = most_at_once(self.run_all(srv, "-j", "1"))
        self.assertEqual(peak, 1)


if __name__ == "__main__":
    unittest.main()
