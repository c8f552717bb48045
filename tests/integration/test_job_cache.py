"""The job cache on an SSH host (docs/run-protocol.md, "The job cache"), against a real sshd:
a job's bytes are uploaded once into the run base as ferry-job-SHA256[.ext] and linked into
later run directories; an entry that is not as ferry left it is replaced, never followed; the
cleanup removes what the rules name and nothing else."""
import hashlib
import os
import tempfile
import time
import unittest

from ferry_harness import SshTestCase, write_job
from sshd_fixture import EXTERNAL_SFTP_SERVER, SshServer, require_root_and_tools

CACHED_STEP = "upload (the job from the host's cache)"
DAY = 24 * 3600


def entry_name(job_path: str) -> str:
    with open(job_path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return "ferry-job-" + digest + os.path.splitext(job_path)[1]


class JobCache(SshTestCase):
    @classmethod
    def setUpClass(cls):
        require_root_and_tools()
        super().setUpClass()
        cls.take_user()
        cls.cache = cls.base

    def job(self, marker: str, name: str = "cached") -> str:
        """A job of its own for each test (its own sha256, so its own entry)."""
        directory = tempfile.mkdtemp(dir=self.tmp)
        return write_job(directory, name, f"print({marker!r})\n")

    def run_job(self, job: str, *extra: str, foreign=()):
        r = self.ferry("run", job, "--json", "-v", *extra)
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.record["status"], "ok", r)
        left = [d for d in self.srv.run_dirs(self.user) if os.path.basename(d) not in foreign]
        self.assertEqual(left, [], "a run directory was left")
        return r

    def entry(self, job: str) -> str:
        return os.path.join(self.cache, entry_name(job))

    def as_user(self, path: str) -> None:
        os.lchown(path, self.uid, self.gid)

    def test_second_run_links_to_the_cached_job(self):
        job = self.job("from the cache")
        first = self.run_job(job)
        self.assertNotIn(CACHED_STEP, first.stderr.decode(), "nothing was cached yet")
        st = os.lstat(self.entry(job))
        self.assertTrue(os.path.isfile(self.entry(job)) and not os.path.islink(self.entry(job)))
        self.assertEqual(st.st_mode & 0o7777, 0o400)
        self.assertEqual(st.st_uid, self.uid)
        with open(job, "rb") as a, open(self.entry(job), "rb") as b:
            self.assertEqual(a.read(), b.read())
        second = self.run_job(job)
        self.assertIn(CACHED_STEP, second.stderr.decode(), second)
        self.assertEqual(second.record["stdout"], "from the cache\n")
        self.assertEqual(os.lstat(self.entry(job)).st_ino, st.st_ino, "the entry was uploaded again")
        self.assertEqual([n for n in self.srv.job_cache(self.user) if n.startswith(".")], [],
                         "an upload was left under its temporary name")

    def test_a_job_with_files_beside_it_is_not_cached(self):
        directory = tempfile.mkdtemp(dir=self.tmp)
        with open(os.path.join(directory, "data.txt"), "w") as f:
            f.write("beside\n")
        job = write_job(directory, "bundled", "print(open('data.txt').read(), end='')\n",
                        params='files = ["data.txt"]')
        for _ in range(2):
            r = self.run_job(job)
            self.assertNotIn(CACHED_STEP, r.stderr.decode(), r)
            self.assertEqual(r.record["stdout"], "beside\n")
        self.assertNotIn(entry_name(job), self.srv.job_cache(self.user))

    def test_an_entry_not_as_ferry_left_it_is_replaced(self):
        for damage in ("truncated", "writable", "directory"):
            with self.subTest(damage=damage):
                job = self.job(f"intact after {damage}")
                self.run_job(job)
                entry = self.entry(job)
                os.chmod(entry, 0o600)
                if damage == "truncated":
                    with open(entry, "r+b") as f:
                        f.truncate(5)
                    os.chmod(entry, 0o400)
                elif damage == "directory":
                    os.unlink(entry)
                    os.mkdir(entry, 0o700)
                    self.as_user(entry)
                r = self.run_job(job)
                self.assertEqual(r.record["stdout"], f"intact after {damage}\n", r)
                if damage == "directory":
                    # A directory at the entry's name is not removed (SFTP removes files only):
                    # the job is uploaded into the run directory instead, and so on later runs.
                    r = self.run_job(job)
                    self.assertNotIn(CACHED_STEP, r.stderr.decode(), r)
                    self.assertEqual(r.record["stdout"], f"intact after {damage}\n", r)
                    self.assertTrue(os.path.isdir(entry))
                    os.rmdir(entry)
                    continue
                self.assertNotIn(CACHED_STEP, r.stderr.decode(), r)
                self.assertEqual(os.lstat(entry).st_mode & 0o7777, 0o400)
                with open(job, "rb") as a, open(entry, "rb") as b:
                    self.assertEqual(a.read(), b.read())

    def test_a_link_in_the_cache_is_never_followed(self):
        job = self.job("the real job")
        self.run_job(job)
        entry = self.entry(job)
        # Same name, same size, mode 0400, but a link to other bytes: never used.
        bait = os.path.join(SshServer.home(self.user), "bait.py")
        with open(job, "rb") as f:
            size = len(f.read())
        text = "print('bait')\n"
        with open(bait, "w") as f:
            f.write(text + "#" * (size - len(text) - 1) + "\n")
        os.chmod(bait, 0o400)
        self.as_user(bait)
        os.unlink(entry)
        os.symlink(bait, entry)
        self.as_user(entry)
        r = self.run_job(job)
        self.assertEqual(r.record["stdout"], "the real job\n", r)
        self.assertFalse(os.path.islink(entry), "the link was kept")
        with open(bait) as f:
            self.assertTrue(f.read().startswith(text), "the link's target was written")

    def test_an_entry_in_use_is_touched_once_a_day(self):
        job = self.job("touched")
        self.run_job(job)
        entry = self.entry(job)
        three_days_ago = time.time() - 3 * DAY
        os.utime(entry, (three_days_ago, three_days_ago), follow_symlinks=False)
        r = self.run_job(job)
        self.assertIn(CACHED_STEP, r.stderr.decode(), r)
        self.assertGreater(os.lstat(entry).st_mtime, time.time() - 600, "the entry was not touched")

    def test_the_cleanup_removes_what_the_rules_name_and_nothing_else(self):
        self.run_job(self.job("makes the cache"))
        now = time.time()

        def plant(name: str, age_s: float, size: int = 10) -> str:
            path = os.path.join(self.cache, name)
            with open(path, "wb") as f:
                f.write(b"x" * size)
            os.chmod(path, 0o400)
            self.as_user(path)
            os.utime(path, (now - age_s, now - age_s))
            return name

        unused = plant("ferry-job-" + "1" * 64 + ".py", 40 * DAY)
        recent = plant("ferry-job-" + "2" * 64 + ".sh", 10 * DAY)
        broken_upload = plant(".ferry-job-0123456789abcdef", 2 * DAY)
        upload_under_way = plant(".ferry-job-fedcba9876543210", 60)
        foreign = plant("notes.txt", 400 * DAY)
        foreign_like = plant("ferry-job-" + "3" * 64 + ".py.bak", 400 * DAY)
        # The cleanup runs on the sweep of the base, once a session.
        self.run_job(self.job("makes a new session"), foreign=(foreign, foreign_like))
        left = set(os.listdir(self.cache))
        self.assertNotIn(unused, left)
        self.assertNotIn(broken_upload, left)
        for kept in (recent, upload_under_way, foreign, foreign_like):
            self.assertIn(kept, left)



class OwnerBitsUmask(SshTestCase):
    """An SFTP server whose umask takes the owner's write bit (sftp-server -u 0277): a run
    directory comes out 0500, so ferry sets every one to 0700 itself (it checks the session's
    first and otherwise leaves out the chmod)."""

    sftp = EXTERNAL_SFTP_SERVER + " -u 0277"

    @classmethod
    def setUpClass(cls):
        require_root_and_tools()
        super().setUpClass()

    def test_every_run_directory_is_made_writable(self):
        first = write_job(self.tmp, "first", "print('first')\n")
        second = write_job(self.tmp, "second", "print('second')\n")
        r = self.ferry("run", first, second, first, "--json")
        self.assertEqual(r.code, 0, r)
        self.assertEqual([rec["status"] for rec in r.records], ["ok"] * 3, r)
        self.assertEqual([rec["stdout"] for rec in r.records], ["first\n", "second\n", "first\n"])
        self.assertEqual(self.srv.run_dirs(self.srv.user("bash")), [])


if __name__ == "__main__":
    unittest.main()
