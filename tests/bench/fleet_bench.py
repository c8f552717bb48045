#!/usr/bin/env python3
"""Fleet speed benchmark: ferry vs OpenSSH vs Ansible on real local sshd instances.

    sudo python3 tests/bench/fleet_bench.py [--quick] [--out FILE.md] [--ferry PATH]
        [--cases LIST] [--ferry-b PATH --b-name LABEL]

Builds nothing: it times the ferry binary given by --ferry (default build/ferry under the
repository root).  Must run as root (the sshd test fixture creates the ferryt-* users and
starts sshd).  Needs hyperfine, ssh, scp, ansible, ansible-playbook and /usr/bin/time.

Cases (see tests/bench/README.md):
  1. one small python job on one host: ferry run | ssh python3 - | ssh -o KexAlgorithms=
     curve25519-sha256 python3 - | ssh through a warm ControlMaster | scp + ssh | ansible -m script
  2. the same job 20 times on one host: one ferry run (20 jobs) | 20 ssh | 20 ssh through a warm
     ControlMaster | playbook 20-item loop
  3. gpu_probe on 16 hosts (sshd on 127.0.0.2..17): ferry -j 16 | 16 sequential ssh | ansible -f 16
  4. peak RSS of ferry for case 3 and for a job printing 500 MiB to stdout
  wan1, wan2. through a relay delaying each direction 50 ms (wan_relay.py): one job cold and
     held against ssh and a ControlMaster; 20 jobs cold and held against 20 ssh through it
  fleet256 (only when asked). 256 hosts (16 sshd × 16 addresses 127.1.I.J), -j/-P/-p/-f 64:
     ferry cold, first run with persistence, held | xargs ssh | pssh | clush | ansible | floor
  cpu (only when asked). CPU time per run on one host, split between the client and the host
     (cpuacct cgroups: the sshd daemon's, every session and job under it, and the client's):
     ferry --persist 0 | ssh python3 - | ssh true. On the fleet fixture both sides share this
     machine's cores, so per-run CPU, not latency, sets fleet256's times.

--cases picks cases (default loopback,wan: 1-4, wan1, wan2). --ferry-b adds B's twin of every
ferry command to the same invocations; the report gives B ÷ A per command.

Every command is run once and must succeed before it is timed; hyperfine runs each case in
ONE invocation (--warmup 2, --runs 10 by default) and the medians come from its JSON export.
All traffic stays on 127.0.0.0/8; every sshd started here is stopped (try/finally).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import secrets
import shlex
import shutil
import statistics
import subprocess
import socket
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))

FAN_OUT = 16                      # case 3 host count: 127.0.0.2 .. 127.0.0.17
REPEAT = 20                       # case 2 job count
BIG_MIB = 500                     # case 4 stdout volume
SHELL = "bash"                    # login shell of the test user (ferryt-bash)
HYPERFINE_SHELL = "bash --norc --noprofile"
SPACED_S = 0.3                    # case 1b: the pause before each timed run
CHECK_TIMEOUT_S = 600
HYPERFINE_TIMEOUT_S = 3600

# Floors, timed beside the baselines (no target of their own): what no tool that connects
# anew, or that starts a fresh python per job, can go below on this machine.
FLOOR_CONNECT = "floor: ssh curve25519 true (connection and session, no job)"
FLOOR_PYTHON = f"floor: {REPEAT}× python3 job, here, one per core at a time (no SSH)"
PARALLEL_SSH = f"{FAN_OUT}× ssh at once (xargs -P {FAN_OUT})"
FLOOR_FLEET = f"floor: {FAN_OUT}× ssh curve25519 true at once (connections and sessions, no job)"
HOST_PYTHON = "/usr/bin/python3"  # the test user's python3 (a login PATH)

TARGETS = {
    # key: (description, limit); ratio targets are "ferry <= limit x baseline"
    "c1_ssh": ("ferry ≤ 0.6× this", 0.6),
    "c1_ansible": ("ferry ≤ 0.15× this", 0.15),
    "c1_kex": ("ferry ≤ 0.6× this", 0.6),
    "c1_master": ("ferry ≤ 1.0× this", 1.0),
    "c2_master": ("ferry ≤ 0.35× this", 0.35),
    "c2_ssh": ("ferry ≤ 0.25× this", 0.25),
    "c2_extra": ("≤ 25 ms", 25.0),
    "c3_ssh": ("ferry ≤ 0.3× this", 0.3),
    "c3_ansible": ("ferry ≤ 0.25× this", 0.25),
    "c4_fanout": ("≤ 32 MiB", 32 * 1024),
    "c4_big": ("≤ 64 MiB", 64 * 1024),
    "c4_holder": ("≤ 32 MiB", 32 * 1024),
}

JOB_PY = '''\
# /// ferry
# description = "bench: format a token count (tiny python job)"
# interpreter = "python3"
# timeout = 60
# ///
import json
import os

n = 1216348
text = f"{n:,.0f} tokens"
print(text)
result = os.environ.get("FERRY_RESULT")
if result:
    with open(result, "w") as f:
        json.dump({"tokens": n, "text": text}, f)
'''

# What ssh, scp and ansible run: the job file itself, so both sides do the same work (the same
# imports and statements; without FERRY_RESULT it writes no result file). Until 2026-12-01 the
# baselines ran a copy without the two imports, ~8 ms less python start-up than ferry's job.
PLAIN_PY = JOB_PY

BIG_PY = f'''\
# /// ferry
# description = "bench: print {BIG_MIB} MiB to stdout"
# interpreter = "python3"
# timeout = 600
# ///
import json
import os
import sys

block = (b"x" * 1023 + b"\\n") * 1024          # 1 MiB
out = sys.stdout.buffer
for _ in range({BIG_MIB}):
    out.write(block)
out.flush()
result = os.environ.get("FERRY_RESULT")
if result:
    with open(result, "w") as f:
        json.dump({{"bytes": {BIG_MIB} * len(block)}}, f)
'''

EXPECT_TEXT = "1,216,348 tokens"


class BenchError(Exception):
    pass


RETRIES: list[str] = []   # hyperfine invocations that failed and were re-run
MASTERS: list[tuple[str, str, str]] = []   # (ssh config, ControlPath, alias) of masters started
HOLDER_ENVS: list[tuple[str, dict]] = []   # (ferry, environment): holders ended at the end
RELAYS: list[subprocess.Popen] = []        # WAN relays, stopped at the end
CHECKED_OUT: dict[str, str] = {}           # command -> stdout of its check run
HOLDERS_PY = os.path.join(HERE, "fleet_holders.py")
MAX_ATTEMPTS = 3

# The ferryt-* test users are shared by every process on the machine that uses the sshd
# fixture, and SshServer(reset_users=True).start() kills their processes and empties their
# homes. A file planted in the test user's home tells afterwards whether that happened.
SENTINEL: str | None = None
RESET_NOTE = ("NOTE: the test user's home was emptied during the run: another process started "
              "the sshd fixture with reset_users=True (e.g. integration tests), which kills the "
              "test users' processes. Do not run the benchmark alongside the integration tests.")


def plant_sentinel() -> None:
    if SENTINEL:
        with open(SENTINEL, "w") as f:
            f.write("fleet_bench.py: removed only by a reset of the test users\n")


def users_were_reset() -> bool:
    return bool(SENTINEL) and not os.path.exists(SENTINEL)


def log(msg: str) -> None:
    print(f"[fleet_bench] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- helpers

def q(s: str) -> str:
    return shlex.quote(s)


def run_checked(label: str, command: str, env: dict, cwd: str, expect: str | None = None,
                timeout: float = CHECK_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run COMMAND once the way hyperfine will (bash -c); abort with its stderr on failure."""
    log(f"check: {label}")
    try:
        proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", command], env=env, cwd=cwd,
                              capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{label}: `{command}` did not finish within {timeout:.0f} s")
    if proc.returncode != 0:
        raise BenchError(f"{label}: `{command}` exited {proc.returncode}\n"
                         + (RESET_NOTE + "\n" if users_were_reset() else "") +
                         f"--- stderr ---\n{proc.stderr.strip()[-4000:]}\n"
                         f"--- stdout ---\n{proc.stdout.strip()[-4000:]}")
    if expect is not None and expect not in proc.stdout:
        raise BenchError(f"{label}: `{command}` exited 0 but its output lacks {expect!r}\n"
                         f"--- stdout ---\n{proc.stdout.strip()[-4000:]}\n"
                         f"--- stderr ---\n{proc.stderr.strip()[-4000:]}")
    CHECKED_OUT[command] = proc.stdout
    return proc


