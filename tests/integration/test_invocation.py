"""One invocation, one id (issue 43 item 5), against a real sshd: every record of a `ferry run`
carries the invocation's id, `ferry log --invocation` lists exactly its runs, and
`ferry run --retry-failed` runs again exactly the runs of an invocation that did not end ok, on
their hosts, with their archived job bytes and parameters, as one new invocation."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from ferry_harness import SshTestCase, run_ferry, write_job  # noqa: E402

# Fails on a host whose user has a file named after it in the test's marker directory (the test
# makes and removes them: the host "recovers" between the invocation and its retry).
JOB = '''
marker="$MARKERS/fail-$(id -un)"
if [ -e "$marker" ]; then echo "told to fail" >&2; exit 7; fi
printf '{"user": "%s", "params": %s}' "$(id -un)" "$(cat "$FERRY_PARAMS")" > "$FERRY_RESULT"
'''


class Invocation(SshTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.markers = tempfile.mkdtemp(prefix="ferry-markers-")
        os.chmod(cls.markers, 0o755)
        cls.job = write_job(cls.tmp, "flaky", JOB, interpreter="sh", params='''
            [env]
            MARKERS = "%s"
            [params.n]
            type = "int"
            default = 1
            ''' % cls.markers)
        cls.shells = ["bash", "zsh", "dash"]
        cls.hosts = ",".join(cls.srv.alias(s) for s in cls.shells)

    def run_all(self, *args):
        return run_ferry("run", *args, "--ssh-config", self.srv.ssh_config, env=self.env)

    def log(self, *args) -> list[dict]:
        res = run_ferry("log", "--json", *args, env=self.env)
        self.assertEqual(res.code, 0, res)
        return [json.loads(line) for line in res.stdout.decode().splitlines() if line.strip()]

    def test_retry_failed_runs_exactly_the_failed_hosts_again(self):
        failing = self.srv.user("zsh")
        marker = os.path.join(self.markers, f"fail-{failing}")
        open(marker, "w").close()
        first = self.run_all(self.job, "--host", self.hosts, "-p", "n=42", "--json")
        self.assertEqual(first.code, 1, first)
        records = [json.loads(line) for line in first.stdout.decode().splitlines()]
        self.assertEqual(len(records), 3, first)
        ids = {r["invocation"] for r in records}
        self.assertEqual(len(ids), 1, records)          # one id for the whole invocation
        invocation = ids.pop()
        self.assertEqual(sorted(r["status"] for r in records), ["failed", "ok", "ok"])
        listed = self.log("--invocation", "last")
        self.assertEqual(sorted(r["run_id"] for r in listed), sorted(r["run_id"] for r in records))
        self.assertEqual(len(self.log("--invocation", invocation[:-2])), 3)   # a unique prefix

        # The host recovers; only its run goes again, with the archived parameters.
        os.unlink(marker)
        retry = self.run_all("--retry-failed", "--json")
        self.assertEqual(retry.code, 0, retry)
        again = [json.loads(line) for line in retry.stdout.decode().splitlines()]
        self.assertEqual(len(again), 1, retry)
        self.assertEqual(again[0]["status"], "ok", again)
        self.assertEqual(again[0]["result"], {"user": failing, "params": {"n": 42}})
        self.assertNotEqual(again[0]["invocation"], invocation)
        self.assertIn(f"of invocation {invocation}".encode(), retry.stderr)
        self.assertEqual([r["run_id"] for r in self.log("--invocation", "last")], [again[0]["run_id"]])
        # Nothing failed in the retry: nothing more to do, said, exit 0.
        none = self.run_all("--retry-failed", "last")
        self.assertEqual(none.code, 0, none)
        self.assertIn(b"nothing to retry", none.stderr)

    def test_retry_failed_refuses_what_would_choose_other_runs(self):
        res = run_ferry("run", self.job, "--retry-failed", "--host", "127.0.0.1", env=self.env)
        self.assertEqual(res.code, 2, res)
        self.assertIn(b"--retry-failed runs the failed runs' own", res.stderr)
        res = self.run_all("--retry-failed", "no-such-invocation")
        self.assertEqual(res.code, 2, res)
        self.assertIn(b"no invocation 'no-such-invocation'", res.stderr)
        res = run_ferry("log", "--invocation", "no-such", env=self.env)
        self.assertEqual(res.code, 2, res)


if __name__ == "__main__":
    unittest.main()
