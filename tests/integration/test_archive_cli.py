"""The archive through the ferry binary (issue 4): show/export give back the exact bytes,
replay runs the archived script (and refuses one that no longer matches its sha256), concurrent
ferry processes all land, a run a locked archive keeps out is spooled and moved in later, a
killed ferry leaves no half run, `log` reads only what it prints. Local target: no sshd needed."""

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
from ferry_harness import ferry_bin, memory_env, run_ferry, write_job  # noqa: E402


class ArchiveCli(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ferry-archive-")
        self.env = {"FERRY_ARCHIVE": os.path.join(self.tmp, "archive.db"), "TMPDIR": self.tmp}

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def ferry(self, *args, env=None, **kw):
        return run_ferry(*args, env={**self.env, **(env or {})}, **kw)

    def test_show_and_export_give_back_the_exact_bytes(self):
        path = os.path.join(self.tmp, "crlf.py")
        script = (b"# -*- coding: latin-1 -*-\r\n# /// ferry\r\n# interpreter = \"python3\"\r\n# result = \"optional\"\r\n# ///\r\n"
                  b"# latin-1 comment: caf\xe9 \xff\r\nimport sys\r\nsys.stdout.buffer.write(b'out\\xfe\\n')\r\n")
        with open(path, "wb") as f:
            f.write(script)
        rec = self.ferry("run", path, "--json").record
        self.assertEqual(rec["status"], "ok", rec)
        self.assertEqual(rec["job_sha256"], hashlib.sha256(script).hexdigest())
        shown = self.ferry("show", rec["run_id"], "--script")
        self.assertEqual(shown.stdout, script)
        self.assertEqual(self.ferry("show", "last", "--stdout").stdout, b"out\xfe\n")
        out = os.path.join(self.tmp, "export")
        self.assertEqual(self.ferry("export", rec["run_id"][:12], out).code, 0)
        with open(os.path.join(out, "script"), "rb") as f:
            self.assertEqual(hashlib.sha256(f.read()).hexdigest(), rec["job_sha256"])
        with open(os.path.join(out, "stdout"), "rb") as f:
            self.assertEqual(f.read(), b"out\xfe\n")
        self.assertEqual(sorted(os.listdir(out)),
                         ["params.json", "result.json", "run.json", "script", "stderr", "stdout"])

    def test_replay_runs_the_archived_bytes_and_compares(self):
        job = write_job(self.tmp, "det", 'import json, os\njson.dump({"answer": 42, "l": [1, 2]}, '
                                         'open(os.environ["FERRY_RESULT"], "w"))\n')
        first = self.ferry("run", job, "--json").record
        res = self.ferry("replay", first["run_id"])
        self.assertEqual(res.code, 0, res)
        self.assertIn("identical", res.stdout.decode())
        # Today's copy changes; the archived bytes still run.
        with open(job, "a") as f:
            f.write('json.dump({"answer": 0}, open(os.environ["FERRY_RESULT"], "w"))\n')
        res = self.ferry("replay", first["run_id"], "--json")
        self.assertEqual(res.code, 0, res)
        rec = res.record
        self.assertEqual(rec["replay_of"], first["run_id"])
        # Identical, and the edit is reported (issue 14): the archived bytes ran.
        self.assertEqual(rec["compare"]["changes"], [])
        self.assertTrue(rec["compare"]["identical"])
        self.assertEqual(rec["compare"]["job"]["replayed"], "archived")
        self.assertIn("has changed since run", res.stderr.decode())
        self.assertEqual(rec["job_sha256"], first["job_sha256"])

    def test_replay_reports_what_changed(self):
        data = os.path.join(self.tmp, "limits.json")
        with open(data, "w") as f:
            json.dump({"max_tokens": 1216348}, f)
        job = write_job(self.tmp, "reads_file", 'import json, os, sys\n'
                        'p = json.load(open(os.environ["FERRY_PARAMS"]))\n'
                        'v = json.load(open(p["path"]))\n'
                        'json.dump({"kv": {"bf16": v}}, open(os.environ["FERRY_RESULT"], "w"))\n',
                        params='[params.path]\ntype = "string"\nrequired = true\n')
        first = self.ferry("run", job, "-p", f"path={data}", "--json").record
        with open(data, "w") as f:
            json.dump({"max_tokens": 641164}, f)
        res = self.ferry("replay", first["run_id"])
        self.assertEqual(res.code, 4, res)
        self.assertIn("/kv/bf16/max_tokens: 1216348 -> 641164", res.stdout.decode())
        rec = self.ferry("replay", first["run_id"], "--json").record
        self.assertEqual(rec["compare"], {"identical": False, "changes": [
            {"path": "/kv/bf16/max_tokens", "old": 1216348, "new": 641164}]})
        self.assertEqual(len(self.ferry("log", "--json", "--limit", "10").records), 3)

    def test_concurrent_ferry_processes_all_land(self):
        job = write_job(self.tmp, "quick", 'print("{\\"ok\\": true}")\n')
        env = dict(os.environ, **self.env)
        procs = [subprocess.Popen([ferry_bin(), "run", job, job, "--json"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(8)]
        ids = set()
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            self.assertEqual(proc.returncode, 0, err)
            ids |= {json.loads(line)["run_id"] for line in out.decode().splitlines()}
        self.assertEqual(len(ids), 16)
        logged = {r["run_id"] for r in self.ferry("log", "--json", "--limit", "0").records}
        self.assertEqual(logged, ids)
        db = sqlite3.connect(self.env["FERRY_ARCHIVE"])
        self.assertEqual(db.execute("PRAGMA integrity_check").fetchone()[0], "ok")
        self.assertEqual(db.execute("SELECT count(*) FROM scripts").fetchone()[0], 1)

    def test_killed_while_writing_leaves_no_half_run(self):
        job = write_job(self.tmp, "big_out", 'print("x" * 8_000_000)\n')
        ok = self.ferry("run", job, "--json").record
        for step in ("after-script", "after-run"):
            res = self.ferry("run", job, "--json", env={"FERRY_TEST_CRASH_IN_RECORD": step})
            self.assertNotEqual(res.code, 0)
        db = sqlite3.connect(self.env["FERRY_ARCHIVE"])
        self.assertEqual(db.execute("PRAGMA integrity_check").fetchone()[0], "ok")
        self.assertEqual([r[0] for r in db.execute("SELECT run_id FROM runs")], [ok["run_id"]])
        db.close()
        again = self.ferry("run", job, "--json").record
        self.assertEqual({r["run_id"] for r in self.ferry("log", "--json").records}, {ok["run_id"], again["run_id"]})

    def test_replay_refuses_a_tampered_script(self):
        marker = os.path.join(self.tmp, "tampered-ran")
        job = write_job(self.tmp, "honest", 'print("{\\"ok\\": true}")\n')
        first = self.ferry("run", job, "--json").record
        # Another job under the same hash: a complete job file that would run if not refused.
        with open(write_job(self.tmp, "evil", f"import pathlib\npathlib.Path({marker!r}).touch()\n"),
                  "rb") as f:
            evil = f.read()
        db = sqlite3.connect(self.env["FERRY_ARCHIVE"])
        with db:
            db.execute("UPDATE scripts SET bytes = ?", (evil,))
        db.close()
        res = self.ferry("replay", first["run_id"])
        self.assertEqual(res.code, 1, res)
        err = res.stderr.decode()
        self.assertIn("does not match its sha256", err)
        self.assertIn(first["run_id"], err)
        self.assertIn(first["job_sha256"], err)
        self.assertNotIn("identical", res.stdout.decode())
        self.assertFalse(os.path.exists(marker), "the tampered script ran")
        self.assertEqual(len(self.ferry("log", "--json", "--limit", "0").records), 1)

    def test_a_run_the_locked_archive_keeps_out_is_spooled_then_moved_in(self):
        job = write_job(self.tmp, "bytes", 'import sys\nsys.stdout.buffer.write(bytes(range(256)) * 3)\n')
        archive = self.env["FERRY_ARCHIVE"]
        self.assertEqual(self.ferry("run", job, "--json").code, 0)
        holder = sqlite3.connect(archive, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # someone holds the write lock past ferry's wait
        try:
            res = self.ferry("run", job, "--json", timeout=120)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        self.assertEqual(res.code, 0, res)
        spooled_id = res.record["run_id"]
        err = res.stderr.decode()
        self.assertRegex(err, r"stayed locked by another process for [0-9]+\.[0-9] s")
        self.assertNotIn("more than 10 s", err)
        spool_file = os.path.join(archive + ".spool", spooled_id + ".run")
        self.assertIn(spool_file, err)
        self.assertEqual(os.stat(spool_file).st_mode & 0o777, 0o600)
        self.assertEqual(os.stat(archive + ".spool").st_mode & 0o777, 0o700)
        self.assertEqual(len(self.ferry("log", "--json").records), 1)  # readers do not move it in
        self.assertEqual(self.ferry("run", job, "--json").code, 0)  # the next writer does
        self.assertFalse(os.path.exists(spool_file))
        self.assertEqual(len(self.ferry("log", "--json").records), 3)
        self.assertEqual(self.ferry("show", spooled_id, "--stdout").stdout, bytes(range(256)) * 3)

    def test_log_reads_only_the_columns_it_prints(self):
        job = write_job(self.tmp, "blob", 'import json, os\n'
                        'p = json.load(open(os.environ["FERRY_PARAMS"]))\n'
                        'json.dump({"len": len(p["blob"])}, open(os.environ["FERRY_RESULT"], "w"))\n',
                        params='[params.blob]\ntype = "string"\n')
        self.assertEqual(self.ferry("run", job, "-p", "blob=small").code, 0)
        small = self.ferry("log", env=memory_env())
        big_params = os.path.join(self.tmp, "big.json")
        with open(big_params, "w") as f:
            json.dump({"blob": "x" * (12 << 20)}, f)
        self.assertEqual(self.ferry("run", job, "--params", big_params).code, 0)
        res = self.ferry("log", env=memory_env())
        self.assertEqual(res.code, 0, res)
        self.assertIn('{"len":12582912}', res.stdout.decode())
        # Reading the 12 MiB params (as text, then as JSON) would add twice that or more.
        self.assertLess(res.max_rss_kib, small.max_rss_kib + 6 * 1024,
                        f"peak RSS {res.max_rss_kib} KiB, {small.max_rss_kib} KiB without the big run")

    def test_log_json_prints_each_record_as_it_reads_it(self):
        # Issue 45 item 6: `log --json` held every record in memory before it printed the first
        # (852 MB after 100k fetched outputs; SQLite sorted the records, outputs and all, before
        # it returned one). Each line now goes out as its run is read: four runs of 2 MiB of
        # output cost what one does, and the lines are as before.
        job = write_job(self.tmp, "loud", 'import sys\nsys.stdout.write("caf\\u00e9 \\x1b[2J\\n" + "x" * (2 << 20))\n')
        res = self.ferry("run", *[job] * 4, "--json")
        self.assertEqual(res.code, 0, res)
        one = self.ferry("log", "--json", "--limit", "1", env=memory_env())
        res = self.ferry("log", "--json", "--limit", "0", env=memory_env())
        self.assertEqual(res.code, 0, res)
        lines = res.stdout.split(b"\n")
        self.assertEqual((len(lines), lines[-1]), (5, b""))
        records = [json.loads(line) for line in lines[:-1]]
        self.assertEqual([r["started_at"] for r in records],
                         sorted((r["started_at"] for r in records), reverse=True))
        for line, rec in zip(lines, records):
            # One compact line, members in order, the whole record as `show --json` gives it.
            self.assertEqual(line, json.dumps(rec, separators=(",", ":"), sort_keys=True,
                                              ensure_ascii=False).encode())
            self.assertEqual(rec, json.loads(self.ferry("show", rec["run_id"], "--json").stdout))
            self.assertTrue(rec["stdout"].startswith("caf\u00e9 \x1b[2J\nxxx"))
        self.assertEqual(one.stdout, lines[0] + b"\n")
        # All four at once held ~2 MiB more for each run after the first; one at a time, none.
        self.assertLess(res.max_rss_kib, one.max_rss_kib + 4 * 1024,
                        f"peak RSS {res.max_rss_kib} KiB for four runs, {one.max_rss_kib} KiB for one")

    def test_daemon_that_escapes_the_job_is_reported(self):
        job = write_job(self.tmp, "daemon", "setsid sleep 876 &\nsleep 0.3\necho done\n", interpreter="sh")
        try:
            rec = self.ferry("run", job, "--json", timeout=60).record
            self.assertEqual(rec["status"], "ok")
            self.assertIn("processes-outlived-job", [w["code"] for w in rec.get("warnings", [])])
        finally:
            subprocess.run(["pkill", "-f", "sleep 876"])


class KvCalcThroughFerry(unittest.TestCase):
    """kv_calc shipped and run by ferry like any job (issue 3)."""

    FIXTURES = os.path.join(os.path.dirname(__file__), "..", "kv_calc", "fixtures")

    def test_seed_deployment_preset(self):
        rec = run_ferry("run", "kv_calc", "--local", "-p", "model=qwen3.5-397b-a17b", "-p", "tp=8",
                        "-p", "kv_memory_gib=17.4", "-p", "kv_dtype=bf16,fp8_e4m3,nvfp4", "--json",
                        "--no-archive").record
        self.assertEqual(rec["status"], "ok", rec["stderr"])
        r = rec["result"]
        self.assertEqual(r["layers"]["full_attention"], 15)
        self.assertEqual(r["layers"]["linear"], 45)
        self.assertEqual(r["kv_heads_per_gpu"], 1)
        self.assertEqual(r["kv"]["fp8_e4m3"]["bytes_per_token"], 7680)
        self.assertEqual(r["kv"]["bf16"]["bytes_per_token"], 15360)
        self.assertEqual(r["kv"]["nvfp4"]["bytes_per_token"], 4320)
        self.assertEqual(r["kv"]["bf16"]["max_tokens"], 641164)
        self.assertEqual(r["kv"]["fp8_e4m3"]["max_tokens"], 1282328)
        self.assertEqual(r["state"]["bytes_per_request"], 24007680)
        self.assertIn("1,216,348", rec["stdout"])

    def test_checkpoint_dir_and_probed_memory(self):
        fake = tempfile.mkdtemp(prefix="ferry-fake-smi-")
        try:
            smi = os.path.join(fake, "nvidia-smi")
            csv = os.path.abspath(os.path.join(self.FIXTURES, "nvidia-smi-h200x8.csv"))
            with open(smi, "w") as f:
                f.write(f"#!/bin/sh\ncat '{csv}'\n")
            os.chmod(smi, 0o755)
            ckpt = os.path.abspath(os.path.join(self.FIXTURES, "qwen35-ckpt"))
            rec = run_ferry("run", "kv_calc", "--local", "-p", f"model_dir={ckpt}", "-p", "tp=8", "--json",
                            "--no-archive", env={"PATH": fake + ":" + os.environ["PATH"]}).record
            self.assertEqual(rec["status"], "ok", rec["stderr"])
            r = rec["result"]
            self.assertEqual(r["kv_heads_per_gpu"], 1)
            codes = {w["code"] for w in r["warnings"]}
            self.assertIn("fp8-kv-no-scales", codes)
            self.assertIn("kv-heads-replicated", codes)
            self.assertTrue(any("nvidia-smi" in a or "probed" in a for a in r["assumptions"]), r["assumptions"])
            self.assertGreater(r["kv"]["bf16"]["max_tokens"], 0)
        finally:
            shutil.rmtree(fake)


if __name__ == "__main__":
    unittest.main()
