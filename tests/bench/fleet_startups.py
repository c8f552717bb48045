#!/usr/bin/env python3
"""256 hosts at sshd's default MaxStartups: does a fan-out get refused? (issue 43 item 2)

    sudo flock /tmp/ferry-fixtures.lock python3 tests/bench/fleet_startups.py [--ferry PATH] [-j N]

fleet_bench.py's fleet256 fixture (16 sshd × 16 addresses 127.1.I.J, hosts in daemon order,
so -j 64 starts 16 handshakes on each of the first 4 daemons) but with sshd's default
`MaxStartups 10:30:100` instead of the fixture's 100. Runs `ferry run PROBE -j N --persist 0`
over the 256 hosts, then the floor `xargs -P N ssh HOST true`, and says for each how many
hosts were ok, how long it took and how many connections the daemons dropped past MaxStartups
(their logs). One run each: a check, not a timing. Must run as root (the sshd fixture); all
traffic stays on 127.0.0.0/8.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
from sshd_fixture import SshServer  # noqa: E402

DAEMONS = 16
PER_DAEMON = 16
PROBE = ('# /// ferry\n# description = "probe"\n# interpreter = "python3"\n# result = "optional"\n# ///\n'
         'import json, platform\nprint(json.dumps({"node": platform.node()}))\n')


def host_block(alias: str, address: str, srv: SshServer, user: str, known: str, empty: str) -> str:
    return (f"Host {alias}\n    HostName {address}\n    Port {srv.port}\n    User {user}\n"
            f"    IdentityFile {srv.client_key}\n    IdentitiesOnly yes\n    UserKnownHostsFile {known}\n"
            f"    GlobalKnownHostsFile {empty}\n    StrictHostKeyChecking yes\n    BatchMode yes\n"
            f"    ConnectTimeout 60\n")


def write(path: str, text: str) -> str:
    with open(path, "w") as f:
        f.write(text)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ferry", default=os.path.join(REPO, "build", "ferry"))
    ap.add_argument("-j", type=int, default=64, help="ferry -j and xargs -P (default 64)")
    args = ap.parse_args()
    servers: list[SshServer] = []
    tmp = tempfile.mkdtemp(prefix="ferry-startups-")
    os.chmod(tmp, 0o755)
    try:
        hosts = []
        for d in range(DAEMONS):
            addresses = [f"127.1.{d + 1}.{j + 1}" for j in range(PER_DAEMON)]
            srv = SshServer(listen=addresses[0], also_listen=addresses[1:], reset_users=not servers,
                            extra_config="MaxStartups 10:30:100\nLoginGraceTime 120\n")
            servers.append(srv)
            srv.start()
            hosts += [(f"fl{d * PER_DAEMON + j + 1:03d}", a, srv) for j, a in enumerate(addresses)]
        user = servers[0].user("bash")
        known = write(os.path.join(tmp, "known_hosts"), "".join(s.known_hosts_line(a) + "\n" for _, a, s in hosts))
        empty = write(os.path.join(tmp, "global_known_hosts"), "")
        config = write(os.path.join(tmp, "ssh_config"),
                       "\n".join(host_block(h, a, s, user, known, empty) for h, a, s in hosts))
        hosts_file = write(os.path.join(tmp, "hosts"), "".join(h + "\n" for h, _, _ in hosts))
        probe = write(os.path.join(tmp, "probe.py"), PROBE)

        def drops() -> int:
            return sum(len(re.findall(r"past MaxStartups", s.log_text())) for s in servers)

        before, start = drops(), time.monotonic()
        proc = subprocess.run([args.ferry, "run", probe, "--hosts-file", hosts_file, "-j", str(args.j),
                               "--ssh-config", config, "--persist", "0", "--no-archive", "--json", "-v"],
                              capture_output=True, text=True, env={**os.environ, "SSH_AUTH_SOCK": ""}, timeout=1800)
        records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        ok = sum(r["status"] == "ok" for r in records)
        print(f"ferry -j {args.j} --persist 0: exit {proc.returncode}, {ok}/{len(hosts)} hosts ok in "
              f"{time.monotonic() - start:.1f} s; sshd dropped {drops() - before} connections past MaxStartups; "
              f"-v: {proc.stderr.count('pacing: waits')} pacing waits, {proc.stderr.count('again in')} retries")
        for r in [r for r in records if r["status"] != "ok"][:5]:
            print(f"  {r['target'].get('host')}: {r.get('failure')}: {r['error'][:200]}")
        before, start = drops(), time.monotonic()
        proc = subprocess.run(["xargs", "-a", hosts_file, "-P", str(args.j), "-I", "@", "ssh", "-F", config, "@", "true"],
                              capture_output=True, text=True, timeout=1800)
        print(f"floor xargs -P {args.j} ssh true: exit {proc.returncode} in {time.monotonic() - start:.1f} s; "
              f"sshd dropped {drops() - before} connections past MaxStartups; "
              f"{proc.stderr.count('kex_exchange_identification')} kex_exchange_identification errors")
        return 0
    finally:
        for srv in servers:
            srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
