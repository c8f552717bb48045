"""A real OpenSSH sshd for integration tests (Python 3 standard library only).

    from sshd_fixture import SshServer, require_root_and_tools

    with SshServer(sftp="external") as srv:
        user = srv.user("zsh")                      # "ferryt-zsh", login shell /usr/bin/zsh
        subprocess.run(["ssh", "-F", srv.ssh_config, srv.alias("zsh"), "true"], check=True)
        assert srv.count_accepted(user) == 1

Each SshServer is one `/usr/sbin/sshd -D` on its own port with its own host key, config,
client key, known_hosts and log, all in a fresh root-owned directory under
FERRY_TEST_ROOT/run (default /var/lib/ferry-test/run) that stop() removes.

Test users `ferryt-<shell>` (zsh, fish, tcsh, bash, dash) are created once per machine with
homes under FERRY_TEST_ROOT/home and are reset to a clean state by start() (their processes
killed, their homes emptied). sshd reads each instance's authorized key from
<instance dir>/keys/<user>, not from ~/.ssh, so several instances (different listen addresses
or ports) can run at once; pass reset_users=False to every instance after the first so one
does not wipe the homes another is using.

FERRY_TEST_USER_SET=N (a digit 2-9) gives another set of test users, `ferrytN-<shell>`, with a
lease of its own, so that tests of two sets run at the same time (the sanitizer build's tests
use set 2: CI runs them beside the normal build's). So a test names its users through user(),
users() or USER_PREFIX, never by a literal name, and keeps anything else machine-wide that it
changes (a mount point, a PAM service) apart per set (USER_SET).

netns="NAME" starts sshd inside an existing network namespace (`ip netns exec NAME`, so
`ip` from iproute2 is needed then) and checks its readiness from inside it; the namespace's
`lo` must be up. Clients must then run inside the namespace too.

also_listen=[ADDR, ...] makes the same sshd listen on those addresses too, on the same port (sshd
takes at most 16 ListenAddress lines in all): a stand-in for many hosts with few daemons.

inetd_netns="NAME" makes a bastion: the fixture listens on listen:port in this process's
namespace and serves each connection with `sshd -i` started inside NAME, so clients here reach
it while it reaches what only NAME can (a target started with netns=NAME). NetNamespace()
creates such a namespace (lo up) and deletes it again.

Why the things below are the way they are:
- UsePAM no: a '!'-locked password field makes sshd refuse the account, so users get '*'.
- StrictModes checks every directory from the key file up to '/': each must be owned by
  root (or the user) and not group/world-writable, so nothing of ours may live under /tmp.
- sshd runs under a small reaper process (PR_SET_CHILD_SUBREAPER): processes orphaned by a
  dropped session are re-parented to it and reaped, instead of going to PID 1, which on
  some CI machines never reaps them and would leave zombies owned by the test users.
- Prerequisites missing make tests FAIL (AssertionError), never skip.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import pwd
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

SSHD = "/usr/sbin/sshd"
EXTERNAL_SFTP_SERVER = "/usr/lib/openssh/sftp-server"
SHELLS = ("zsh", "fish", "tcsh", "bash", "dash")
USER_SET = os.environ.get("FERRY_TEST_USER_SET", "")
if not re.fullmatch(r"[2-9]?", USER_SET):
    raise AssertionError(f"FERRY_TEST_USER_SET={USER_SET!r}: a digit 2-9, or empty for the first set of test users")
USER_PREFIX = f"ferryt{USER_SET}-"
ROOT = os.environ.get("FERRY_TEST_ROOT", "/var/lib/ferry-test")
HOME_BASE = os.path.join(ROOT, "home")
RUN_BASE = os.path.join(ROOT, "run")
READY_TIMEOUT_S = 10.0
SETUP_HINT = "run `./setup.sh --deps` as root from the repository root (Debian 12)"

# Where each login shell picks up a line printed on startup when sshd runs `SHELL -c CMD`
# (sshd runs the shell as neither login nor interactive).  dash reads no file at all then.
NOISE_FILES = {
    "zsh": ".zshenv",                       # every zsh reads it
    "bash": ".bashrc",                      # Debian's bash sources it when run by sshd (SSH_SOURCE_BASHRC)
    "fish": ".config/fish/config.fish",     # every fish reads it
    "tcsh": ".tcshrc",                      # every tcsh reads it (before .cshrc)
}

_TOOLS = {  # tool -> Debian package providing it
    "ssh": "openssh-client", "sftp": "openssh-client", "ssh-keygen": "openssh-client",
    "useradd": "passwd", "usermod": "passwd",
    "zsh": "zsh", "fish": "fish", "tcsh": "tcsh", "bash": "bash", "dash": "dash",
}
_TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Runs as `python3 -c REAPER SSHD ARGS...`: becomes a child subreaper, starts sshd, forwards
# TERM/INT/HUP to it and reaps every child (sshd and the orphans of its sessions) until none
# is left; exits with sshd's status. sshd starts with SIGPIPE and SIGXFSZ at their defaults, as
# init starts it (python ignores both, and an ignored signal stays ignored across exec: the
# login shells and jobs would inherit SIGXFSZ ignored).
_REAPER = r"""
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(36, 1, 0, 0, 0)                 # PR_SET_CHILD_SUBREAPER
libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG: the test died, so stop
if os.getppid() != int(os.environ.pop("FERRY_FIXTURE_PARENT", os.getppid())):
    sys.exit(1)
