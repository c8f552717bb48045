"""A real Slurm 22.05 cluster on this machine for integration tests (Python 3 stdlib only).

    from slurm_fixture import SlurmCluster
    from sshd_fixture import SshServer

    with SlurmCluster(accounting=True) as cluster, SshServer() as login:
        job = subprocess.run(login.ssh_command("zsh", "sbatch --parsable --wrap 'exit 3'"), ...)
        info = cluster.wait_job(int(job.stdout))        # {"JobState": "FAILED", "ExitCode": "3:0", ...}
        cluster.assert_idle()                           # queue empty, no job process left

What runs (as root, no systemd; every daemon in the foreground under a small reaper process,
all files in a fresh root-owned directory under FERRY_TEST_ROOT/slurm that stop() removes):
- munged with its own key and socket (AuthInfo=socket=... in slurm.conf points clients at it);
- with accounting=True, a throwaway mariadbd on 127.0.0.1 (empty datadir, --skip-grant-tables,
  so no mariadb-install-db: that alone costs ~4 s) and slurmdbd, so `sacct` works;
- slurmctld (hostname "ctl" in its own UTS namespace, SlurmctldHost=ctl(127.0.0.1));
- one `slurmd -N nK` per node, each in its own UTS namespace whose hostname is the node name
  (so `hostname` in a job prints n1, n2), on its own port, NodeAddr=127.0.0.1, with
  GPUS_PER_NODE fake GPUs (gres.conf File= entries: symlinks to /dev/null) and the CPU layout
  that `slurmd -C` reports.
Nodes n1 and n2 are in partitions `debug` (default) and `gpu`. With isolated_node=True there is
also n3, alone in partition `isolated`: its slurmd (and so every job step on it) runs in a
its own mount namespace where each of `hidden_paths` (default: the sshd fixture's home base,
where ferry's remote run directories live) is covered by an empty root-owned tmpfs. That is a
node that cannot see the run directory, while n1/n2 share it with the login node. Measured on
n3: a batch job whose output file is in a hidden directory (the default slurm-%j.out in the
submit dir) never starts its script: FAILED, Reason=JobLaunchFailure, ExitCode 0:53; with its
output elsewhere, the step prints "couldn't chdir to ...: going to /tmp instead" and runs in
/tmp, where a path under the hidden dirs does not exist.

/etc/slurm/slurm.conf gets a copy of the cluster's slurm.conf, because clients started by ssh
users read only that path (they never see SLURM_CONF). A slurm.conf that was there before is
kept aside as slurm.conf.ferry-test-saved and put back by stop(). The daemons read the
instance's own copy (SLURM_CONF), next to its gres.conf and slurmdbd.conf.

Helpers for tests: nodes(), wait_nodes_idle(), queue(), job(), wait_job(), sacct_state(),
wait_sacct_state(), cancel_all(), assert_idle(), job_processes(), occupy()/release()/busy()
(hold a node's GPUs with a blocking job), stop_controller()/start_controller() ("controller
down"), log_tail(). Client commands run as root on this machine through run(); tests run them
as the ssh test users through the sshd fixture (the login node).

Why the things below are the way they are (Debian 12, Slurm 22.05, measured on a 2-core VM):
- ProctrackType=proctrack/linuxproc, TaskPlugin=task/none, JobAcctGatherType=none: no cgroups.
- A node's CPU/Boards/Sockets/Cores/Threads must be what `slurmd -C` says, or the node is
  drained ("reconfigured socket/core boundaries"); a drained node is resumed with
  `scontrol update` (ReturnToService=2 lifts DOWN only).
- gres.conf `Count=8` without File= is dropped and the node drains (0 < 8 GPUs).
- SchedulerParameters=batch_sched_delay=0: submit-to-start drops from ~1.9 s to ~0.5 s.
- MinJobAge=4 (22.05 clamps lower values to 2; the default 300 makes `sbatch --wait` poll
  slowly): finished jobs stay visible to squeue/scontrol for ~4 s only, so wait_job() polls;
  `sacct` keeps them, a little behind the end (wait_sacct_state() polls too).
- Time limits are enforced by slurmctld every 30 s (not configurable), and --time has a 1-min
  granularity, so a TIMEOUT takes 60-90 s after the start; a controller restart resets the
  30-s clock.
- Each daemon runs under a child-subreaper (_REAPER) that reaps slurmstepd and whatever a job
  leaves behind (a detached child survives scancel without cgroups), kills them once the
  daemon is gone, and goes down with the test process: this machine's PID 1 reaps orphans
  late (state Z counts as exited) and must not inherit anything.
- Clients retry an unreachable controller for MessageTimeout - 1 s (default 10: `squeue`
  fails after ~9.4 s); extra_config="MessageTimeout=3" makes that 2 s.
- A test user's processes, jobs included, die whenever an sshd fixture resets the users;
  a job that must live long is safer submitted as root (run()).
- A fixture that cannot start raises with the failing daemon's log tail; it never skips.
- A run killed outright leaves its instance dir and /etc/slurm/slurm.conf: the next start()
  kills what is left and removes them (only one cluster per machine, under a lock).

Measured on this machine type (2 shared cores, Debian 12, Slurm 22.05.8; medians, ranges):
- apt-get install: slurmctld slurmd slurm-client munge ~14 s; slurmdbd mariadb-server-core ~9 s.
- start 0.5-1.0 s without accounting; 3.0-4.9 s with it (mariadbd + slurmdbd ~1.2 s, slurmctld's
  registration with slurmdbd ~2 s). stop 0.3 s / 2.5 s.
- sbatch 0.01 s locally, ~0.4 s through ssh; submit to RUNNING 0.85 s (0.6-2.6 s);
  `sbatch --wait` of `true` 2.0 s; `srun -N2 true` 0.09 s locally, ~0.45 s through ssh.
- sacct shows the final state 0.1-0.4 s after scontrol does; scancel to no job process 0.5 s.
- controller stop 1.7 s, start 1.0 s (jobs survive; nodes idle again at once).
- TIMEOUT of a --time=1 job: run time 71-85 s. The whole self-test: 95-100 s.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from sshd_fixture import (HOME_BASE, ROOT, SETUP_HINT, _descendants, _free_port, _kill,
                          _proc_table, _wait_until, unix_socket_accepts)

SLURM_BASE = os.path.join(ROOT, "slurm")
ETC_SLURM = "/etc/slurm"
ETC_SLURM_CONF = os.path.join(ETC_SLURM, "slurm.conf")
SAVED_SLURM_CONF = ETC_SLURM_CONF + ".ferry-test-saved"
MARKER = "# written by tests/integration/slurm_fixture.py"
CLUSTER_NAME = "ferrytest"
CONTROLLER_HOST = "ctl"
NODES = ("n1", "n2")
ISOLATED_NODE = "n3"
GPUS_PER_NODE = 8
FINAL_STATES = {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY", "NODE_FAIL",
                "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
START_TIMEOUT_S = 30.0
CLIENT_TIMEOUT_S = 30.0
LOCK_TIMEOUT_S = 120.0

_TOOLS = {  # tool -> Debian package providing it
    "munged": "munge", "mungekey": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd",
    "sbatch": "slurm-client", "squeue": "slurm-client", "sinfo": "slurm-client",
    "scontrol": "slurm-client", "scancel": "slurm-client", "srun": "slurm-client",
    "unshare": "util-linux", "hostname": "hostname", "mount": "mount",
}
_ACCOUNTING_TOOLS = {"slurmdbd": "slurmdbd", "sacct": "slurm-client",
                     "sacctmgr": "slurm-client", "mariadbd": "mariadb-server-core"}
_TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Runs as `python3 -c REAPER DAEMON ARGS...`: becomes a child subreaper (so slurmstepd and
# whatever a job leaves behind are re-parented here and reaped, not left to PID 1), starts
# the daemon, forwards TERM/INT/HUP to it and reaps every child; once the daemon has exited
# it SIGKILLs everything still below it, so no job outlives its slurmd. It dies with the test
# process (PR_SET_PDEATHSIG). Exits with the daemon's status.
_REAPER = r"""
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(36, 1, 0, 0, 0)                   # PR_SET_CHILD_SUBREAPER
libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() != int(os.environ.pop("FERRY_FIXTURE_PARENT", os.getppid())):
    sys.exit(1)
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
def forward(sig, _frame):
    try: os.kill(pid, sig)
    except ProcessLookupError: pass
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, forward)
def kill_descendants():
    children = {}
    for e in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{e}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(e))
    todo = list(children.get(os.getpid(), []))
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try: os.kill(p, signal.SIGKILL)
        except ProcessLookupError: pass