def hyperfine(case: str, commands: list[tuple[str, str]], env: dict, cwd: str, workdir: str,
              runs: int, warmup: int, prepare: str | list[str] | None = None, cleanup: str | None = None,
              attempts: int = MAX_ATTEMPTS, timeout_s: float = HYPERFINE_TIMEOUT_S) -> dict[str, dict]:
    """One hyperfine invocation for all COMMANDS; returns name -> {median_ms, ...}.
    `prepare`: a command hyperfine runs (untimed) before each timed run, or one per command;
    `cleanup`: one it runs after each command's runs."""
    export = os.path.join(workdir, f"hyperfine-{case}.json")
    errlog = os.path.join(workdir, f"hyperfine-{case}.stderr")
    outlog = os.path.join(workdir, f"hyperfine-{case}.stdout")
    argv = ["hyperfine", "--shell", HYPERFINE_SHELL, "--warmup", str(warmup), "--runs", str(runs),
            "--export-json", export, "--style", "basic", "--time-unit", "millisecond",
            "--output", outlog]
    for one in ([prepare] if isinstance(prepare, str) else prepare or []):
        argv += ["--prepare", one]
    if cleanup:
        argv += ["--cleanup", cleanup]
    for name, command in commands:
        # stderr of every timed run is kept (hyperfine itself only reports "non-zero exit code")
        argv += ["--command-name", name, f"{{ {command}; }} 2>>{q(errlog)}"]
    for attempt in range(1, attempts + 1):
        log(f"hyperfine {case}: {len(commands)} commands, {runs} runs, {warmup} warmup"
            + (f" (attempt {attempt})" if attempt > 1 else ""))
        for path in (errlog, outlog):
            open(path, "w").close()
        try:
            proc = subprocess.run(argv, env=env, cwd=cwd, stdout=sys.stderr, stderr=subprocess.PIPE,
                                  text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise BenchError(f"hyperfine {case} did not finish within {timeout_s:.0f} s")
        if proc.returncode == 0:
            break
        # hyperfine only says "non-zero exit code": find out which command and why.
        reset = users_were_reset()
        why = [f"hyperfine {case} attempt {attempt} exited {proc.returncode}: {proc.stderr.strip()}",
               f"--- last stderr of the timed runs ({errlog}) ---\n{tail(errlog)}",
               f"--- last stdout of the timed runs ---\n{tail(outlog)}"]
        if reset:
            why.insert(1, RESET_NOTE)
        for name, command in commands:
            try:
                run_checked(f"{case}: {name} (after hyperfine failed)", command, env, cwd)
            except BenchError as e:
                why.append(str(e))
        RETRIES.append(f"{case} attempt {attempt}: "
                       + ("test users reset by another process during the run; " if reset else "")
                       + " | ".join(w.replace("\n", " ")[:600] for w in why))
        log("\n".join(why))
        if attempt == attempts:
            raise BenchError("\n".join(why))
        plant_sentinel()
    with open(export) as f:
        data = json.load(f)
    out = {}
    for res in data["results"]:
        times = res["times"]
        out[res["command"]] = {
            "median_ms": res["median"] * 1000.0,
            "mean_ms": res["mean"] * 1000.0,
            "stddev_ms": (res.get("stddev") or 0.0) * 1000.0,
            "min_ms": res["min"] * 1000.0,
            "max_ms": res["max"] * 1000.0,
            "runs": len(times),
            "times_ms": [t * 1000.0 for t in times],
        }
    missing = [n for n, _ in commands if n not in out]
    if missing:
        raise BenchError(f"hyperfine {case}: no result for {missing} in {export}")
    return out


def tail(path: str, n: int = 3000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:].strip()
    except OSError as e:
        return f"({e})"


def peak_rss_kib(label: str, command: str, env: dict, cwd: str, workdir: str, repeats: int) -> int:
    """Largest peak RSS (KiB, /usr/bin/time -f %M) of COMMAND over REPEATS runs."""
    worst = 0
    for i in range(repeats):
        out = os.path.join(workdir, f"rss-{secrets.token_hex(4)}.txt")
        run_checked(f"{label} (RSS run {i + 1}/{repeats})",
                    f"/usr/bin/time -f %M -o {q(out)} {command} >/dev/null", env, cwd)
        with open(out) as f:
            worst = max(worst, int(f.read().strip().splitlines()[-1]))
    return worst


def held(ferry: str, env: dict) -> list[dict]:
    proc = subprocess.run([ferry, "disconnect", "--list", "--json"], env=env, capture_output=True,
                          text=True, timeout=60)
    return json.loads(proc.stdout or "[]")


def wait_for_holders(ferry: str, env: dict, count: int) -> None:
    """The holders the check runs left have connected (each connects in the background)."""
    deadline = time.monotonic() + 60
    while len(held(ferry, env)) < count:
        if time.monotonic() > deadline:
            raise BenchError(f"{len(held(ferry, env))} connection holders after 60 s, expected {count}")
        time.sleep(0.2)


def wait_for_host_holder(ferry: str, env: dict, host: str) -> None:
    """The holder a check run left for HOST has connected."""
    deadline = time.monotonic() + 60
    while not any(h.get("host") == host and not h.get("ended") for h in held(ferry, env)):
        if time.monotonic() > deadline:
            raise BenchError(f"no connection holder for {host} 60 s after its held run")
        time.sleep(0.2)


def holders_peak_rss_kib(ferry: str, env: dict) -> int:
    """The largest peak RSS (VmHWM) among the live connection holders."""
    peak = 0
    for h in held(ferry, env):
        with open(f"/proc/{h['pid']}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
    if not peak:
        raise BenchError("no connection holder to measure")
    return peak


def tool_version(argv: list[str]) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unavailable ({e})"
    text = (p.stdout.strip() or p.stderr.strip()).splitlines()
    return text[0] if text else "?"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write(path: str, text: str, mode: int = 0o644) -> str:
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


# ----------------------------------------------------------------------------- ferry --json timings

PHASES = ("connect", "upload", "exec", "fetch")


def ferry_phase_profile(label: str, command: str, env: dict, cwd: str, repeats: int) -> dict:
    """Run `COMMAND --json` REPEATS times; aggregate the per-run `timings` records.

    Per invocation: wall time, number of records, sum over records of each phase, and the
    largest per-record duration. Returns the medians over the invocations."""
    per_invocation = []
    for i in range(repeats):
        t0 = time.monotonic()
        proc = run_checked(f"{label} --json ({i + 1}/{repeats})", command + " --json", env, cwd)
        wall = time.monotonic() - t0
        records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip().startswith("{")]
        if not records:
            raise BenchError(f"{label}: `{command} --json` printed no JSON records:\n{proc.stdout[-2000:]}")
        bad = [r for r in records if r.get("status") != "ok"]
        if bad:
            raise BenchError(f"{label}: runs not ok: {json.dumps(bad[0])[:2000]}")
        sums = {p: 0.0 for p in PHASES}
        firsts = {p: 0.0 for p in PHASES}
        rest = {p: [] for p in PHASES}
        ordered = sorted(records, key=lambda r: r.get("started_at") or "")
        for k, r in enumerate(ordered):
            t = r.get("timings") or {}
            for p in PHASES:
                v = float(t.get(p) or 0.0)
                sums[p] += v
                if k == 0:
                    firsts[p] = v
                else:
                    rest[p].append(v)
        per_invocation.append({
            "wall": wall,
            "records": len(records),
            "sum": sums,
            "first": firsts,
            "rest_mean": {p: (statistics.mean(v) if v else 0.0) for p, v in rest.items()},
            "max_duration": max(float(r.get("duration_s") or 0.0) for r in records),
            "sum_duration": sum(float(r.get("duration_s") or 0.0) for r in records),
        })

    def med(get):
        return statistics.median(get(x) for x in per_invocation)

    return {
        "repeats": repeats,
        "records": per_invocation[0]["records"],
        "wall_ms": med(lambda x: x["wall"]) * 1000,
        "sum_ms": {p: med(lambda x, p=p: x["sum"][p]) * 1000 for p in PHASES},
        "mean_ms": {p: med(lambda x, p=p: x["sum"][p] / x["records"]) * 1000 for p in PHASES},
        "first_ms": {p: med(lambda x, p=p: x["first"][p]) * 1000 for p in PHASES},
        "rest_mean_ms": {p: med(lambda x, p=p: x["rest_mean"][p]) * 1000 for p in PHASES},
        "max_duration_ms": med(lambda x: x["max_duration"]) * 1000,
        "sum_duration_ms": med(lambda x: x["sum_duration"]) * 1000,
    }


def fmt_phases(d: dict) -> str:
    return ", ".join(f"{p} {d[p]:.1f}" for p in PHASES)


# ----------------------------------------------------------------------------- cases and A/B

CASES = ("1", "2", "3", "4", "wan1", "wan2", "fleet256", "cpu")
CASE_GROUPS = {"loopback": ("1", "2", "3", "4"), "wan": ("wan1", "wan2"), "all": CASES}
DEFAULT_CASES = "loopback,wan"


def parse_cases(text: str) -> list[str]:
    """`1,3`, `wan`, `fleet256`, `all` ... -> the cases, in running order; ValueError names a bad one."""
    chosen = set()
    for word in (w.strip() for w in text.split(",")):
        if word not in CASES and word not in CASE_GROUPS:
            raise ValueError(word)
        chosen.update(CASE_GROUPS.get(word, (word,)))
    return [case for case in CASES if case in chosen]


def is_ferry(c, command: str) -> bool:
    return command.startswith(c.F + " ")


def b_name(c, name: str) -> str:
    return f"{name} [{c.b_name}]"


def b_command(c, command: str) -> str:
    """A's ferry command run by B's binary, with B's own connection holders."""
    return f"XDG_RUNTIME_DIR={q(c.runtime_b)} {c.FB}" + command[len(c.F):]


SECOND = " (2nd)"


def with_b(c, commands: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """COMMANDS, each ferry command as A, B, B, A (with --ferry-b; else unchanged): the machine's
    drift during the invocation (load comes and goes) weighs on A and B alike."""
    out = []
    for name, command in commands:
        out.append((name, command))
        if c.FB and is_ferry(c, command):
            twin = (b_name(c, name), b_command(c, command))
            out += [twin, (twin[0] + SECOND, twin[1]), (name + SECOND, command)]
    return out


def merge_abba(c, commands: list[tuple[str, str]], results: dict[str, dict]) -> dict[str, dict]:
    """RESULTS with each side's two runs of a ferry command taken together under its name."""
    for name, command in commands:
        if c.FB and is_ferry(c, command):
            for side in (name, b_name(c, name)):
                times = results[side]["times_ms"] + results.pop(side + SECOND)["times_ms"]
                results[side] = {"median_ms": statistics.median(times), "mean_ms": statistics.mean(times),
                                 "stddev_ms": statistics.stdev(times) if len(times) > 1 else 0.0,
                                 "min_ms": min(times), "max_ms": max(times), "runs": len(times),
                                 "times_ms": times}
    return results


def check_b(c, case: str, commands: list[tuple[str, str]]) -> None:
    """B's twin of every ferry command exits 0 and prints what A's printed (job outputs, answers)."""
    if not c.FB:
        return
    for name, command in commands:
        if not is_ferry(c, command):
            continue
        a_out = CHECKED_OUT.get(command)
        if a_out is None:
            a_out = run_checked(f"{case}: {name}", command, c.env, c.cwd).stdout
        b_out = run_checked(f"{case}: {b_name(c, name)}", b_command(c, command), c.env, c.cwd).stdout
        # Each run's end line, not its summary row: with more than 4 hosts a newer ferry folds the
        # summary by sameness (one line for 16 equal results), an older one has a row per host.
        for marker in (EXPECT_TEXT, ": ok in "):
            if b_out.count(marker) != a_out.count(marker):
                raise BenchError(f"{case}: {b_name(c, name)} printed {marker!r} {b_out.count(marker)} "
                                 f"times, A {a_out.count(marker)}:\n{b_out[-3000:]}")


def timed(c, case: str, commands: list[tuple[str, str]], **kw) -> dict[str, dict]:
    """One hyperfine invocation for COMMANDS and B's twins; B ÷ A noted for the A/B report."""
    results = merge_abba(c, commands, hyperfine(case, with_b(c, commands), c.env, c.cwd, c.workdir,
                                                kw.pop("runs", c.runs), kw.pop("warmup", c.warmup), **kw))
    for name, command in commands:
        if c.FB and is_ferry(c, command):
            ab_timed(c, case, name, results[name], results[b_name(c, name)])
    return results


def ab_timed(c, case: str, name: str, a: dict, b: dict) -> None:
    """A row of the A/B report: medians, and each side's standard deviation over its median."""
    def spread(x):   # none from a single run
        return x["stddev_ms"] / x["median_ms"] if x["runs"] > 1 else None

    c.ab_rows.append((case, name, a["median_ms"], b["median_ms"], "ms", spread(a), spread(b)))


def wait_for_all_holders(c, count: int) -> None:
    wait_for_holders(c.ferry, c.env, count)
    if c.FB:
        wait_for_holders(c.ferry_b, c.env_b, count)


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ferry", default=None, help="ferry binary (default: build/ferry in the repo)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke check: --runs 3 --warmup 1 (fleet256: --fleet-runs 1 --fleet-warmup 0)")
    ap.add_argument("--runs", type=int, default=None, help="hyperfine runs per command (default 10)")
    ap.add_argument("--warmup", type=int, default=None, help="hyperfine warmup runs (default 2)")
    ap.add_argument("--out", default=None, help="also write the markdown report to this file")
    ap.add_argument("--cases", default=DEFAULT_CASES,
                    help=f"cases to run, comma-separated: {', '.join(CASES)}, or the groups "
                         f"loopback (1-4), wan (wan1, wan2), all (default: {DEFAULT_CASES})")
    ap.add_argument("--ferry-b", default=None,
                    help="a second ferry binary: its twin of every ferry command is timed in the "
                         "same invocations, and the report gives B ÷ A")
    ap.add_argument("--b-name", default="B", help="B's label in the report (default B)")
    ap.add_argument("--wan-delay-ms", type=float, default=50.0,
                    help="the WAN relay's delay each way (default 50: a 100 ms round trip)")
    ap.add_argument("--fleet-hosts", type=int, default=256,
                    help="fleet256's host count, 16 per sshd (default 256; fewer for a trial)")
    ap.add_argument("--fleet-parallel", type=int, default=64, help="fleet256's -j/-P/-p/-f (default 64)")
    ap.add_argument("--fleet-runs", type=int, default=None, help="fleet256's hyperfine runs (default 3)")
    ap.add_argument("--fleet-warmup", type=int, default=None, help="fleet256's warmup runs (default 1)")
    args = ap.parse_args(argv)
    if args.out is not None and (os.path.isdir(args.out)
                                 or not os.path.isdir(os.path.dirname(os.path.abspath(args.out)))):
        ap.error(f"--out {args.out}: give a file path in an existing directory (the markdown "
                 f"report is written there at the end)")
    try:
        cases = parse_cases(args.cases)
    except ValueError as e:
        ap.error(f"--cases: no case {str(e)!r}; cases: {', '.join(CASES)}; groups: "
                 f"{', '.join(CASE_GROUPS)}")

    runs = args.runs if args.runs is not None else (3 if args.quick else 10)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    fleet_runs = args.fleet_runs if args.fleet_runs is not None else (1 if args.quick else 3)
    fleet_warmup = args.fleet_warmup if args.fleet_warmup is not None else (0 if args.quick else 1)
    if runs < 1 or warmup < 0 or fleet_runs < 1 or fleet_warmup < 0:
        ap.error("--runs and --fleet-runs must be ≥ 1, --warmup and --fleet-warmup ≥ 0")
    if not 1 <= args.fleet_hosts <= 256 or args.fleet_parallel < 1 or args.wan_delay_ms < 0:
        ap.error("--fleet-hosts must be 1 to 256, --fleet-parallel ≥ 1, --wan-delay-ms ≥ 0")
    if not args.quick and runs < 10 and any(x in cases for x in ("1", "2", "3")):
        log(f"warning: --runs {runs} < 10; the issue's targets are defined for ≥ 10 runs")

    binaries = {"--ferry": os.path.abspath(args.ferry) if args.ferry else os.path.join(REPO, "build", "ferry")}
    if args.ferry_b:
        binaries["--ferry-b"] = os.path.abspath(args.ferry_b)
    for option, path in binaries.items():
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            print(f"fleet_bench: {option}: ferry binary not found or not executable: {path}\n"
                  f"Build it first: cmake -S . -B build && cmake --build build -j2 (or pass --ferry PATH)",
                  file=sys.stderr)
            return 2
    tools = ["hyperfine", "ssh", "scp", "ansible", "ansible-playbook", "bash"]
    if "fleet256" in cases:
        tools += ["parallel-ssh (package pssh)", "clush (package clustershell)", "xargs"]
    missing = [t for t in tools if not shutil.which(t.split()[0])]
    if not os.access("/usr/bin/time", os.X_OK):
        missing.append("/usr/bin/time (package time)")
    if missing:
        print(f"fleet_bench: missing tools: {', '.join(missing)} (run ./setup.sh --deps as root)",
              file=sys.stderr)
        return 2
    gpu_probe_sh = os.path.join(REPO, "jobs", "gpu_probe.sh")
    if not os.path.isfile(gpu_probe_sh):
        print(f"fleet_bench: {gpu_probe_sh} not found", file=sys.stderr)
        return 2

    from sshd_fixture import SshServer  # noqa: E402  (after the argument checks)

    servers: list = []
    workdir = tempfile.mkdtemp(prefix="ferry-bench-")
    # time private copies: a rebuild of build/ferry during the run must not change what is timed
    ferry = os.path.join(workdir, "ferry")
    shutil.copy2(binaries["--ferry"], ferry)
    ferry_b = None
    if args.ferry_b:
        ferry_b = os.path.join(workdir, "ferry-b")
        shutil.copy2(binaries["--ferry-b"], ferry_b)
    remote_tmp = f"/tmp/ferry-bench-{secrets.token_hex(8)}.py"
    c = types.SimpleNamespace(
        args=args, cases=cases, runs=runs, warmup=warmup, fleet_runs=fleet_runs,
        fleet_warmup=fleet_warmup, profile_repeats=2 if args.quick else 5,
        rss_repeats=1 if args.quick else 3, ferry=ferry, F=q(ferry), ferry_b=ferry_b,
        FB=q(ferry_b) if ferry_b else None, b_name=args.b_name, servers=servers, workdir=workdir,
        remote_tmp=remote_tmp, gpu_probe_sh=gpu_probe_sh, SshServer=SshServer, ab_rows=[])
    try:
        return _bench(c)
    except BenchError as e:
        print(f"fleet_bench: FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        for binary, holder_env in HOLDER_ENVS:
            subprocess.run([binary, "disconnect", "--all"], env=holder_env, capture_output=True, timeout=120)
        for cfg, control, alias in MASTERS:
            subprocess.run(["ssh", "-F", cfg, "-o", f"ControlPath={control}", "-O", "exit", alias],
                           capture_output=True, timeout=60)
        for relay in RELAYS:
            relay.terminate()
            relay.wait(30)
        if getattr(c, "single", None):
            # the scp baseline's copy on the "remote" side
            subprocess.run(["ssh", "-F", c.single.ssh_config, c.single.alias(SHELL), "rm", "-f", remote_tmp],
                           capture_output=True, timeout=60)
        if SENTINEL and os.path.exists(SENTINEL):
            os.unlink(SENTINEL)
        for srv in reversed(servers):
            try:
                srv.stop()
            except Exception as e:  # keep stopping the others
                log(f"stopping sshd on {srv.listen}: {e}")
        shutil.rmtree(workdir, ignore_errors=True)


def start_server(c, **kw):
    """An sshd of the fixture; the first one resets the test users and plants the sentinel."""
    global SENTINEL
    srv = c.SshServer(sftp="internal", reset_users=not c.servers, **kw)
    c.servers.append(srv)
    srv.start()
    if SENTINEL is None:
        SENTINEL = os.path.join(c.SshServer.home(c.user), f".ferry-bench-sentinel-{secrets.token_hex(4)}")
        plant_sentinel()
    return srv


def ssh_host_block(alias: str, address: str, port: int, user: str, key: str, known: str,
                   empty_global: str, connect_timeout: int = 10) -> str:
    return (f"Host {alias}\n"
            f"    HostName {address}\n"
            f"    Port {port}\n"
            f"    User {user}\n"
            f"    IdentityFile {key}\n"
            f"    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {known}\n"
            f"    GlobalKnownHostsFile {empty_global}\n"
            f"    StrictHostKeyChecking yes\n"
            f"    BatchMode yes\n"
            f"    ConnectTimeout {connect_timeout}\n")


def inventory_line(name: str, address: str, port: int, user: str, key: str, known: str) -> str:
    common = f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
    return (f"{name} ansible_host={address} ansible_port={port} ansible_user={user} "
            f"ansible_ssh_private_key_file={key} ansible_ssh_common_args='{common}'\n")


def _bench(c) -> int:
    c.started = datetime.datetime.now(datetime.timezone.utc)
    c.load_start = os.getloadavg()
    workdir = c.workdir
    c.user = c.SshServer.user(SHELL)

    # --- job files ---------------------------------------------------------------------------
    c.job = write(os.path.join(workdir, "bench_job.py"), JOB_PY)
    c.plain = write(os.path.join(workdir, "bench_plain.py"), PLAIN_PY)
    c.big = write(os.path.join(workdir, "bench_big.py"), BIG_PY)
    c.empty_global = write(os.path.join(workdir, "global_known_hosts"), "", 0o644)

    # --- servers -----------------------------------------------------------------------------
    c.single = None
    c.fleet = []
    if any(x in c.cases for x in ("1", "2", "4", "wan1", "wan2", "cpu")):
        log("starting sshd on 127.0.0.1 (cases 1, 2, 4, wan)")
        c.single = start_server(c, listen="127.0.0.1")
    if "3" in c.cases or "4" in c.cases:
        log(f"starting {FAN_OUT} sshd instances on 127.0.0.2 .. 127.0.0.{FAN_OUT + 1} (case 3)")
        c.fleet = [start_server(c, listen=f"127.0.0.{i + 2}") for i in range(FAN_OUT)]

    # --- ansible and the environment ---------------------------------------------------------
    ansible_home = os.path.join(workdir, "ansible-home")
    os.makedirs(os.path.join(ansible_home, "tmp"), exist_ok=True)
    ansible_cfg = write(os.path.join(workdir, "ansible.cfg"),
                        "[defaults]\n"
                        "host_key_checking = True\n"
                        "gathering = explicit\n"
                        "retry_files_enabled = False\n"
                        "interpreter_python = /usr/bin/python3\n"
                        "nocolor = True\n")
    runtime_dir = os.path.join(workdir, "runtime")
    os.makedirs(runtime_dir, mode=0o700, exist_ok=True)
    env = dict(os.environ)
    env.update({
        "LC_ALL": "C.UTF-8",
        "ANSIBLE_CONFIG": ansible_cfg,
        "ANSIBLE_HOME": ansible_home,
        "ANSIBLE_LOCAL_TEMP": os.path.join(ansible_home, "tmp"),
        "ANSIBLE_SSH_CONTROL_PATH_DIR": os.path.join(ansible_home, "cp"),
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3",
        "ANSIBLE_GATHERING": "explicit",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        "XDG_CONFIG_HOME": os.path.join(workdir, "xdg-config"),   # no user job dirs
        "FERRY_JOBS_PATH": "",
        # Connection holders (persistent sessions) of this benchmark only; ended at the end.
        "XDG_RUNTIME_DIR": runtime_dir,
    })
    env.pop("FERRY_PERSIST", None)
    env.pop("SSH_AUTH_SOCK", None)   # keys come from the generated configs only
    c.env = env
    c.cwd = workdir                  # no ./jobs, no ./ansible.cfg from the caller
    HOLDER_ENVS.append((c.ferry, dict(env)))
    if c.FB:
        c.runtime_b = os.path.join(workdir, "runtime-b")   # B's own holders
        os.makedirs(c.runtime_b, mode=0o700, exist_ok=True)
        c.env_b = dict(env, XDG_RUNTIME_DIR=c.runtime_b)
        HOLDER_ENVS.append((c.ferry_b, c.env_b))

    sections = []
    if any(x in c.cases for x in ("1", "2", "3", "4")):
        sections += loopback(c)
    if "wan1" in c.cases or "wan2" in c.cases:
        sections += wan(c)
    if "fleet256" in c.cases:
        sections += fleet256(c)
    if "cpu" in c.cases:
        sections += cpu_split(c)
    if c.FB:
        sections += ab_report(c)
    report = "\n".join(header(c) + sections)
    print(report)
    if c.args.out:
        with open(c.args.out, "w") as f:
            f.write(report)
        log(f"wrote {c.args.out}")
    return 0


def header(c) -> list[str]:
    versions = {
        "ferry": tool_version([c.ferry, "--version"]),
        "ssh": tool_version(["ssh", "-V"]),
        "ansible": tool_version(["ansible", "--version"]),
        "hyperfine": tool_version(["hyperfine", "--version"]),
    }
    if "fleet256" in c.cases:
        versions["ssh"] += (f" · pssh {tool_version(['parallel-ssh', '--version'])} · "
                            f"{tool_version(['clush', '--version'])}")
    nproc = tool_version(["nproc"])
    load_end = os.getloadavg()
    where = "127.0.0.1" if c.single else ""
    if c.fleet:
        where += (" and " if where else "") + f"127.0.0.2–127.0.0.{FAN_OUT + 1}"
    lines = [
        f"## ferry fleet benchmark — {c.started.strftime('%Y-%m-%d %H:%M UTC')}",
        "",
        f"- machine: {nproc} CPUs (nproc), {cpu_model()}, {platform.system()} {platform.release()}",
        f"- versions: ferry {versions['ferry']} · {versions['ssh']} · {versions['ansible']} · {versions['hyperfine']}",
        f"- load average (1/5/15 min): {' '.join(f'{x:.2f}' for x in c.load_start)} at start, "
        f"{' '.join(f'{x:.2f}' for x in load_end)} at end",
        "- hyperfine: one invocation per case, "
        + (f"--warmup {c.warmup}, --runs {c.runs}" + (" (fleet256: see its section), "
                                                       if "fleet256" in c.cases else ", ")
           if any(x != "fleet256" for x in c.cases) else "--warmup and --runs in its section, ")
        + f"shell `{HYPERFINE_SHELL}` (spawn time subtracted); medians; "
        f"test user `{c.user}`" + (f"; sshd on {where}" if where else "")
        + (" — **--quick smoke run, not a measurement**" if c.args.quick else ""),
    ]
    if c.args.cases != DEFAULT_CASES:
        lines.append(f"- cases: {', '.join(c.cases)} (--cases {c.args.cases})")
    if c.FB:
        lines.append(f"- A/B: B = `{c.b_name}`, {c.args.ferry_b} ({tool_version([c.ferry_b, '--version'])}); "
                     f"A = {c.args.ferry or 'build/ferry'}")
    return lines + [""]


# ----------------------------------------------------------------------------- cases 1-4

def loopback(c) -> list[str]:
    """Cases 1-4 on loopback, as they always ran; the report's table, targets, floors, profile."""
    sel = c.cases
    env, cwd, workdir, F = c.env, c.cwd, c.workdir, c.F
    job, plain, big = c.job, c.plain, c.big
    user, single, fleet = c.user, c.single, c.fleet

    # case 3 client files: ssh_config with bench-h01..16, one known_hosts with all 16 keys
    aliases = [f"bench-h{i + 1:02d}" for i in range(FAN_OUT)]
    if fleet:
        known16 = write(os.path.join(workdir, "known_hosts_fleet"),
                        "".join(s.known_hosts_line() + "\n" for s in fleet), 0o600)
        cfg16 = write(os.path.join(workdir, "ssh_config_fleet"), "\n".join(
            ssh_host_block(a, s.listen, s.port, user, s.client_key, known16, c.empty_global)
            for a, s in zip(aliases, fleet)), 0o600)
        hosts16 = write(os.path.join(workdir, "hosts_fleet.txt"),
                        "# generated by tests/bench/fleet_bench.py\n" + "".join(a + "\n" for a in aliases))
        inv16 = write(os.path.join(workdir, "inventory_fleet.ini"),
                      "[bench]\n" + "".join(inventory_line(a, s.listen, s.port, user, s.client_key,
                                                           s.known_hosts) for a, s in zip(aliases, fleet)))
    expected_holders = 0
    if single:
        alias1 = single.alias(SHELL)
        cfg1 = single.ssh_config
        inv1 = write(os.path.join(workdir, "inventory_single.ini"),
                     "[bench]\n" + inventory_line("bench-single", single.listen, single.port, user,
                                                  single.client_key, single.known_hosts))
        playbook = write(os.path.join(workdir, "playbook_loop.yml"), json.dumps([{
            "hosts": "all",
            "gather_facts": False,
            "tasks": [{
                "name": f"plain python job x{REPEAT}",
                "ansible.builtin.script": {"cmd": plain, "executable": "python3"},
                "loop": list(range(REPEAT)),
            }],
        }], indent=2) + "\n")
        ssh1 = f"ssh -F {q(cfg1)} {alias1}"
        ssh1_kex = f"ssh -F {q(cfg1)} -o KexAlgorithms=curve25519-sha256 {alias1}"
        # A warm OpenSSH ControlMaster (ControlPersist), as Ansible and many users have: started
        # once here, used by every timed run, stopped in the finally of main().
        control = os.path.join(workdir, "cm.sock")
        ssh1_cm = f"ssh -F {q(cfg1)} -o ControlMaster=no -o ControlPath={q(control)} {alias1}"
        if "1" in sel or "2" in sel:
            run_checked("ControlMaster start", f"ssh -F {q(cfg1)} -o ControlMaster=yes -o ControlPath={q(control)} "
                        f"-o ControlPersist=3600 -f -N {alias1}", env, cwd)
            MASTERS.append((cfg1, control, alias1))

    # --- case 1 ------------------------------------------------------------------------------
    # "cold": --persist 0, a new SSH connection every time; "held session": the connection a
    # holder keeps (started by the check run below), as every later run has by default.
    keep = "--persist 3600"
    c1 = c2 = c3 = []
    if single:
        c1 = [
            ("ferry run", f"{F} run {q(job)} --host {alias1} --ssh-config {q(cfg1)} --no-archive --persist 0"),
            ("ferry run (held session)", f"{F} run {q(job)} --host {alias1} --ssh-config {q(cfg1)} --no-archive {keep}"),
            ("ssh python3 -", f"{ssh1} python3 - < {q(plain)}"),
            ("ssh curve25519 python3 -", f"{ssh1_kex} python3 - < {q(plain)}"),
            ("ssh ControlMaster python3 -", f"{ssh1_cm} python3 - < {q(plain)}"),
            ("scp + ssh", f"scp -q -F {q(cfg1)} {q(plain)} {alias1}:{c.remote_tmp} && {ssh1} python3 {c.remote_tmp}"),
            ("ansible -m script", f"ansible all -i {q(inv1)} -m script -a {q(plain + ' executable=python3')}"),
            # What the cold target leaves room for: the connection and the session alone, no job.
            (FLOOR_CONNECT, f"{ssh1_kex} true"),
        ]
    if "1" in sel:
        for name, cmd in c1:
            run_checked(f"case 1: {name}", cmd, env, cwd, expect=None if name == FLOOR_CONNECT else EXPECT_TEXT)
        check_b(c, "case 1", c1)
        expected_holders = 1
        wait_for_all_holders(c, expected_holders)

    # --- case 2 ------------------------------------------------------------------------------
    if "2" in sel:
        jobs20 = " ".join([q(job)] * REPEAT)
        ssh_loop = (f"for i in {' '.join(str(i) for i in range(1, REPEAT + 1))}; do "
                    f"{ssh1} python3 - < {q(plain)} || exit 1; done")
        c2 = [
            (f"ferry run ({REPEAT} jobs)",
             f"{F} run {jobs20} --host {alias1} --ssh-config {q(cfg1)} --no-archive --persist 0"),
            ("ferry run (1 job)", c1[0][1]),
            (f"ferry run ({REPEAT} jobs, held session)",
             f"{F} run {jobs20} --host {alias1} --ssh-config {q(cfg1)} --no-archive {keep}"),
            (f"{REPEAT}× ssh python3 -", ssh_loop),
            (f"{REPEAT}× ssh ControlMaster python3 -", ssh_loop.replace(ssh1, ssh1_cm)),
            (f"ansible-playbook loop ×{REPEAT}", f"ansible-playbook -i {q(inv1)} {q(playbook)}"),
            # What the 20-job target leaves room for: the 20 interpreters alone, on this machine's
            # cores (the host's: loopback), no SSH at all.
            (FLOOR_PYTHON, f"seq {REPEAT} | xargs -P {os.cpu_count() or 1} -I @ {q(HOST_PYTHON)} {q(plain)}"),
        ]
        for name, cmd in c2:
            if name == "ferry run (1 job)":
                if cmd not in CHECKED_OUT:
                    run_checked(f"case 2: {name}", cmd, env, cwd, expect=EXPECT_TEXT)
                continue
            proc = run_checked(f"case 2: {name}", cmd, env, cwd,
                               expect=None if "ansible" in name else EXPECT_TEXT)
            if name.startswith("ferry") and proc.stdout.count(EXPECT_TEXT) < REPEAT:
                raise BenchError(f"case 2: ferry printed {proc.stdout.count(EXPECT_TEXT)} job outputs, "
                                 f"expected {REPEAT}:\n{proc.stdout[-3000:]}")
            if "ansible" in name and f"ok=1" not in proc.stdout and "changed=1" not in proc.stdout:
                raise BenchError(f"case 2: ansible-playbook recap is not ok:\n{proc.stdout[-3000:]}")
            if (name.startswith(f"{REPEAT}× ssh") or name == FLOOR_PYTHON) \
                    and proc.stdout.count(EXPECT_TEXT) != REPEAT:
                raise BenchError(f"case 2: {name} printed {proc.stdout.count(EXPECT_TEXT)} outputs")
        check_b(c, "case 2", c2)
        expected_holders = 1

    # --- case 3 ------------------------------------------------------------------------------
    if fleet:
        ssh16 = (f"for h in {' '.join(aliases)}; do "
                 f"ssh -F {q(cfg16)} $h sh -s < {q(c.gpu_probe_sh)} || exit 1; done")
        at_once = f"printf '%s\\n' {' '.join(aliases)} | xargs -P {FAN_OUT} -I @ "   # one per host
        c3 = [
            (f"ferry run -j {FAN_OUT}",
             f"{F} run gpu_probe --hosts-file {q(hosts16)} -j {FAN_OUT} --ssh-config {q(cfg16)} --no-archive --persist 0"),
            (f"ferry run -j {FAN_OUT} (held sessions)",
             f"{F} run gpu_probe --hosts-file {q(hosts16)} -j {FAN_OUT} --ssh-config {q(cfg16)} --no-archive {keep}"),
            (f"{FAN_OUT} sequential ssh", ssh16),
            # What fleets use instead of a loop (pssh, pdsh, xargs -P): every host's ssh at once.
            # No target of its own; the is against the sequential loop.
            (PARALLEL_SSH, at_once +
                           f"sh -c 'ssh -F \"$1\" \"$2\" sh -s < \"$3\"' sh {q(cfg16)} @ {q(c.gpu_probe_sh)}"),
            (f"ansible -f {FAN_OUT} -m script",
             f"ansible all -i {q(inv16)} -f {FAN_OUT} -m script -a {q(c.gpu_probe_sh + ' executable=sh')}"),
            # What the cold fan-out leaves room for: the 16 connections and sessions alone, all at
            # once, with the key exchange ferry's libssh negotiates (curve25519), no job.
            (FLOOR_FLEET, at_once +
                          f"ssh -F {q(cfg16)} -o KexAlgorithms=curve25519-sha256 @ true"),
        ]
    if "3" in sel:
        for name, cmd in c3:
            proc = run_checked(f"case 3: {name}", cmd, env, cwd)
            if name.startswith("ferry") or name == FLOOR_FLEET:
                continue
            hits = proc.stdout.count('"gpus"') if "ansible" not in name else \
                sum(proc.stdout.count(s) for s in ("CHANGED", "SUCCESS"))
            if hits < FAN_OUT:
                raise BenchError(f"case 3: {name}: {hits} of {FAN_OUT} hosts answered:\n{proc.stdout[-3000:]}")
        check_b(c, "case 3", c3)
        expected_holders += FAN_OUT
        wait_for_all_holders(c, expected_holders)

    # --- timings -----------------------------------------------------------------------------
    if "1" in sel:
        r1 = timed(c, "case1", c1)
        # Case 1 again for the held run and the ControlMaster, with a pause before each run (as an
        # engineer or an agent calls it): the holder opens the next run's channel meanwhile
        # (docs/persistence.md), as the ControlMaster idles. No target of its own.
        c1b = [(f"{name} ({SPACED_S} s apart)", cmd) for name, cmd in c1
               if name in ("ferry run (held session)", "ssh ControlMaster python3 -")]
        r1b = timed(c, "case1b", c1b, prepare=f"sleep {SPACED_S}")
    if "2" in sel:
        r2 = timed(c, "case2", c2)
    if "3" in sel:
        r3 = timed(c, "case3", c3)

    # --- case 4: peak RSS --------------------------------------------------------------------
    if "4" in sel:
        big_cmd = f"{F} run {q(big)} --host {alias1} --ssh-config {q(cfg1)} --no-archive"
        t0 = time.monotonic()
        run_checked(f"case 4: {BIG_MIB} MiB job", big_cmd + " >/dev/null", env, cwd)
        big_wall_ms = (time.monotonic() - t0) * 1000
        rss_cmds = [("c4_fanout", f"ferry peak RSS, case 3 (gpu_probe × {FAN_OUT} hosts, -j {FAN_OUT})", c3[0][1]),
                    ("c4_big", f"ferry peak RSS, job printing {BIG_MIB} MiB to stdout (1 host)", big_cmd),
                    (None, "ferry peak RSS, case 1 (reference, no target)", c1[0][1])]
        rss = {label: peak_rss_kib(f"case 4: {label}", cmd, env, cwd, workdir, c.rss_repeats)
               for _, label, cmd in rss_cmds}
        if not held(c.ferry, env):   # case 4 alone: one held session to measure
            run_checked("case 4: a holder to measure", c1[1][1], env, cwd, expect=EXPECT_TEXT)
            wait_for_holders(c.ferry, env, 1)
        n_holders = len(held(c.ferry, env))
        rss_holder = holders_peak_rss_kib(c.ferry, env)
        if c.FB:
            for _, label, cmd in rss_cmds:
                b_kib = peak_rss_kib(f"case 4: {label} [{c.b_name}]", f"{c.FB}{cmd[len(F):]}",
                                     c.env_b, cwd, workdir, c.rss_repeats)
                c.ab_rows.append(("case4", label, rss[label] / 1024, b_kib / 1024, "MiB", None, None))
            if not held(c.ferry_b, c.env_b):
                run_checked("case 4: a holder to measure [B]", b_command(c, c1[1][1]), env, cwd)
                wait_for_holders(c.ferry_b, c.env_b, 1)
            c.ab_rows.append(("case4", "connection holder peak RSS (largest)", rss_holder / 1024,
                              holders_peak_rss_kib(c.ferry_b, c.env_b) / 1024, "MiB", None, None))

    # --- where ferry's time goes (its own --json timings) ------------------------------------
    n = c.profile_repeats
    prof1 = ferry_phase_profile("case 1 ferry", c1[0][1], env, cwd, n) if "1" in sel else None
    prof2 = ferry_phase_profile("case 2 ferry", c2[0][1], env, cwd, n) if "2" in sel else None
    prof3 = ferry_phase_profile("case 3 ferry", c3[0][1], env, cwd, n) if "3" in sel else None

    # --- report ------------------------------------------------------------------------------
    rows = []
    verdicts = []

    def ratio_rows(case, results, ferry_name, targets):
        """Rows for every command of the case, divided by `ferry_name`'s median; `targets`:
        baseline name -> (target key, the ferry command it is for)."""
        f_ms = results[ferry_name]["median_ms"]
        for name, _ in {"case1": c1, "case2": c2, "case3": c3}[case]:
            m = results[name]["median_ms"]
            if name == ferry_name:
                rows.append((case[-1], name, f"{m:.1f} ms", "1.00 (ferry)", "", ""))
                continue
            target, met = "", ""
            if name in targets:
                key, ferry_cmd = targets[name]
                desc, limit = TARGETS[key]
                got = results[ferry_cmd]["median_ms"] / m
                ok = got <= limit
                who = "ferry" if ferry_cmd == ferry_name else ferry_cmd
                target = desc.replace("ferry", who)
                met = f"{'yes' if ok else 'NO'} ({who} = {got:.3f}×)"
                verdicts.append((f"case {case[-1]}: {target.replace('this', name)}", ok, f"{got:.3f}×"))
            rows.append((case[-1], name, f"{m:.1f} ms", f"{m / f_ms:.2f}", target, met))

    if "1" in sel:
        ratio_rows("case1", r1, "ferry run", {"ssh python3 -": ("c1_ssh", "ferry run"),
                                              "ansible -m script": ("c1_ansible", "ferry run"),
                                              "ssh curve25519 python3 -": ("c1_kex", "ferry run"),
                                              "ssh ControlMaster python3 -": ("c1_master", "ferry run (held session)")})
        f_spaced = r1b[c1b[0][0]]["median_ms"]
        for name, _ in c1b:
            m = r1b[name]["median_ms"]
            rows.append(("1", name, f"{m:.1f} ms", f"{m / f_spaced:.2f} (of the held run)", "",
                         "" if name == c1b[0][0] else f"held run = {f_spaced / m:.3f}× (no target)"))
    if "2" in sel:
        ratio_rows("case2", r2, c2[0][0], {f"{REPEAT}× ssh python3 -": ("c2_ssh", c2[0][0]),
                                            f"{REPEAT}× ssh ControlMaster python3 -": ("c2_master", c2[2][0])})
        extra_ms = (r2[c2[0][0]]["median_ms"] - r2["ferry run (1 job)"]["median_ms"]) / (REPEAT - 1)
        desc, limit = TARGETS["c2_extra"]
        ok = extra_ms <= limit
        verdicts.append((f"case 2: each extra job {desc}", ok, f"{extra_ms:.1f} ms"))
        rows.append(("2", f"each extra job: (ferry {REPEAT} jobs − ferry 1 job) / {REPEAT - 1}",
                     f"{extra_ms:.1f} ms", "", desc, "yes" if ok else "NO"))
    if "3" in sel:
        ratio_rows("case3", r3, c3[0][0], {f"{FAN_OUT} sequential ssh": ("c3_ssh", c3[0][0]),
                                            f"ansible -f {FAN_OUT} -m script": ("c3_ansible", c3[0][0])})

    if "4" in sel:
        for key, label, _ in rss_cmds[:2]:
            desc, limit = TARGETS[key]
            kib = rss[label]
            ok = kib <= limit
            verdicts.append((f"case 4: {label} {desc}", ok, f"{kib / 1024:.1f} MiB"))
            rows.append(("4", label, f"{kib / 1024:.1f} MiB ({kib} KiB)", "", desc, "yes" if ok else "NO"))
        desc, limit = TARGETS["c4_holder"]
        ok = rss_holder <= limit
        verdicts.append((f"case 4: connection holder peak RSS (largest of {n_holders}) {desc}", ok,
                         f"{rss_holder / 1024:.1f} MiB"))
        rows.append(("4", f"connection holder peak RSS (largest of {n_holders}, after cases 1–3)",
                     f"{rss_holder / 1024:.1f} MiB ({rss_holder} KiB)", "", desc, "yes" if ok else "NO"))
        kib = rss[rss_cmds[2][1]]
        rows.append(("4", rss_cmds[2][1], f"{kib / 1024:.1f} MiB ({kib} KiB)", "", "", ""))

    lines = [
        "| case | command | median | baseline ÷ ferry | target | met |",
        "|---|---|---:|---:|---|---|",
    ]
    lines += [f"| {' | '.join(r)} |" for r in rows]
    lines += [
        "",
        f"Targets met: {sum(ok for _, ok, _ in verdicts)}/{len(verdicts)}"
        + "".join(f"\n- {'met' if ok else '**MISSED**'}: {d} — got {got}" for d, ok, got in verdicts),
        "",
    ]
    floors = []
    if "1" in sel:
        floor_c = r1[FLOOR_CONNECT]["median_ms"]
        c.loopback_floor_ms = floor_c
        kex = r1["ssh curve25519 python3 -"]["median_ms"]
        floors.append(
            f"- cold single job: a bare connection and session (`ssh curve25519 true`) takes "
            f"{floor_c:.1f} ms = {floor_c / kex:.3f}× the curve25519 ssh job; the target asks "
            f"≤ {TARGETS['c1_kex'][1]}× for a connection and the job; ferry took "
            f"{r1['ferry run']['median_ms'] - floor_c:+.1f} ms beyond the bare connection")
    if "2" in sel:
        floor_p = r2[FLOOR_PYTHON]["median_ms"]
        master20 = r2[f"{REPEAT}× ssh ControlMaster python3 -"]["median_ms"]
        floors.append(
            f"- {REPEAT} jobs on one host: the {REPEAT} python interpreters alone, here, one per core "
            f"at a time, take {floor_p:.1f} ms = {floor_p / master20:.3f}× the {REPEAT} ControlMaster "
            f"calls; the target asks ≤ {TARGETS['c2_master'][1]}×; ferry's held run took "
            f"{r2[c2[2][0]]['median_ms'] - floor_p:+.1f} ms beyond them")
    if "3" in sel:
        floor_f = r3[FLOOR_FLEET]["median_ms"]
        seq16 = r3[f"{FAN_OUT} sequential ssh"]["median_ms"]
        floors.append(
            f"- {FAN_OUT} hosts, cold: the {FAN_OUT} bare connections and sessions at once "
            f"(`ssh curve25519 true`) take {floor_f:.1f} ms = {floor_f / seq16:.3f}× the {FAN_OUT} "
            f"sequential ssh; the target asks ≤ {TARGETS['c3_ssh'][1]}×; ferry's cold run took "
            f"{r3[c3[0][0]]['median_ms'] - floor_f:+.1f} ms beyond them")
    if floors:
        lines += ["Floors (timed in the same invocations; no target of their own):"] + floors + [""]
    if RETRIES:
        lines += ["Re-run after a failure (see the log above):"] + [f"- {r}" for r in RETRIES] + [""]
    lines += [
        f"Where ferry's time goes (its `--json` `timings`, ms; medians of {n} "
        "invocations; wall = whole process as seen from outside):",
    ]
    if prof1:
        lines.append(f"- case 1 (1 job): wall {prof1['wall_ms']:.1f}; {fmt_phases(prof1['sum_ms'])}; "
                     f"run duration {prof1['max_duration_ms']:.1f}; outside the run "
                     f"{prof1['wall_ms'] - prof1['max_duration_ms']:.1f}")
    if prof2:
        lines.append(f"- case 2 ({prof2['records']} jobs, one session): wall {prof2['wall_ms']:.1f}; "
                     f"sum over jobs: {fmt_phases(prof2['sum_ms'])}; first job: {fmt_phases(prof2['first_ms'])}; "
                     f"each later job (mean): {fmt_phases(prof2['rest_mean_ms'])}; "
                     f"sum of run durations {prof2['sum_duration_ms']:.1f}")
    if prof3:
        lines.append(f"- case 3 ({prof3['records']} hosts, -j {FAN_OUT}): wall {prof3['wall_ms']:.1f}; "
                     f"per host (mean): {fmt_phases(prof3['mean_ms'])}; slowest host's run {prof3['max_duration_ms']:.1f}; "
                     f"sum over hosts: {fmt_phases(prof3['sum_ms'])}")
    if "4" in sel:
        lines.append(f"- case 4: the {BIG_MIB} MiB job took {big_wall_ms:.0f} ms wall (single run)")
    return lines + [""]


# ----------------------------------------------------------------------------- WAN

WAN_ADDRESS = "127.0.0.100"       # the relay; the sshd it forwards to is on 127.0.0.1
WAN_ALIAS = "bench-wan"
WAN_FLOOR_CONNECT = "floor: ssh curve25519 true (connection and session, no job)"
WAN_FLOOR_HELD = "floor: ssh ControlMaster true (the ControlMaster's: a session on its connection, no job)"


def start_relay(c, target: tuple[str, int]) -> tuple[str, int]:
    """wan_relay.py in front of TARGET, on WAN_ADDRESS; its (address, port)."""
    argv = [sys.executable, os.path.join(HERE, "wan_relay.py"), "--listen", WAN_ADDRESS,
            "--to", f"{target[0]}:{target[1]}", "--delay-ms", str(c.args.wan_delay_ms)]
    if os.geteuid() == 0:
        argv += ["--nice", "-10"]   # the machine's load must not stretch the link's delay
    errors = open(os.path.join(c.workdir, "relay.stderr"), "w")
    relay = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, text=True)
    RELAYS.append(relay)
    words = relay.stdout.readline().split()
    if len(words) != 3 or words[0] != "listening":
        raise BenchError(f"the WAN relay did not start: {tail(errors.name)}")
    return words[1], int(words[2])


def banner_ms(address: tuple[str, int], samples: int = 5) -> float:
    """Median ms from connect() to the SSH banner (through the relay: 2 round trips more)."""
    times = []
    for _ in range(samples):
        t0 = time.monotonic()
        with socket.create_connection(address, timeout=10) as s:
            data = b""
            while b"\n" not in data:
                chunk = s.recv(256)
                if not chunk:
                    raise BenchError(f"{address} closed the connection before the SSH banner")
                data += chunk
        times.append((time.monotonic() - t0) * 1000)
    return statistics.median(times)


def check_relay(c, relay: tuple[str, int], cfg: str) -> str:
    """What the relay adds, measured here: to the SSH banner after connect() (a real link: 2
    round trips) and to a bare `ssh true` (OpenSSH's round trips)."""
    single, rtt = c.single, 2 * c.args.wan_delay_ms
    direct_banner, relay_banner = banner_ms((single.listen, single.port)), banner_ms(relay)

    def ssh_true_ms(command: str) -> float:
        times = []
        for _ in range(3):
            t0 = time.monotonic()
            run_checked("WAN relay check: ssh true", command, c.env, c.cwd)
            times.append((time.monotonic() - t0) * 1000)
        return statistics.median(times)

    direct = ssh_true_ms(f"ssh -F {q(single.ssh_config)} {single.alias(SHELL)} true")
    relayed = ssh_true_ms(f"ssh -F {q(cfg)} {WAN_ALIAS} true")
    return (f"Measured before the cases (medians): connect() to the SSH banner {relay_banner:.1f} ms "
            f"through the relay, {direct_banner:.1f} ms direct: {relay_banner - direct_banner:+.1f} ms "
            f"(a real link: {2 * rtt:g} ms, 2 round trips); `ssh true` {relayed:.0f} ms through it, "
            f"{direct:.0f} ms direct: {(relayed - direct) / rtt:.1f} round trips of {rtt:g} ms")


def wan(c) -> list[str]:
    """ssh and ferry through a relay that delays each direction: one job cold and held, 20 jobs."""
    env, cwd, workdir, F = c.env, c.cwd, c.workdir, c.F
    single = c.single
    rtt = 2 * c.args.wan_delay_ms
    address, port = start_relay(c, (single.listen, single.port))
    keytype_blob = " ".join(single.known_hosts_line().split()[1:3])
    known = write(os.path.join(workdir, "known_hosts_wan"), f"[{address}]:{port} {keytype_blob}\n", 0o600)
    cfg = write(os.path.join(workdir, "ssh_config_wan"),
                ssh_host_block(WAN_ALIAS, address, port, c.user, single.client_key, known,
                               c.empty_global), 0o600)
    ssh = f"ssh -F {q(cfg)} {WAN_ALIAS}"
    control = os.path.join(workdir, "cm-wan.sock")
    ssh_cm = f"ssh -F {q(cfg)} -o ControlMaster=no -o ControlPath={q(control)} {WAN_ALIAS}"
    run_checked("WAN ControlMaster start", f"ssh -F {q(cfg)} -o ControlMaster=yes -o ControlPath={q(control)} "
                f"-o ControlPersist=3600 -f -N {WAN_ALIAS}", env, cwd)
    MASTERS.append((cfg, control, WAN_ALIAS))
    relay_check = check_relay(c, (address, port), cfg)
    run = f"{F} run {{jobs}} --host {WAN_ALIAS} --ssh-config {q(cfg)} --no-archive"
    one, twenty = run.format(jobs=q(c.job)), run.format(jobs=" ".join([q(c.job)] * REPEAT))
    floors = [(WAN_FLOOR_CONNECT, f"ssh -F {q(cfg)} -o KexAlgorithms=curve25519-sha256 {WAN_ALIAS} true"),
              (WAN_FLOOR_HELD, f"{ssh_cm} true")]
    loop = (f"for i in {' '.join(str(i) for i in range(1, REPEAT + 1))}; do "
            f"{ssh_cm} python3 - < {q(c.plain)} || exit 1; done")
    w = {
        "wan1": [("ferry run (cold)", f"{one} --persist 0"),
                 ("ferry run (held session)", f"{one} --persist 3600"),
                 ("ssh python3 -", f"{ssh} python3 - < {q(c.plain)}"),
                 ("ssh ControlMaster python3 -", f"{ssh_cm} python3 - < {q(c.plain)}")] + floors,
        "wan2": [(f"ferry run ({REPEAT} jobs, cold)", f"{twenty} --persist 0"),
                 (f"ferry run ({REPEAT} jobs, held session)", f"{twenty} --persist 3600"),
                 (f"{REPEAT}× ssh ControlMaster python3 -", loop)] + floors,
    }
    # baseline -> the ferry command it is set against
    against = {"wan1": {"ssh python3 -": "ferry run (cold)", WAN_FLOOR_CONNECT: "ferry run (cold)",
                        "ssh ControlMaster python3 -": "ferry run (held session)",
                        WAN_FLOOR_HELD: "ferry run (held session)"},
               "wan2": {f"{REPEAT}× ssh ControlMaster python3 -": f"ferry run ({REPEAT} jobs, cold)",
                        WAN_FLOOR_CONNECT: f"ferry run ({REPEAT} jobs, cold)",
                        WAN_FLOOR_HELD: f"ferry run ({REPEAT} jobs, held session)"}}
    cases = [case for case in ("wan1", "wan2") if case in c.cases]
    for case in cases:
        for name, cmd in w[case]:
            proc = run_checked(f"{case}: {name}", cmd, env, cwd,
                               expect=None if name.startswith("floor") else EXPECT_TEXT)
            want = 0 if name.startswith("floor") else REPEAT if case == "wan2" else 1
            if proc.stdout.count(EXPECT_TEXT) < want:
                raise BenchError(f"{case}: {name} printed {proc.stdout.count(EXPECT_TEXT)} job outputs, "
                                 f"expected {want}:\n{proc.stdout[-3000:]}")
        check_b(c, case, w[case])
    for binary, side_env in [(c.ferry, env)] + ([(c.ferry_b, c.env_b)] if c.FB else []):
        wait_for_host_holder(binary, side_env, WAN_ALIAS)   # the held runs', through the relay
    results = {case: timed(c, case, w[case]) for case in cases}

    lines = [f"### WAN: through a relay that delays each direction by {c.args.wan_delay_ms:g} ms",
             "",
             f"- `tests/bench/wan_relay.py` on {address}:{port} → sshd on {single.listen}:{single.port}. "
             + relay_check,
             "",
             "| case | command | median | ferry ÷ this | set against |",
             "|---|---|---:|---:|---|"]
    notes = []
    for case in cases:
        r = results[case]
        for name, _ in w[case]:
            m = r[name]["median_ms"]
            if name in against[case]:
                who = against[case][name]
                lines.append(f"| {case} | {name} | {m:.1f} ms | {r[who]['median_ms'] / m:.3f} | {who} |")
            else:
                lines.append(f"| {case} | {name} | {m:.1f} ms | | |")
        for floor in (WAN_FLOOR_CONNECT, WAN_FLOOR_HELD):
            who = against[case][floor]
            notes.append(f"- {case}: {who} took {r[who]['median_ms'] - r[floor]['median_ms']:+.1f} ms "
                         f"({(r[who]['median_ms'] - r[floor]['median_ms']) / rtt:+.1f} round trips) "
                         f"beyond `{floor[len('floor: '):]}`")
    floor_wan = results[cases[0]][WAN_FLOOR_CONNECT]["median_ms"]
    if getattr(c, "loopback_floor_ms", None):
        extra = floor_wan - c.loopback_floor_ms
        notes.append(f"- a bare ssh connection and session took {extra:.1f} ms more through the relay "
                     f"than on loopback (case 1's floor, another invocation): {extra / rtt:.1f} round trips")
    notes.append(f"- no held run goes below one round trip ({rtt:g} ms) and the job")
    return lines + ["", "Floors (same invocations):"] + notes + [""]


# ----------------------------------------------------------------------------- 256 hosts

FLEET_PER_DAEMON = 16     # sshd listens on at most 16 addresses
FLEET_JOB_TIMEOUT_S = 1800
FLEET_LOGIN_GRACE_S = 120
SSHD_TROUBLE = re.compile(r"Timeout before authentication|drop connection|MaxStartups|error|fatal",
                          re.IGNORECASE)


def sshd_trouble(c, hosts: list[str]) -> str:
    """The last lines of trouble in the logs of the daemons serving HOSTS."""
    lines = []
    for srv in {c.fleet_server_of[h]: None for h in hosts if h in c.fleet_server_of}:
        found = [line for line in srv.log_text().splitlines() if SSHD_TROUBLE.search(line)]
        lines += [f"sshd {srv.listen}: {line}" for line in found[-5:]]
        lines += [f"sshd {srv.listen}: {len(found)} such lines in all"] if found else []
    return "\n".join(lines) or "(no timeouts, drops or errors in their sshd logs)"


def fleet_ferry_check(c, label: str, binary: str, env: dict, rest: str, n: int) -> int:
    """Run `BINARY REST --json` once under /usr/bin/time; every one of the N hosts must be ok
    (else the hosts that were not, and why). Returns the peak RSS in KiB."""
    out = os.path.join(c.workdir, f"rss-{secrets.token_hex(4)}.txt")
    command = f"/usr/bin/time -f %M -o {q(out)} {q(binary)}{rest} --json"
    log(f"check: {label}")
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", command], env=env, cwd=c.cwd,
                          capture_output=True, text=True, errors="replace", timeout=FLEET_JOB_TIMEOUT_S)
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    ok = {(r.get("target") or {}).get("host") for r in records if r.get("status") == "ok"}
    bad = [r for r in records if r.get("status") != "ok"]
    if proc.returncode != 0 or len(ok) != n or bad:
        why = "; ".join(f"{(r.get('target') or {}).get('host')}: {r.get('status')}: "
                        f"{json.dumps(r.get('error'))[:300]}" for r in bad[:10])
        raise BenchError(f"{label}: `{command}` exited {proc.returncode} after "
                         f"{time.monotonic() - t0:.0f} s, {len(ok)} of {n} hosts ok, {len(bad)} not"
                         + (f" (first {min(10, len(bad))}: {why})" if bad else "")
                         + (f"\n{RESET_NOTE}" if users_were_reset() else "")
                         + "\n--- their sshd logs ---\n"
                         + sshd_trouble(c, [(r.get("target") or {}).get("host") for r in bad])
                         + f"\n--- stderr ---\n{proc.stderr.strip()[-3000:]}")
    log(f"{label}: {n} hosts ok in {time.monotonic() - t0:.1f} s")
    with open(out) as f:
        return int(f.read().strip().splitlines()[-1])


def holders_now(binary: str, env: dict) -> tuple[int, int, int]:
    """(holder processes, their RSS KiB in all, sessions listed) for BINARY's holders."""
    proc = subprocess.run([sys.executable, HOLDERS_PY, "count", binary], env=env,
                          capture_output=True, text=True, timeout=120)
    procs, rss, listed = (int(x) for x in proc.stdout.split())
    return procs, rss, listed


def fleet256(c) -> list[str]:
    """N hosts (16 sshd × 16 addresses 127.1.I.J): ferry cold, first run with persistence, held;
    xargs ssh, pssh, clush, ansible; the floor; ferry's RSS and its holders."""
    n, par = c.args.fleet_hosts, c.args.fleet_parallel
    env, cwd, workdir, F = c.env, c.cwd, c.workdir, c.F
    # Holders are counted by binary: those the earlier cases left must go first.
    for binary, holder_env in HOLDER_ENVS:
        subprocess.run([sys.executable, HOLDERS_PY, "end", binary], env=holder_env, timeout=300)
    daemons = -(-n // FLEET_PER_DAEMON)
    log(f"starting {daemons} sshd instances on {n} addresses 127.1.1.1 .. (fleet256)")
    hosts = []   # (alias, address, server)
    for d in range(daemons):
        addresses = [f"127.1.{d + 1}.{j + 1}" for j in range(min(FLEET_PER_DAEMON, n - d * FLEET_PER_DAEMON))]
        # sshd's default grace for a login (the fixture's 30 s is for quick failures in tests)
        srv = start_server(c, listen=addresses[0], also_listen=addresses[1:],
                           extra_config=f"LoginGraceTime {FLEET_LOGIN_GRACE_S}\n")
        hosts += [(f"fl{d * FLEET_PER_DAEMON + j + 1:03d}", a, srv) for j, a in enumerate(addresses)]
    c.fleet_server_of = {h: srv for h, _, srv in hosts}
    known = write(os.path.join(workdir, "known_hosts_256"),
                  "".join(s.known_hosts_line(a) + "\n" for _, a, s in hosts), 0o600)
    cfg = write(os.path.join(workdir, "ssh_config_256"), "\n".join(
        ssh_host_block(h, a, s.port, c.user, s.client_key, known, c.empty_global, connect_timeout=60)
        for h, a, s in hosts), 0o600)
    hosts_file = write(os.path.join(workdir, "hosts_256.txt"), "".join(h + "\n" for h, _, _ in hosts))
    inv = write(os.path.join(workdir, "inventory_256.ini"), "[bench]\n" + "".join(
        inventory_line(h, a, s.port, c.user, s.client_key, known) for h, a, s in hosts))

    rest = f" run {q(c.job)} --hosts-file {q(hosts_file)} -j {par} --ssh-config {q(cfg)} --no-archive"
    cold, persist = f"{F}{rest} --persist 0", f"{F}{rest}"
    N_COLD = f"ferry -j {par} --persist 0 (cold)"
    N_FIRST = f"ferry -j {par}, persistence on: first run (holders start)"
    N_HELD = f"ferry -j {par} again, sessions held"
    N_FLOOR = f"floor: {n}× ssh curve25519 true, xargs -P {par} (connections and sessions, no job)"
    N_JOBS = f"floor of a held run: {n}× python3 job here, xargs -P {par} (the jobs' interpreters, no SSH)"
    peers = [
        (f"xargs -P {par} ssh python3 -", f"xargs -a {q(hosts_file)} -P {par} -I @ "
                                          f"sh -c 'ssh -F \"$1\" \"$2\" python3 - < \"$3\"' sh {q(cfg)} @ {q(c.plain)}"),
        (f"pssh -p {par}", f"parallel-ssh -h {q(hosts_file)} -p {par} -t 0 -x {q('-F ' + cfg)} -I -i "
                           f"python3 - < {q(c.plain)}"),
        (f"clush -f {par}", f"clush --hostfile {q(hosts_file)} -f {par} -S -o {q('-F ' + cfg)} "
                            f"python3 - < {q(c.plain)}"),
    ]
    ansible = (f"ansible -f {par} -m script", f"ansible all -i {q(inv)} -f {par} -m script -a "
                                              f"{q(c.plain + ' executable=python3')}")
    floor = (N_FLOOR, f"xargs -a {q(hosts_file)} -P {par} -I @ "
                      f"ssh -F {q(cfg)} -o KexAlgorithms=curve25519-sha256 @ true")
    # What a held run cannot go below on this machine: the job's own interpreter on each host
    # (its start and its statements), without any SSH, at the same parallelism; the hosts' python3
    # (the test users' PATH), never a wrapper of the caller's (a pyenv shim is a bash script).
    jobs = (N_JOBS, f"xargs -a {q(hosts_file)} -P {par} -I @ /usr/bin/python3 {q(c.plain)}")

    # --- checks: every host ok, ferry's peak RSS and its holders -----------------------------
    sides = [("A", c.ferry, env)] + ([(c.b_name, c.ferry_b, c.env_b)] if c.FB else [])
    measured = {}
    for side, binary, side_env in sides:
        tag = "" if side == "A" else f" [{side}]"
        subprocess.run([sys.executable, HOLDERS_PY, "end", binary], env=side_env, timeout=300)
        m = {"rss_cold": fleet_ferry_check(c, f"fleet256: {N_COLD}{tag}", binary, side_env,
                                           f"{rest} --persist 0", n)}
        m["rss_first"] = fleet_ferry_check(c, f"fleet256: {N_FIRST}{tag}", binary, side_env, rest, n)
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", "import sys, fleet_holders; "
                        "fleet_holders.wait_for_sessions(sys.argv[1], int(sys.argv[2]))", binary, str(n)],
                       env=side_env, cwd=HERE, timeout=300)
        m["after_first"] = holders_now(binary, side_env)
        log(f"fleet256: {m['after_first'][2]} of {n} sessions held {time.monotonic() - t0:.0f} s "
            f"after the first run; {m['after_first'][0]} holder processes")
        m["rss_held"] = fleet_ferry_check(c, f"fleet256: {N_HELD}{tag}", binary, side_env, rest, n)
        m["after_held"] = holders_now(binary, side_env)
        subprocess.run([sys.executable, HOLDERS_PY, "end", binary], env=side_env, timeout=300)
        measured[side] = m
    for name, cmd in peers + [ansible, floor, jobs]:
        proc = run_checked(f"fleet256: {name}", cmd, env, cwd, timeout=FLEET_JOB_TIMEOUT_S)
        hits = (sum(proc.stdout.count(s) for s in ("CHANGED", "SUCCESS")) if name == ansible[0]
                else n if name == N_FLOOR else proc.stdout.count(EXPECT_TEXT))
        if hits != n:
            raise BenchError(f"fleet256: {name}: {hits} of {n} hosts answered:\n{proc.stdout[-3000:]}")

    # --- one hyperfine invocation ------------------------------------------------------------
    holders = q(HOLDERS_PY)
    py = q(sys.executable)
    end_a = f"{py} {holders} end {F}"
    ready_a = f"{py} {holders} ready {n} {F} {q(persist)}"
    main, commands, prepares = [], [], []

    def add(name, cmd, prep_a, prep_b=None):   # A, B, B, A as with_b() orders them
        main.append((name, cmd))
        for (twin, twin_cmd), prep in zip(with_b(c, [(name, cmd)]), (prep_a, prep_b, prep_b, prep_a)):
            commands.append((twin, twin_cmd))
            prepares.append(prep)

    cleanup = end_a
    if c.FB:
        b_env = f"XDG_RUNTIME_DIR={q(c.runtime_b)}"
        end_b = f"{b_env} {py} {holders} end {c.FB}"
        ready_b = f"{b_env} {py} {holders} ready {n} {c.FB} {q(b_command(c, persist))}"
        cleanup = f"{end_a}; {end_b}"
    else:
        end_b = ready_b = None
    add(N_COLD, cold, "true", "true")
    add(N_FIRST, persist, end_a, end_b)
    add(N_HELD, persist, ready_a, ready_b)
    for name, cmd in peers + [floor, jobs, ansible]:   # ansible last: its masters stay for 60 s
        add(name, cmd, "true")
    per_run_s = 600
    r = merge_abba(c, main, hyperfine(
        "fleet256", commands, env, cwd, workdir, c.fleet_runs, c.fleet_warmup, prepare=prepares,
        cleanup=cleanup, attempts=2, timeout_s=len(commands) * (c.fleet_runs + c.fleet_warmup + 1) * per_run_s))
    if c.FB:
        for name in (N_COLD, N_FIRST, N_HELD):
            ab_timed(c, "fleet256", name, r[name], r[b_name(c, name)])
        a, b = measured["A"], measured[c.b_name]
        for key, label in (("rss_cold", "ferry peak RSS, cold"),
                           ("rss_first", "ferry peak RSS, first run"),
                           ("rss_held", "ferry peak RSS, held")):
            c.ab_rows.append(("fleet256", label, a[key] / 1024, b[key] / 1024, "MiB", None, None))
        c.ab_rows.append(("fleet256", "holders' RSS in all, after the first run",
                          a["after_first"][1] / 1024, b["after_first"][1] / 1024, "MiB", None, None))
    return fleet_report(c, r, measured["A"], n, par, [p[0] for p in peers] + [ansible[0]],
                        (N_COLD, N_FIRST, N_HELD, N_FLOOR, N_JOBS), [name for name, _ in main])


