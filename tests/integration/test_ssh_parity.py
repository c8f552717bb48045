"""ferry reaches every host `ssh` reaches, and says why when it cannot (issue 12).

A corpus of scenarios against real sshd: a plain server, one that trusts a user CA with
MaxAuthTries 3, and a target in a network namespace of its own reachable only through a bastion.
Each scenario writes one ssh config (and known_hosts files) twice, one copy for each client, and
runs `ssh -v -F CFG HOST true` and `ferry check --host HOST --ssh-config CFG` under the same
environment (agent included). Both must connect, or both must refuse, and when both refuse
ferry's message must name the cause `ssh -v` shows. The documented exceptions: a crowded agent
that makes ssh use up MaxAuthTries before the named key (ferry offers the named key first), and
StrictHostKeyChecking no (ferry never skips the host key check). The table of scenarios is
printed with the results.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from ferry_harness import ferry_bin  # noqa: E402
from sshd_fixture import USER_PREFIX, NetNamespace, SshServer, _free_port, require_root_and_tools, start_ssh_agent  # noqa: E402

KEY_ROOT = os.path.join(os.environ.get("FERRY_TEST_ROOT", "/var/lib/ferry-test"), "keys")
PASSPHRASE = "parity-" + os.urandom(6).hex()

CONNECTS, REFUSED = "connects", "refused"
# Expected outcomes: both the same, or one of the documented exceptions.
SAME_OK, SAME_REFUSED = "both connect", "both refuse"
CROWDED = "ferry only (crowded agent: ssh runs out of MaxAuthTries)"
NEVER_SKIPS = "ssh only (ferry never skips the host key check)"


@dataclasses.dataclass
class Scenario:
    name: str
    config: str                    # ssh_config text; {d} is the client's own directory
    expect: str                    # SAME_OK, SAME_REFUSED, CROWDED or NEVER_SKIPS
    agent: str | None = None       # the agent whose socket is SSH_AUTH_SOCK
    host: str = "target"
    files: dict = dataclasses.field(default_factory=dict)  # name -> text, in {d}
    ssh_cause: str | None = None   # regex in ssh -v's stderr (both refuse)
    ferry_cause: str | None = None  # regex in ferry's output (both refuse, or ferry refuses)
    netns: str | None = None       # run both clients inside this namespace
    ssh_args: tuple = ()
    ferry_args: tuple = ()
    after: object = None           # callable(scenario_dirs) for checks on the files left
    env: dict = dataclasses.field(default_factory=dict)  # more environment for both clients


class Agent:
    def __init__(self, directory: str, name: str):
        self.dir = os.path.join(directory, "agent-" + name)
        os.makedirs(self.dir, mode=0o700)
        self.sock = os.path.join(self.dir, "sock")
        self.proc = start_ssh_agent(self.sock)

    def add(self, *keys: str, askpass: str | None = None) -> "Agent":
        env = dict(os.environ, SSH_AUTH_SOCK=self.sock)
        if askpass:
            env.update(SSH_ASKPASS=askpass, SSH_ASKPASS_REQUIRE="force", DISPLAY=":0")
        for key in keys:
            added = subprocess.run(["ssh-add", key], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
            if added.returncode != 0:
                raise AssertionError(f"ssh-add {key}: {added.stderr}")
        return self

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Parity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        require_root_and_tools()
        os.makedirs(KEY_ROOT, mode=0o755, exist_ok=True)
        cls.tmp = tempfile.mkdtemp(prefix="parity-", dir=KEY_ROOT)
        os.chmod(cls.tmp, 0o700)
        cls.keys = os.path.join(cls.tmp, "keys")
        os.mkdir(cls.keys, 0o700)
        cls._stack = []
        try:
            cls._make_keys()
            cls._start_servers()
            cls._start_agents()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for thing in reversed(cls._stack):
            try:
                thing.stop()
            except Exception:  # noqa: BLE001 - stop what can be stopped
                pass
        shutil.rmtree(cls.tmp, ignore_errors=True)

    # --- the world ----------------------------------------------------------------------------

    @classmethod
    def key(cls, name: str) -> str:
        return os.path.join(cls.keys, name)

    @classmethod
    def pub(cls, name: str) -> str:
        with open(cls.key(name) + ".pub") as f:
            return f.read()

    @classmethod
    def _keygen(cls, name: str, passphrase: str = "") -> None:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", name, "-f", cls.key(name)],
                       check=True)

    @classmethod
    def _sign(cls, name: str, principals: str, validity: str = "-5m:+1h") -> None:
        subprocess.run(["ssh-keygen", "-q", "-s", cls.key("ca"), "-I", name, "-n", principals, "-V", validity,
                        cls.key(name) + ".pub"], check=True)

    @classmethod
    def _make_keys(cls):
        for name in ["ca", "right", "cert", "cert2", "expired", "stranger", "plain"] + [f"noise{i}" for i in range(8)]:
            cls._keygen(name)
        cls._keygen("locked", PASSPHRASE)
        cls._sign("cert", SshServer.user("dash"))
        cls._sign("cert2", SshServer.user("dash"))
        os.rename(cls.key("cert2") + "-cert.pub", cls.key("cert2-elsewhere.pub"))  # CertificateFile only
        cls._sign("expired", SshServer.user("dash"), "20200101:20200201")
        cls._sign("stranger", "someone-else")
        cls.askpass = os.path.join(cls.tmp, "askpass")
        with open(cls.askpass, "w") as f:
            f.write(f"#!/bin/sh\necho '{PASSPHRASE}'\n")
        os.chmod(cls.askpass, 0o700)

    @classmethod
    def _start_servers(cls):
        cls.srv = SshServer(extra_config="MaxAuthTries 6")  # sshd's default; the fixture's is 10
        cls._stack.append(cls.srv)
        cls.srv.start()
        cls.srv.set_authorized_keys("bash", [cls.pub("right")])
        cls.srv.set_authorized_keys("zsh", [cls.pub("locked")])
        cls.ca = SshServer(extra_config=f"TrustedUserCAKeys {cls.key('ca')}.pub\nMaxAuthTries 3", reset_users=False)
        cls._stack.append(cls.ca)
        cls.ca.start()
        cls.ca.set_authorized_keys("dash", [])  # certificates only
        cls.ns = NetNamespace("ferry-parity")
        cls._stack.append(cls.ns)
        cls.ns.start()
        cls.inner = SshServer(netns=cls.ns.name, reset_users=False)
        cls._stack.append(cls.inner)
        cls.inner.start()
        cls.inner.set_authorized_keys("bash", [cls.pub("right")])
        cls.bastion = SshServer(inetd_netns=cls.ns.name, reset_users=False)
        cls._stack.append(cls.bastion)
        cls.bastion.start()
        cls.bastion.set_authorized_keys("bash", [cls.pub("right")])
        cls.empty_ns = NetNamespace("ferry-nodns")  # no route anywhere: name lookups fail here
        cls._stack.append(cls.empty_ns)
        cls.empty_ns.start()
        with open(cls.srv.host_key_pub) as f:
            cls.srv_key = " ".join(f.read().split()[:2])
        with open(cls.ca.host_key_pub) as f:
            cls.other_key = " ".join(f.read().split()[:2])

    @classmethod
    def _start_agents(cls):
        noise = [cls.key(f"noise{i}") for i in range(8)]
        cls.agents = {}
        for name, keys, askpass in (("crowd", noise, None), ("crowd+right", noise + [cls.key("right")], None),
                                    ("right", [cls.key("right")], None), ("locked", [cls.key("locked")], cls.askpass),
                                    ("crowd+locked", noise + [cls.key("locked")], cls.askpass),
                                    ("cert", [cls.key("cert")], None), ("cert2-plain", [cls.key("cert2")], None)):
            agent = Agent(cls.tmp, name)
            cls._stack.append(agent)
            cls.agents[name] = agent.add(*keys, askpass=askpass)

    # --- configs ------------------------------------------------------------------------------

    def block(self, srv: SshServer, user: str = "bash", alias: str = "target", **extra) -> str:
        lines = [f"Host {alias}", f"    HostName {srv.listen}", f"    Port {srv.port}",
                 f"    User {SshServer.user(user)}", "    UserKnownHostsFile {d}/known_hosts",
                 "    GlobalKnownHostsFile /dev/null", "    BatchMode yes", "    ConnectTimeout 10"]
        lines += [f"    {k} {v}" for k, v in extra.items()]
        return "\n".join(lines) + "\n"

    def known(self, *servers: SshServer) -> dict:
        return {"known_hosts": "".join(s.known_hosts_line() + "\n" for s in servers)}

    # --- running ------------------------------------------------------------------------------

    def run_clients(self, sc: Scenario, base: str):
        env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
        if sc.agent:
            env["SSH_AUTH_SOCK"] = self.agents[sc.agent].sock
        env["FERRY_ARCHIVE"] = os.path.join(base, "archive.db")
        env.update(sc.env)
        results = {}
        for tool in ("ssh", "ferry"):
            d = os.path.join(base, tool)
            os.makedirs(d, mode=0o700)
            for name, text in sc.files.items():
                os.makedirs(os.path.dirname(os.path.join(d, name)), exist_ok=True)
                with open(os.path.join(d, name), "w") as f:
                    f.write(text.replace("{d}", d))
            cfg = os.path.join(d, "config")
            with open(cfg, "w") as f:
                f.write(sc.config.replace("{d}", d))
            if tool == "ssh":
                argv = ["ssh", "-v", "-F", cfg, *sc.ssh_args, sc.host, "true"]
            else:
                argv = [ferry_bin(), "check", "--host", sc.host, "--ssh-config", cfg, *sc.ferry_args]
            if sc.netns:
                argv = [shutil.which("ip") or "ip", "netns", "exec", sc.netns, *argv]
            started = time.monotonic()
            proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=60, errors="replace")
            results[tool] = (proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started, d)
        return results

    def judge(self, sc: Scenario, results) -> list[str]:
        ssh_rc, ssh_out, _, _ = results["ssh"]
        ferry_rc, ferry_out, _, _ = results["ferry"]
        ssh_v = CONNECTS if ssh_rc == 0 else REFUSED
        ferry_v = CONNECTS if ferry_rc == 0 else REFUSED
        wanted = {SAME_OK: (CONNECTS, CONNECTS), SAME_REFUSED: (REFUSED, REFUSED),
                  CROWDED: (REFUSED, CONNECTS), NEVER_SKIPS: (CONNECTS, REFUSED)}[sc.expect]
        problems = []
        if (ssh_v, ferry_v) != wanted:
            problems.append(f"ssh {ssh_v} (exit {ssh_rc}), ferry {ferry_v} (exit {ferry_rc}); expected {sc.expect}")
        if ferry_rc not in (0, 2, 3):
            problems.append(f"ferry exit {ferry_rc}: not 0, 2 or 3")
        if ssh_v == REFUSED and sc.ssh_cause and not re.search(sc.ssh_cause, ssh_out):
            problems.append(f"ssh -v does not show {sc.ssh_cause!r}")
        if ferry_v == REFUSED and not sc.ferry_cause:
            problems.append("a refusal without a cause to look for in ferry's message")
        if ferry_v == REFUSED and sc.ferry_cause and not re.search(sc.ferry_cause, ferry_out):
            problems.append(f"ferry's message lacks {sc.ferry_cause!r}")
        if ferry_v == REFUSED and ferry_rc == 3 and "FAILED" not in ferry_out and "error" not in ferry_out:
            problems.append("ferry refused without saying so")
        if not problems and sc.after:
            try:
                sc.after(results)
            except AssertionError as e:
                problems.append(str(e))
        return problems

    def test_parity_corpus(self):
        scenarios = self.scenarios()
        self.assertGreaterEqual(len(scenarios), 40, "the corpus must hold at least 40 scenarios")
        self.assertEqual(len({s.name for s in scenarios}), len(scenarios), "scenario names repeat")
        rows, failures = [], []
        for sc in scenarios:
            base = os.path.join(self.tmp, "runs", re.sub(r"[^a-z0-9]+", "-", sc.name.lower()))
            os.makedirs(base)
            results = self.run_clients(sc, base)
            problems = self.judge(sc, results)
            ssh_rc, _, ssh_s, _ = results["ssh"]
            ferry_rc, ferry_out, ferry_s, _ = results["ferry"]
            rows.append((sc.name, f"exit {ssh_rc}", f"exit {ferry_rc}", f"{ssh_s:.1f}/{ferry_s:.1f}",
                         sc.expect, "ok" if not problems else "FAIL"))
            if problems:
                failures.append(f"{sc.name}: " + "; ".join(problems) + "\n  --- ssh -v (tail) ---\n  "
                                + "\n  ".join(results["ssh"][1].strip().splitlines()[-8:])
                                + "\n  --- ferry ---\n  " + "\n  ".join(ferry_out.strip().splitlines()[-8:]))
        widths = [max(len(str(r[i])) for r in rows + [("scenario", "ssh", "ferry", "s", "expected", "")])
                  for i in range(6)]
        table = ["  ".join(str(c).ljust(w) for c, w in zip(("scenario", "ssh", "ferry", "s", "expected", ""), widths))]
        table += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
        print("\nssh/ferry parity, one scenario a line:\n" + "\n".join(table), file=sys.stderr, flush=True)
        self.assertEqual(failures, [], "\n\n".join(failures))

    # --- the corpus ---------------------------------------------------------------------------

    def scenarios(self) -> list[Scenario]:
        return (self.identity_scenarios() + self.certificate_scenarios() + self.host_key_scenarios()
                + self.config_scenarios() + self.proxy_scenarios())

    def identity_scenarios(self) -> list[Scenario]:
        s, k = self.srv, self.key
        known = self.known(s)
        denied = r"Permission denied \(publickey\)"
        too_many = r"Too many authentication failures"
        return [
            Scenario("file key, IdentitiesOnly", self.block(s, IdentityFile=k("right"), IdentitiesOnly="yes"),
                     SAME_OK, files=known),
            Scenario("file key, no agent", self.block(s, IdentityFile=k("right")), SAME_OK, files=known),
            Scenario("crowded agent, IdentitiesOnly yes", self.block(s, IdentityFile=k("right"), IdentitiesOnly="yes"),
                     SAME_OK, agent="crowd", files=known),
            Scenario("crowded agent, key only in a file", self.block(s, IdentityFile=k("right")), CROWDED,
                     agent="crowd", files=known, ssh_cause=too_many),
            Scenario("crowded agent holding the named key", self.block(s, IdentityFile=k("right")), SAME_OK,
                     agent="crowd+right", files=known),
            Scenario("agent key, nothing named", self.block(s), SAME_OK, agent="right", files=known),
            Scenario("agent key, IdentitiesOnly, nothing named", self.block(s, IdentitiesOnly="yes"), SAME_REFUSED,
                     agent="right", files=known, ssh_cause=denied, ferry_cause=r"no key to offer"),
            Scenario("wrong key", self.block(s, IdentityFile=k("noise0"), IdentitiesOnly="yes"), SAME_REFUSED,
                     files=known, ssh_cause=denied, ferry_cause=denied + r".*noise0"),
            Scenario("crowded agent, wrong key named", self.block(s, IdentityFile=k("noise0")), SAME_REFUSED,
                     agent="crowd", files=known, ssh_cause=too_many, ferry_cause=too_many + ".*MaxAuthTries"),
            Scenario("encrypted key, no agent", self.block(s, user="zsh", IdentityFile=k("locked"), IdentitiesOnly="yes"),
                     SAME_REFUSED, files=known, ssh_cause=r"Server accepts key: .*locked",
                     ferry_cause=r"would accept it, but it is encrypted and no ssh-agent holds it.*ssh-add"),
            Scenario("encrypted key in the agent", self.block(s, user="zsh", IdentityFile=k("locked"), IdentitiesOnly="yes"),
                     SAME_OK, agent="locked", files=known),
            Scenario("encrypted key in a crowded agent", self.block(s, user="zsh", IdentityFile=k("locked"),
                                                                    IdentitiesOnly="yes"),
                     SAME_OK, agent="crowd+locked", files=known),
            Scenario("--identity / -i, crowded agent, IdentitiesOnly", self.block(s, IdentitiesOnly="yes"), SAME_OK,
                     agent="crowd", files=known, ssh_args=("-i", k("right")), ferry_args=("--identity", k("right"))),
            Scenario("--identity / -i, crowded agent", self.block(s), CROWDED, agent="crowd", files=known,
                     ssh_args=("-i", k("right")), ferry_args=("--identity", k("right")), ssh_cause=too_many),
            Scenario("missing identity file", self.block(s, IdentityFile=k("absent"), IdentitiesOnly="yes"),
                     SAME_REFUSED, files=known, ssh_cause=r"No more authentication methods|" + denied,
                     ferry_cause=r"absent.*no such file"),
            Scenario("IdentityAgent none", self.block(s, IdentityAgent="none"), SAME_REFUSED, agent="right",
                     files=known, ssh_cause=denied, ferry_cause=r"no key to offer"),
            Scenario("IdentityAgent names the socket", self.block(s, IdentityAgent=self.agents["right"].sock), SAME_OK,
                     files=known),
            # Issue 42 item 5: ${VAR} in IdentityAgent was taken for a variable named "{VAR}/sock".
            Scenario("IdentityAgent ${XDG_RUNTIME_DIR}/sock", self.block(s, IdentityAgent="${XDG_RUNTIME_DIR}/sock"),
                     SAME_OK, files=known, env={"XDG_RUNTIME_DIR": self.agents["right"].dir}),
            Scenario("IdentityAgent $VAR", self.block(s, IdentityAgent="$FERRY_PARITY_AGENT"), SAME_OK, files=known,
                     env={"FERRY_PARITY_AGENT": self.agents["right"].sock}),
            Scenario("IdentityAgent ${VAR} unset", self.block(s, IdentityAgent="${FERRY_PARITY_UNSET}/sock"),
                     SAME_REFUSED, agent="right", files=known, ssh_cause=r"FERRY_PARITY_UNSET",
                     ferry_cause=r"IdentityAgent.*\$\{FERRY_PARITY_UNSET\} has no value"),
        ]

    def certificate_scenarios(self) -> list[Scenario]:
        c, k = self.ca, self.key
        known = self.known(c)
        denied = r"Permission denied \(publickey\)"
        return [
            Scenario("certificate beside the key", self.block(c, user="dash", IdentityFile=k("cert"), IdentitiesOnly="yes"),
                     SAME_OK, files=known),
            Scenario("CertificateFile", self.block(c, user="dash", IdentityFile=k("cert2"), IdentitiesOnly="yes",
                                                   CertificateFile=k("cert2-elsewhere.pub")), SAME_OK, files=known),
            Scenario("certificate in the agent", self.block(c, user="dash"), SAME_OK, agent="cert", files=known),
            Scenario("CertificateFile, key in the agent", self.block(c, user="dash",
                                                                     CertificateFile=k("cert2-elsewhere.pub")),
                     SAME_OK, agent="cert2-plain", files=known),
            Scenario("expired certificate", self.block(c, user="dash", IdentityFile=k("expired"), IdentitiesOnly="yes"),
                     SAME_REFUSED, files=known, ssh_cause=denied, ferry_cause=denied + r".*expired on 2020-02-01"),
            Scenario("certificate for another principal", self.block(c, user="dash", IdentityFile=k("stranger"),
                                                                     IdentitiesOnly="yes"),
                     SAME_REFUSED, files=known, ssh_cause=denied, ferry_cause=rf"do not include {USER_PREFIX}dash"),
            Scenario("certificate, crowded agent, IdentitiesOnly", self.block(c, user="dash", IdentityFile=k("cert"),
                                                                              IdentitiesOnly="yes"),
                     SAME_OK, agent="crowd", files=known),
            Scenario("certificate, crowded agent, MaxAuthTries 3", self.block(c, user="dash", IdentityFile=k("cert")),
                     CROWDED, agent="crowd", files=known, ssh_cause=r"Too many authentication failures"),
            Scenario("plain key where only certificates count", self.block(c, user="dash", IdentityFile=k("plain"),
                                                                           IdentitiesOnly="yes"),
                     SAME_REFUSED, files=known, ssh_cause=denied, ferry_cause=denied),
        ]

    def host_key_scenarios(self) -> list[Scenario]:
        s, k = self.srv, self.key
        ident = {"IdentityFile": k("right"), "IdentitiesOnly": "yes"}
        name = f"[{s.listen}]:{s.port}"

        def recorded(hashed: bool, lookup: str):
            def check(results):
                lines = {}
                for tool in ("ssh", "ferry"):
                    with open(os.path.join(results[tool][3], "known_hosts")) as f:
                        lines[tool] = [line.split() for line in f if line.strip()]
                    assert len(lines[tool]) == 1, f"{tool} recorded {lines[tool]}"
                    assert " ".join(lines[tool][0][1:3]) == self.srv_key, f"{tool} recorded another key"
                    found = subprocess.run(["ssh-keygen", "-F", lookup, "-f",
                                            os.path.join(results[tool][3], "known_hosts")], capture_output=True)
                    assert found.returncode == 0, f"ssh-keygen -F {lookup} finds nothing {tool} recorded"
                    assert lines[tool][0][0].startswith("|1|") == hashed, f"{tool}: hashed is not {hashed}"
                if not hashed:
                    assert lines["ssh"] == lines["ferry"], f"different lines: {lines}"
            return check

        unknown = r"Host key verification failed"
        return [
            Scenario("known host key", self.block(s, **ident), SAME_OK, files=self.known(s)),
            Scenario("unknown host key, strict", self.block(s, StrictHostKeyChecking="yes", **ident), SAME_REFUSED,
                     files={"known_hosts": ""}, ssh_cause=unknown, ferry_cause=r"host key unknown"),
            Scenario("unknown host key, accept-new", self.block(s, StrictHostKeyChecking="accept-new", **ident),
                     SAME_OK, files={"known_hosts": ""}, after=recorded(False, name)),
            Scenario("accept-new, HashKnownHosts", self.block(s, StrictHostKeyChecking="accept-new", HashKnownHosts="yes",
                                                               **ident),
                     SAME_OK, files={"known_hosts": ""}, after=recorded(True, name)),
            Scenario("HostKeyAlias known", self.block(s, HostKeyAlias="gpu-alias", **ident), SAME_OK,
                     files={"known_hosts": f"gpu-alias {self.srv_key}\n"}),
            Scenario("HostKeyAlias names another key", self.block(s, HostKeyAlias="gpu-alias", **ident), SAME_REFUSED,
                     files={"known_hosts": f"gpu-alias {self.other_key}\n{s.known_hosts_line()}\n"},
                     ssh_cause=r"HOST IDENTIFICATION HAS CHANGED", ferry_cause=r"host key changed.*gpu-alias"),
            Scenario("HostKeyAlias, accept-new", self.block(s, HostKeyAlias="new-alias", StrictHostKeyChecking="accept-new",
                                                            **ident),
                     SAME_OK, files={"known_hosts": ""}, after=recorded(False, "new-alias")),
            Scenario("changed host key", self.block(s, **ident), SAME_REFUSED,
                     files={"known_hosts": f"{name} {self.other_key}\n"},
                     ssh_cause=r"HOST IDENTIFICATION HAS CHANGED", ferry_cause=r"host key changed"),
            Scenario("revoked host key", self.block(s, **ident), SAME_REFUSED,
                     files={"known_hosts": f"@revoked {name} {self.srv_key}\n{name} {self.srv_key}\n"},
                     ssh_cause=r"REVOKED", ferry_cause=r"REVOKED"),
            Scenario("StrictHostKeyChecking no", self.block(s, StrictHostKeyChecking="no", **ident), NEVER_SKIPS,
                     files={"known_hosts": ""}, ferry_cause=r"StrictHostKeyChecking no: ferry never skips"),
            Scenario("second UserKnownHostsFile",
                     self.block(s, **ident).replace("UserKnownHostsFile {d}/known_hosts",
                                                    "UserKnownHostsFile {d}/empty {d}/known_hosts"),
                     SAME_OK, files={"empty": "", **self.known(s)}),
            Scenario("GlobalKnownHostsFile list",
                     self.block(s, **ident).replace("UserKnownHostsFile {d}/known_hosts", "UserKnownHostsFile {d}/empty")
                     .replace("GlobalKnownHostsFile /dev/null", "GlobalKnownHostsFile {d}/empty {d}/global"),
                     SAME_OK, files={"empty": "", "global": s.known_hosts_line() + "\n"}),
        ]

    def config_scenarios(self) -> list[Scenario]:
        s, k = self.srv, self.key
        known = self.known(s)
        common = (f"    User {USER_PREFIX}bash\n    IdentityFile {k('right')}\n    IdentitiesOnly yes\n"
                  "    UserKnownHostsFile {d}/known_hosts\n    GlobalKnownHostsFile /dev/null\n    BatchMode yes\n")
        refused = r"Connection refused"
        return [
            Scenario("Match originalhost", f"Match originalhost gpu-a*\n    HostName 127.0.0.1\n    Port {s.port}\n"
                     f"Host *\n{common}", SAME_OK, host="gpu-alias", files=known),
            Scenario("Match host after HostName", f"Host gpu-alias\n    HostName 127.0.0.1\nMatch host 127.0.0.1\n"
                     f"    Port {s.port}\nHost *\n{common}", SAME_OK, host="gpu-alias", files=known),
            Scenario("Match exec true", f"Host target\n    HostName 127.0.0.1\nMatch exec \"test %n = target\"\n"
                     f"    Port {s.port}\nHost *\n{common}", SAME_OK, files=known),
            Scenario("Match exec false", f"Host target\n    HostName 127.0.0.1\nMatch exec false\n    Port {s.port}\n"
                     f"Host *\n    Port {self.dead_port()}\n{common}", SAME_REFUSED, files=known,
                     ssh_cause=refused, ferry_cause=refused),
            Scenario("Match user", f"Host target\n    HostName 127.0.0.1\n    Port {s.port}\n    User {USER_PREFIX}bash\n"
                     f"Match user {USER_PREFIX}bash\n    IdentityFile {k('right')}\nHost *\n"
                     "    IdentitiesOnly yes\n    UserKnownHostsFile {d}/known_hosts\n    BatchMode yes\n",
                     SAME_OK, files=known),
            Scenario("Match user before User is set", f"Host target\n    HostName 127.0.0.1\n    Port {s.port}\n"
                     f"Match user {USER_PREFIX}bash\n    IdentityFile {k('right')}\nHost *\n    User {USER_PREFIX}bash\n"
                     "    IdentitiesOnly yes\n    UserKnownHostsFile {d}/known_hosts\n    BatchMode yes\n",
                     SAME_REFUSED, files=known, ssh_cause=r"Permission denied \(publickey\)",
                     ferry_cause=r"no key to offer"),
            Scenario("Match final", f"Host target\n    HostName 127.0.0.1\nMatch final host 127.0.0.1\n    Port {s.port}\n"
                     f"Host *\n{common}", SAME_OK, files=known),
            Scenario("Include with a glob", "Include {d}/conf.d/*.conf\n", SAME_OK,
                     files={**known, "conf.d/a.conf": self.block(s, IdentityFile=k("right"), IdentitiesOnly="yes")}),
            Scenario("unknown keyword", self.block(s, IdentityFile=k("right"), Frobnicate="yes"), SAME_REFUSED,
                     files=known, ssh_cause=r"Bad configuration option: frobnicate",
                     ferry_cause=r"Bad configuration option: frobnicate"),
            Scenario("IgnoreUnknown", "IgnoreUnknown Frobnicate\n" + self.block(s, IdentityFile=k("right"), Frobnicate="yes"),
                     SAME_OK, files=known),
            # Issue 42 item 5: SetEnv was ignored without a word; -v names the variables (never
            # their values) and where a job's variables are declared.
            Scenario("SetEnv, said under -v", self.block(s, IdentityFile=k("right"), IdentitiesOnly="yes",
                                                         SetEnv="HF_TOKEN=parity-secret MODE=fast"),
                     SAME_OK, files=known, ferry_args=("-v",), after=self.set_env_said),
            Scenario("first value wins", self.block(s, IdentityFile=k("right"), IdentitiesOnly="yes")
                     + f"Host *\n    Port {self.dead_port()}\n    User nobody\n", SAME_OK, files=known),
            Scenario("nothing listens", self.block(s, IdentityFile=k("right")).replace(f"Port {s.port}",
                                                                                       f"Port {self.dead_port()}"),
                     SAME_REFUSED, files=known, ssh_cause=refused, ferry_cause=refused),
        ]

    @staticmethod
    def set_env_said(results):
        out = results["ferry"][1]
        assert re.search(r"line \d+: SetEnv HF_TOKEN MODE: not sent .*--env HF_TOKEN=VALUE", out), \
            "ferry -v does not say that SetEnv is not sent"
        assert "parity-secret" not in out, "ferry -v shows a SetEnv value"

    def proxy_scenarios(self) -> list[Scenario]:
        t, b, k = self.inner, self.bastion, self.key
        known = self.known(t, b)
        bastion = self.block(b, alias="bastion", IdentityFile=k("right"), IdentitiesOnly="yes")
        denied = r"Permission denied \(publickey\)"
        return [
            Scenario("ProxyJump", self.block(t, IdentityFile=k("right"), IdentitiesOnly="yes", ProxyJump="bastion")
                     + bastion, SAME_OK, files=known),
            Scenario("ProxyCommand ssh -W", self.block(t, IdentityFile=k("right"), IdentitiesOnly="yes",
                                                       ProxyCommand="ssh -F {d}/config -W %h:%p bastion") + bastion,
                     SAME_OK, files=known),
            Scenario("two hops", self.block(t, IdentityFile=k("right"), IdentitiesOnly="yes", ProxyJump="bastion,bastion2")
                     + bastion + self.block(b, alias="bastion2", IdentityFile=k("right"), IdentitiesOnly="yes")
                     .replace(f"HostName {b.listen}\n    Port {b.port}", f"HostName {t.listen}\n    Port {t.port}"),
                     SAME_OK, files=known),
            Scenario("target not reachable without the bastion", self.block(t, IdentityFile=k("right")), SAME_REFUSED,
                     files=known, ssh_cause=r"Connection refused", ferry_cause=r"Connection refused"),
            Scenario("bastion name misspelt", self.block(t, IdentityFile=k("right"), ProxyJump="bastoin") + bastion,
                     SAME_REFUSED, files=known, netns=self.empty_ns.name,
                     ssh_cause=r"Could not resolve hostname bastoin", ferry_cause=r"Could not resolve hostname bastoin"),
            Scenario("bastion host key unknown", self.block(t, IdentityFile=k("right"), ProxyJump="bastion") + bastion,
                     SAME_REFUSED, files=self.known(t), ssh_cause=r"Host key verification failed",
                     ferry_cause=r"proxy failed.*Host key verification failed"),
            Scenario("proxy command fails", self.block(t, IdentityFile=k("right"),
                                                       ProxyCommand="sh -c 'echo no route to the moon >&2; exit 3'"),
                     SAME_REFUSED, files=known, ssh_cause=r"no route to the moon",
                     ferry_cause=r"proxy failed.*exit status 3.*no route to the moon"),
            Scenario("proxy command missing", self.block(t, IdentityFile=k("right"), ProxyCommand="/nonexistent/proxy %h"),
                     SAME_REFUSED, files=known, ssh_cause=r"not found|No such file",
                     ferry_cause=r"proxy failed.*(not found|No such file)"),
            Scenario("through the bastion, wrong key", self.block(t, IdentityFile=k("noise1"), IdentitiesOnly="yes",
                                                                  ProxyJump="bastion") + bastion,
                     SAME_REFUSED, files=known, ssh_cause=denied, ferry_cause=denied),
        ]

    @staticmethod
    def dead_port() -> int:
        # Outside the ephemeral range: no outgoing connection or bind(0) listener takes it.
        return _free_port("127.0.0.1")


if __name__ == "__main__":
    unittest.main()