code, daemon_done = 1, False
while True:
    try: w, status = os.waitpid(-1, 0)
    except ChildProcessError: break
    if w == pid:
        code, daemon_done = os.waitstatus_to_exitcode(status), True
    if daemon_done:
        kill_descendants()
sys.exit(code if code >= 0 else 128 - code)
"""

# Run by /bin/sh inside `unshare --uts [--mount]` (_namespace_prefix) as
#   sh -c NAMESPACE_SETUP HOSTNAME HIDDEN... -- PROGRAM ARGS...
# Fixed text: every value arrives as a positional parameter.
_NAMESPACE_SETUP = r"""
hostname "$0" || exit 1
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
  mount -t tmpfs -o mode=0755,size=64k ferry-hidden "$1" || exit 1
  shift
done
shift
exec "$@"
"""


def _tool(name: str) -> str | None:
    return shutil.which(name, path=_TOOL_PATH)


def missing_prerequisites(accounting: bool, euid: int | None = None, which=None) -> list[str]:
    """What keeps the cluster from starting, one readable item each (empty: all there)."""
    euid = os.geteuid() if euid is None else euid
    which = which or _tool
    missing = []
    if euid != 0:
        missing.append(f"root (running as uid {euid}; the fixture starts munged and the Slurm daemons)")
    tools = {**_TOOLS, **(_ACCOUNTING_TOOLS if accounting else {})}
    for tool, package in tools.items():
        if not which(tool):
            missing.append(f"{tool} (package {package})")
    return missing


def require_prerequisites(accounting: bool, euid: int | None = None, which=None) -> None:
    """Fail loudly (AssertionError, never a skip) when a prerequisite is missing."""
    missing = missing_prerequisites(accounting, euid, which)
    if missing:
        raise AssertionError("Slurm test fixture cannot run; missing: " + "; ".join(missing)
                             + f". To fix: {SETUP_HINT}, then run the tests as root.")


class SlurmFixtureError(RuntimeError):
    """The cluster could not start or do what a helper asked; the message has the log tail."""


# ----------------------------------------------------------------------------- one daemon

def _tail(path: str, lines: int) -> str:
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class _Daemon:
    """One daemon in the foreground under _REAPER."""

    def __init__(self, name: str, argv: list[str], log_path: str, env: dict[str, str],
                 prefix: list[str] | None = None):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.stderr_path = os.path.splitext(log_path)[0] + ".stderr"
        self.env = env
        self.prefix = prefix or []
        self.reaper: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.stderr_path, "ab") as err:
            self.reaper = subprocess.Popen(
                [*self.prefix, sys.executable, "-c", _REAPER, *self.argv],
                stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**self.env, "FERRY_FIXTURE_PARENT": str(os.getpid())})

    def running(self) -> bool:
        return self.reaper is not None and self.reaper.poll() is None

    def tail(self, lines: int = 30) -> str:
        parts = []
        for path in (self.log_path, self.stderr_path):
            text = _tail(path, lines)
            if text:
                parts.append(f"--- {path} (last lines)\n{text}")
        return "\n".join(parts) or f"(no output from {self.name})"

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the daemon (the reaper forwards it and then kills what the daemon leaves),
        SIGKILL everything after grace_s; returns once the reaper has reaped them all."""
        reaper, self.reaper = self.reaper, None
        if reaper is None:
            return
        if reaper.poll() is None:
            _kill([reaper.pid], signal.SIGTERM)
            if not _wait_until(lambda: reaper.poll() is not None, grace_s):
                _kill(_descendants(reaper.pid, _proc_table()))
                _kill([reaper.pid])
        with contextlib.suppress(subprocess.TimeoutExpired):
            reaper.wait(10)
        if reaper.poll() is None:
            raise SlurmFixtureError(f"slurm fixture: {self.name} (reaper pid {reaper.pid}) "
                                    "survives SIGKILL")


