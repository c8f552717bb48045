"""Live output (issue 13 item 5): a job's lines reach ferry's stdout/stderr as the job prints
them, measured against the job's own timestamps (the job and the test share this machine's
clock: the local target, and sshd on 127.0.0.1).

The job prints `tick I T` (T: time.time() when printed) once a second, four times, and one line
on stderr; ferry's output is read line by line as it arrives. Each tick must arrive before the
job prints the next one (within 0.9 s of T), so a line a second shows as a line a second; with
buffered output they would all arrive together when the job ends, 3 s after the first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from ferry_harness import SshTestCase, ferry_bin, run_in_pty, write_job  # noqa: E402

TICKS = 4
INTERVAL_S = 1.0
LATE_S = 0.9  # a tick arriving later than this after the job printed it was held back

TICK_JOB = f'''
import json, os, sys, time
for i in range({TICKS}):
    print(f"tick {{i}} {{time.time():.3f}}", flush=True)
    if i == 1:
        print(f"note {{time.time():.3f}}", file=sys.stderr, flush=True)
    time.sleep({INTERVAL_S})
with open(os.environ["FERRY_RESULT"], "w") as f:
    json.dump({{"ticks": {TICKS}}}, f)
'''


def run_live(args: list[str], env: dict) -> tuple[int, dict[str, list[tuple[float, str]]]]:
    """Runs ferry and stamps every line of its stdout and stderr with the time it arrived."""
    proc = subprocess.Popen([ferry_bin(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env={**os.environ, **env})
    lines: dict[str, list[tuple[float, str]]] = {"out": [], "err": []}

    def pump(stream, key):
        for raw in iter(stream.readline, b""):
            lines[key].append((time.time(), raw.decode(errors="replace").rstrip("\n")))

    threads = [threading.Thread(target=pump, args=(proc.stdout, "out")),
               threading.Thread(target=pump, args=(proc.stderr, "err"))]
    for t in threads:
        t.start()
    try:
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        for t in threads:
            t.join(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
    return code, lines


def run_live_in_pty(args: list[str], env: dict) -> tuple[int, list[tuple[float, str]]]:
    """Runs ferry on a pseudo-terminal (stdout and stderr both), stamping each line it shows
    with the time it arrived."""
    lines: list[tuple[float, str]] = []
    taken = 0  # bytes of the terminal's output already cut into lines

    def stamp(_fd: int, shown: bytes) -> None:
        nonlocal taken
        *done, _ = shown[taken:].split(b"\n")
        taken += sum(len(line) + 1 for line in done)
        # What is left of a line once the progress line before it was cleared ("\r\x1b[K").
        lines.extend((time.time(), line.decode(errors="replace").rstrip("\r").split("\x1b[K")[-1])
                     for line in done)

    code, _ = run_in_pty([ferry_bin(), *args], {**os.environ, **env}, 120, stamp)
    return code, lines


class LiveOutput(SshTestCase):
    def setUp(self):
        self.job = write_job(self.tmp, "ticks", TICK_JOB, timeout=60, result="required")

    def assert_on_time(self, lines: list[tuple[float, str]], word: str, prefix: str = "") -> list[float]:
        """Every `WORD I T` line (after `prefix`) arrived within LATE_S of T; their T values."""
        stamps = []
        for arrived, text in lines:
            if not text.startswith(prefix + word + " "):
                continue
            printed = float(text.split()[-1])
            stamps.append(printed)
            self.assertLess(arrived - printed, LATE_S,
                            f"{text!r} arrived {arrived - printed:.2f} s after the job printed it")
        return stamps

    def check_single_host(self, args: list[str], where: str):
        code, lines = run_live(["run", self.job, *args], self.env)
        self.assertEqual(code, 0, lines)
        self.assertEqual(len(self.assert_on_time(lines["out"], "tick")), TICKS, lines["out"])
        # stderr of a successful run is shown, and as it comes.
        self.assertEqual(len(self.assert_on_time(lines["err"], "note")), 1, lines["err"])
        # The summary line comes after the job's output.
        self.assertIn(f"ticks @ {where}: ok", lines["out"][-1][1])

    def test_one_host_streams_each_line_as_the_job_prints_it_locally(self):
        self.check_single_host(["--local"], "local")

    def test_one_host_streams_each_line_as_the_job_prints_it_over_ssh(self):
        for shell in ("zsh", "fish", "tcsh", "bash", "dash"):
            with self.subTest(shell=shell):
                host = self.srv.alias(shell)
                self.check_single_host(["--host", host, "--ssh-config", self.srv.ssh_config], host)

    def test_stream_prefixes_each_line_with_its_host_as_it_arrives(self):
        hosts = [self.srv.alias("bash"), self.srv.alias("zsh")]
        code, lines = run_live(["run", self.job, "--stream", "--host", ",".join(hosts),
                                "--ssh-config", self.srv.ssh_config], self.env)
        self.assertEqual(code, 0, lines)
        for host in hosts:
            self.assertEqual(len(self.assert_on_time(lines["out"], "tick", f"{host}: ")), TICKS,
                             lines["out"])
            self.assertEqual(len(self.assert_on_time(lines["err"], "note", f"{host}: ")), 1,
                             lines["err"])

    def test_a_terminal_streams_a_few_hosts_by_default_and_no_stream_gives_blocks(self):
        """Issue 42.4: on a terminal, a fleet of a few hosts is not silent until each ends."""
        hosts = [self.srv.alias("bash"), self.srv.alias("dash")]
        target = ["--host", ",".join(hosts), "--ssh-config", self.srv.ssh_config]
        code, lines = run_live_in_pty(["run", self.job, *target], self.env)
        self.assertEqual(code, 0, lines)
        for host in hosts:
            self.assertEqual(len(self.assert_on_time(lines, "tick", f"{host}: ")), TICKS, lines)
            self.assertEqual(len(self.assert_on_time(lines, "note", f"{host}: ")), 1, lines)
        self.assertFalse([text for _, text in lines if text.startswith("== ")], lines)
        code, lines = run_live_in_pty(["run", self.job, "--no-stream", *target], self.env)
        self.assertEqual(code, 0, lines)
        self.assertEqual(sorted(text for _, text in lines if text.startswith("== ")),
                         sorted(f"== ticks @ {host} ==" for host in hosts))
        self.assertFalse([text for _, text in lines if text.startswith(f"{hosts[0]}: tick")])

    def test_json_stream_gives_output_events_before_the_record(self):
        code, lines = run_live(["run", self.job, "--local", "--json", "--stream"], self.env)
        self.assertEqual(code, 0, lines)
        objects = [(arrived, json.loads(text)) for arrived, text in lines["out"]]
        events = [(arrived, o) for arrived, o in objects if o.get("event") == "output"]
        records = [o for _, o in objects if "run_id" in o]
        self.assertEqual(len(records), 1, objects)
        self.assertEqual(objects[-1][1], records[0], "the record comes after the events")
        for _, event in events:
            self.assertEqual(set(event), {"event", "host", "job", "stream", "data"}, event)
            self.assertEqual(event["host"], "local")
        stdout = "".join(e["data"] for _, e in events if e["stream"] == "stdout")
        self.assertEqual(stdout, records[0]["stdout"])
        self.assertIn("note ", "".join(e["data"] for _, e in events if e["stream"] == "stderr"))
        # Each tick's event arrived while the job ran, not all at its end.
        for arrived, event in events:
            for line in event["data"].splitlines():
                if line.startswith("tick "):
                    self.assertLess(arrived - float(line.split()[-1]), LATE_S, line)


if __name__ == "__main__":
    unittest.main()