CPUACCT = "/sys/fs/cgroup/cpuacct"


def cpu_split(c) -> list[str]:
    """CPU per run, client and host side, each command run N times in a row (N = --runs × 2)."""
    if not os.path.isfile(os.path.join(CPUACCT, "cpuacct.usage")):
        raise BenchError(f"cpu: no cgroup v1 cpuacct at {CPUACCT}: the case needs it to split "
                         "the client's CPU from the host's")
    groups = {side: os.path.join(CPUACCT, f"ferry-bench-{side}-{os.getpid()}") for side in ("host", "client")}
    for path in groups.values():
        os.makedirs(path, exist_ok=True)
    usage = {side: (lambda p=path: int(open(os.path.join(p, "cpuacct.usage")).read()) / 1e6)
             for side, path in groups.items()}
    srv, n = c.single, 2 * c.runs
    with open(srv.pid_path) as f:
        daemon = f.read().strip()
    with open(os.path.join(groups["host"], "cgroup.procs"), "w") as f:
        f.write(daemon)   # its sessions, login shells and jobs are born in it
    cfg, alias = srv.ssh_config, srv.alias(SHELL)
    ferry_run = f"{c.F} run {q(c.job)} --host {alias} --ssh-config {q(cfg)} --no-archive"
    held = "ferry again, the session held"
    first = "ferry, persistence on: first run (a holder already up)"
    # The first run's host is let go before each run; another host held all along keeps the
    # holder up, as a fleet's other hosts do (one holder start for 256 hosts is not the host's).
    keeper = srv.alias("bash" if SHELL != "bash" else "dash")
    let_go = f"{c.F} disconnect {alias} > /dev/null"
    # In this order: no holder has run yet, so the first cold run finds no python standby's
    # script in the host's job cache and goes over SFTP and launch.sh; the held runs' holder
    # puts it there, and the cold runs after boot a python standby (as fleet256's do).
    commands = [
        ("ferry --persist 0 (cold, over SFTP)", f"{ferry_run} --persist 0"),
        (held, ferry_run),
        (first, f"{let_go} && {ferry_run}"),
        ("ferry disconnect alone (to subtract from the row above)", let_go),
        ("ferry --persist 0 (cold, a python standby)", f"{ferry_run} --persist 0"),
        ("ssh python3 -", f"ssh -F {q(cfg)} {alias} python3 - < {q(c.plain)}"),
        ("floor: ssh true", f"ssh -F {q(cfg)} {alias} true"),
    ]
    rows = {}
    try:
        into_client = f"echo $$ > {q(os.path.join(groups['client'], 'cgroup.procs'))}"
        for name, cmd in commands:
            # Checked first: a held run's holder starts then, in the client's group, and counts
            # there; the others' holders are ended.
            disconnect = [c.ferry, "disconnect", "--all"]
            subprocess.run(disconnect, env=c.env, capture_output=True, timeout=120)
            if name == first:
                # Started in the client's group: the holder's own CPU (the first run's connect,
                # its SFTP steps) counts on the client's side, as the held row's does.
                run_checked("cpu: the holder kept up",
                            f"{into_client} && {c.F} connect {keeper} --ssh-config {q(cfg)} --persist 900",
                            c.env, c.cwd)
            run_checked(f"cpu: {name}", f"{into_client} && {cmd}", c.env, c.cwd)
            before = {side: get() for side, get in usage.items()}
            loop = f"{into_client} && for i in $(seq {n}); do {cmd} > /dev/null || exit 1; done"
            run_checked(f"cpu: {name} × {n}", loop, c.env, c.cwd, timeout=n * 60)
            time.sleep(0.5)   # the host side's last processes end after the client's
            rows[name] = {side: (get() - before[side]) / n for side, get in usage.items()}
    finally:
        subprocess.run([c.ferry, "disconnect", "--all"], env=c.env, capture_output=True, timeout=120)
        time.sleep(1)   # the holder's end
        with open(os.path.join(CPUACCT, "cgroup.procs"), "w") as f:
            f.write(daemon)
        for path in groups.values():
            try:
                os.rmdir(path)
            except OSError as e:
                log(f"cpu: cannot remove {path}: {e}")
    ssh_total = rows["ssh python3 -"]["host"] + rows["ssh python3 -"]["client"]
    lines = [f"### CPU per run on one host: client and host side, {n} runs in a row each",
             "",
             "| command | client | host | both | ÷ ssh python3 - (both) |",
             "|---|---:|---:|---:|---:|"]
    for name, _ in commands:
        r = rows[name]
        lines.append(f"| {name} | {r['client']:.1f} ms | {r['host']:.1f} ms | "
                     f"{r['client'] + r['host']:.1f} ms | {(r['client'] + r['host']) / ssh_total:.3f} |")
    return lines + [""]