pid = os.fork()
if pid == 0:
    for s in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(s, signal.SIG_DFL)
    os.execv(sys.argv[1], sys.argv[1:])
def forward(sig, _frame):
    try: os.kill(pid, sig)
    except ProcessLookupError: pass
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, forward)
code = 1
while True:
    try: w, status = os.waitpid(-1, 0)
    except ChildProcessError: break
    if w == pid: code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


# ----------------------------------------------------------------------------- prerequisites

def _tool(name: str) -> str | None:
    return shutil.which(name, path=_TOOL_PATH)


def missing_prerequisites(euid: int | None = None, which=None, exists=None) -> list[str]:
    """What keeps the fixture from running, one readable item each (empty: all there)."""
    euid = os.geteuid() if euid is None else euid
    which = which or _tool
    exists = exists or os.path.exists
    missing = []
    if euid != 0:
        missing.append(f"root (running as uid {euid}; the fixture creates users and starts sshd)")
    if not exists(SSHD):
        missing.append(f"{SSHD} (package openssh-server)")
    if not exists(EXTERNAL_SFTP_SERVER):
        missing.append(f"{EXTERNAL_SFTP_SERVER} (package openssh-sftp-server)")
    for tool, package in _TOOLS.items():
        if not which(tool):
            missing.append(f"{tool} (package {package})")
    return missing


def require_root_and_tools(euid: int | None = None, which=None, exists=None) -> None:
    """Fail loudly (AssertionError, never a skip) when a prerequisite is missing."""
    missing = missing_prerequisites(euid, which, exists)
    if missing:
        raise AssertionError(
            "sshd test fixture cannot run; missing: " + "; ".join(missing) + f". To fix: {SETUP_HINT}, then run the tests as root."
        )


# ----------------------------------------------------------------------------- /proc helpers

