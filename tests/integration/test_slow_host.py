"""Slow host (issue 6): ferry over a link that adds 2 s to every round trip, against a real sshd.

The link. The test makes two network namespaces, `ferry-slow-<random>-c` (ferry runs there,
address 127.0.0.1) and `ferry-slow-<random>-s` (the test sshd runs there, on 127.0.0.2), and
joins them with a TUN device in each and a small relay process that holds every IP packet
for DELAY_S = 1.0 s before it passes it on, in both directions. Every round trip (the TCP
handshake, each SSH or SFTP request and its reply) therefore takes 2 s more, which is what
`tc qdisc add dev DEV root netem delay 1000ms` on both ends of a veth pair gives. The relay is
used instead of netem because the kernel may not have sch_netem (the development VM's kernel
has neither netem nor fq: "Specified qdisc kind is unknown"), while /dev/net/tun is nearly
everywhere. Each namespace keeps only its own address on lo and routes the other one over its
TUN device (route_localnet=1), so all traffic stays inside 127.0.0.0/8 and inside the test's
namespaces. A missing prerequisite (root, `ip`, /dev/net/tun, namespaces) fails the test.

What is measured and asserted:
- the link: a TCP connect from the client namespace to the sshd takes >= 1.8 s (one round
  trip), and the server's SSH banner arrives >= 3.6 s after the connect started (two);
- a run through the link is correct (typed parameters in, result JSON out, exit 0, archived);
- a job's timeout counts from the job's start on the host, not from the connect: a job whose
  own work (sleep 2 s) fits its 4 s timeout ends ok although connecting and staging it took far
  longer than 4 s; a job that outlives its 4 s timeout is stopped about 4 s after it started
  (timestamps the job prints on the host, which is this machine), gets status `timeout` and
  exit 124, and leaves no process and no run directory on the host;
- `--connect-timeout`: 10 s (ferry's default, and the ConnectTimeout of the fixture's ssh
  config) connects although the TCP connect alone takes 2 s; a timeout shorter than one round
  trip fails fast with exit 3 and a message naming --connect-timeout. Note: libssh applies the
  timeout to the TCP connect, the banner exchange and the key exchange together, about 4 round
  trips (8-9 s here: 8 s fails, 9 s connects), while OpenSSH's ssh gets through this link with
  ConnectTimeout=5 (it times the TCP connect and the banner exchange).
- persistence over the link: a later run uses the holder the first one left (no connect); with
  a client connected to that holder all along (so it is never idle), the holder still readies
  its python standby soon after that run, and the next run, staged by the standby, takes under
  1.5 round trips; side by side, for another user, a sh job's second held run takes under 1.5
  round trips too (over a slow link a sh job's run is followed by a python standby).
The runs go to different test users concurrently (one SSH session each), because one run
costs about 50 round trips (~100 s) over this link; setUpClass prints the cost of each phase.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from ferry_harness import ECHO_JOB, ECHO_PARAMS, Result, ferry_bin, run_ferry, write_job  # noqa: E402
from sshd_fixture import SshServer, _tool, require_root_and_tools  # noqa: E402

DELAY_S = 1.0                      # per direction; a round trip gains 2 * DELAY_S
CLIENT_ADDR, SERVER_ADDR = "127.0.0.1", "127.0.0.2"
SETUP_HINT = "run `./setup.sh --deps` as root (Debian package iproute2) on a kernel with TUN and network namespaces"

# Runs as `python3 -c RELAY FD_A FD_B DELAY`: a delay line between two TUN devices. Every packet
# read from one is written to the other DELAY seconds later, in order.
RELAY = r"""
import collections, ctypes, os, select, signal, sys, time
a, b, delay, parent = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)   # PR_SET_PDEATHSIG: the test died
if os.getppid() != parent:
    sys.exit(1)
pending = {a: collections.deque(), b: collections.deque()}   # fd to write to -> (due, packet)
other = {a: b, b: a}
while True:
    due = [q[0][0] for q in pending.values() if q]
    wait = max(0.0, min(due) - time.monotonic()) if due else None
    ready, _, _ = select.select([a, b], [], [], wait)
    for fd in ready:
        try:
            packet = os.read(fd, 65536)
        except OSError:
            continue
        pending[other[fd]].append((time.monotonic() + delay, packet))
    now = time.monotonic()
    for fd, queue in pending.items():
        while queue and queue[0][0] <= now:
            try:
                os.write(fd, queue.popleft()[1])
            except OSError:
                pass  # the device is down or gone (teardown): drop the packet, as a link would