# ----------------------------------------------------------------------------- the cluster

class SlurmCluster:
    """munged + slurmctld + slurmd n1, n2 (+ n3 isolated) [+ mariadbd + slurmdbd]."""

    def __init__(self, accounting: bool = False, isolated_node: bool = True,
                 hidden_paths: tuple[str, ...] = (HOME_BASE,), extra_config: str = ""):
        """accounting: also run mariadbd + slurmdbd so that `sacct` works (+~3 s to start).
        isolated_node: add n3 (partition `isolated`) that cannot see hidden_paths.
        extra_config: slurm.conf lines appended after the fixture's own."""
        self.accounting = accounting
        self.nodes_all = list(NODES) + ([ISOLATED_NODE] if isolated_node else [])
        self.hidden_paths = tuple(os.path.abspath(p) for p in hidden_paths)
        self.extra_config = extra_config
        self.dir = ""
        self.conf_path = self.gres_conf_path = self.munge_socket = ""
        self.ports: dict[str, int] = {}
        self.timings: dict[str, float] = {}
        self.daemons: dict[str, _Daemon] = {}
        self._lock_file = None
        self._wrote_etc_conf = False
        self._env: dict[str, str] = {}

    # --- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> "SlurmCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "SlurmCluster":
        """Starts the cluster. The daemons' ports are drawn free, then bound by the daemons a
        moment later: a test of another fixture side by side may bind one meanwhile (its daemon
        then exits with 'Address already in use'). The whole cluster then starts again on new
        ports, at most 3 times."""
        for attempt in range(3):
            try:
                return self._start_once()
            except SlurmFixtureError as e:
                if "Address already in use" not in str(e) or attempt == 2:
                    raise
                print(f"slurm fixture: a port was taken meanwhile; starting again ({e})"[:400],
                      file=sys.stderr)
        raise AssertionError("unreachable")

    def _start_once(self) -> "SlurmCluster":
        require_prerequisites(self.accounting)
        if self.dir:
            raise SlurmFixtureError("slurm fixture: start() called twice")
        t0 = time.monotonic()
        atexit.register(self.stop)
        try:
            self._take_machine_lock()
            _clean_stale_instances()
            self.dir = tempfile.mkdtemp(prefix="cluster-", dir=SLURM_BASE)
            os.chmod(self.dir, 0o755)  # clients of ssh users reach the munge socket through it
            self._write_files()
            self._install_etc_conf()
            self._start_munged()
            if self.accounting:
                self._start_accounting()
            self.start_controller()
            for node in self.nodes_all:
                self._start_node(node)
            self.wait_nodes_idle()
            if self.accounting:
                self._wait_cluster_registered()
            self.timings["start_s"] = time.monotonic() - t0
            return self
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Kill and reap every daemon and job process, remove the instance dir, put
        /etc/slurm/slurm.conf back as it was. Safe to call twice; start() may follow."""
        t0 = time.monotonic()
        problems = []
        for name in [n for n in self.daemons if n.startswith("slurmd-")] + \
                ["slurmctld", "slurmdbd", "mariadbd", "munged"]:
            daemon = self.daemons.pop(name, None)
            if daemon is None:
                continue
            try:
                daemon.stop()
            except SlurmFixtureError as e:
                problems.append(str(e))
        self._restore_etc_conf()
        if self.dir and not os.environ.get("FERRY_TEST_KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = ""
        self._release_machine_lock()
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        self.timings["stop_s"] = time.monotonic() - t0
        if problems:
            raise SlurmFixtureError("; ".join(problems))

    # --- the controller (for "controller down" tests) ----------------------------------------

    def stop_controller(self) -> None:
        """Stop slurmctld (SIGTERM: it saves its state); clients then fail to reach it."""
        daemon = self.daemons.pop("slurmctld", None)
        if daemon is not None:
            daemon.stop()

    def start_controller(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start slurmctld (again: it recovers jobs from its state dir) and wait until it
        answers `scontrol ping`."""
        if "slurmctld" in self.daemons:
            raise SlurmFixtureError("slurm fixture: slurmctld is already running")
        t0 = time.monotonic()
        daemon = _Daemon("slurmctld", [_tool("slurmctld"), "-D", "-i"],
                         os.path.join(self.dir, "log", "slurmctld.log"), self._env,
                         _namespace_prefix(CONTROLLER_HOST, ()))
        self.daemons["slurmctld"] = daemon
        daemon.start()
        self._wait_ready(daemon, lambda: "is UP" in self.run(["scontrol", "ping"], check=False).stdout,
                         timeout_s)
        self.timings["controller_start_s"] = time.monotonic() - t0

    # --- reading the cluster --------------------------------------------------------------------

    def run(self, argv: list[str], check: bool = True, timeout_s: float = CLIENT_TIMEOUT_S,
            **kw) -> subprocess.CompletedProcess:
        """A Slurm client command as root on this machine (reads /etc/slurm/slurm.conf)."""
        env = {"PATH": _TOOL_PATH, "LANG": "C.UTF-8", "HOME": "/root"}
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL, env=env, **kw)
        except subprocess.TimeoutExpired as e:
            raise SlurmFixtureError(f"slurm fixture: `{' '.join(argv)}` did not finish in "
                                    f"{timeout_s:.0f} s") from e
        if check and proc.returncode != 0:
            raise SlurmFixtureError(f"slurm fixture: `{' '.join(argv)}` failed ({proc.returncode}): "
                                    f"{(proc.stderr or proc.stdout).strip()}")
        return proc

    def nodes(self) -> dict[str, dict]:
        """node -> {"state": "idle", "gres": "gpu:8", "partitions": ["debug", "gpu"]} (sinfo)."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N|%T|%G|%P"]).stdout
        nodes: dict[str, dict] = {}
        for line in out.splitlines():
            name, state, gres, partition = line.split("|", 3)
            entry = nodes.setdefault(name, {"state": state, "gres": gres, "partitions": []})
            entry["partitions"].append(partition.rstrip("*"))
        return nodes

    def wait_nodes_idle(self, nodes: tuple[str, ...] | None = None,
                        timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until the nodes (default: all) are idle, resuming drained ones; raise with
        the reasons and the slurmd log tails at the deadline."""
        wanted = tuple(nodes or self.nodes_all)
        deadline = time.monotonic() + timeout_s
        while True:
            seen = self.nodes()
            if all(seen.get(n, {}).get("state") == "idle" for n in wanted):
                return
            for name, entry in seen.items():
                if name in wanted and re.match(r"(drain|inval)", entry["state"]):
                    self.run(["scontrol", "update", f"nodename={name}", "state=resume"], check=False)
            for name in wanted:
                daemon = self.daemons.get(f"slurmd-{name}")
                if daemon is not None and not daemon.running():
                    raise SlurmFixtureError(f"slurm fixture: slurmd for {name} exited\n{daemon.tail()}")
            if time.monotonic() >= deadline:
                raise SlurmFixtureError(
                    f"slurm fixture: nodes not idle after {timeout_s:.0f} s: "
                    f"{ {n: e['state'] for n, e in seen.items()} }\n{self._node_reasons()}\n"
                    + "\n".join(self.log_tail(f"slurmd-{n}") for n in wanted))
            time.sleep(0.2)

    def queue(self) -> list[dict]:
        """Jobs squeue lists by default (pending, running, completing...), as dicts with
        id, user, state, reason, nodes, partition, name. A job array's task keeps its id as a
        string ("12_3"), one line per task."""
        out = self.run(["squeue", "-h", "-r", "-o", "%i|%u|%T|%r|%N|%P|%j"]).stdout
        jobs = []
        for line in out.splitlines():
            fields = line.split("|", 6)
            jobs.append(dict(zip(("id", "user", "state", "reason", "nodes", "partition", "name"),
                                 fields)))
            if jobs[-1]["id"].isdigit():
                jobs[-1]["id"] = int(jobs[-1]["id"])
        return jobs

    def job(self, job_id: int) -> dict[str, str] | None:
        """`scontrol show job -o ID` as a dict (JobState, Reason, ExitCode, NodeList, ...);
        None once slurmctld has forgotten the job (MinJobAge after its end)."""
        proc = self.run(["scontrol", "show", "job", "-o", str(job_id)], check=False)
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr:
                return None
            raise SlurmFixtureError(f"slurm fixture: scontrol show job {job_id}: {proc.stderr.strip()}")
        return dict(re.findall(r"(\w+(?:/\w+)?)=(\S*)", proc.stdout))

    def wait_job(self, job_id: int, states=FINAL_STATES, timeout_s: float = 30.0) -> dict[str, str]:
        """Poll scontrol until the job's state is one of `states` (default: any final one);
        returns the scontrol dict. Raises with the last state seen at the deadline."""
        deadline = time.monotonic() + timeout_s
        last = None
        while True:
            info = self.job(job_id)
            if info is None:
                raise SlurmFixtureError(f"slurm fixture: job {job_id} vanished from slurmctld "
                                        f"before reaching {sorted(states)}; last seen: {last}")
            last = info
            if info.get("JobState") in states:
                return info
            if time.monotonic() >= deadline:
                raise SlurmFixtureError(f"slurm fixture: job {job_id} not in {sorted(states)} "
                                        f"after {timeout_s:.0f} s: JobState={info.get('JobState')} "
                                        f"Reason={info.get('Reason')}")
            time.sleep(0.1)

    def squeue_state(self, job_id: int) -> str | None:
        """The job's state as `squeue -t all` shows it (finished jobs too, for MinJobAge)."""
        out = self.run(["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T"], check=False).stdout
        return out.strip() or None

    def sacct_state(self, job_id: int) -> tuple[str, str] | None:
        """(State, ExitCode) of the job's allocation from sacct, e.g. ("FAILED", "3:0");
        None while slurmdbd has no record yet."""
        out = self.run(["sacct", "-n", "-P", "-X", "-j", str(job_id), "-o", "JobID,State,ExitCode"]).stdout
        for line in out.splitlines():
            jid, state, code = line.split("|")
            if jid == str(job_id):
                return state.split()[0], code
        return None

    def wait_sacct_state(self, job_id: int, timeout_s: float = 15.0) -> tuple[str, str]:
        """sacct's final (State, ExitCode) for the job: it lags the job's end by 1.5-3 s."""
        last = None
        deadline = time.monotonic() + timeout_s
        while True:
            last = self.sacct_state(job_id)
            if last is not None and last[0] in FINAL_STATES:
                return last
            if time.monotonic() >= deadline:
                raise SlurmFixtureError(f"slurm fixture: sacct has no final state for job {job_id} "
                                        f"after {timeout_s:.0f} s (last: {last})")
            time.sleep(0.2)

    # --- job processes and cleanup ------------------------------------------------------------

    def job_processes(self, job_id: int | None = None) -> list[int]:
        """Live processes on the nodes that belong to a job (slurmstepd and what it started,
        including anything that detached: the reaper keeps them); only job_id's if given."""
        table = _proc_table()
        pids = []
        for name, daemon in self.daemons.items():
            if not name.startswith("slurmd-") or daemon.reaper is None:
                continue
            for pid in _descendants(daemon.reaper.pid, table):
                info = table[pid]
                if info["state"] == "Z" or info["name"] == "slurmd":
                    continue
                if job_id is None or _belongs_to_job(pid, info, job_id):
                    pids.append(pid)
        return sorted(pids)

    def daemon_pids(self) -> list[int]:
        """Every live process the fixture started: reapers, daemons, job processes."""
        table = _proc_table()
        pids = []
        for daemon in self.daemons.values():
            if daemon.reaper is not None and daemon.reaper.pid in table:
                pids += [daemon.reaper.pid, *_descendants(daemon.reaper.pid, table)]
        return sorted(p for p in pids if table[p]["state"] != "Z")

    def describe_processes(self, pids: list[int]) -> str:
        table = _proc_table()
        return "\n".join(f"{p} {table[p]['state']} {table[p]['cmdline'] or table[p]['name']}"
                         for p in pids if p in table) or "(none)"

    def cancel_all(self, keep: tuple[int, ...] = ()) -> None:
        """scancel every job in the queue except `keep`."""
        ids = [str(j["id"]) for j in self.queue() if j["id"] not in keep]
        if ids:
            self.run(["scancel", *ids], check=False)

    def assert_idle(self, keep: tuple[int, ...] = (), timeout_s: float = 15.0) -> None:
        """Raise unless, within timeout_s, the queue holds no job but `keep` and no job process
        is left on any node (those of `keep` excepted)."""
        def clean():
            jobs = [j for j in self.queue() if j["id"] not in keep]
            return not jobs and not self._stray_processes(keep)
        if _wait_until(clean, timeout_s, 0.2):
            return
        jobs = [j for j in self.queue() if j["id"] not in keep]
        stray = self._stray_processes(keep)
        raise AssertionError(f"slurm cluster not idle after {timeout_s:.0f} s: queue {jobs}; "
                             f"job processes:\n{self.describe_processes(stray)}")

    def _stray_processes(self, keep: tuple[int, ...]) -> list[int]:
        kept = {p for k in keep for p in self.job_processes(k)}
        return [p for p in self.job_processes() if p not in kept]

    # --- making resources busy ------------------------------------------------------------------

    def occupy(self, node: str, gres: str = f"gpu:{GPUS_PER_NODE}", timeout_s: float = 15.0) -> int:
        """Submit a blocking root job holding `gres` on `node`; returns its id once RUNNING."""
        partition = "isolated" if node == ISOLATED_NODE else "debug"
        out = self.run(["sbatch", "--parsable", "-p", partition, "-w", node, f"--gres={gres}",
                        "-J", "ferry-busy", "-o", "/dev/null", "--wrap", "exec sleep 3600"]).stdout
        job_id = int(out.strip().split(";")[0])
        self.wait_job(job_id, {"RUNNING"}, timeout_s)
        return job_id

    def release(self, job_id: int, timeout_s: float = 15.0) -> None:
        """Cancel a job (e.g. from occupy()) and wait until it and its processes are gone."""
        self.run(["scancel", str(job_id)], check=False)
        if not _wait_until(lambda: job_id not in {j["id"] for j in self.queue()}
                           and not self.job_processes(job_id), timeout_s, 0.1):
            raise SlurmFixtureError(f"slurm fixture: job {job_id} still there {timeout_s:.0f} s "
                                    f"after scancel: {self.job(job_id)}")

    @contextlib.contextmanager
    def busy(self, node: str, gres: str = f"gpu:{GPUS_PER_NODE}"):
        """with cluster.busy("n1"): ... -- n1's GPUs are held by a job for the block."""
        job_id = self.occupy(node, gres)
        try:
            yield job_id
        finally:
            self.release(job_id)

    # --- logs -------------------------------------------------------------------------------------

    def log_tail(self, daemon: str, lines: int = 30) -> str:
        d = self.daemons.get(daemon)
        return d.tail(lines) if d is not None else f"({daemon} not running)"

    # --- internals: files -------------------------------------------------------------------------

    def _take_machine_lock(self) -> None:
        """One cluster per machine: /etc/slurm/slurm.conf and the node names are global."""
        os.makedirs(SLURM_BASE, mode=0o755, exist_ok=True)
        os.chmod(SLURM_BASE, 0o755)
        f = open(os.path.join(SLURM_BASE, ".lock"), "a+")
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    f.seek(0)
                    holder = f.read().strip()
                    f.close()
                    raise SlurmFixtureError(
                        f"slurm fixture: another Slurm test cluster holds {SLURM_BASE}/.lock "
                        f"(pid {holder or '?'}) for over {LOCK_TIMEOUT_S:.0f} s; run the Slurm "
                        "tests one at a time (ctest RESOURCE_LOCK slurm)")
                time.sleep(0.5)
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._lock_file = f

    def _release_machine_lock(self) -> None:
        if self._lock_file is not None:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    def _write_files(self) -> None:
        for sub in ("etc", "log", "run", "state", "spool", "dev", "munge"):
            os.mkdir(os.path.join(self.dir, sub), 0o755)
        for node in self.nodes_all:  # slurmd puts its sockets there before it would create it
            os.mkdir(os.path.join(self.dir, "spool", node), 0o755)
        for i in range(GPUS_PER_NODE):
            os.symlink("/dev/null", os.path.join(self.dir, "dev", f"nvidia{i}"))
        for name in ("slurmctld", "slurmdbd", "mariadbd"):
            self.ports[name] = _free_port("127.0.0.1")
        for node in self.nodes_all:
            self.ports[f"slurmd-{node}"] = _free_port("127.0.0.1")
        self.munge_socket = os.path.join(self.dir, "munge", "munge.socket")
        self.conf_path = os.path.join(self.dir, "etc", "slurm.conf")
        self.gres_conf_path = os.path.join(self.dir, "etc", "gres.conf")
        self._env = {"PATH": _TOOL_PATH, "LANG": "C.UTF-8", "SLURM_CONF": self.conf_path}
        _write(self.conf_path, self._slurm_conf(), 0o644)
        _write(self.gres_conf_path, self._gres_conf(), 0o644)
        if self.accounting:
            _write(os.path.join(self.dir, "etc", "slurmdbd.conf"), self._slurmdbd_conf(), 0o600)

    def _slurm_conf(self) -> str:
        d = self.dir
        hw = _node_hardware()
        lines = [
            MARKER, f"# instance {d}",
            f"ClusterName={CLUSTER_NAME}",
            f"SlurmctldHost={CONTROLLER_HOST}(127.0.0.1)",
            f"SlurmctldPort={self.ports['slurmctld']}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool/%n",
            f"SlurmctldPidFile={d}/run/slurmctld.pid",
            f"SlurmdPidFile={d}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/log/slurmctld.log",
            f"SlurmdLogFile={d}/log/slurmd-%n.log",
            "SlurmctldDebug=info", "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none", "MpiDefault=none",
            "MailProg=/bin/true", "ReturnToService=2",
            "SchedulerType=sched/backfill", "SchedulerParameters=batch_sched_delay=0",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "GresTypes=gpu", "MinJobAge=4", "KillWait=5", "InactiveLimit=0",
        ]
        if self.accounting:
            lines += ["AccountingStorageType=accounting_storage/slurmdbd",
                      "AccountingStorageHost=127.0.0.1",
                      f"AccountingStoragePort={self.ports['slurmdbd']}",
                      # slurmctld's connection to slurmdbd ignores AuthInfo; this names the socket
                      f"AccountingStoragePass={self.munge_socket}"]
        for node in self.nodes_all:
            lines.append(f"NodeName={node} NodeAddr=127.0.0.1 Port={self.ports['slurmd-' + node]} "
                         f"{hw} Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN")
        shared = ",".join(NODES)
        lines += [f"PartitionName=debug Nodes={shared} Default=YES MaxTime=INFINITE State=UP",
                  f"PartitionName=gpu Nodes={shared} MaxTime=INFINITE State=UP"]
        if ISOLATED_NODE in self.nodes_all:
            lines.append(f"PartitionName=isolated Nodes={ISOLATED_NODE} MaxTime=INFINITE State=UP")
        if self.extra_config:
            lines += ["# extra_config", self.extra_config.strip("\n")]
        return "\n".join(lines) + "\n"

    def _gres_conf(self) -> str:
        last = GPUS_PER_NODE - 1
        return "".join(f"NodeName={n} Name=gpu File={self.dir}/dev/nvidia[0-{last}]\n"
                       for n in self.nodes_all)

    def _slurmdbd_conf(self) -> str:
        d = self.dir
        return "\n".join([
            MARKER,
            "AuthType=auth/munge", f"AuthInfo=socket={self.munge_socket}",
            "DbdHost=localhost", "DbdAddr=127.0.0.1", f"DbdPort={self.ports['slurmdbd']}",
            "SlurmUser=root", "DebugLevel=info",
            f"LogFile={d}/log/slurmdbd.log", f"PidFile={d}/run/slurmdbd.pid",
            "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1",
            f"StoragePort={self.ports['mariadbd']}", "StorageUser=slurm",
            "StorageLoc=slurm_acct_db",
        ]) + "\n"

    def _install_etc_conf(self) -> None:
        """Clients of ssh users read only /etc/slurm/slurm.conf: put ours there, keeping a
        foreign one aside (a stale one of ours from a crashed run is simply replaced)."""
        os.makedirs(ETC_SLURM, mode=0o755, exist_ok=True)
        if os.path.exists(ETC_SLURM_CONF) and not _is_ours(ETC_SLURM_CONF):
            if os.path.exists(SAVED_SLURM_CONF):
                raise SlurmFixtureError(
                    f"slurm fixture: both {ETC_SLURM_CONF} (not written by this fixture) and "
                    f"{SAVED_SLURM_CONF} exist; keep the right one and remove the other")
            os.rename(ETC_SLURM_CONF, SAVED_SLURM_CONF)
        shutil.copyfile(self.conf_path, ETC_SLURM_CONF)
        os.chmod(ETC_SLURM_CONF, 0o644)
        self._wrote_etc_conf = True

    def _restore_etc_conf(self) -> None:
        if not self._wrote_etc_conf:
            return
        self._wrote_etc_conf = False
        if _is_ours(ETC_SLURM_CONF):
            os.unlink(ETC_SLURM_CONF)
        if os.path.exists(SAVED_SLURM_CONF) and not os.path.exists(ETC_SLURM_CONF):
            os.rename(SAVED_SLURM_CONF, ETC_SLURM_CONF)

    # --- internals: daemons -------------------------------------------------------------------

    def _wait_ready(self, daemon: _Daemon, ready, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if not daemon.running():
                code = daemon.reaper.returncode if daemon.reaper else None
                raise SlurmFixtureError(f"slurm fixture: {daemon.name} exited at start "
                                        f"(status {code})\n{daemon.tail()}")
            if time.monotonic() >= deadline:
                raise SlurmFixtureError(f"slurm fixture: {daemon.name} not ready after "
                                        f"{timeout_s:.0f} s\n{daemon.tail()}")
            time.sleep(0.05)

    def _start_munged(self) -> None:
        t0 = time.monotonic()
        key = os.path.join(self.dir, "munge", "munge.key")
        proc = subprocess.run([_tool("mungekey"), "--create", f"--keyfile={key}"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SlurmFixtureError(f"slurm fixture: mungekey failed: {proc.stderr.strip()}")
        m = os.path.join(self.dir, "munge")
        daemon = _Daemon("munged", [_tool("munged"), "--foreground", f"--key-file={key}",
                                    f"--socket={self.munge_socket}", f"--pid-file={m}/munged.pid",
                                    f"--seed-file={m}/munged.seed", "--num-threads=4"],
                         os.path.join(self.dir, "log", "munged.log"), self._env)
        self.daemons["munged"] = daemon
        daemon.start()
        self._wait_ready(daemon, lambda: unix_socket_accepts(self.munge_socket))
        self.timings["munged_s"] = time.monotonic() - t0

    def _start_accounting(self) -> None:
        t0 = time.monotonic()
        data = os.path.join(self.dir, "mariadb")
        os.mkdir(data, 0o700)
        # A throwaway database on 127.0.0.1: without grant tables there is nothing to
        # initialise (mariadb-install-db would add ~4 s) and slurmdbd needs no password.
        db = _Daemon("mariadbd", [_tool("mariadbd"), "--no-defaults", f"--datadir={data}",
                                  "--user=root", "--skip-grant-tables", "--bind-address=127.0.0.1",
                                  f"--port={self.ports['mariadbd']}",
                                  f"--socket={self.dir}/run/mariadb.sock",
                                  f"--pid-file={self.dir}/run/mariadb.pid",
                                  f"--log-error={self.dir}/log/mariadbd.log", "--skip-log-bin",
                                  "--innodb-buffer-pool-size=32M", "--innodb-log-file-size=8M"],
                     os.path.join(self.dir, "log", "mariadbd.log"), self._env)
        self.daemons["mariadbd"] = db
        db.start()
        self._wait_ready(db, lambda: _port_open(self.ports["mariadbd"]))
        dbd = _Daemon("slurmdbd", [_tool("slurmdbd"), "-D"],
                      os.path.join(self.dir, "log", "slurmdbd.log"), self._env)
        self.daemons["slurmdbd"] = dbd
        dbd.start()
        self._wait_ready(dbd, lambda: _port_open(self.ports["slurmdbd"]))
        self.timings["accounting_s"] = time.monotonic() - t0

    def _wait_cluster_registered(self) -> None:
        """slurmctld adds its cluster to slurmdbd on its own; sacct is useless until then."""
        def registered():
            out = self.run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"],
                           check=False).stdout
            return CLUSTER_NAME in out.split()
        if not _wait_until(registered, START_TIMEOUT_S, 0.2):
            raise SlurmFixtureError("slurm fixture: slurmctld did not register cluster "
                                    f"{CLUSTER_NAME} with slurmdbd\n{self.log_tail('slurmctld')}\n"
                                    f"{self.log_tail('slurmdbd')}")

    def _start_node(self, node: str) -> None:
        hidden = self.hidden_paths if node == ISOLATED_NODE else ()
        daemon = _Daemon(f"slurmd-{node}", [_tool("slurmd"), "-D", "-N", node],
                         os.path.join(self.dir, "log", f"slurmd-{node}.log"), self._env,
                         _namespace_prefix(node, hidden))
        self.daemons[f"slurmd-{node}"] = daemon
        daemon.start()

    def _node_reasons(self) -> str:
        out = self.run(["scontrol", "show", "node", "-o"], check=False).stdout
        rows = []
        for line in out.splitlines():
            fields = dict(re.findall(r"(\w+)=(\S*)", line))
            reason = re.search(r"Reason=(.*?)(?: \w+=|$)", line)
            rows.append(f"{fields.get('NodeName')}: {fields.get('State')} "
                        f"{reason.group(1) if reason else ''}".rstrip())
        return "\n".join(rows)


# ----------------------------------------------------------------------------- helpers

def _namespace_prefix(hostname: str, hidden: tuple[str, ...]) -> list[str]:
    """A UTS namespace named `hostname`; with hidden paths also a mount namespace (slave:
    the host's later mounts still reach it, its tmpfs mounts stay inside)."""
    mount_ns = ["--mount", "--propagation", "slave"] if hidden else []
    return [_tool("unshare"), "--uts", *mount_ns, "--", "/bin/sh", "-c", _NAMESPACE_SETUP,
            hostname, *hidden, "--"]


_HARDWARE: str | None = None


def _node_hardware() -> str:
    """The CPU/board/socket/core/thread/memory fields of `slurmd -C`, as slurm.conf wants them."""
    global _HARDWARE
    if _HARDWARE is None:
        proc = subprocess.run([_tool("slurmd"), "-C"], capture_output=True, text=True,
                              env={"PATH": _TOOL_PATH})
        fields = dict(re.findall(r"(\w+)=(\S+)", proc.stdout.splitlines()[0] if proc.stdout else ""))
        wanted = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
        if proc.returncode != 0 or not all(k in fields for k in wanted):
            raise SlurmFixtureError(f"slurm fixture: `slurmd -C` gave no node layout "
                                    f"({proc.returncode}): {(proc.stderr or proc.stdout).strip()}")
        _HARDWARE = " ".join(f"{k}={fields[k]}" for k in wanted)
    return _HARDWARE


def alive(pids: list[int]) -> list[int]:
    """Those of pids that still run (a zombie counts as exited: PID 1 reaps late here)."""
    table = _proc_table()
    return [p for p in pids if p in table and table[p]["state"] != "Z"]


def _belongs_to_job(pid: int, info: dict, job_id: int) -> bool:
    if re.match(rf"slurmstepd: \[{job_id}\.", info["cmdline"]):
        return True
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    return f"SLURM_JOB_ID={job_id}".encode() in env


def _write(path: str, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _is_ours(path: str) -> bool:
    try:
        with open(path, errors="replace") as f:
            return f.readline().rstrip("\n") == MARKER
    except OSError:
        return False


def _clean_stale_instances() -> None:
    """Under the machine lock no other cluster runs, so whatever a crashed run left is stale:
    its daemons and slurmstepds (SLURM_CONF names an instance dir), its job processes
    (SLURM_CLUSTER_NAME), its instance dirs."""
    conf_prefix = f"SLURM_CONF={SLURM_BASE}/cluster-".encode()
    job_marker = f"SLURM_CLUSTER_NAME={CLUSTER_NAME}".encode()
    stale = []
    for pid, info in _proc_table().items():
        if pid == os.getpid() or info["state"] == "Z":
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if job_marker in env or any(v.startswith(conf_prefix) for v in env):
            stale.append(pid)
    _kill(stale)
    for entry in os.listdir(SLURM_BASE):
        path = os.path.join(SLURM_BASE, entry)
        if entry.startswith("cluster-") and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
