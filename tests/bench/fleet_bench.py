#!/usr/bin/env python3
"""Fleet speed benchmark: ferry vs OpenSSH vs Ansible on real local sshd instances.

    sudo python3 tests/bench/fleet_bench.py [--quick] [--out FILE.md] [--ferry PATH]

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
import secrets
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

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
HOLDER_ENVS: list[dict] = []   # environments whose ferry connection holders end at the end
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
    return proc


def hyperfine(case: str, commands: list[tuple[str, str]], env: dict, cwd: str, workdir: str,
              runs: int, warmup: int, prepare: str | None = None) -> dict[str, dict]:
    """One hyperfine invocation for all COMMANDS; returns name -> {median_ms, ...}.
    `prepare`: a command hyperfine runs (untimed) before each timed run."""
    export = os.path.join(workdir, f"hyperfine-{case}.json")
    errlog = os.path.join(workdir, f"hyperfine-{case}.stderr")
    outlog = os.path.join(workdir, f"hyperfine-{case}.stdout")
    argv = ["hyperfine", "--shell", HYPERFINE_SHELL, "--warmup", str(warmup), "--runs", str(runs),
            "--export-json", export, "--style", "basic", "--time-unit", "millisecond",
            "--output", outlog]
    if prepare:
        argv += ["--prepare", prepare]
    for name, command in commands:
        # stderr of every timed run is kept (hyperfine itself only reports "non-zero exit code")
        argv += ["--command-name", name, f"{{ {command}; }} 2>>{q(errlog)}"]
    for attempt in range(1, MAX_ATTEMPTS + 1):
        log(f"hyperfine {case}: {len(commands)} commands, {runs} runs, {warmup} warmup"
            + (f" (attempt {attempt})" if attempt > 1 else ""))
        for path in (errlog, outlog):
            open(path, "w").close()
        try:
            proc = subprocess.run(argv, env=env, cwd=cwd, stdout=sys.stderr, stderr=subprocess.PIPE,
                                  text=True, timeout=HYPERFINE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BenchError(f"hyperfine {case} did not finish within {HYPERFINE_TIMEOUT_S} s")
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
        if attempt == MAX_ATTEMPTS:
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


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ferry", default=None, help="ferry binary (default: build/ferry in the repo)")
    ap.add_argument("--quick", action="store_true", help="smoke check: --runs 3 --warmup 1")
    ap.add_argument("--runs", type=int, default=None, help="hyperfine runs per command (default 10)")
    ap.add_argument("--warmup", type=int, default=None, help="hyperfine warmup runs (default 2)")
    ap.add_argument("--out", default=None, help="also write the markdown report to this file")
    args = ap.parse_args(argv)
    if args.out is not None and (os.path.isdir(args.out)
                                 or not os.path.isdir(os.path.dirname(os.path.abspath(args.out)))):
        ap.error(f"--out {args.out}: give a file path in an existing directory (the markdown "
                 f"report is written there at the end)")

    runs = args.runs if args.runs is not None else (3 if args.quick else 10)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    if runs < 1 or warmup < 0:
        ap.error("--runs must be ≥ 1 and --warmup ≥ 0")
    if not args.quick and runs < 10:
        log(f"warning: --runs {runs} < 10; the issue's targets are defined for ≥ 10 runs")
    profile_repeats = 2 if args.quick else 5
    rss_repeats = 1 if args.quick else 3

    ferry = os.path.abspath(args.ferry) if args.ferry else os.path.join(REPO, "build", "ferry")
    if not (os.path.isfile(ferry) and os.access(ferry, os.X_OK)):
        print(f"fleet_bench: ferry binary not found or not executable: {ferry}\n"
              f"Build it first: cmake -S . -B build && cmake --build build -j2 (or pass --ferry PATH)",
              file=sys.stderr)
        return 2
    missing = [t for t in ("hyperfine", "ssh", "scp", "ansible", "ansible-playbook", "bash")
               if not shutil.which(t)]
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
    # time a private copy: a rebuild of build/ferry during the run must not change what is timed
    ferry_copy = os.path.join(workdir, "ferry")
    shutil.copy2(ferry, ferry_copy)
    ferry = ferry_copy
    remote_tmp = f"/tmp/ferry-bench-{secrets.token_hex(8)}.py"
    single = None
    try:
        return _bench(args, ferry, gpu_probe_sh, runs, warmup, profile_repeats, rss_repeats,
                      servers, workdir, remote_tmp, SshServer)
    except BenchError as e:
        print(f"fleet_bench: FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        for holder_env in HOLDER_ENVS:
            subprocess.run([ferry, "disconnect", "--all"], env=holder_env, capture_output=True, timeout=60)
        for cfg, control, alias in MASTERS:
            subprocess.run(["ssh", "-F", cfg, "-o", f"ControlPath={control}", "-O", "exit", alias],
                           capture_output=True, timeout=60)
        if servers:
            single = servers[0]
            # the scp baseline's copy on the "remote" side
            subprocess.run(["ssh", "-F", single.ssh_config, single.alias(SHELL), "rm", "-f", remote_tmp],
                           capture_output=True, timeout=60)
        if SENTINEL and os.path.exists(SENTINEL):
            os.unlink(SENTINEL)
        for srv in reversed(servers):
            try:
                srv.stop()
            except Exception as e:  # keep stopping the others
                log(f"stopping sshd on {srv.listen}: {e}")
        shutil.rmtree(workdir, ignore_errors=True)


def _bench(args, ferry, gpu_probe_sh, runs, warmup, profile_repeats, rss_repeats,
           servers, workdir, remote_tmp, SshServer) -> int:
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = os.getloadavg()

    # --- job files ---------------------------------------------------------------------------
    job = write(os.path.join(workdir, "bench_job.py"), JOB_PY)
    plain = write(os.path.join(workdir, "bench_plain.py"), PLAIN_PY)
    big = write(os.path.join(workdir, "bench_big.py"), BIG_PY)

    # --- servers -----------------------------------------------------------------------------
    log("starting sshd on 127.0.0.1 (cases 1, 2, 4)")
    single = SshServer(sftp="internal", listen="127.0.0.1", reset_users=True)
    servers.append(single)
    single.start()
    log(f"starting {FAN_OUT} sshd instances on 127.0.0.2 .. 127.0.0.{FAN_OUT + 1} (case 3)")
    fleet = []
    for i in range(FAN_OUT):
        srv = SshServer(sftp="internal", listen=f"127.0.0.{i + 2}", reset_users=False)
        servers.append(srv)
        srv.start()
        fleet.append(srv)

    user = SshServer.user(SHELL)
    global SENTINEL
    SENTINEL = os.path.join(SshServer.home(user), f".ferry-bench-sentinel-{secrets.token_hex(4)}")
    plant_sentinel()
    alias1 = single.alias(SHELL)
    cfg1 = single.ssh_config

    # case 3 client files: ssh_config with bench-h01..16, one known_hosts with all 16 keys
    aliases = [f"bench-h{i + 1:02d}" for i in range(FAN_OUT)]
    known16 = write(os.path.join(workdir, "known_hosts_fleet"),
                    "".join(s.known_hosts_line() + "\n" for s in fleet), 0o600)
    empty_global = write(os.path.join(workdir, "global_known_hosts"), "", 0o644)
    cfg16 = write(os.path.join(workdir, "ssh_config_fleet"), "\n".join(
        f"Host {a}\n"
        f"    HostName {s.listen}\n"
        f"    Port {s.port}\n"
        f"    User {user}\n"
        f"    IdentityFile {s.client_key}\n"
        f"    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {known16}\n"
        f"    GlobalKnownHostsFile {empty_global}\n"
        f"    StrictHostKeyChecking yes\n"
        f"    BatchMode yes\n"
        f"    ConnectTimeout 10\n" for a, s in zip(aliases, fleet)), 0o600)
    hosts16 = write(os.path.join(workdir, "hosts_fleet.txt"),
                    "# generated by tests/bench/fleet_bench.py\n" + "".join(a + "\n" for a in aliases))

    # --- ansible -----------------------------------------------------------------------------
    def inv_line(name, srv):
        common = (f"-o UserKnownHostsFile={srv.known_hosts} -o StrictHostKeyChecking=yes "
                  f"-o IdentitiesOnly=yes")
        return (f"{name} ansible_host={srv.listen} ansible_port={srv.port} ansible_user={user} "
                f"ansible_ssh_private_key_file={srv.client_key} ansible_ssh_common_args='{common}'\n")

    inv1 = write(os.path.join(workdir, "inventory_single.ini"), "[bench]\n" + inv_line("bench-single", single))
    inv16 = write(os.path.join(workdir, "inventory_fleet.ini"),
                  "[bench]\n" + "".join(inv_line(a, s) for a, s in zip(aliases, fleet)))
    ansible_home = os.path.join(workdir, "ansible-home")
    os.makedirs(os.path.join(ansible_home, "tmp"), exist_ok=True)
    ansible_cfg = write(os.path.join(workdir, "ansible.cfg"),
                        "[defaults]\n"
                        "host_key_checking = True\n"
                        "gathering = explicit\n"
                        "retry_files_enabled = False\n"
                        "interpreter_python = /usr/bin/python3\n"
                        "nocolor = True\n")
    playbook = write(os.path.join(workdir, "playbook_loop.yml"), json.dumps([{
        "hosts": "all",
        "gather_facts": False,
        "tasks": [{
            "name": f"plain python job x{REPEAT}",
            "ansible.builtin.script": {"cmd": plain, "executable": "python3"},
            "loop": list(range(REPEAT)),
        }],
    }], indent=2) + "\n")

    runtime_dir = os.path.join(workdir, "runtime")
    os.makedirs(runtime_dir, mode=0o700, exist_ok=True)
    HOLDER_ENVS.append(dict(os.environ, XDG_RUNTIME_DIR=runtime_dir))
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
    cwd = workdir                    # no ./jobs, no ./ansible.cfg from the caller

    F = q(ferry)
    ssh1 = f"ssh -F {q(cfg1)} {alias1}"
    ssh1_kex = f"ssh -F {q(cfg1)} -o KexAlgorithms=curve25519-sha256 {alias1}"
    # A warm OpenSSH ControlMaster (ControlPersist), as Ansible and many users have: started
    # once here, used by every timed run, stopped in the finally of main().
    control = os.path.join(workdir, "cm.sock")
    ssh1_cm = f"ssh -F {q(cfg1)} -o ControlMaster=no -o ControlPath={q(control)} {alias1}"
    run_checked("ControlMaster start", f"ssh -F {q(cfg1)} -o ControlMaster=yes -o ControlPath={q(control)} "
                f"-o ControlPersist=3600 -f -N {alias1}", env, cwd)
    MASTERS.append((cfg1, control, alias1))

    # --- case 1 ------------------------------------------------------------------------------
    # "cold": --persist 0, a new SSH connection every time; "held session": the connection a
    # holder keeps (started by the check run below), as every later run has by default.
    keep = "--persist 3600"
    c1 = [
        ("ferry run", f"{F} run {q(job)} --host {alias1} --ssh-config {q(cfg1)} --no-archive --persist 0"),
        ("ferry run (held session)", f"{F} run {q(job)} --host {alias1} --ssh-config {q(cfg1)} --no-archive {keep}"),
        ("ssh python3 -", f"{ssh1} python3 - < {q(plain)}"),
        ("ssh curve25519 python3 -", f"{ssh1_kex} python3 - < {q(plain)}"),
        ("ssh ControlMaster python3 -", f"{ssh1_cm} python3 - < {q(plain)}"),
        ("scp + ssh", f"scp -q -F {q(cfg1)} {q(plain)} {alias1}:{remote_tmp} && {ssh1} python3 {remote_tmp}"),
        ("ansible -m script", f"ansible all -i {q(inv1)} -m script -a {q(plain + ' executable=python3')}"),
        # What the cold target leaves room for: the connection and the session alone, no job.
        (FLOOR_CONNECT, f"{ssh1_kex} true"),
    ]
    for name, cmd in c1:
        run_checked(f"case 1: {name}", cmd, env, cwd, expect=None if name == FLOOR_CONNECT else EXPECT_TEXT)
    wait_for_holders(ferry, env, 1)

    # --- case 2 ------------------------------------------------------------------------------
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

    # --- case 3 ------------------------------------------------------------------------------
    ssh16 = (f"for h in {' '.join(aliases)}; do "
             f"ssh -F {q(cfg16)} $h sh -s < {q(gpu_probe_sh)} || exit 1; done")
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
                       f"sh -c 'ssh -F \"$1\" \"$2\" sh -s < \"$3\"' sh {q(cfg16)} @ {q(gpu_probe_sh)}"),
        (f"ansible -f {FAN_OUT} -m script",
         f"ansible all -i {q(inv16)} -f {FAN_OUT} -m script -a {q(gpu_probe_sh + ' executable=sh')}"),
        # What the cold fan-out leaves room for: the 16 connections and sessions alone, all at
        # once, with the key exchange ferry's libssh negotiates (curve25519), no job.
        (FLOOR_FLEET, at_once +
                      f"ssh -F {q(cfg16)} -o KexAlgorithms=curve25519-sha256 @ true"),
    ]
    for name, cmd in c3:
        proc = run_checked(f"case 3: {name}", cmd, env, cwd)
        if name.startswith("ferry") or name == FLOOR_FLEET:
            continue
        hits = proc.stdout.count('"gpus"') if "ansible" not in name else \
            sum(proc.stdout.count(s) for s in ("CHANGED", "SUCCESS"))
        if hits < FAN_OUT:
            raise BenchError(f"case 3: {name}: {hits} of {FAN_OUT} hosts answered:\n{proc.stdout[-3000:]}")
    wait_for_holders(ferry, env, 1 + FAN_OUT)

    # --- timings -----------------------------------------------------------------------------
    r1 = hyperfine("case1", c1, env, cwd, workdir, runs, warmup)
    # Case 1 again for the held run and the ControlMaster, with a pause before each run (as an
    # engineer or an agent calls it): the holder opens the next run's channel meanwhile
    # (docs/persistence.md), as the ControlMaster idles. No target of its own.
    c1b = [(f"{name} ({SPACED_S} s apart)", cmd) for name, cmd in c1
           if name in ("ferry run (held session)", "ssh ControlMaster python3 -")]
    r1b = hyperfine("case1b", c1b, env, cwd, workdir, runs, warmup, prepare=f"sleep {SPACED_S}")
    r2 = hyperfine("case2", c2, env, cwd, workdir, runs, warmup)
    r3 = hyperfine("case3", c3, env, cwd, workdir, runs, warmup)

    # --- case 4: peak RSS --------------------------------------------------------------------
    big_cmd = f"{F} run {q(big)} --host {alias1} --ssh-config {q(cfg1)} --no-archive"
    t0 = time.monotonic()
    run_checked(f"case 4: {BIG_MIB} MiB job", big_cmd + " >/dev/null", env, cwd)
    big_wall_ms = (time.monotonic() - t0) * 1000
    rss_fanout = peak_rss_kib("case 4: ferry case 3", c3[0][1], env, cwd, workdir, rss_repeats)
    rss_big = peak_rss_kib(f"case 4: ferry {BIG_MIB} MiB job", big_cmd, env, cwd, workdir, rss_repeats)
    rss_one = peak_rss_kib("case 4: ferry case 1 (reference)", c1[0][1], env, cwd, workdir, rss_repeats)
    rss_holder = holders_peak_rss_kib(ferry, env)

    # --- where ferry's time goes (its own --json timings) ------------------------------------
    prof1 = ferry_phase_profile("case 1 ferry", c1[0][1], env, cwd, profile_repeats)
    prof2 = ferry_phase_profile("case 2 ferry", c2[0][1], env, cwd, profile_repeats)
    prof3 = ferry_phase_profile("case 3 ferry", c3[0][1], env, cwd, profile_repeats)

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

    ratio_rows("case1", r1, "ferry run", {"ssh python3 -": ("c1_ssh", "ferry run"),
                                          "ansible -m script": ("c1_ansible", "ferry run"),
                                          "ssh curve25519 python3 -": ("c1_kex", "ferry run"),
                                          "ssh ControlMaster python3 -": ("c1_master", "ferry run (held session)")})
    f_spaced = r1b[c1b[0][0]]["median_ms"]
    for name, _ in c1b:
        m = r1b[name]["median_ms"]
        rows.append(("1", name, f"{m:.1f} ms", f"{m / f_spaced:.2f} (of the held run)", "",
                     "" if name == c1b[0][0] else f"held run = {f_spaced / m:.3f}× (no target)"))
    ratio_rows("case2", r2, c2[0][0], {f"{REPEAT}× ssh python3 -": ("c2_ssh", c2[0][0]),
                                        f"{REPEAT}× ssh ControlMaster python3 -": ("c2_master", c2[2][0])})
    extra_ms = (r2[c2[0][0]]["median_ms"] - r2["ferry run (1 job)"]["median_ms"]) / (REPEAT - 1)
    desc, limit = TARGETS["c2_extra"]
    ok = extra_ms <= limit
    verdicts.append((f"case 2: each extra job {desc}", ok, f"{extra_ms:.1f} ms"))
    rows.append(("2", f"each extra job: (ferry {REPEAT} jobs − ferry 1 job) / {REPEAT - 1}",
                 f"{extra_ms:.1f} ms", "", desc, "yes" if ok else "NO"))
    ratio_rows("case3", r3, c3[0][0], {f"{FAN_OUT} sequential ssh": ("c3_ssh", c3[0][0]),
                                        f"ansible -f {FAN_OUT} -m script": ("c3_ansible", c3[0][0])})

    for key, label, kib in (("c4_fanout", f"ferry peak RSS, case 3 (gpu_probe × {FAN_OUT} hosts, -j {FAN_OUT})", rss_fanout),
                            ("c4_big", f"ferry peak RSS, job printing {BIG_MIB} MiB to stdout (1 host)", rss_big)):
        desc, limit = TARGETS[key]
        ok = kib <= limit
        verdicts.append((f"case 4: {label} {desc}", ok, f"{kib / 1024:.1f} MiB"))
        rows.append(("4", label, f"{kib / 1024:.1f} MiB ({kib} KiB)", "", desc, "yes" if ok else "NO"))
    desc, limit = TARGETS["c4_holder"]
    ok = rss_holder <= limit
    verdicts.append((f"case 4: connection holder peak RSS (largest of {1 + FAN_OUT}) {desc}", ok,
                     f"{rss_holder / 1024:.1f} MiB"))
    rows.append(("4", f"connection holder peak RSS (largest of {1 + FAN_OUT}, after cases 1–3)",
                 f"{rss_holder / 1024:.1f} MiB ({rss_holder} KiB)", "", desc, "yes" if ok else "NO"))
    rows.append(("4", "ferry peak RSS, case 1 (reference, no target)",
                 f"{rss_one / 1024:.1f} MiB ({rss_one} KiB)", "", "", ""))

    versions = {
        "ferry": tool_version([ferry, "--version"]),
        "ssh": tool_version(["ssh", "-V"]),
        "ansible": tool_version(["ansible", "--version"]),
        "hyperfine": tool_version(["hyperfine", "--version"]),
    }
    nproc = tool_version(["nproc"])
    load_end = os.getloadavg()
    lines = [
        f"## ferry fleet benchmark — {started.strftime('%Y-%m-%d %H:%M UTC')}",
        "",
        f"- machine: {nproc} CPUs (nproc), {cpu_model()}, {platform.system()} {platform.release()}",
        f"- versions: ferry {versions['ferry']} · {versions['ssh']} · {versions['ansible']} · {versions['hyperfine']}",
        f"- load average (1/5/15 min): {' '.join(f'{x:.2f}' for x in load_start)} at start, "
        f"{' '.join(f'{x:.2f}' for x in load_end)} at end",
        f"- hyperfine: one invocation per case, --warmup {warmup}, --runs {runs}, "
        f"shell `{HYPERFINE_SHELL}` (spawn time subtracted); medians; "
        f"test user `{user}`; sshd on 127.0.0.1 and 127.0.0.2–127.0.0.{FAN_OUT + 1}"
        + (" — **--quick smoke run, not a measurement**" if args.quick else ""),
        "",
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
    floor_c = r1[FLOOR_CONNECT]["median_ms"]
    kex = r1["ssh curve25519 python3 -"]["median_ms"]
    floor_p = r2[FLOOR_PYTHON]["median_ms"]
    master20 = r2[f"{REPEAT}× ssh ControlMaster python3 -"]["median_ms"]
    floor_f = r3[FLOOR_FLEET]["median_ms"]
    seq16 = r3[f"{FAN_OUT} sequential ssh"]["median_ms"]
    lines += [
        "Floors (timed in the same invocations; no target of their own):",
        f"- cold single job: a bare connection and session (`ssh curve25519 true`) takes "
        f"{floor_c:.1f} ms = {floor_c / kex:.3f}× the curve25519 ssh job; the target asks "
        f"≤ {TARGETS['c1_kex'][1]}× for a connection and the job; ferry took "
        f"{r1['ferry run']['median_ms'] - floor_c:+.1f} ms beyond the bare connection",
        f"- {REPEAT} jobs on one host: the {REPEAT} python interpreters alone, here, one per core "
        f"at a time, take {floor_p:.1f} ms = {floor_p / master20:.3f}× the {REPEAT} ControlMaster "
        f"calls; the target asks ≤ {TARGETS['c2_master'][1]}×; ferry's held run took "
        f"{r2[c2[2][0]]['median_ms'] - floor_p:+.1f} ms beyond them",
        f"- {FAN_OUT} hosts, cold: the {FAN_OUT} bare connections and sessions at once "
        f"(`ssh curve25519 true`) take {floor_f:.1f} ms = {floor_f / seq16:.3f}× the {FAN_OUT} "
        f"sequential ssh; the target asks ≤ {TARGETS['c3_ssh'][1]}×; ferry's cold run took "
        f"{r3[c3[0][0]]['median_ms'] - floor_f:+.1f} ms beyond them",
        "",
    ]
    if RETRIES:
        lines += ["Re-run after a failure (see the log above):"] + [f"- {r}" for r in RETRIES] + [""]
    lines += [
        f"Where ferry's time goes (its `--json` `timings`, ms; medians of {profile_repeats} "
        "invocations; wall = whole process as seen from outside):",
        f"- case 1 (1 job): wall {prof1['wall_ms']:.1f}; {fmt_phases(prof1['sum_ms'])}; "
        f"run duration {prof1['max_duration_ms']:.1f}; outside the run "
        f"{prof1['wall_ms'] - prof1['max_duration_ms']:.1f}",
        f"- case 2 ({prof2['records']} jobs, one session): wall {prof2['wall_ms']:.1f}; "
        f"sum over jobs: {fmt_phases(prof2['sum_ms'])}; first job: {fmt_phases(prof2['first_ms'])}; "
        f"each later job (mean): {fmt_phases(prof2['rest_mean_ms'])}; "
        f"sum of run durations {prof2['sum_duration_ms']:.1f}",
        f"- case 3 ({prof3['records']} hosts, -j {FAN_OUT}): wall {prof3['wall_ms']:.1f}; "
        f"per host (mean): {fmt_phases(prof3['mean_ms'])}; slowest host's run {prof3['max_duration_ms']:.1f}; "
        f"sum over hosts: {fmt_phases(prof3['sum_ms'])}",
        f"- case 4: the {BIG_MIB} MiB job took {big_wall_ms:.0f} ms wall (single run)",
        "",
    ]
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
        log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