"""

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000


def _run(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"slow link setup: `{' '.join(argv)}` failed ({proc.returncode}): "
                             f"{(proc.stderr or proc.stdout).strip()}")


class SlowLink:
    """Two namespaces joined by a delaying TUN link (see the module docstring)."""

    def __init__(self, delay_s: float = DELAY_S):
        self.delay_s = delay_s
        tag = os.urandom(4).hex()
        self.client_ns = f"ferry-slow-{tag}-c"
        self.server_ns = f"ferry-slow-{tag}-s"
        self.devices = (f"fslow{tag}c", f"fslow{tag}s")   # at most 15 characters
        self.fds: list[int] = []
        self.namespaces: list[str] = []
        self.relay: subprocess.Popen | None = None

    @staticmethod
    def missing_prerequisites() -> list[str]:
        missing = []
        if os.geteuid() != 0:
            missing.append("root (namespaces and TUN devices need it)")
        if not _tool("ip"):
            missing.append("ip (package iproute2)")
        if not os.path.exists("/dev/net/tun"):
            missing.append("/dev/net/tun (kernel TUN support; `mknod /dev/net/tun c 10 200`)")
        return missing

    def start(self) -> "SlowLink":
        missing = self.missing_prerequisites()
        if missing:
            raise AssertionError("slow-host test cannot build its delaying link; missing: "
                                 + "; ".join(missing) + f". To fix: {SETUP_HINT}")
        ip = _tool("ip")
        # The TUN devices are made here and moved into the namespaces; this process (and the
        # relay) keeps their file descriptors, and closing them removes the devices.
        for name in self.devices:
            fd = os.open("/dev/net/tun", os.O_RDWR)
            self.fds.append(fd)
            try:
                fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
            except OSError as e:
                raise AssertionError(f"slow-host test: cannot create the TUN device {name}: {e}. "
                                     f"To fix: {SETUP_HINT}") from e
        sides = ((self.client_ns, self.devices[0], CLIENT_ADDR, SERVER_ADDR),
                 (self.server_ns, self.devices[1], SERVER_ADDR, CLIENT_ADDR))
        for ns, dev, me, peer in sides:
            _run(ip, "netns", "add", ns)
            self.namespaces.append(ns)
            _run(ip, "link", "set", dev, "netns", ns)
            _run(ip, "-n", ns, "link", "set", "lo", "up")
            # Only this side's address stays local; the peer's is reached over the TUN device.
            _run(ip, "-n", ns, "address", "del", "127.0.0.1/8", "dev", "lo")
            _run(ip, "-n", ns, "address", "add", me + "/32", "dev", "lo")
            for conf in ("all", "default", dev):
                _run(ip, "netns", "exec", ns, "sysctl", "-q", "-w", f"net.ipv4.conf.{conf}.route_localnet=1")
                _run(ip, "netns", "exec", ns, "sysctl", "-q", "-w", f"net.ipv4.conf.{conf}.rp_filter=0")
            _run(ip, "-n", ns, "link", "set", dev, "up")
            _run(ip, "-n", ns, "route", "add", peer + "/32", "dev", dev, "src", me)
        self.relay = subprocess.Popen([sys.executable, "-c", RELAY, str(self.fds[0]), str(self.fds[1]),
                                       str(self.delay_s), str(os.getpid())],
                                      pass_fds=self.fds, stdin=subprocess.DEVNULL)
        return self

    def close(self) -> None:
        if self.relay is not None:
            self.relay.kill()
            self.relay.wait()
            self.relay = None
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        for ns in self.namespaces:
            subprocess.run([_tool("ip") or "ip", "netns", "delete", ns], capture_output=True)
        self.namespaces = []

    def client_argv(self, *argv: str) -> list[str]:
        return [_tool("ip") or "ip", "netns", "exec", self.client_ns, *argv]

    def time_connect(self, port: int) -> tuple[float, float]:
        """Seconds, from the client namespace, to a TCP connect to SERVER_ADDR:port and to the
        first line the server sends (sshd's banner)."""
        probe = ("import socket, sys, time\n"
                 "t = time.monotonic()\n"
                 f"s = socket.create_connection(({SERVER_ADDR!r}, {port}), timeout=30)\n"
                 "c = time.monotonic() - t\n"
                 "data = b''\n"
                 "while b'\\n' not in data:\n"
                 "    chunk = s.recv(256)\n"
                 "    if not chunk: break\n"
                 "    data += chunk\n"
                 "print(c, time.monotonic() - t, data[:8].decode(errors='replace'))\n")
        proc = subprocess.run(self.client_argv(sys.executable, "-c", probe), capture_output=True,
                              text=True, timeout=60)
        if proc.returncode != 0 or len(proc.stdout.split()) != 3:
            raise AssertionError(f"timing a connect over the slow link failed: {proc.stderr.strip()}")
        connect_s, banner_s, banner = proc.stdout.split()
        if banner != "SSH-2.0-":
            raise AssertionError(f"the server over the slow link sent {banner!r}, not an SSH banner")
        return float(connect_s), float(banner_s)


RTT_S = 2 * DELAY_S
JOB_TIMEOUT_S = 4
# A holder's python standby, after the run that took its first standby. A holder's start work
# lets runs go first, so after a held run that came at once it may all be still to do: the
# standby's script put in the job cache (SFTP: lstat, open, write, close, rename), the first run
# directory (the umask check and the sweep of the base) made and removed, then the standby
# channel's open, exec and start (3 round trips): about 20 round trips, measured up to 20.1.
STANDBY_LIMIT_S = 30 * RTT_S
RUN_LIMIT_S = 420          # one run costs ~100 s over the link; this only stops a hung ferry

# Prints host-side (this machine's) wall-clock times when it starts and when it gets TERM.
OVERRUN_JOB = '''
import signal, sys, time
def on_term(signum, frame):
    print(f"term {time.time():.3f}", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
print(f"start {time.time():.3f}", flush=True)
time.sleep(300)
print("woke up", flush=True)
'''

# A sh job for the held runs of the user of `fits` (run_through_holder, run_staged_by_standby).
QUICK_JOB = "echo quick\n"

FITS_JOB = '''
start=$(date +%s.%N)
sleep 2
printf '{"slept": 2, "start": %s, "end": %s}\\n' "$start" "$(date +%s.%N)"
'''


class SlowHost(unittest.TestCase):
    """All runs start at once in setUpClass (each its own ferry, its own test user, its own SSH
    session over the slow link); the tests below check what each one gave."""

    @classmethod
    def setUpClass(cls):
        require_root_and_tools()
        ferry = ferry_bin()
        cls.link = SlowLink()
        cls.addClassCleanup(cls.link.close)
        cls.link.start()
        cls.srv = SshServer(netns=cls.link.server_ns, listen=SERVER_ADDR)
        cls.addClassCleanup(cls.srv.stop)
        cls.srv.start()
        cls.tmp = tempfile.mkdtemp(prefix="ferry-slow-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        # Persistence on, as a user has it: these runs go through the user's one holder, which
        # connects them and keeps the sessions; a later run uses one
        # (test_a_later_run_uses_the_held_connection).
        runtime = os.path.join(cls.tmp, "runtime")
        os.mkdir(runtime, 0o700)
        cls.env = {"FERRY_ARCHIVE": os.path.join(cls.tmp, "archive.db"), "XDG_RUNTIME_DIR": runtime,
                   "FERRY_PERSIST": "120"}
        cls.addClassCleanup(run_ferry, "disconnect", "--all", env=cls.env)

        cls.connect_s, cls.banner_s = cls.link.time_connect(cls.srv.port)

        echo = write_job(cls.tmp, "echo", ECHO_JOB, params=ECHO_PARAMS)
        fits = write_job(cls.tmp, "fits", FITS_JOB, interpreter="sh", timeout=JOB_TIMEOUT_S)
        overrun = write_job(cls.tmp, "overrun", OVERRUN_JOB, timeout=JOB_TIMEOUT_S)
        cls.echo_text = "slow ( ) $HOME `id` ' \" \\ 日本語"
        cls.users = {"echo": cls.srv.user("bash"), "fits": cls.srv.user("zsh"),
                     "overrun": cls.srv.user("dash"), "short_connect": cls.srv.user("tcsh")}
        plans = {
            "echo": [echo, "-p", f"text={cls.echo_text}", "-p", "items=a,b,c", "-p", 'blob={"k": [1, 2.5, null]}'],
            "fits": [fits],
            # no holder: the test counts the user's processes afterwards
            "overrun": [overrun, "--persist", "0"],
            # shorter than the 2 s TCP connect: must fail, quickly, naming the option
            "short_connect": [echo, "-p", "text=x", "--connect-timeout", "1"],
        }
        cls.results: dict[str, Result] = {}
        cls.busy: list[socket.socket] = []
        cls.busy_names: set[str] = set()
        cls.wall: dict[str, float] = {}
        cls.run_side_by_side(ferry, {name: (cls.users[name], args) for name, args in plans.items()})
        quick = write_job(cls.tmp, "quick", QUICK_JOB, interpreter="sh")
        cls.run_through_holder(ferry, echo, quick)
        cls.run_staged_by_standby(ferry, echo, quick)
        cls.report_costs()

    @classmethod
    def run_side_by_side(cls, ferry, runs: dict[str, tuple[str, list[str]]]):
        """Runs NAME: (user, ferry run arguments) at once, each its own ferry, its output in
        files; its result and its wall time (until it ended) under NAME."""
        procs = {}
        for name, (user, args) in runs.items():
            argv = cls.link.client_argv(ferry, "run", *args, "--host", user,
                                        "--ssh-config", cls.srv.ssh_config, "--json", "-v")
            out = open(os.path.join(cls.tmp, name + ".out"), "w+b")
            err = open(os.path.join(cls.tmp, name + ".err"), "w+b")
            cls.addClassCleanup(out.close)
            cls.addClassCleanup(err.close)
            proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **cls.env})
            cls.addClassCleanup(lambda p=proc: p.poll() is None and (p.kill(), p.wait()))
            procs[name] = (proc, out, err, time.monotonic())
        while any(name not in cls.wall for name in procs):
            for name, (proc, _, _, started) in procs.items():
                if name not in cls.wall and proc.poll() is not None:
                    cls.wall[name] = time.monotonic() - started
                elif name not in cls.wall and time.monotonic() - started > RUN_LIMIT_S:
                    raise AssertionError(f"ferry ({name}) still runs after {RUN_LIMIT_S} s over the slow link")
            time.sleep(0.1)
        for name, (proc, out, err, _) in procs.items():
            out.seek(0)
            err.seek(0)
            cls.results[name] = Result(subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read()))

    @classmethod
    def run_through_holder(cls, ferry, echo, quick):
        """The echo run again, and a sh job's first run for the user of `fits`, once the
        sessions the first runs left are listed."""
        def held():
            res = run_ferry("disconnect", "--list", "--json", env=cls.env)
            hosts = {h["host"] for h in json.loads(res.stdout or b"[]")}
            return {cls.users["echo"], cls.users["fits"]} <= hosts
        # Each holder gets its client the moment its socket is there: a holder idle for 2 s
        # does its idle work, which closes its sh standby for a python one, and a run that came
        # while that one opened would not take one round trip (what a holder does when idle is
        # not what these runs measure).
        deadline = time.monotonic() + RUN_LIMIT_S
        while time.monotonic() < deadline:
            cls.keep_holders_busy()
            if cls.busy and held():
                break
            time.sleep(0.1)
        if not cls.busy or not held():
            raise AssertionError(f"the first runs left no two held sessions within {RUN_LIMIT_S} s: "
                                 f"{run_ferry('disconnect', '--list', env=cls.env).stdout!r}")
        cls.run_side_by_side(ferry, {
            "echo_held": (cls.users["echo"], [echo, "-p", "text=again", "-p", "items=x", "-p", "blob=1"]),
            "quick_held": (cls.users["fits"], [quick])})

    @classmethod
    def keep_holders_busy(cls):
        """Stays connected to every holder, from a moment after it started until the staged run
        is done, as runs that follow one another closely (a script's loop) keep it: a holder
        with a client is never idle, so what it readies must not wait for an idle moment."""
        folder = os.path.join(cls.env["XDG_RUNTIME_DIR"], "ferry")
        names = os.listdir(folder) if os.path.isdir(folder) else []
        for name in names:
            if name.endswith(".sock") and name not in cls.busy_names:
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                cls.addClassCleanup(conn.close)
                try:
                    conn.connect(os.path.join(folder, name))
                except OSError:
                    conn.close()   # a holder's socket being renamed into place: next time
                    continue
                cls.busy.append(conn)
                cls.busy_names.add(name)

    @classmethod
    def python_standbys(cls, user: str) -> list[int]:
        """The user's python standbys (`python3 -I -S -c VERIFIER ... ferry-standby`) on the host."""
        uid = pwd.getpwnam(user).pw_uid
        found = []
        for entry in os.listdir("/proc"):
            try:
                if os.stat(f"/proc/{entry}").st_uid != uid:
                    continue
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except (OSError, ValueError):
                continue
            if argv[:4] == [b"python3", b"-I", b"-S", b"-c"] and argv[-2:] == [b"ferry-standby", b""]:
                found.append(int(entry))
        return found

    @classmethod
    def run_staged_by_standby(cls, ferry, echo, quick):
        """The echo run a third time, and the sh job's second run, once their holders have a
        python standby waiting, although they never were idle (keep_holders_busy): the
        standbys stage the runs (docs/persistence.md, "Staged by the python standby"), the sh
        job's too."""
        cls.standby_after = {}
        started = time.monotonic()
        for name in ("echo", "fits"):
            while not cls.python_standbys(cls.users[name]) and time.monotonic() - started < STANDBY_LIMIT_S:
                time.sleep(0.5)
            cls.standby_after[name] = time.monotonic() - started
        # Its process is there half a round trip before the holder hears that its channel is.
        time.sleep(RTT_S)
        cls.run_side_by_side(ferry, {
            "echo_staged": (cls.users["echo"], [echo, "-p", "text=staged", "-p", "items=y", "-p", "blob=2"]),
            "quick_staged": (cls.users["fits"], [quick])})
        for conn in cls.busy:
            conn.close()

    @classmethod
    def report_costs(cls):
        """What one run costs over the link, in seconds and round trips (for the record)."""
        lines = [f"slow link: TCP connect {cls.connect_s:.2f} s, SSH banner after {cls.banner_s:.2f} s "
                 f"(round trip {RTT_S:.0f} s)"]
        for name in ("echo", "fits", "overrun", "echo_held", "echo_staged", "quick_held", "quick_staged"):
            try:
                rec = cls.results[name].record
            except Exception:  # the tests below report a missing or bad record
                continue
            t = rec["timings"]
            parts = {k: t.get(k) or 0.0 for k in ("connect", "upload", "exec", "fetch")}
            parts["clean"] = rec["duration_s"] - sum(parts.values())
            lines.append(f"{name}: {rec['status']}, {rec['duration_s']:.1f} s = "
                         + ", ".join(f"{k} {v:.1f} s ({v / RTT_S:.1f} RTT)" for k, v in parts.items())
                         + f"; ferry wall {cls.wall[name]:.1f} s")
            stamps = dict(re.findall(r"^(start|term) (\d+\.\d+)$", rec["stdout"], re.M))
            if len(stamps) == 2:
                lines.append(f"{name}: TERM {float(stamps['term']) - float(stamps['start']):.2f} s after "
                             f"the job started on the host (timeout {JOB_TIMEOUT_S} s)")
        for name, after in getattr(cls, "standby_after", {}).items():
            lines.append(f"{name}: python standby {after:.1f} s ({after / RTT_S:.1f} RTT) after the held runs")
        print("\n" + "\n".join(lines), file=sys.stderr)

    # --- the link itself ----------------------------------------------------------------------

    def test_link_adds_two_seconds_per_round_trip(self):
        self.assertGreaterEqual(self.connect_s, 0.9 * RTT_S, "the TCP connect was not slowed down")
        self.assertLess(self.connect_s, 2 * RTT_S, "the TCP connect took more than two round trips")
        self.assertGreaterEqual(self.banner_s, 1.8 * RTT_S, "sshd's banner came back too fast")

    # --- a run through it is correct ----------------------------------------------------------

    def test_run_is_correct_and_archived(self):
        res = self.results["echo"]
        self.assertEqual(res.code, 0, res)
        rec = res.record
        self.assertEqual(rec["status"], "ok", res)
        self.assertIsNone(rec["error"], res)
        self.assertEqual(rec["exit_code"], 0)
        params = {"text": self.echo_text, "items": ["a", "b", "c"], "blob": {"k": [1, 2.5, None]}}
        self.assertEqual(rec["params"], params)
        self.assertEqual(rec["result"]["params"], params)
        self.assertEqual(rec["result"]["job"], "echo")
        self.assertEqual(rec["result"]["stdin"], "")
        self.assertEqual(rec["stdout"], "echoed 3 params\n")
        self.assertEqual(rec["target"]["address"], SERVER_ADDR)
        self.assertEqual(rec["target"]["host_key_sha256"], self.srv.host_key_sha256)
        # It really went over the slow link, with a 10 s connect timeout (the default).
        self.assertGreaterEqual(rec["timings"]["connect"], 3 * RTT_S, rec["timings"])
        self.assertEqual(self.srv.run_dirs(self.users["echo"]), [])
        shown = run_ferry("show", rec["run_id"], "--json", env=self.env)
        self.assertEqual(shown.code, 0, shown)
        archived = json.loads(shown.stdout)
        self.assertEqual(archived["status"], "ok")
        self.assertEqual(archived["params"], params)
        self.assertEqual(archived["result"], rec["result"])
        logged = run_ferry("log", "--json", "--limit", "100", env=self.env)
        self.assertEqual(logged.code, 0, logged)
        statuses = {r["run_id"]: r["status"] for r in logged.records}
        self.assertEqual(statuses.get(rec["run_id"]), "ok", logged)

    def ok_record(self, name: str, said: bytes = b"using the connection held by process") -> dict:
        """The record of the run `name`, which ended ok and said `said` under -v."""
        res = self.results[name]
        self.assertEqual(res.code, 0, res)
        self.assertIn(said, res.stderr)
        self.assertEqual(res.record["status"], "ok", res)
        return res.record

    def test_a_later_run_uses_the_held_connection(self):
        rec = self.ok_record("echo_held")
        self.assertEqual(rec["result"]["params"], {"text": "again", "items": ["x"], "blob": 1})
        self.assertEqual(rec["target"]["host_key_sha256"], self.srv.host_key_sha256)
        # No connect over the link (the first run's took 7 round trips), and the whole run
        # takes fewer round trips than the first one's connect and staging.
        self.assertLess(rec["timings"]["connect"], 0.5 * RTT_S, rec["timings"])
        first = self.results["echo"].record
        self.assertLess(rec["duration_s"], first["duration_s"] - 7 * RTT_S, (rec["timings"], first["timings"]))
        # The holder's own start-up steps (its SFTP work for the python standby) do not come
        # between the run's files and its exec. The run's files are held for a python standby:
        # its exec is a fresh python standby's (its open 2 round trips, its ready line 1, the
        # run's line and the report 1: ~4.4), or, when the holder's sh standby is open by then,
        # the files' upload over SFTP (the directory, the job's link, launch.sh: ~5) and the
        # exec line on it (1): ~6.4. A start-up step between them would add 1 to 4 more.
        # With one holder for every host the run comes right after the first run, which went
        # through the holder, so its sh standby may still be opening: the whole run takes ~11
        # round trips (a holder per host, started as the first run ended: ~17, of which 16 were
        # its staging waiting behind the holder's start-up steps).
        self.assertLess(rec["timings"]["exec"], 7 * RTT_S, rec["timings"])
        self.assertLess(rec["duration_s"], 15 * RTT_S, rec["timings"])
        self.assertEqual(self.srv.run_dirs(self.users["echo"]), [])

    def test_a_held_run_staged_by_its_python_standby_takes_one_round_trip(self):
        # Once the holder has its python standby waiting, a python job's run is its line to the
        # standby, which makes the run's files itself, and the report back: 1 round trip, where
        # the run directory, the job's link and launch.sh took 5 more over SFTP.
        rec = self.ok_record("echo_staged")
        self.assertEqual(rec["result"]["params"], {"text": "staged", "items": ["y"], "blob": 2})
        self.assertLess(rec["duration_s"], 1.5 * RTT_S, rec["timings"])
        self.assertEqual(self.srv.run_dirs(self.users["echo"]), [])

    def test_a_holder_that_is_never_idle_readies_its_python_standby(self):
        # A client stayed connected to the holder from a moment after its start (no idle moment
        # at all); the python standby was still there soon after the run before.
        self.assertLess(self.standby_after["echo"], STANDBY_LIMIT_S,
                        "no python standby while the holder had a client all the time")

    def test_a_held_sh_run_over_a_slow_link_is_staged_by_a_python_standby_too(self):
        # After a sh job's run a holder opens a python standby, which stages the sh job's next
        # run too (5 SFTP round trips saved): that run takes 1 round trip.
        first = self.results["quick_held"]
        self.assertEqual(first.code, 0, first)
        self.assertIn(b"using the connection held by process", first.stderr)
        self.assertEqual(first.record["stdout"], "quick\n", first.record)
        self.assertLess(self.standby_after["fits"], STANDBY_LIMIT_S,
                        "no python standby after a sh job's run over a slow link")
        rec = self.ok_record("quick_staged")
        self.assertEqual(rec["stdout"], "quick\n")
        self.assertLess(rec["duration_s"], 1.5 * RTT_S, rec["timings"])
        self.assertEqual(self.srv.run_dirs(self.users["fits"]), [])

    # --- timeouts count from the job's start, not from the connect ------------------------------

    def test_timeout_counts_from_job_start_not_connect(self):
        res = self.results["fits"]
        self.assertEqual(res.code, 0, res)
        rec = res.record
        before_job = rec["timings"]["connect"] + rec["timings"]["upload"]
        # The point of the case: connecting and staging took far longer than the job's timeout.
        self.assertGreater(before_job, 2 * JOB_TIMEOUT_S, rec["timings"])
        self.assertGreater(rec["duration_s"], 2 * JOB_TIMEOUT_S)
        self.assertEqual(rec["status"], "ok", res)
        self.assertEqual(rec["exit_code"], 0)
        self.assertEqual(rec["result"]["slept"], 2)
        self.assertGreaterEqual(rec["result"]["end"] - rec["result"]["start"], 2.0)
        self.assertEqual(self.srv.run_dirs(self.users["fits"]), [])

    def test_overrun_is_stopped_at_its_timeout_after_the_job_started(self):
        res = self.results["overrun"]
        user = self.users["overrun"]
        self.assertEqual(res.code, 1, res)
        rec = res.record
        self.assertEqual(rec["status"], "timeout", res)
        self.assertEqual(rec["exit_code"], 124, res)
        self.assertIn(f"{JOB_TIMEOUT_S} s timeout", rec["error"])
        stamps = dict(re.findall(r"^(start|term) (\d+\.\d+)$", rec["stdout"], re.M))
        self.assertEqual(sorted(stamps), ["start", "term"], f"the job's stdout: {rec['stdout']!r}")
        ran = float(stamps["term"]) - float(stamps["start"])
        # TERM came about JOB_TIMEOUT_S after the job started on the host (the watchdog starts
        # just before the interpreter does), however long connecting and staging took.
        self.assertGreater(rec["timings"]["connect"] + rec["timings"]["upload"], 2 * JOB_TIMEOUT_S)
        self.assertGreaterEqual(ran, JOB_TIMEOUT_S - 1.0, rec["stdout"])
        self.assertLessEqual(ran, JOB_TIMEOUT_S + 1.5, rec["stdout"])
        self.assertNotIn("woke up", rec["stdout"])
        # ferry waited for the job, not for a deadline of its own: the exec phase took the
        # timeout plus a few round trips (channel open, exec request, the exit status back).
        self.assertLess(rec["timings"]["exec"], JOB_TIMEOUT_S + 4 * RTT_S, rec["timings"])
        self.assertEqual(self.srv.wait_no_processes(user, timeout_s=15), [],
                         self.srv.describe_processes(user))
        self.assertEqual(self.srv.run_dirs(user), [])

    # --- --connect-timeout --------------------------------------------------------------------

    def test_connect_timeout_shorter_than_a_round_trip_fails_fast(self):
        res = self.results["short_connect"]
        self.assertEqual(res.code, 3, res)
        rec = res.record
        self.assertEqual(rec["status"], "error")
        self.assertIn("--connect-timeout", rec["error"])
        self.assertIn("timeout 1 s", rec["error"])
        # One attempt and one retry of 1 s each, plus the back-off: not the default 10 s.
        self.assertLess(self.wall["short_connect"], 8.0, res)


if __name__ == "__main__":
    unittest.main()