def fleet_report(c, r, m, n, par, peer_names, names, order) -> list[str]:
    N_COLD, N_FIRST, N_HELD, N_FLOOR, N_JOBS = names
    ms = {name: r[name]["median_ms"] for name in order}
    fastest = min(peer_names, key=lambda p: ms[p])
    lines = [f"### {n} hosts: {-(-n // FLEET_PER_DAEMON)} sshd × up to {FLEET_PER_DAEMON} "
             f"addresses 127.1.I.J, `-j/-P/-p/-f {par}`, the small python job",
             "",
             f"- one hyperfine invocation, --warmup {c.fleet_warmup}, --runs {c.fleet_runs}"
             + (" (A/B: each ferry command twice, A B B A, taken together)" if c.FB else "") + "; medians; "
             f"every host's run was checked ok first; load average {os.getloadavg()[0]:.2f} at the end",
             "",
             f"| command | median | ÷ fastest peer ({fastest}) | ÷ floor |",
             "|---|---:|---:|---:|"]
    for name in order:
        lines.append(f"| {name} | {ms[name] / 1000:.2f} s | {ms[name] / ms[fastest]:.3f} | "
                     f"{ms[name] / ms[N_FLOOR]:.3f} |")
    peak = max(m["rss_cold"], m["rss_first"], m["rss_held"])
    procs_first, rss_first, listed_first = m["after_first"]
    procs_held, rss_held, listed_held = m["after_held"]
    lines += ["",
              f"- ferry's peak RSS (check runs): cold {m['rss_cold'] / 1024:.1f} MiB, first run "
              f"{m['rss_first'] / 1024:.1f} MiB, held {m['rss_held'] / 1024:.1f} MiB",
              f"- holders after the first run: {procs_first} processes, {rss_first / 1024:.1f} MiB RSS "
              f"in all, {listed_first} sessions listed; after the held run: {procs_held} processes, "
              f"{rss_held / 1024:.1f} MiB, {listed_held} listed",
              ""]
    floor_vs_peer = ms[N_FLOOR] / ms[fastest]
    jobs_vs_peer = ms[N_JOBS] / ms[fastest]
    verdicts = [   # (target, got, limit, note, the floor's own ratio on the target's terms)
        (f"ferry cold ≤ 1.0× the fastest peer ({fastest})", ms[N_COLD] / ms[fastest], 1.0,
         f"the floor alone is {floor_vs_peer:.3f}×", floor_vs_peer),
        ("ferry cold ≤ 1.15× the floor", ms[N_COLD] / ms[N_FLOOR], 1.15, "", None),
        ("the first run with persistence on ≤ 1.1× the cold run", ms[N_FIRST] / ms[N_COLD], 1.1, "", None),
        (f"a held re-run ≤ 0.25× the fastest peer's cold run ({fastest})", ms[N_HELD] / ms[fastest], 0.25,
         f"the jobs' interpreters alone are {jobs_vs_peer:.3f}×, the held run "
         f"{ms[N_HELD] / ms[N_JOBS]:.3f}× them", jobs_vs_peer),
    ]
    lines.append("Targets (issue 43), ratios from this invocation:")
    for desc, got, limit, note, floor_ratio in verdicts:
        below = floor_ratio is not None and floor_ratio > limit
        lines.append(f"- {'met' if got <= limit else '**MISSED**'}: {desc} — got {got:.3f}×"
                     + (f"; {note}" if note else "")
                     + (" (the target lies below the floor)" if below else ""))
    for desc, ok, got in (
            ("ferry's peak RSS ≤ 64 MiB", peak <= 64 * 1024, f"{peak / 1024:.1f} MiB"),
            ("after the run, holder processes ≤ 2", procs_first <= 2, str(procs_first)),
            ("after the run, the holders' RSS ≤ 64 MiB in all", rss_first <= 64 * 1024,
             f"{rss_first / 1024:.1f} MiB")):
        lines.append(f"- {'met' if ok else '**MISSED**'}: {desc} — got {got}")
    return lines + [""]


