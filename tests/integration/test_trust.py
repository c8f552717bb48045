"""What ferry trusts on a host before it runs anything there (docs/run-protocol.md, "Stage"; issue
45 item 1): the run base and every directory above it up to the first of root's, as sshd's
StrictModes trusts the path to a user's keys, and the files it runs from the base (the job cache's
entries, the python standby's script and its compiled code).

A table: each row makes one thing on the host untrustworthy, as another user of the host could
(a directory open to others, a directory or a file of another user's), and runs ferry on every
path that stages and launches a run there: a direct connection's only run (over SFTP, or, once
this machine has noted the python standby's script in the job cache, staged by that standby
without SFTP), a direct fan-out (whose later runs go to python standbys), and runs through a
holder. A directory row must refuse the run
with a message naming the directory and the fix; a file row must run the user's own bytes, never
the planted ones. The planted bytes, run, would leave a marker file: it must never appear."""
import glob
import hashlib
import marshal
import os
import pwd
import shutil
import tempfile
import time
import unittest

from ferry_harness import run_ferry, write_job
from sshd_fixture import SshServer, require_root_and_tools

VICTIM = "bash"
OTHER = "dash"  # another user of the host

STAGED = b"the run is staged by a python standby, without SFTP"
NOT_STAGED = b"the python standby did not stage the run"

JOB = """
import json, os
json.dump({"honest": True}, open(os.environ["FERRY_RESULT"], "w"))
"""


def wait_for(predicate, timeout_s=15.0):
    until = time.monotonic() + timeout_s
    while time.monotonic() < until:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


