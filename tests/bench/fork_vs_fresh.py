#!/usr/bin/env python3
"""Whether a job's python would start faster forked from a warm python than started fresh.

ferry's python standby starts each job's interpreter fresh (docs/persistence.md, "The python
standby"). A forking server would instead keep one warm interpreter and fork it per job. This
times both for fleet_bench.py's job (JOB_PY: imports json and os, prints a line),
N jobs one after another, in one hyperfine invocation of two small pythons:

  fresh: spawns `python3 JOB` N times and waits for each;
  fork:  forks itself N times; each child runs JOB's code as __main__.

Each pays its own start once and loads no module beyond python's start-up before it spawns or
forks. Run as any user (needs hyperfine):

  python3 tests/bench/fork_vs_fresh.py            # hyperfine, 10 runs, N = 20
  python3 tests/bench/fork_vs_fresh.py --faults   # also: page faults of one job's imports
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fleet_bench import HOST_PYTHON as PYTHON, JOB_PY as JOB  # noqa: E402  (the same job)


# The two timed commands. Each runs as `python3 SCRIPT JOB COUNT` and loads no module beyond
# what python loads at its start, so that a forked child imports what a fresh python would.
RUN_FRESH = """
import os, sys
job, count = sys.argv[1], int(sys.argv[2])
null = os.open(os.devnull, os.O_WRONLY)
for _ in range(count):
    pid = os.posix_spawn(sys.executable, [sys.executable, job], os.environ,
                         file_actions=[(os.POSIX_SPAWN_DUP2, null, 1)])
    if os.waitpid(pid, 0)[1]:
        raise SystemExit("a fresh job failed")
"""
RUN_FORKED = """
import os, sys
job, count = sys.argv[1], int(sys.argv[2])
with open(job) as f:
    code = compile(f.read(), job, "exec")
null = os.open(os.devnull, os.O_WRONLY)
for _ in range(count):
    pid = os.fork()
    if pid == 0:
        os.dup2(null, 1)
        os.setsid()
        exec(code, {"__name__": "__main__", "__file__": job})
        sys.stdout.flush()
        os._exit(0)
    if os.waitpid(pid, 0)[1]:
        raise SystemExit("a forked job failed")
"""


# One job's imports (`import json`), measured in the process that runs them: in a fresh python,
# and in a child forked from a python that has not imported them (its parent loads only
# resource and time). Prints wall, CPU and minor page faults of each.
PROBE = """
import os, resource, sys, time
def probe():
    a = resource.getrusage(resource.RUSAGE_SELF)
    t, c = time.perf_counter(), time.process_time()
    import json
    b = resource.getrusage(resource.RUSAGE_SELF)
    return "%.1f ms wall, %.1f ms CPU, %d minor faults" % (
        (time.perf_counter() - t) * 1e3, (time.process_time() - c) * 1e3, b.ru_minflt - a.ru_minflt)
if sys.argv[1] == "fresh":
    print("import json, fresh python:  ", probe())
else:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, probe().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    print("import json, forked child:  ", os.read(read, 4096).decode())
"""


def faults():
    for mode in ("fresh", "fork"):
        subprocess.run([PYTHON, "-c", PROBE, mode], check=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20, help="jobs per timed command (20)")
    parser.add_argument("--runs", type=int, default=10, help="hyperfine runs (10)")
    parser.add_argument("--faults", action="store_true", help="also count one job's page faults")
    args = parser.parse_args()
    if shutil.which("hyperfine") is None:
        raise SystemExit("fork_vs_fresh: hyperfine is missing: install it (apt-get install hyperfine)")
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.py")
        with open(job, "w") as f:
            f.write(JOB)
        out = os.path.join(tmp, "times.json")
        scripts = []
        for name, code in (("fresh", RUN_FRESH), ("fork", RUN_FORKED)):
            scripts.append(os.path.join(tmp, f"run_{name}.py"))
            with open(scripts[-1], "w") as f:
                f.write(code)
        commands = [f"{PYTHON} {script} {job} {args.count}" for script in scripts]
        subprocess.run(["hyperfine", "-N", "--warmup", "2", "--runs", str(args.runs),
                        "--export-json", out, *commands], check=True)
        with open(out) as f:
            results = {r["command"]: r["median"] for r in json.load(f)["results"]}
        fresh, fork = (results[c] * 1e3 for c in commands)
        print(f"\n{args.count} jobs: fresh python each {fresh:.1f} ms, forked from a warm one "
              f"{fork:.1f} ms: fork/fresh {fork / fresh:.2f}× (medians, load average "
              f"{os.getloadavg()[0]:.2f} at the end)")
        if args.faults:
            faults()


if __name__ == "__main__":
    main()
