"""Run ids, replay that explains, and an archive that stays small (issue 14 items 5-7), through
the ferry binary on the local target (no sshd needed): prefixes of the random part, last~N and
--job/--host narrowing; replay with the archived options, job changes, status first, --ignore
and `volatile`; prune, log --stats and the config's archive.max_size."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from ferry_harness import ferry_bin, run_ferry, write_job  # noqa: E402

# A job whose result is its params, and one that writes no result.
ANSWER = ('import json, os\n'
          'p = json.load(open(os.environ["FERRY_PARAMS"]))\n'
          'json.dump({"answer": 42, "n": p["n"]}, open(os.environ["FERRY_RESULT"], "w"))\n')
N_PARAM = '[params.n]\ntype = "int"\ndefault = 0\n'


def size_if_there(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ferry-upkeep-")
        self.archive = os.path.join(self.tmp, "archive.db")
        # An empty config directory: a config.toml of the machine's user must not prune here.
        self.config = os.path.join(self.tmp, "config")
        os.makedirs(os.path.join(self.config, "ferry"))
        self.env = {"FERRY_ARCHIVE": self.archive, "TMPDIR": self.tmp,
                    "XDG_CONFIG_HOME": self.config}

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def ferry(self, *args, env=None, **kw):
        return run_ferry(*args, env={**self.env, **(env or {})}, **kw)

    def run_ok(self, *args) -> dict:
        res = self.ferry("run", *args, "--json")
        self.assertEqual(res.code, 0, res)
        return res.record

    def count_runs(self) -> int:
        return len(self.ferry("log", "--json", "--limit", "0").records)


class RunIds(Base):
    def test_prefix_of_the_random_part_last_n_and_narrowing(self):
        a = write_job(self.tmp, "job_a", ANSWER, params=N_PARAM)
        b = write_job(self.tmp, "job_b", ANSWER, params=N_PARAM)
        runs = [self.run_ok(a, "-p", "n=1"), self.run_ok(b, "-p", "n=2"), self.run_ok(a, "-p", "n=3")]
        ids = [r["run_id"] for r in runs]
        randoms = [i.split("-", 1)[1] for i in ids]
        for run_id, random in zip(ids, randoms):
            # The shortest prefix of the random part that no other run's id or random part shares.
            prefix = next(random[:k] for k in range(1, 9)
                          if not any(o != run_id and (o.startswith(random[:k]) or
                                                     o.split("-", 1)[1].startswith(random[:k]))
                                     for o in ids))
            shown = self.ferry("show", prefix, "--json")
            self.assertEqual(shown.code, 0, shown)
            self.assertEqual(json.loads(shown.stdout)["run_id"], run_id)
        self.assertEqual(json.loads(self.ferry("show", "last~1", "--json").stdout)["run_id"], ids[1])
        self.assertEqual(json.loads(self.ferry("show", "last~2", "--json").stdout)["run_id"], ids[0])
        narrowed = self.ferry("show", "last~1", "--job", "job_a", "--json")
        self.assertEqual(json.loads(narrowed.stdout)["run_id"], ids[0], narrowed)
        self.assertEqual(json.loads(self.ferry("show", "last", "--job", "job_b", "--json").stdout)
                         ["run_id"], ids[1])
        self.assertEqual(json.loads(self.ferry("show", "last", "--host", "local", "--json").stdout)
                         ["run_id"], ids[2])
        out = os.path.join(self.tmp, "export")
        self.assertEqual(self.ferry("export", "last~1", out).code, 0)
        with open(os.path.join(out, "run.json")) as f:
            self.assertEqual(json.load(f)["run_id"], ids[1])
        # replay's --host picks a target, so --from-host narrows.
        replayed = self.ferry("replay", "last", "--job", "job_b", "--from-host", "local", "--json")
        self.assertEqual(replayed.code, 0, replayed)
        self.assertEqual(replayed.record["replay_of"], ids[1])

    def test_ambiguous_and_bad_references_exit_2_and_say_why(self):
        job = write_job(self.tmp, "quick", ANSWER, params=N_PARAM)
        ids = [self.run_ok(job)["run_id"] for _ in range(3)]
        res = self.ferry("show", ids[0][:4])  # the year: every run matches
        self.assertEqual(res.code, 2, res)
        err = res.stderr.decode()
        self.assertIn("ambiguous", err)
        for run_id in ids:
            self.assertIn(run_id, err)
        self.assertIn("give more characters", err)
        res = self.ferry("show", "last~3")
        self.assertEqual(res.code, 2, res)
        self.assertIn("no run 'last~3'", res.stderr.decode())
        res = self.ferry("show", "last~x")
        self.assertEqual(res.code, 2, res)
        self.assertIn("last~1", res.stderr.decode())
        res = self.ferry("show", ids[0], "--job", "quick")
        self.assertEqual(res.code, 2, res)
        self.assertIn("--job and --host narrow 'last'", res.stderr.decode())


SLEEPS_WHILE_FLAG = ('import json, os, time\n'
                     'if os.path.exists(json.load(open(os.environ["FERRY_PARAMS"]))["flag"]):\n'
                     '    time.sleep(60)\n'
                     'json.dump({"done": True}, open(os.environ["FERRY_RESULT"], "w"))\n')
FLAG_PARAM = 'result = "optional"\n[params.flag]\ntype = "string"\nrequired = true\n'


class Replay(Base):
    def test_replay_keeps_the_timeout_and_reports_the_status_first(self):
        flag = os.path.join(self.tmp, "slow")
        open(flag, "w").close()
        job = write_job(self.tmp, "sleepy", SLEEPS_WHILE_FLAG, timeout=120, params=FLAG_PARAM)
        first = self.ferry("run", job, "-p", f"flag={flag}", "--timeout", "1", "--json")
        self.assertEqual(first.code, 1, first)
        first = first.record
        self.assertEqual(first["status"], "timeout")
        self.assertEqual(first["options"]["timeout_s"], 1)
        self.assertEqual(first["options"]["interpreter"], "python3")
        self.assertEqual(first["options"]["output_cap"], 16 << 20)
        self.assertEqual(first["options"]["job_source"], os.path.abspath(job))
        # Still slow: the replay times out under the archived 1 s, not the job's 120 s.
        again = self.ferry("replay", first["run_id"], "--json")
        self.assertEqual(again.code, 1, again)
        self.assertEqual(again.record["status"], "timeout")
        self.assertEqual(again.record["options"]["timeout_s"], 1)
        self.assertIn("1 s timeout", again.record["error"])
        self.assertTrue(again.record["compare"]["identical"], again.record["compare"])
        os.unlink(flag)
        res = self.ferry("replay", first["run_id"])
        self.assertEqual(res.code, 4, res)
        text = res.stdout.decode()
        self.assertIn("status differs: timeout -> ok\n", text)
        self.assertIn("exit code differs: 124 -> 0\n", text)
        self.assertLess(text.index("status differs"), text.index("result differs"))
        res = self.ferry("replay", first["run_id"], "--timeout", "7", "--json")
        self.assertEqual(res.code, 4, res)
        compare = res.record["compare"]
        self.assertEqual(compare["status"], {"old": "timeout", "new": "ok"})
        self.assertEqual(compare["exit_code"], {"old": 124, "new": 0})
        self.assertFalse(compare["identical"])
        self.assertEqual(res.record["options"]["timeout_s"], 7)

    def test_replay_says_when_the_job_file_changed_and_current_runs_it(self):
        job = write_job(self.tmp, "det", ANSWER, params=N_PARAM)
        first = self.run_ok(job, "-p", "n=5")
        with open(job, "rb") as f:
            archived = hashlib.sha256(f.read()).hexdigest()
        self.assertEqual(archived, first["job_sha256"])
        res = self.ferry("replay", "last")
        self.assertEqual(res.code, 0, res)
        self.assertNotIn("has changed", res.stderr.decode())
        with open(job, "a") as f:
            f.write('json.dump({"answer": 43, "n": p["n"]}, open(os.environ["FERRY_RESULT"], "w"))\n')
        with open(job, "rb") as f:
            current = hashlib.sha256(f.read()).hexdigest()
        res = self.ferry("replay", first["run_id"], "--json")
        self.assertEqual(res.code, 0, res)
        err = res.stderr.decode()
        self.assertIn("has changed since run", err)
        self.assertIn(archived, err)
        self.assertIn(current, err)
        self.assertIn("--current", err)
        self.assertEqual(res.record["job_sha256"], archived)
        self.assertEqual(res.record["compare"]["job"], {"archived_sha256": archived,
                                                         "current_sha256": current,
                                                         "replayed": "archived"})
        res = self.ferry("replay", first["run_id"], "--current", "--json")
        self.assertEqual(res.code, 4, res)
        self.assertEqual(res.record["job_sha256"], current)
        self.assertEqual(res.record["compare"]["changes"], [{"path": "/answer", "old": 42, "new": 43}])
        self.assertEqual(res.record["compare"]["job"]["replayed"], "current")
        self.assertEqual(res.record["params"], {"n": 5})
        os.unlink(job)
        res = self.ferry("replay", first["run_id"], "--current")
        self.assertEqual(res.code, 2, res)
        self.assertIn("--current", res.stderr.decode())

    def test_replay_takes_env_and_names_the_variables_it_lacks(self):
        # Issue 42 item 3: `--env HF_TOKEN` archives the name only; replay takes --env and says
        # which archived names nothing gives now before it runs.
        body = ('import json, os\n'
                'json.dump({"token_present": "HF_TOKEN" in os.environ, "mode": os.environ.get("MODE")},'
                ' open(os.environ["FERRY_RESULT"], "w"))\n')
        job = write_job(self.tmp, "needs_token", body, params='[env]\nMODE = "fast"\n')
        secret = {"HF_TOKEN": "hf_secret_value"}
        first = self.ferry("run", job, "--env", "HF_TOKEN", "--json", env=secret)
        self.assertEqual(first.code, 0, first)
        self.assertEqual(first.record["env"], ["HF_TOKEN", "MODE"])
        self.assertEqual(first.record["result"], {"token_present": True, "mode": "fast"})
        run_id = first.record["run_id"]
        bare = self.ferry("replay", run_id, "--json")
        self.assertEqual(bare.code, 4, bare)
        err = bare.stderr.decode()
        self.assertIn(f"run {run_id} was given the variable HF_TOKEN, whose value the archive never "
                      "keeps; the replay runs without it — pass --env HF_TOKEN", err)
        self.assertNotIn("MODE", err)  # the job's [env] travels in its bytes
        self.assertEqual(bare.record["compare"]["missing_env"], ["HF_TOKEN"])
        self.assertEqual(bare.record["compare"]["changes"],
                         [{"path": "/token_present", "old": True, "new": False}])
        text = self.ferry("replay", run_id).stdout.decode()
        self.assertIn(f"(replayed without HF_TOKEN: run {run_id} had it; --env gives it)", text)
        given = self.ferry("replay", run_id, "--env", "HF_TOKEN", "--json", env=secret)
        self.assertEqual(given.code, 0, given)
        self.assertNotIn("HF_TOKEN", given.stderr.decode())
        self.assertNotIn("missing_env", given.record["compare"])
        self.assertTrue(given.record["compare"]["identical"])
        valued = self.ferry("replay", run_id, "--env", "HF_TOKEN=other", "--json")
        self.assertEqual(valued.code, 0, valued)
        self.assertNotIn(b"hf_secret_value", valued.stdout + valued.stderr)
        self.assertNotIn("HF_TOKEN", os.environ)
        res = self.ferry("replay", run_id, "--env", "HF_TOKEN")
        self.assertEqual(res.code, 2, res)
        self.assertIn("HF_TOKEN", res.stderr.decode())

    def test_ignore_and_volatile_leave_fields_out(self):
        body = ('import json, os, random\n'
                'json.dump({"answer": 42, "nonce": random.random(), "deep": {"x": random.random()}},'
                ' open(os.environ["FERRY_RESULT"], "w"))\n')
        job = write_job(self.tmp, "noisy", body)
        first = self.run_ok(job)
        res = self.ferry("replay", first["run_id"])
        self.assertEqual(res.code, 4, res)
        self.assertIn("/nonce:", res.stdout.decode())
        res = self.ferry("replay", first["run_id"], "--ignore", "/nonce", "--ignore", "/deep")
        self.assertEqual(res.code, 0, res)
        self.assertIn("identical (ignoring /nonce, /deep: 2 changes)", res.stdout.decode())
        res = self.ferry("replay", first["run_id"], "--ignore", "/nonce", "--json")
        self.assertEqual(res.code, 4, res)
        compare = res.record["compare"]
        self.assertEqual(compare["ignored"], ["/nonce"])
        self.assertEqual([c["path"] for c in compare["changes"]], ["/deep/x"])
        res = self.ferry("replay", first["run_id"], "--ignore", "nonce")
        self.assertEqual(res.code, 2, res)
        self.assertIn("not a JSON Pointer", res.stderr.decode())
        # The job's own `volatile` list does the same without options.
        steady = write_job(self.tmp, "steady", body, params='volatile = ["/nonce", "/deep"]\n')
        first = self.run_ok(steady)
        res = self.ferry("replay", first["run_id"], "--json")
        self.assertEqual(res.code, 0, res)
        self.assertEqual(res.record["compare"]["ignored"], ["/nonce", "/deep"])
        self.assertTrue(res.record["compare"]["identical"])
        bad = write_job(self.tmp, "bad_volatile", body, params='volatile = ["nonce"]\n')
        res = self.ferry("run", bad)
        self.assertEqual(res.code, 2, res)
        self.assertIn("volatile", res.stderr.decode())


class NoResult(Base):
    """Issue 42 item 7: `no-result` is a status like the others, in the docs and in `log`."""

    def test_no_result_is_listed_documented_and_filtered(self):
        silent = write_job(self.tmp, "silent", 'print("nothing to return")\n', result="required")
        optional = write_job(self.tmp, "optional", 'print("nothing to return")\n', result="optional")
        res = self.ferry("run", silent, "--json")
        self.assertEqual(res.code, 1, res)
        self.assertEqual(res.record["status"], "no-result")
        self.assertIn('result = "optional"', res.record["error"])
        self.assertEqual(self.run_ok(optional)["status"], "ok")
        listed = self.ferry("log", "--status", "no-result", "--json")
        self.assertEqual(listed.code, 0, listed)
        self.assertEqual([r["job"] for r in listed.records], ["silent"])
        refused = self.ferry("log", "--status", "none")
        self.assertEqual(refused.code, 2, refused)
        statuses = refused.stderr.decode().split("expected one of ", 1)[1].strip().split(", ")
        self.assertIn("no-result", statuses)
        helped = self.ferry("help", "log").stdout.decode()
        self.assertIn(", ".join(statuses), " ".join(helped.split()))
        docs = os.path.join(os.path.dirname(__file__), "..", "..", "docs")
        with open(os.path.join(docs, "record.md"), encoding="utf-8") as f:
            record_md = f.read()
        with open(os.path.join(docs, "cli.md"), encoding="utf-8") as f:
            cli_md = f.read()
        with open(os.path.join(docs, "job-file.md"), encoding="utf-8") as f:
            job_md = f.read()
        for status in statuses:
            self.assertIn(f"\n| `{status}` |", record_md, f"docs/record.md's statuses lack {status}")
        self.assertIn(", ".join(f"`{s}`" for s in statuses), cli_md, "docs/cli.md's log --status")
        self.assertIn("\n| `result` | string | no |", job_md, "docs/job-file.md's key table")
        self.assertNotIn("A run without a result is still `ok`", job_md)


class Summary(Base):
    def test_a_sweep_and_log_show_the_jobs_summary_figures(self):
        # Issue 42 item 10: every row showed {"assumptions": … (the result's first key); kv_calc
        # declares its headline figures with `summary`.
        res = self.ferry("run", "kv_calc", "--local", "-p", "model=qwen3.5-397b-a17b", "-p", "kv_memory_gib=17.4",
                         "--sweep", "tp=4,8")
        self.assertEqual(res.code, 0, res)
        table = res.stdout.decode().split("\nHOST ", 1)[1]
        self.assertNotIn("assumptions", table)
        self.assertRegex(table, r"\n\S+ +kv_calc +8 +ok +[\d.]+ s +bf16/max_tokens=641164 fp8_e4m3/max_tokens=1282328")
        logged = self.ferry("log").stdout.decode()
        self.assertNotIn("assumptions", logged)
        self.assertIn("bf16/max_tokens=641164 fp8_e4m3/max_tokens=", logged)
        record = json.loads(self.ferry("show", "last", "--json").stdout)
        self.assertEqual(record["summary"], [{"name": "bf16/max_tokens", "value": 641164},
                                             {"name": "fp8_e4m3/max_tokens", "value": 1282328}])
        plain = write_job(self.tmp, "plain", ANSWER, params=N_PARAM)
        self.assertNotIn("summary", self.run_ok(plain))
        self.assertIn('{"answer":42,"n":0}', self.ferry("log", "--limit", "1").stdout.decode())


BIG_OUTPUT = ('import json, os, sys\n'
              'p = json.load(open(os.environ["FERRY_PARAMS"]))\n'
              'sys.stdout.write(os.urandom(p["kib"] * 512).hex())\n')
KIB_PARAM = 'result = "optional"\n[params.kib]\ntype = "int"\ndefault = 256\n'


# Reads the file sent beside it, answers with its content and writes one output.
CONF_JOB = ('import json, os\n'
            'os.chdir(os.environ["FERRY_RUN_DIR"])\n'
            'conf = json.load(open("conf.json"))\n'
            'os.makedirs("out", exist_ok=True)\n'
            'open("out/r.txt", "w").write("fetched back\\n")\n'
            'json.dump(conf, open(os.environ["FERRY_RESULT"], "w"))\n')
OUT_SHA256 = hashlib.sha256(b"fetched back\n").hexdigest()


class Prune(Base):
    def make_runs(self, job, count, kib=256):
        return [self.run_ok(job, "-p", f"kib={kib}")["run_id"] for _ in range(count)]

    def logged_ids(self):
        return [r["run_id"] for r in self.ferry("log", "--json", "--limit", "0").records]

    def test_keep_last_dry_run_then_prune_returns_the_space(self):
        job = write_job(self.tmp, "big", BIG_OUTPUT, params=KIB_PARAM)
        ids = self.make_runs(job, 5)
        res = self.ferry("prune")
        self.assertEqual(res.code, 2, res)
        self.assertIn("--older-than", res.stderr.decode())
        before = os.path.getsize(self.archive) + size_if_there(self.archive + "-wal")
        res = self.ferry("prune", "--keep-last", "2", "--dry-run")
        self.assertEqual(res.code, 0, res)
        out = res.stdout.decode()
        self.assertIn("would remove 3 runs", out)
        for run_id in ids[:3]:
            self.assertIn(run_id, out)
        self.assertEqual(len(self.logged_ids()), 5)
        res = self.ferry("prune", "--keep-last", "2", "--json")
        self.assertEqual(res.code, 0, res)
        outcome = json.loads(res.stdout)
        self.assertEqual(sorted(outcome["removed"]), sorted(ids[:3]))
        self.assertGreater(outcome["removed_bytes"], 3 * 256 * 1024)
        self.assertEqual(sorted(self.logged_ids()), sorted(ids[3:]))
        after = os.path.getsize(self.archive) + size_if_there(self.archive + "-wal")
        self.assertLess(after, before - 2 * 256 * 1024, (before, after))
        db = sqlite3.connect(self.archive)
        self.assertEqual(db.execute("PRAGMA integrity_check").fetchone()[0], "ok")
        self.assertEqual(db.execute("PRAGMA auto_vacuum").fetchone()[0], 2)
        db.close()
        stats = json.loads(self.ferry("log", "--stats", "--json").stdout)
        self.assertEqual(stats["runs"], 2)
        self.assertEqual(stats["scripts"], 1)
        self.assertEqual(len(stats["largest"]), 2)
        self.assertGreater(stats["largest"][0]["bytes"], 256 * 1024)
        text = self.ferry("log", "--stats").stdout.decode()
        self.assertIn("2 runs", text)
        self.assertIn("largest runs:", text)

    def test_job_host_age_and_size_select_runs_and_unused_scripts_go(self):
        big = write_job(self.tmp, "big", BIG_OUTPUT, params=KIB_PARAM)
        other = write_job(self.tmp, "other", ANSWER, params=N_PARAM)
        big_ids = self.make_runs(big, 4)
        other_id = self.run_ok(other)["run_id"]
        res = self.ferry("prune", "--older-than", "2000-01-01")
        self.assertEqual(res.code, 0, res)
        self.assertIn("removed 0 runs", res.stdout.decode())
        res = self.ferry("prune", "--older-than", "soon")
        self.assertEqual(res.code, 2, res)
        self.assertIn("--older-than 'soon'", res.stderr.decode())
        res = self.ferry("prune", "--max-size", "lots")
        self.assertEqual(res.code, 2, res)
        self.assertIn("--max-size 'lots'", res.stderr.decode())
        # Only job big's runs on local count: its oldest go until the archive fits.
        res = self.ferry("prune", "--job", "big", "--host", "local", "--max-size", "700KiB")
        self.assertEqual(res.code, 0, res)
        left = self.logged_ids()
        self.assertIn(other_id, left)
        self.assertIn(big_ids[-1], left)
        self.assertNotIn(big_ids[0], left)
        stats = json.loads(self.ferry("log", "--stats", "--json").stdout)
        self.assertLessEqual(stats["used_bytes"], 700 * 1024 + 64 * 1024, stats)
        res = self.ferry("prune", "--job", "big", "--keep-last", "0")
        self.assertEqual(res.code, 0, res)
        self.assertEqual(self.logged_ids(), [other_id])
        self.assertIn("what no remaining run uses: 1 script, 0 files sent, 0 outputs fetched",
                      res.stdout.decode())
        db = sqlite3.connect(self.archive)
        self.assertEqual(db.execute("SELECT count(*) FROM scripts").fetchone()[0], 1)
        db.close()

    def test_prune_while_other_ferry_processes_write(self):
        job = write_job(self.tmp, "big", BIG_OUTPUT, params=KIB_PARAM)
        self.make_runs(job, 2, kib=64)
        env = dict(os.environ, **self.env)
        writers = [subprocess.Popen([ferry_bin(), "run", job, job, "-p", "kib=64", "--json"],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                   for _ in range(4)]
        for _ in range(5):
            res = self.ferry("prune", "--keep-last", "3")
            self.assertEqual(res.code, 0, res)
        written = set()
        for proc in writers:
            out, err = proc.communicate(timeout=120)
            self.assertEqual(proc.returncode, 0, err)
            self.assertNotIn(b"spooled", err)
            written |= {json.loads(line)["run_id"] for line in out.decode().splitlines()}
        self.assertEqual(len(written), 8)
        res = self.ferry("prune", "--keep-last", "3")
        self.assertEqual(res.code, 0, res)
        self.assertEqual(len(self.logged_ids()), 3)
        db = sqlite3.connect(self.archive)
        self.assertEqual(db.execute("PRAGMA integrity_check").fetchone()[0], "ok")
        db.close()

    def test_a_run_that_sent_a_file_and_fetched_an_output_survives_prune_and_replays(self):
        # Issue 42 item 1: prune removed the archived bytes of files sent and outputs fetched
        # (even a prune that removed no run), and `replay last` then refused the run.
        job = write_job(self.tmp, "conf_user", CONF_JOB, params='outputs = ["out/*"]')
        config = os.path.join(self.config, "ferry", "config.toml")

        def run(*extra):
            res = self.ferry("run", job, "--file", "conf.json", "--out", os.path.join(self.tmp, "out", "{run_id}"),
                             "--json", *extra, cwd=self.tmp)
            self.assertEqual(res.code, 0, res)
            self.assertEqual([f["path"] for f in res.record["files"]], ["conf.json"])
            self.assertEqual([o["path"] for o in res.record["outputs"]], ["out/r.txt"])
            return res.record["run_id"]

        def replays_identical():
            last = json.loads(self.ferry("show", "last", "--json").stdout)["run_id"]
            res = self.ferry("replay", "last", "--json", cwd=self.tmp)
            self.assertEqual(res.code, 0, res)
            self.assertEqual(res.record["replay_of"], last)
            self.assertTrue(res.record["compare"]["identical"], res.record["compare"])
            self.assertEqual(res.record["result"], {"tp": 2})
            self.assertEqual([o["sha256"] for o in res.record["outputs"]], [OUT_SHA256])

        with open(os.path.join(self.tmp, "conf.json"), "w") as f:
            f.write('{"tp": 1}\n')
        first = run()
        with open(os.path.join(self.tmp, "conf.json"), "w") as f:
            f.write('{"tp": 2}\n')
        kept = run()
        # By age, removing no run: nothing else goes either, and the text says so by role.
        res = self.ferry("prune", "--older-than", "30d")
        self.assertEqual(res.code, 0, res)
        self.assertIn("removed 0 runs (0 B) and what no remaining run uses: 0 scripts, 0 files sent, "
                      "0 outputs fetched", res.stdout.decode())
        replays_identical()
        # By count: the first two runs go, the replay just recorded stays with the same bytes; only
        # the file the first run alone sent goes with it.
        res = self.ferry("prune", "--keep-last", "1", "--json")
        self.assertEqual(res.code, 0, res)
        outcome = json.loads(res.stdout)
        self.assertEqual(sorted(outcome["removed"]), sorted([first, kept]))
        self.assertEqual((outcome["scripts_removed"], outcome["files_removed"], outcome["outputs_removed"]),
                         (0, 1, 0), outcome)
        replays_identical()
        # By size, from the command line and from the config after a run.
        res = self.ferry("prune", "--max-size", "1", "--keep-last", "1")
        self.assertEqual(res.code, 0, res)
        self.assertIn("removed 1 run ", res.stdout.decode())
        self.assertEqual(len(self.logged_ids()), 1)
        replays_identical()
        with open(config, "w") as f:
            f.write('[archive]\nmax_size = 1\n')
        newest = run()
        self.assertEqual(self.logged_ids(), [newest])
        replays_identical()
        db = sqlite3.connect(self.archive)
        self.assertEqual(db.execute("SELECT count(*) FROM run_files WHERE run_id NOT IN "
                                    "(SELECT run_id FROM runs)").fetchone()[0], 0)
        db.close()

    def test_config_max_size_prunes_the_oldest_after_each_write(self):
        job = write_job(self.tmp, "big", BIG_OUTPUT, params=KIB_PARAM)
        config = os.path.join(self.config, "ferry", "config.toml")
        with open(config, "w") as f:
            f.write('[archive]\nmax_size = "900KiB"\n')
        ids = self.make_runs(job, 5)
        left = self.logged_ids()
        self.assertIn(ids[-1], left)
        self.assertLessEqual(len(left), 3, left)
        self.assertNotIn(ids[0], left)
        res = self.ferry("run", job)
        self.assertEqual(res.code, 0, res)
        self.assertIn("archive over its max_size of 900.0 KiB", res.stderr.decode())
        with open(config, "w") as f:
            f.write('[archive]\nmax_size = "big"\n')
        res = self.ferry("run", job)
        self.assertEqual(res.code, 0, res)
        self.assertIn(f"{config}:2: archive.max_size 'big'", res.stderr.decode())


if __name__ == "__main__":
    unittest.main()