class TrustOnTheHost(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        require_root_and_tools()
        cls.srv = SshServer().start()
        cls.addClassCleanup(cls.srv.stop)
        cls.user = cls.srv.user(VICTIM)
        cls.home = SshServer.home(cls.user)
        cls.pw = pwd.getpwnam(cls.user)
        cls.other = pwd.getpwnam(cls.srv.user(OTHER))
        cls.tmp = tempfile.mkdtemp(prefix="ferry-trust-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        os.chmod(cls.tmp, 0o755)
        cls.runtime = os.path.join(cls.tmp, "runtime")
        os.mkdir(cls.runtime, 0o700)
        cls.markers = os.path.join(cls.tmp, "markers")
        os.mkdir(cls.markers)
        os.chmod(cls.markers, 0o777)
        cls.job = write_job(cls.tmp, "honest", JOB)
        with open(cls.job, "rb") as f:
            cls.job_bytes = f.read()
        cls.base = os.path.join(cls.home, ".cache", "ferry", "runs")

    def setUp(self):
        shutil.rmtree(os.path.join(self.home, ".cache"), ignore_errors=True)
        # No note of the standby's script from an earlier test: warm's holder writes one.
        for note in glob.glob(os.path.join(self.runtime, "ferry", "*.standby")):
            os.unlink(note)
        self.env = {"FERRY_ARCHIVE": os.path.join(self.tmp, "archive.db"),
                    "XDG_RUNTIME_DIR": self.runtime}
        self.marker = os.path.join(self.markers, self.id().rsplit(".", 1)[-1])

    def tearDown(self):
        run_ferry("disconnect", "--all", env=self.env)
        SshServer.kill_user_processes(self.user)
        for path in (os.path.join(self.home, ".cache"), os.path.join(self.home, ".cache", "ferry")):
            if os.path.isdir(path):
                os.chown(path, self.pw.pw_uid, self.pw.pw_gid)
                os.chmod(path, 0o700)
        os.chmod(self.home, 0o755)
        self.assertFalse(os.path.exists(self.marker), "ferry ran bytes another user planted")

    # --- helpers -----------------------------------------------------------------------------

    def ferry(self, *args, persist=False, host_args=()):
        env = {**self.env, "FERRY_PERSIST": "" if persist else "0"}
        return run_ferry("-v", "run", *args, "--host", self.srv.alias(VICTIM), "--ssh-config",
                         self.srv.ssh_config, *host_args, "--json", env=env, timeout=120)

    def hostile(self, size: int) -> bytes:
        """Python that leaves the marker, padded to `size` bytes (a planted cache entry has the
        size of the bytes it stands in for)."""
        code = f"open({self.marker!r}, 'w').write('planted')\n".encode()
        self.assertLessEqual(len(code), size)
        return code + b"#" * (size - len(code) - 1) + b"\n"

    def plant(self, path: str, data: bytes, owner=None, mode=0o400):
        """A file at `path` as another user would leave it (by default: that user's, 0400)."""
        owner = owner or self.other
        if os.path.lexists(path):
            os.chmod(path, 0o600)
            os.unlink(path)
        with open(path, "wb") as f:
            f.write(data)
        os.chown(path, owner.pw_uid, owner.pw_gid)
        os.chmod(path, mode)

    def warm(self):
        """One run through a holder, which puts the python standby's script in the job cache;
        returns the script's entry."""
        res = self.ferry(self.job, persist=True)
        self.assertEqual(res.code, 0, res)
        def standby_script():
            for path in glob.glob(os.path.join(self.base, "ferry-job-*.py")):
                with open(path, "rb") as f:
                    if f.read(40).startswith(b"# ferry's python standby"):
                        return path
            return None
        script = wait_for(standby_script)
        self.assertTrue(script, "the holder did not put the python standby's script in the cache")
        # ... and noted it for a later direct connection's only run (its path without SFTP).
        def noted():
            for note in glob.glob(os.path.join(self.runtime, "ferry", "*.standby")):
                with open(note) as f:
                    if f.read().strip() == script:
                        return note
            return None
        self.assertTrue(wait_for(noted), "the holder left no note of the standby's script")
        run_ferry("disconnect", "--all", env=self.env)
        self.assertEqual(SshServer.wait_no_processes(self.user, timeout_s=10), [],
                         SshServer.describe_processes(self.user))
        return script

    def only_run_without_sftp(self, *args, host_args=()):
        """A direct connection's only run on the path without SFTP (warm left the note): that
        path is tried, and it does not stage the run."""
        res = self.ferry(self.job, *args, host_args=host_args)
        self.assertIn(STAGED, res.stderr, res)
        self.assertIn(NOT_STAGED, res.stderr, res)
        return res

    def job_entry(self) -> str:
        return os.path.join(self.base, "ferry-job-" + hashlib.sha256(self.job_bytes).hexdigest() + ".py")

    def assert_refused(self, res, *said: str):
        self.assertEqual(res.code, 1, res)
        for rec in res.records:
            self.assertEqual(rec["status"], "error", rec)
            for text in said:
                self.assertIn(text, rec["error"], rec)

    def assert_honest(self, res, runs=1):
        self.assertEqual(res.code, 0, res)
        self.assertEqual(len(res.records), runs, res)
        for rec in res.records:
            self.assertEqual(rec["status"], "ok", rec)
            self.assertEqual(rec["result"], {"honest": True}, rec)

    # --- directories: refused, naming the directory and the fix ------------------------------

    def refused_on_every_path(self, *said: str, host_args=()):
        self.assert_refused(self.ferry(self.job, host_args=host_args), *said)
        self.assert_refused(self.ferry(self.job, self.job, "-j", "2", host_args=host_args), *said)
        # With persistence on: the direct run, then one through the holder it left.
        self.assert_refused(self.ferry(self.job, persist=True, host_args=host_args), *said)
        self.assert_refused(self.ferry(self.job, persist=True, host_args=host_args), *said)

    def test_a_cache_directory_open_to_others_is_refused(self):
        script = self.warm()
        cache = os.path.join(self.home, ".cache")
        os.chmod(cache, 0o777)
        # What another user could then do: swap in what ferry would run.
        self.plant(script, self.hostile(os.path.getsize(script)), owner=self.pw)
        self.refused_on_every_path(f"{cache}, above the run base, is writable by group or others "
                                   "(mode 777)", f"chmod go-w {cache}")

    def test_a_home_open_to_others_is_refused(self):
        os.chmod(self.home, 0o777)
        self.refused_on_every_path(f"{self.home}, above the run base, is writable by group or others")

    def test_a_directory_of_another_users_above_the_base_is_refused(self):
        self.warm()
        cache = os.path.join(self.home, ".cache")
        os.chown(cache, self.other.pw_uid, self.other.pw_gid)
        os.chmod(cache, 0o755)
        self.refused_on_every_path(f"{cache}, above the run base, belongs to uid {self.other.pw_uid}")

    def test_a_group_writable_project_directory_as_remote_base_is_refused(self):
        project = tempfile.mkdtemp(prefix="project-", dir="/var/lib/ferry-test")
        self.addCleanup(shutil.rmtree, project, ignore_errors=True)
        os.chmod(project, 0o2775)
        base = os.path.join(project, "runs")
        os.mkdir(base, 0o700)
        os.chown(base, self.pw.pw_uid, self.pw.pw_gid)
        self.refused_on_every_path(f"{project}, above the run base, is writable by group or others "
                                   "(mode 2775) and not sticky", host_args=("--remote-base", base))

    def test_tmp_as_remote_base_is_refused_with_a_private_directory_under_it(self):
        private = f"/tmp/ferry-{self.user}"
        self.addCleanup(shutil.rmtree, private, ignore_errors=True)
        res = self.ferry(self.job, host_args=("--remote-base", "/tmp"))
        self.assert_refused(res, "shared by every user", f"--remote-base {private}")
        self.assertNotIn("chmod", res.record["error"])
        self.assert_honest(self.ferry(self.job, host_args=("--remote-base", private)))
        st = os.lstat(private)
        self.assertEqual((st.st_uid, st.st_mode & 0o7777), (self.pw.pw_uid, 0o700))

    def test_a_base_open_to_others_is_refused_on_the_only_run_without_sftp(self):
        self.warm()
        os.chmod(self.base, 0o770)
        try:
            res = self.only_run_without_sftp()
        finally:
            os.chmod(self.base, 0o700)
        self.assert_refused(res, f"the run base {self.base} is writable by group or others",
                            f"chmod 700 {self.base}")

    def test_a_directory_of_another_users_above_the_base_is_refused_on_the_only_run_without_sftp(self):
        self.warm()
        ferry_dir = os.path.join(self.home, ".cache", "ferry")
        os.chown(ferry_dir, self.other.pw_uid, self.other.pw_gid)
        os.chmod(ferry_dir, 0o755)
        res = self.only_run_without_sftp()
        self.assert_refused(res, f"{ferry_dir}, above the run base, belongs to uid {self.other.pw_uid}")

    # --- files: another user's bytes, or bytes others could write, are never run -------------

    def test_a_job_cache_entry_of_another_users_is_not_run(self):
        self.assert_honest(self.ferry(self.job))
        entry = self.job_entry()
        self.plant(entry, self.hostile(len(self.job_bytes)))
        self.assert_honest(self.ferry(self.job))
        self.plant(entry, self.hostile(len(self.job_bytes)))
        self.assert_honest(self.ferry(self.job, self.job, "-j", "2"), runs=2)
        self.plant(entry, self.hostile(len(self.job_bytes)))
        self.assert_honest(self.ferry(self.job, persist=True))
        self.assert_honest(self.ferry(self.job, persist=True))
        st = os.lstat(entry)
        self.assertEqual((st.st_uid, st.st_mode & 0o777), (self.pw.pw_uid, 0o400))

    def test_a_job_cache_entry_others_could_write_is_not_run(self):
        self.assert_honest(self.ferry(self.job))
        entry = self.job_entry()
        self.plant(entry, self.hostile(len(self.job_bytes)), owner=self.pw, mode=0o666)
        self.assert_honest(self.ferry(self.job, self.job, "-j", "2"), runs=2)

    def test_a_standby_script_of_another_users_is_not_run(self):
        script = self.warm()
        size = os.path.getsize(script)
        self.plant(script, self.hostile(size))
        # A direct fan-out's later runs go to python standbys; a holder runs them from its start.
        self.assert_honest(self.ferry(self.job, self.job, "-j", "1"), runs=2)
        self.plant(script, self.hostile(size))
        for _ in range(3):
            self.assert_honest(self.ferry(self.job, persist=True))

    def test_a_rewritten_standby_script_is_not_run_on_the_only_run_without_sftp(self):
        script = self.warm()
        # The user's own file, mode 0400, its size kept: only its sha256 tells it apart.
        self.plant(script, self.hostile(os.path.getsize(script)), owner=self.pw)
        res = self.only_run_without_sftp()
        self.assert_honest(res)
        self.assertIn(b"(it ended with 4)", res.stderr)  # the verifier refused it

    def test_job_cache_entries_not_the_jobs_are_not_run_on_the_only_run_without_sftp(self):
        script = self.warm()
        entry = self.job_entry()
        note = glob.glob(os.path.join(self.runtime, "ferry", "*.standby"))
        self.assertEqual(len(note), 1, note)
        for owner in (self.other, self.pw):  # another user's; the user's own, 0400, other bytes
            with open(note[0], "w") as f:
                f.write(script + "\n")
            self.plant(entry, self.hostile(len(self.job_bytes)), owner=owner)
            res = self.ferry(self.job)
            self.assertIn(STAGED, res.stderr, res)
            self.assertNotIn(NOT_STAGED, res.stderr, res)
            self.assert_honest(res)
            st = os.lstat(entry)
            self.assertEqual((st.st_uid, st.st_mode & 0o777), (self.pw.pw_uid, 0o400))
            with open(entry, "rb") as f:
                self.assertEqual(f.read(), self.job_bytes)

    def test_compiled_standby_code_of_another_users_is_not_run(self):
        script = self.warm()
        # The first python standby to start compiles its code and keeps it beside its script.
        self.assert_honest(self.ferry(self.job, self.job, "-j", "1"), runs=2)
        compiled = wait_for(lambda: glob.glob(script[:-3] + ".cpython*"))
        self.assertTrue(compiled, "the python standby kept no compiled code beside its script")
        with open(compiled[0], "rb") as f:
            magic = f.read(4)  # the python's magic number, as the loader checks it
        # The hostile source compiled, behind the right magic number.
        self.plant(compiled[0], magic + marshal.dumps(compile(self.hostile(200), "planted", "exec")))
        self.assert_honest(self.ferry(self.job, self.job, "-j", "1"), runs=2)
        for _ in range(3):
            self.assert_honest(self.ferry(self.job, persist=True))


if __name__ == "__main__":
    unittest.main()