def _proc_table() -> dict[int, dict]:
    """pid -> {ppid, state, uids, cmdline} for every process we can read."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/status") as f:
                status = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        try:
            table[pid] = {
                "ppid": int(fields["PPid"]),
                "state": fields["State"].strip().split()[0],
                "uids": {int(u) for u in fields["Uid"].split()},
                "name": fields["Name"].strip(),
                "cmdline": cmdline.replace(b"\0", b" ").decode(errors="replace").strip(),
            }
        except (KeyError, ValueError):
            continue
    return table


def _descendants(root_pid: int, table: dict[int, dict]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, info in table.items():
        children.setdefault(info["ppid"], []).append(pid)
    out, stack = [], [root_pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def _kill(pids, sig=signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _wait_until(predicate, timeout_s: float, interval_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def _run(argv, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"sshd fixture: `{' '.join(argv)}` failed ({proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()}")
    return proc


def _check_secure_dir(path: str) -> None:
    """StrictModes would refuse a key file below a directory that is not like this."""
    p = os.path.abspath(path)
    while True:
        st = os.stat(p)
        if st.st_uid != 0 or st.st_mode & 0o022:
            raise RuntimeError(
                f"sshd fixture: {p} (on the path to {path}) must be owned by root and not "
                f"group/world-writable (mode {st.st_mode & 0o7777:o}, uid {st.st_uid}); sshd's "
                "StrictModes would refuse the keys. Point FERRY_TEST_ROOT elsewhere (not under /tmp).")
        if p == "/":
            return
        p = os.path.dirname(p)


def _ensure_root_dir(path: str) -> None:
    os.makedirs(path, mode=0o755, exist_ok=True)
    st = os.stat(path)
    if st.st_uid != 0 or st.st_gid != 0:
        os.chown(path, 0, 0)
    if st.st_mode & 0o7777 != 0o755:
        os.chmod(path, 0o755)


@contextlib.contextmanager
def _machine_lock():
    """Serialises user creation/reset between fixture instances in different processes."""
    _ensure_root_dir(ROOT)
    with open(os.path.join(ROOT, ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class _TestUsersLease:
    """The test users and their homes are machine-wide: while one process has servers up, another
    process (a second ctest run, a second checkout's tests) waits here instead of resetting the
    users under it. Servers within one process share the lease. Each user set
    (FERRY_TEST_USER_SET) has its own lease."""

    def __init__(self):
        self._file = None
        self._holders = 0
        self._lock = threading.Lock()

    def acquire(self) -> None:
        with self._lock:
            if self._holders == 0:
                _ensure_root_dir(ROOT)
                self._file = open(os.path.join(ROOT, f".users-lease{USER_SET}"), "w")
                fcntl.flock(self._file, fcntl.LOCK_EX)
            self._holders += 1

    def release(self) -> None:
        with self._lock:
            if self._holders == 0:
                return
            self._holders -= 1
            if self._holders == 0 and self._file is not None:
                fcntl.flock(self._file, fcntl.LOCK_UN)
                self._file.close()
                self._file = None


_USERS_LEASE = _TestUsersLease()


def _read_shadow_field(user: str) -> str | None:
    with open("/etc/shadow") as f:
        for line in f:
            parts = line.rstrip("\n").split(":")
            if parts[0] == user:
                return parts[1]
    return None


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _free_port(listen: str, *also: str) -> int:
    """A port nobody listens on (on `listen` nor on any of `also`), drawn at random from
    outside the kernel's ephemeral range.
    A port from bind(0) is an ephemeral one: between this check and the daemon's own bind, any
    outgoing connection on the machine (the daemon's own, a parallel test's) may take it as its
    source port, and the daemon then dies with 'Address already in use'. Outside that range
    only an explicit bind can take it."""
    lo, hi = _ephemeral_range()
    spans = [(a, b) for a, b in ((10000, lo - 1), (hi + 1, 65535)) if b - a >= 1000]
    if not spans:
        raise RuntimeError(f"test fixture: no port range outside the ephemeral {lo}-{hi}; "
                           "narrow net.ipv4.ip_local_port_range")
    rng = random.SystemRandom()
    for _ in range(200):
        a, b = rng.choice(spans)
        port = rng.randint(a, b)
        if all(_bindable(address, port) for address in (listen, *also)):
            return port
    raise RuntimeError(f"test fixture: no free port on {listen} outside {lo}-{hi} after 200 tries")


def _bindable(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((address, port))
        except OSError:
            return False
        return True


def _answers_ssh(listen: str, port: int, timeout_s: float = 1.0) -> bool:
    try:
        with socket.create_connection((listen, port), timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            data = b""
            while b"\n" not in data and len(data) < 256:
                chunk = s.recv(256)
                if not chunk:
                    break
                data += chunk
            return data.startswith(b"SSH-2.0-")
    except OSError:
        return False


def _answers_ssh_in_netns(netns: str, listen: str, port: int, timeout_s: float) -> bool:
    """_answers_ssh, run by a Python inside the namespace (`ip netns exec`)."""
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import sshd_fixture; "
             "sys.exit(0 if sshd_fixture._answers_ssh(sys.argv[2], int(sys.argv[3]), float(sys.argv[4])) else 1)")
    try:
        result = subprocess.run([_tool("ip") or "ip", "netns", "exec", netns, sys.executable, "-c", probe,
                                 os.path.dirname(os.path.abspath(__file__)), listen, str(port), f"{timeout_s:.3f}"],
                                capture_output=True, timeout=timeout_s + 10)
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0


def unix_socket_accepts(path: str) -> bool:
    """Whether the Unix socket at PATH accepts a connection: its file appears at bind(), before
    listen(), so a daemon whose socket file exists may still refuse (seen once in CI:
    `ssh-add: Error connecting to agent: Connection refused`)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
            return True
        except OSError:
            return False


def start_ssh_agent(sock: str, timeout_s: float = 10.0) -> subprocess.Popen:
    """An `ssh-agent -D` on SOCK, returned once it accepts connections."""
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _wait_until(lambda: proc.poll() is not None or unix_socket_accepts(sock), timeout_s)
    if proc.poll() is not None:
        raise AssertionError(f"ssh-agent -D -a {sock} exited with status {proc.returncode} before it "
                             "accepted a connection")
    if not unix_socket_accepts(sock):
        proc.kill()
        proc.wait(5)
        raise AssertionError(f"ssh-agent -D -a {sock} did not accept a connection in {timeout_s:.0f} s")
    return proc


def _fingerprint(pub_path: str) -> str:
    # "256 SHA256:abc... comment (ED25519)"
    out = _run(["ssh-keygen", "-l", "-E", "sha256", "-f", pub_path]).stdout.split()
    return out[1]


# ----------------------------------------------------------------------------- the server

class SshServer:
    """One real sshd on `listen`:port, serving the ferryt-<shell> test users (of USER_SET)."""

    host: str
    port: int
    shells = list(SHELLS)

    def __init__(self, sftp: str = "internal", extra_config: str = "", listen: str = "127.0.0.1",
                 reset_users: bool = True, port: int | None = None, netns: str | None = None,
                 inetd_netns: str | None = None, also_listen: list[str] | tuple[str, ...] = (),
                 program: str = SSHD):
        """sftp: "internal" (internal-sftp), "external" (/usr/lib/openssh/sftp-server), an
        absolute path of an sftp server, or "none" (no sftp subsystem at all).  extra_config: sshd_config text; its keywords win over
        the fixture's (sshd keeps the first value it reads), its Match blocks go at the end.
        port: a fixed port instead of a free one.  netns: the name of an existing network
        namespace (`ip netns add NAME`, its lo up) to run sshd in; None: this process's.
        inetd_netns: listen here, serve each connection by `sshd -i` inside that namespace.
        also_listen: more addresses the same sshd listens on, on the same port (15 at most).
        program: the sshd to run, by an absolute path; a symlink to sshd under another name
        gets that name's PAM service (OpenSSH names it after its program name)."""
        if sftp == "internal":
            self.sftp_subsystem = "internal-sftp"
        elif sftp == "external":
            self.sftp_subsystem = EXTERNAL_SFTP_SERVER
        elif sftp.startswith("/"):
            self.sftp_subsystem = sftp
        elif sftp == "none":
            self.sftp_subsystem = ""
        else:
            raise ValueError(f'sftp must be "internal", "external", "none" or an absolute path, not {sftp!r}')
        self.sftp = sftp
        self.extra_config = extra_config
        self.host = listen
        self.listen = listen
        self.reset_users = reset_users
        self.port = port or 0
        self.netns = netns
        self.inetd_netns = inetd_netns
        self.also_listen = list(also_listen)
        self.program = program
        if len(self.also_listen) > 15 or (self.also_listen and (netns or inetd_netns)):
            raise ValueError("also_listen: at most 15 more addresses (sshd's limit is 16), "
                             "and not with netns or inetd_netns")
        self._listener: socket.socket | None = None
        self._inetd_thread: threading.Thread | None = None
        self._inetd_procs: list[subprocess.Popen] = []
        self.dir = ""
        self.host_key = self.host_key_pub = ""
        self.client_key = self.client_key_pub = ""
        self.known_hosts = self.global_known_hosts = self.ssh_config = self.sshd_config = ""
        self.log_path = self.stderr_path = self.pid_path = ""
        self.host_key_sha256 = ""
        self.previous_host_key_sha256 = ""
        self.reset_killed: dict[str, list[int]] = {}
        self._reaper: subprocess.Popen | None = None
        self._stderr_file = None

    # --- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> "SshServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "SshServer":
        require_root_and_tools()
        if (self.netns is not None or self.inetd_netns is not None) and not _tool("ip"):
            raise AssertionError(f"sshd fixture: netns={self.netns or self.inetd_netns!r} needs `ip` (package iproute2); "
                                 f"to fix: {SETUP_HINT}")
        if self._reaper is not None:
            raise RuntimeError("sshd fixture: start() called twice")
        _USERS_LEASE.acquire()
        self._leased = True
        try:
            with _machine_lock():
                _ensure_root_dir(HOME_BASE)
                _ensure_root_dir(RUN_BASE)
                _check_secure_dir(RUN_BASE)
                _clean_stale_instances()
                for shell in SHELLS:
                    _ensure_user(shell)
                    if self.reset_users:
                        self.reset_killed[self.user(shell)] = _reset_user(self.user(shell))
            self.dir = tempfile.mkdtemp(prefix="sshd-", dir=RUN_BASE)
            os.chmod(self.dir, 0o755)  # users must traverse it to reach keys/<user>
            self._write_keys()
            port_given = bool(self.port)
            for attempt in range(5):
                if not port_given:
                    self.port = _free_port(self.listen, *self.also_listen)
                self._write_client_files()
                try:
                    self._launch()
                    break
                except _PortTaken:
                    if port_given or attempt == 4:
                        raise
            atexit.register(self.stop)
            return self
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop sshd and every process under it (sessions included); remove the instance dir.
        Set FERRY_TEST_KEEP=1 to keep the dir for a look afterwards."""
        self._stop_sshd()
        if self.dir and os.path.isdir(self.dir) and not os.environ.get("FERRY_TEST_KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)
        if self.dir and not os.environ.get("FERRY_TEST_KEEP"):
            self.dir = ""
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        if getattr(self, "_leased", False):
            self._leased = False
            _USERS_LEASE.release()

    def rotate_host_key(self) -> str:
        """Give the server a new host key and restart it on the same port; known_hosts keeps
        the old key, so clients using it now see a CHANGED key. Returns the new fingerprint."""
        if self._reaper is None:
            raise RuntimeError("sshd fixture: rotate_host_key() needs a started server")
        self._stop_sshd()
        self.previous_host_key_sha256 = self.host_key_sha256
        for path in (self.host_key, self.host_key_pub):
            os.unlink(path)
        self._keygen(self.host_key, "ferry-test-host")
        self.host_key_sha256 = _fingerprint(self.host_key_pub)
        self._launch()
        return self.host_key_sha256

    def refresh_known_hosts(self) -> None:
        """Rewrite known_hosts with the server's current host key."""
        with open(self.known_hosts, "w") as f:
            f.write(self.known_hosts_line() + "\n")

    # --- names and paths -------------------------------------------------------------------

    @staticmethod
    def user(shell: str) -> str:
        if shell not in SHELLS:
            raise ValueError(f"no test user for shell {shell!r}; shells: {', '.join(SHELLS)}")
        return USER_PREFIX + shell

    @staticmethod
    def users() -> list[str]:
        return [USER_PREFIX + s for s in SHELLS]

    @staticmethod
    def alias(shell: str) -> str:
        return SshServer.user(shell)

    @staticmethod
    def home(user: str) -> str:
        return os.path.join(HOME_BASE, _as_user(user))

    @staticmethod
    def shell_path(shell: str) -> str:
        return _tool(shell) or ""

    def known_hosts_line(self, address: str | None = None) -> str:
        """The known_hosts line for this server's key at `address` (default: listen)."""
        with open(self.host_key_pub) as f:
            keytype, blob = f.read().split()[:2]
        return f"[{address or self.listen}]:{self.port} {keytype} {blob}"

    def ssh_command(self, shell: str, *remote: str) -> list[str]:
        """argv for the system ssh client to run `remote` as that shell's user."""
        return ["ssh", "-F", self.ssh_config, self.alias(shell), *remote]

    # --- the log ------------------------------------------------------------------------------

    def log_text(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def count_accepted(self, user: str | None = None) -> int:
        """How many `Accepted publickey for USER` lines the log has (any user when None)."""
        users = re.findall(r"Accepted publickey for (\S+) from", self.log_text())
        return len(users) if user is None else users.count(_as_user(user))

    # --- processes and leftovers ----------------------------------------------------------

    @staticmethod
    def processes_of(user: str) -> list[int]:
        """pids of every live process whose real, effective, saved or fs uid is that user's. A
        zombie (state Z) is not counted: it is dead and holds nothing, and this machine's PID 1
        reaps orphans late, longer still under load."""
        uid = pwd.getpwnam(_as_user(user)).pw_uid
        return sorted(pid for pid, info in _proc_table().items()
                      if uid in info["uids"] and info["state"] != "Z")

    @classmethod
    def argvs_of(cls, user: str) -> list[tuple[int, list[bytes]]]:
        """(pid, argv) of every live process of that user's (processes_of) whose command line
        can still be read; argv as /proc gives it, split at NULs (its last item empty)."""
        found = []
        for pid in cls.processes_of(user):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    found.append((pid, f.read().split(b"\0")))
            except OSError:
                continue
        return found

    @staticmethod
    def describe_processes(user: str) -> str:
        """One line per process of that user (pid, state, ppid, command): for failure messages."""
        uid = pwd.getpwnam(_as_user(user)).pw_uid
        rows = [f"{pid} {i['state']} ppid={i['ppid']} {i['cmdline'] or '[' + i['name'] + ']'}"
                for pid, i in sorted(_proc_table().items()) if uid in i["uids"]]
        return "\n".join(rows) or "(none)"

    @classmethod
    def wait_no_processes(cls, user: str, timeout_s: float = 5.0) -> list[int]:
        """Wait until that user has no process (sshd needs a moment after a disconnect);
        returns what is still there at the deadline (empty list: all gone)."""
        _wait_until(lambda: not cls.processes_of(user), timeout_s)
        return cls.processes_of(user)

    @staticmethod
    def kill_user_processes(user: str) -> list[int]:
        pids = SshServer.processes_of(user)
        _kill(pids)
        return pids

    @staticmethod
    def run_dirs(user: str) -> list[str]:
        """Full paths of the entries left under ~user/.cache/ferry/runs, sorted, but for the
        job cache's files (which stay by design: see job_cache)."""
        base = os.path.join(SshServer.home(user), ".cache", "ferry", "runs")
        try:
            return sorted(os.path.join(base, e) for e in os.listdir(base) if not _is_job_cache_name(e))
        except FileNotFoundError:
            return []

    @staticmethod
    def job_cache(user: str) -> dict[str, os.stat_result]:
        """The job cache's names under ~user/.cache/ferry/runs (ferry-job-SHA256[.ext] and
        uploads .ferry-job-HEX): name -> lstat."""
        base = os.path.join(SshServer.home(user), ".cache", "ferry", "runs")
        try:
            return {e: os.lstat(os.path.join(base, e)) for e in os.listdir(base) if _is_job_cache_name(e)}
        except FileNotFoundError:
            return {}

    def kill_connections(self, user: str) -> list[int]:
        """SIGKILL the per-connection sshd processes serving that user ("sshd: USER [priv]",
        "sshd: USER@notty"); the commands they started are left alone. Returns the pids."""
        name = _as_user(user)
        if self._reaper is None:
            return []
        table = _proc_table()
        pattern = re.compile(rf"^sshd: {re.escape(name)}(?:[ @]|$)")
        pids = [p for p in _descendants(self._reaper.pid, table) if pattern.match(table[p]["cmdline"])]
        _kill(pids)
        return pids

    @staticmethod
    def set_startup_noise(user: str, on: bool) -> str:
        """Make that user's login shell print a line whenever sshd starts it (`SHELL -c CMD`).
        Returns the line printed. Works for zsh, bash, fish and tcsh; dash reads no startup
        file when run as `dash -c CMD`, so for dash this raises ValueError."""
        line = f"hello from {os.path.basename(SshServer._startup_file(user))}"
        SshServer.set_startup_script(user, f"echo '{line}'\n" if on else None)
        return line

    @staticmethod
    def _startup_file(user: str) -> str:
        name = _as_user(user)
        shell = name[len(USER_PREFIX):]
        if shell not in NOISE_FILES:
            raise ValueError(f"{name}: {shell} reads no startup file when sshd runs `{shell} -c CMD`, "
                             "so its login shell cannot be made to print on startup")
        return os.path.join(SshServer.home(name), NOISE_FILES[shell])

    @staticmethod
    def set_startup_script(user: str, script: str | None) -> None:
        """Put `script` (in that shell's syntax) in the startup file its login shell reads
        whenever sshd starts it; None removes it. For zsh, bash, fish and tcsh."""
        name = _as_user(user)
        path = SshServer._startup_file(name)
        if script is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        pw = pwd.getpwnam(name)
        _makedirs_owned(os.path.dirname(path), pw, stop_at=SshServer.home(name))
        with open(path, "w") as f:
            f.write(script)
        os.chown(path, pw.pw_uid, pw.pw_gid)
        os.chmod(path, 0o644)

    @staticmethod
    @contextlib.contextmanager
    def login_shell(user: str, shell_path: str):
        """That user's login shell is `shell_path` (e.g. /usr/sbin/nologin) inside the block."""
        name = _as_user(user)
        before = pwd.getpwnam(name).pw_shell
        _run(["usermod", "-s", shell_path, name])
        try:
            yield
        finally:
            _run(["usermod", "-s", before, name])

    # --- internals ----------------------------------------------------------------------------

    def _keygen(self, path: str, comment: str) -> None:
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])

    def _write_keys(self) -> None:
        self.host_key = os.path.join(self.dir, "host_ed25519_key")
        self.host_key_pub = self.host_key + ".pub"
        self.client_key = os.path.join(self.dir, "client_ed25519")
        self.client_key_pub = self.client_key + ".pub"
        self._keygen(self.host_key, "ferry-test-host")
        self._keygen(self.client_key, "ferry-test-client")
        self.host_key_sha256 = _fingerprint(self.host_key_pub)
        with open(self.client_key_pub) as f:
            pub = f.read()
        keys_dir = os.path.join(self.dir, "keys")
        os.mkdir(keys_dir, 0o755)
        os.chmod(keys_dir, 0o755)
        for name in self.users():
            pw = pwd.getpwnam(name)
            path = os.path.join(keys_dir, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(pub)
            os.chown(path, pw.pw_uid, pw.pw_gid)
            os.chmod(path, 0o600)
        self.log_path = os.path.join(self.dir, "sshd.log")
        self.stderr_path = os.path.join(self.dir, "sshd.stderr")
        self.pid_path = os.path.join(self.dir, "sshd.pid")
        self.sshd_config = os.path.join(self.dir, "sshd_config")
        self.known_hosts = os.path.join(self.dir, "known_hosts")
        self.global_known_hosts = os.path.join(self.dir, "global_known_hosts")
        self.ssh_config = os.path.join(self.dir, "ssh_config")

    def _write_client_files(self) -> None:
        self.refresh_known_hosts()
        # An empty global known_hosts: not /dev/null, which libssh warns about (not a file).
        open(self.global_known_hosts, "w").close()
        blocks = []
        for shell in SHELLS:
            blocks.append(
                f"Host {self.alias(shell)}\n"
                f"    HostName {self.listen}\n"
                f"    Port {self.port}\n"
                f"    User {self.user(shell)}\n"
                f"    IdentityFile {self.client_key}\n"
                f"    IdentitiesOnly yes\n"
                f"    UserKnownHostsFile {self.known_hosts}\n"
                f"    GlobalKnownHostsFile {self.global_known_hosts}\n"
                f"    StrictHostKeyChecking yes\n"
                f"    BatchMode yes\n"
                f"    ConnectTimeout 10\n")
        with open(self.ssh_config, "w") as f:
            f.write("\n".join(blocks))
        os.chmod(self.ssh_config, 0o644)

        before, match = _split_match(self.extra_config)
        config = (
            "# written by tests/integration/sshd_fixture.py\n"
            + (before + "\n" if before else "")
            + "".join(f"ListenAddress {a}:{self.port}\n" for a in (self.listen, *self.also_listen))
            + f"HostKey {self.host_key}\n"
            f"PidFile {self.pid_path}\n"
            "LogLevel VERBOSE\n"
            "UsePAM no\n"
            "StrictModes yes\n"
            "PermitRootLogin no\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "HostbasedAuthentication no\n"
            f"AuthorizedKeysFile {self.dir}/keys/%u\n"
            f"AllowUsers {' '.join(self.users())}\n"
            "UseDNS no\n"
            "PrintMotd no\n"
            "PrintLastLog no\n"
            "X11Forwarding no\n"
            "PermitUserRC no\n"
            # sshd takes the LAST MaxStartups it reads (unlike most keywords): the fixture's
            # is left out when extra_config sets one.
            + ("" if re.search(r"(?im)^\s*maxstartups\b", self.extra_config) else "MaxStartups 100\n")
            + "MaxSessions 64\n"
            "MaxAuthTries 10\n"
            "LoginGraceTime 30\n"
            + ("" if re.search(r"(?im)^\s*subsystem\s+sftp\b", self.extra_config) or not self.sftp_subsystem
               else f"Subsystem sftp {self.sftp_subsystem}\n")
            + (match + "\n" if match else "")
        )
        with open(self.sshd_config, "w") as f:
            f.write(config)
        os.chmod(self.sshd_config, 0o644)

    def set_authorized_keys(self, user: str, public_keys: list[str]) -> None:
        """Replace what this server accepts for that user (public key lines; empty: nothing, as
        for a user who logs in with certificates only)."""
        name = _as_user(user)
        path = os.path.join(self.dir, "keys", name)
        pw = pwd.getpwnam(name)
        with open(path, "w") as f:
            f.write("".join(k.strip() + "\n" for k in public_keys))
        os.chown(path, pw.pw_uid, pw.pw_gid)
        os.chmod(path, 0o600)

    def _launch(self) -> None:
        _ensure_root_dir("/run/sshd")  # sshd's privilege-separation directory
        if self.inetd_netns is not None:
            self._launch_inetd()
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.pid_path)
        test = subprocess.run([self.program, "-t", "-f", self.sshd_config], capture_output=True, text=True)
        if test.returncode != 0:
            raise RuntimeError(f"sshd fixture: sshd -t rejects {self.sshd_config}: "
                               f"{(test.stderr + test.stdout).strip()}")
        log_offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        self._stderr_file = open(self.stderr_path, "ab")
        # `ip netns exec` switches namespace and execs the reaper in the same process, so the
        # reaper's parent is still this process.
        prefix = [_tool("ip") or "ip", "netns", "exec", self.netns] if self.netns is not None else []
        self._reaper = subprocess.Popen(
            [*prefix, sys.executable, "-c", _REAPER, self.program, "-D", "-E", self.log_path, "-f", self.sshd_config],
            stdin=subprocess.DEVNULL, stdout=self._stderr_file, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "FERRY_FIXTURE_PARENT": str(os.getpid())})
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self._reaper.poll() is not None:
                text = self._log_since(log_offset)
                self._reaper = None
                if "Address already in use" in text:
                    raise _PortTaken(text)
                raise RuntimeError(f"sshd fixture: sshd exited at start on {self.listen}:{self.port}; "
                                   f"log:\n{text}")
            if self.netns is None:
                if _answers_ssh(self.listen, self.port):
                    self._check_also_listening(log_offset)
                    return
            elif _answers_ssh_in_netns(self.netns, self.listen, self.port,
                                       max(1.0, deadline - time.monotonic())):
                return
            if time.monotonic() >= deadline:
                text = self._log_since(log_offset)
                self._stop_sshd()
                raise RuntimeError(f"sshd fixture: sshd did not answer an SSH banner on "
                                   f"{self.listen}:{self.port} within {READY_TIMEOUT_S:.0f} s; log:\n{text}")
            time.sleep(0.02)

    def _check_also_listening(self, log_offset: int) -> None:
        """sshd carries on when some of its addresses cannot be bound: every one must answer."""
        for address in self.also_listen:
            if not _wait_until(lambda a=address: _answers_ssh(a, self.port), READY_TIMEOUT_S, 0.05):
                text = self._log_since(log_offset)
                self._stop_sshd()
                if "Address already in use" in text:
                    raise _PortTaken(text)
                raise RuntimeError(f"sshd fixture: sshd does not answer on {address}:{self.port}; log:\n{text}")

    def _log_since(self, offset: int) -> str:
        text = self.log_text()[offset:]
        with contextlib.suppress(OSError):
            with open(self.stderr_path, errors="replace") as f:
                text += f.read()
        return "\n".join(text.strip().splitlines()[-40:])

    def _launch_inetd(self) -> None:
        test = subprocess.run([SSHD, "-t", "-f", self.sshd_config], capture_output=True, text=True)
        if test.returncode != 0:
            raise RuntimeError(f"sshd fixture: sshd -t rejects {self.sshd_config}: "
                               f"{(test.stderr + test.stdout).strip()}")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((self.listen, self.port))
        except OSError as e:
            listener.close()
            raise _PortTaken(str(e))
        listener.listen(64)
        listener.settimeout(0.2)
        self._listener = listener
        self._stderr_file = open(self.stderr_path, "ab")
        self._inetd_thread = threading.Thread(target=self._serve_inetd, daemon=True)
        self._inetd_thread.start()

    def _serve_inetd(self) -> None:
        ip = _tool("ip") or "ip"
        while self._listener is not None:
            try:
                conn, _ = self._listener.accept()
            except (socket.timeout, OSError):
                continue
            with conn:
                self._inetd_procs.append(subprocess.Popen(
                    [ip, "netns", "exec", self.inetd_netns, SSHD, "-i", "-E", self.log_path, "-f", self.sshd_config],
                    stdin=conn.fileno(), stdout=conn.fileno(), stderr=self._stderr_file,
                    start_new_session=True))
            self._inetd_procs = [p for p in self._inetd_procs if p.poll() is None]

    def _stop_inetd(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        if self._inetd_thread is not None:
            self._inetd_thread.join(5)
            self._inetd_thread = None
        for proc in self._inetd_procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self._inetd_procs:
            try:
                proc.wait(3)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        self._inetd_procs = []

    def _stop_sshd(self) -> None:
        self._stop_inetd()
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            # sshd's connection children call setsid(), so signal the whole tree ourselves
            # (collected first: once the listener is gone they move to the reaper anyway).
            table = _proc_table()
            tree = _descendants(reaper.pid, table)
            _kill(tree, signal.SIGTERM)
            if not _wait_until(lambda: reaper.poll() is not None, 3.0):
                _kill(_descendants(reaper.pid, _proc_table()))
                _kill([reaper.pid])
                with contextlib.suppress(subprocess.TimeoutExpired):
                    reaper.wait(5)
        if self._stderr_file is not None:
            self._stderr_file.close()
            self._stderr_file = None


class _PortTaken(RuntimeError):
    pass


class NetNamespace:
    """A network namespace with only `lo` (up), deleted by stop(): what it runs is reachable from
    nowhere else. `run(argv)` gives the argv that runs a command inside it."""

    def __init__(self, prefix: str = "ferry-ns"):
        self.name = f"{prefix}-{os.getpid()}-{os.urandom(3).hex()}"
        self._made = False

    def __enter__(self) -> "NetNamespace":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "NetNamespace":
        ip = _tool("ip")
        if not ip:
            raise AssertionError(f"sshd fixture: network namespaces need `ip` (package iproute2); to fix: {SETUP_HINT}")
        _run([ip, "netns", "add", self.name])
        self._made = True
        atexit.register(self.stop)
        _run([ip, "netns", "exec", self.name, ip, "link", "set", "lo", "up"])
        return self

    def stop(self) -> None:
        if self._made:
            self._made = False
            subprocess.run([_tool("ip") or "ip", "netns", "delete", self.name], capture_output=True)
            with contextlib.suppress(Exception):
                atexit.unregister(self.stop)

    def run(self, argv: list[str]) -> list[str]:
        return [_tool("ip") or "ip", "netns", "exec", self.name, *argv]


# ----------------------------------------------------------------------------- users

def _is_job_cache_name(name: str) -> bool:
    """The job cache's names (docs/run-protocol.md, "The job cache")."""
    return re.fullmatch(r"ferry-job-[0-9a-f]{64}(\.[A-Za-z0-9]{1,15})?|\.ferry-job-[0-9a-f]+", name) is not None


def _as_user(user_or_shell: str) -> str:
    return USER_PREFIX + user_or_shell if user_or_shell in SHELLS else user_or_shell


def _ensure_user(shell: str) -> None:
    name = USER_PREFIX + shell
    shell_path = _tool(shell)
    home = os.path.join(HOME_BASE, name)
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        _run(["useradd", "--create-home", "--home-dir", home, "--shell", shell_path,
              "--user-group", "--password", "*", "--comment", "ferry test user", name])
        pw = pwd.getpwnam(name)
    if pw.pw_shell != shell_path or pw.pw_dir != home:
        _run(["usermod", "--shell", shell_path, "--home", home, name])
    if _read_shadow_field(name) != "*":  # '!' (locked) is refused by sshd without PAM
        _run(["usermod", "--password", "*", name])
    pw = pwd.getpwnam(name)
    os.makedirs(home, exist_ok=True)
    os.chown(home, pw.pw_uid, pw.pw_gid)
    os.chmod(home, 0o755)


def _reset_user(name: str) -> list[int]:
    """Kill the user's processes and empty the home. Returns the pids that had to be killed."""
    killed = SshServer.kill_user_processes(name)
    if killed and not _wait_until(lambda: not SshServer.processes_of(name), 5.0):
        raise RuntimeError(f"sshd fixture: processes of {name} survive SIGKILL:\n"
                           + SshServer.describe_processes(name))
    home = os.path.join(HOME_BASE, name)
    for entry in os.listdir(home):
        path = os.path.join(home, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    return killed


def _makedirs_owned(path: str, pw, stop_at: str) -> None:
    if os.path.isdir(path) or os.path.abspath(path) == os.path.abspath(stop_at):
        return
    _makedirs_owned(os.path.dirname(path), pw, stop_at)
    os.mkdir(path, 0o755)
    os.chown(path, pw.pw_uid, pw.pw_gid)


def _split_match(extra: str) -> tuple[str, str]:
    lines = extra.strip("\n").splitlines()
    for i, line in enumerate(lines):
        if re.match(r"\s*match\s", line, re.IGNORECASE):
            return "\n".join(lines[:i]), "\n".join(lines[i:])
    return "\n".join(lines), ""


def _clean_stale_instances() -> None:
    """Remove instance dirs left by crashed runs (no live sshd, older than ten minutes)."""
    now = time.time()
    for entry in os.listdir(RUN_BASE):
        path = os.path.join(RUN_BASE, entry)
        try:
            if now - os.stat(path).st_mtime < 600:
                continue
            with open(os.path.join(path, "sshd.pid")) as f:
                pid = int(f.read().strip())
            os.kill(pid, 0)
            continue  # still running
        except (OSError, ValueError):
            pass
        shutil.rmtree(path, ignore_errors=True)
