#!/usr/bin/env python3
"""ferry's connection holders for the benchmark's fleet case: end them, ready them, count them.

    fleet_holders.py end FERRY                 # `disconnect --all`, then wait until none is left
    fleet_holders.py ready N FERRY COMMAND     # fewer than N sessions held: run COMMAND (bash -c)
                                               # once, then wait until N are held (or no more come);
                                               # then until the holders and this machine (the
                                               # fixture's hosts) are idle
    fleet_holders.py count FERRY               # "PROCESSES RSS_KIB SESSIONS"

hyperfine runs the first two, untimed, as --prepare and --cleanup. The holders are those of
$XDG_RUNTIME_DIR; a holder process is any live process of the FERRY binary (the benchmark
times a private copy: nothing else runs it), so a design with one holder for many hosts is
counted as it is. Python 3 standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

WAIT_S = 120
STALL_S = 15
SETTLE_S = 120
IDLE_TICKS = 2
IDLE_SHARE = 0.1  # of the machine's CPU time, over a second


def sessions(ferry: str) -> int:
    """How many held sessions `ferry disconnect --list --json` lists (not yet ended)."""
    proc = subprocess.run([ferry, "disconnect", "--list", "--json"], capture_output=True, text=True,
                          timeout=60)
    return sum(1 for h in json.loads(proc.stdout or "[]") if not h.get("ended"))


def processes(ferry: str) -> list[tuple[int, int]]:
    """(pid, VmRSS KiB) of every live process of the FERRY binary."""
    target = os.path.realpath(ferry)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/exe") != target:
                continue
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if fields.get("State", "").split()[:1] == ["Z"]:
            continue
        found.append((int(entry), int(fields.get("VmRSS", "0 kB").split()[0])))
    return found


def end(ferry: str) -> int:
    subprocess.run([ferry, "disconnect", "--all"], capture_output=True, timeout=120)
    deadline = time.monotonic() + WAIT_S
    while processes(ferry):
        if time.monotonic() > deadline:
            print(f"fleet_holders: {len(processes(ferry))} holder processes left {WAIT_S} s after "
                  "`ferry disconnect --all`", file=sys.stderr)
            return 1
        time.sleep(0.2)
    return 0


def cpu_ticks(pids: list[int]) -> int:
    """utime + stime, in clock ticks, of the live processes among PIDS."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total


def machine_ticks() -> tuple[int, int]:
    """(busy, all) clock ticks of this machine's CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def settle(ferry: str) -> None:
    """Wait until the holders are idle (at most IDLE_TICKS of CPU in a second) and so is this
    machine (at most IDLE_SHARE of its CPU), SETTLE_S at most: after a run a holder readies each
    host's next standby, and each python standby starts the next run's interpreter once the
    host's CPUs are not oversubscribed; a held run timed while that goes on measures the two at
    once (on this fixture the hosts share the machine's CPUs, where each real host has its own).
    A user's next run seldom follows the last within seconds."""
    start = time.monotonic()
    pids = [pid for pid, _ in processes(ferry)]
    before, machine_before = cpu_ticks(pids), machine_ticks()
    while time.monotonic() - start < SETTLE_S:
        time.sleep(1)
        now, machine_now = cpu_ticks(pids), machine_ticks()
        busy = machine_now[0] - machine_before[0]
        share = busy / max(1, machine_now[1] - machine_before[1])
        if now - before <= IDLE_TICKS and share <= IDLE_SHARE:
            return
        before, machine_before = now, machine_now
    print(f"fleet_holders: the holders or this machine still busy {SETTLE_S} s after the "
          "sessions were held", file=sys.stderr)


def ready(n: int, ferry: str, command: str) -> int:
    if sessions(ferry) >= n:
        settle(ferry)
        return 0
    run = subprocess.run(["bash", "--norc", "--noprofile", "-c", command],
                         stdout=subprocess.DEVNULL, timeout=1800)
    if run.returncode != 0:
        print(f"fleet_holders: `{command}` exited {run.returncode}", file=sys.stderr)
        return 1
    wait_for_sessions(ferry, n)
    settle(ferry)
    return 0


def wait_for_sessions(ferry: str, n: int) -> int:
    """Wait until N sessions are held, or their count has not grown for STALL_S (a holder that
    failed to connect never comes), WAIT_S at most; the count reached."""
    start = last_growth = time.monotonic()
    count = sessions(ferry)
    while count < n and time.monotonic() - last_growth < STALL_S and time.monotonic() - start < WAIT_S:
        time.sleep(0.5)
        now = sessions(ferry)
        if now > count:
            count, last_growth = now, time.monotonic()
    if count < n:
        print(f"fleet_holders: {count} of {n} sessions held {time.monotonic() - start:.0f} s after "
              "the run; going on without the others", file=sys.stderr)
    return count


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "end":
        return end(argv[1])
    if len(argv) == 4 and argv[0] == "ready":
        return ready(int(argv[1]), argv[2], argv[3])
    if len(argv) == 2 and argv[0] == "count":
        procs = processes(argv[1])
        print(len(procs), sum(rss for _, rss in procs), sessions(argv[1]))
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