# ----------------------------------------------------------------------------- A/B report

def ab_report(c) -> list[str]:
    lines = [f"### A/B: B = `{c.b_name}` against A, the same ferry commands in the same invocations",
             "",
             "Each ferry command ran as A, B, B, A in its invocation (so that the machine's drift "
             "weighs on both alike), each side's two halves taken together, here and in the tables "
             "above. B ÷ A per ferry command (medians, ± the standard deviation over the median; "
             "peak RSS for case 4 and fleet256); a difference of 5 % or more is flagged. A flag "
             "within the spread of the runs is noise: take more runs.",
             "",
             "| case | ferry command | A | B | B ÷ A | |",
             "|---|---|---:|---:|---:|---|"]

    def spread(x):
        return "" if x is None else f" ± {100 * x:.0f} %"

    for case, name, a, b, unit, a_sd, b_sd in c.ab_rows:
        ratio = b / a if a else float("inf")
        flag = ("**B ≥ 5 % less**" if ratio <= 0.95 else "**B ≥ 5 % more**" if ratio >= 1.05 else "")
        if flag and abs(ratio - 1) < max(a_sd or 0, b_sd or 0):
            flag += " (within the spread)"
        lines.append(f"| {case} | {name} | {a:.1f} {unit}{spread(a_sd)} | {b:.1f} {unit}{spread(b_sd)} "
                     f"| {ratio:.3f} | {flag} |")
    return lines + [""]


if __name__ == "__main__":
    sys.exit(main())
