#!/usr/bin/env python3
"""Two rules of the layering (docs/architecture.md):

1. Code outside src/transport/ never reaches libssh, SFTP or Boost.Process headers, directly or
   through a project header that includes them: the runner, the archive, the CLI and the jobs
   know nothing of how a session reaches its host.
2. The folders keep one dependency order, cli -> mcp -> run/archive -> transport -> job ->
   remote/report -> util: a file includes project headers of its own layer or of a layer below.
   Each public header under include/ferry/ belongs to the layer named in LAYER_OF_HEADER, and
   within src/transport/, ssh/ and held/ do not include each other (the holder drives an SSH
   session through the HostSession seam; the SSH session knows nothing of holders)."""

import os
import re
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FORBIDDEN = re.compile(r"^(libssh/|boost/process)")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
ALLOWED_DIR = os.path.join("src", "transport") + os.sep


# Higher numbers sit higher: a layer may include its own and lower ones.
LAYER = {"util": 0, "remote": 1, "report": 1, "job": 2, "transport": 3, "run": 4, "archive": 4,
         "mcp": 5, "cli": 6, "main": 7}
LAYER_OF_HEADER = {
    "expected.hpp": "util", "exit_code.hpp": "util", "fd.hpp": "util", "text.hpp": "util",
    "util.hpp": "util", "suggest.hpp": "util", "version.hpp": "util", "host_spec.hpp": "util", "hostlist.hpp": "util",
    "json_diff.hpp": "util", "dir_entry.hpp": "util", "output_stream.hpp": "util",
    "remote/launcher.hpp": "remote", "remote/shell_neutral.hpp": "remote", "remote/standby_boot.hpp": "remote",
    "run_record.hpp": "report", "reporter.hpp": "report", "run_observer.hpp": "report",
    "bundle.hpp": "job", "job.hpp": "job", "params.hpp": "job", "run_env.hpp": "job",
    "slurm_options.hpp": "job", "sweep.hpp": "job", "user_config.hpp": "job",
    "transport.hpp": "transport", "sessions.hpp": "transport", "held.hpp": "transport",
    "slurm.hpp": "transport",
    "runner.hpp": "run", "fleet.hpp": "run", "archive.hpp": "archive",
}


def layer_of(path: str):
    """The layer of a file under src/ or include/ferry/, or None for tests and tools."""
    parts = path.split(os.sep)
    if parts[0] == "include" and parts[1] == "ferry":
        return LAYER_OF_HEADER.get("/".join(parts[2:]), "unknown")
    if parts[0] == "src":
        return "main" if len(parts) == 2 else parts[1]
    return None


def order_breaks(includes) -> list:
    bad = []
    for path, incs in sorted(includes.items()):
        mine = layer_of(path)
        if mine is None:
            continue
        if mine not in LAYER:
            bad.append(f"{path}: no layer (add it to LAYER_OF_HEADER in check_layering.py)")
            continue
        for inc in incs:
            local = resolve(REPO_TOP[0], inc)
            theirs = layer_of(local) if local else None
            if theirs is None:
                continue
            if theirs not in LAYER:
                bad.append(f"{local}: no layer (add it to LAYER_OF_HEADER in check_layering.py)")
            elif LAYER[theirs] > LAYER[mine]:
                bad.append(f"{path} ({mine}) includes {local} ({theirs}), a layer above it")
            elif mine == "transport" and cross_transport(path, local):
                bad.append(f"{path} includes {local}: ssh/ and held/ do not include each other")
    return sorted(set(bad))


def cross_transport(path: str, included: str) -> bool:
    sub = {os.path.join("src", "transport", d) + os.sep: d for d in ("ssh", "held")}
    mine = next((d for p, d in sub.items() if path.startswith(p)), None)
    theirs = next((d for p, d in sub.items() if included.startswith(p)), None)
    return mine is not None and theirs is not None and mine != theirs


REPO_TOP = [REPO]


def sources(top: str):
    for base in ("src", "include", "tests"):
        for root, _dirs, files in os.walk(os.path.join(top, base)):
            for name in files:
                if name.endswith((".cpp", ".hpp", ".h", ".cc")):
                    yield os.path.relpath(os.path.join(root, name), top)


def resolve(top: str, included: str):
    for base in ("src", "include"):
        path = os.path.join(base, included)
        if os.path.isfile(os.path.join(top, path)):
            return path
    return None


def main(top: str) -> int:
    includes = {}
    for path in sources(top):
        with open(os.path.join(top, path), encoding="utf-8", errors="replace") as f:
            includes[path] = INCLUDE.findall(f.read())

    reaches = {}

    def forbidden_via(path, seen=()):
        if path in reaches:
            return reaches[path]
        reaches[path] = None  # cycles: not (yet) known to reach
        for inc in includes.get(path, []):
            if FORBIDDEN.match(inc):
                reaches[path] = [inc]
                return reaches[path]
            local = resolve(top, inc)
            if local and local not in seen:
                chain = forbidden_via(local, seen + (path,))
                if chain:
                    reaches[path] = [local] + chain
                    return reaches[path]
        return None

    bad = []
    for path in sorted(includes):
        if path.startswith(ALLOWED_DIR):
            continue
        chain = forbidden_via(path)
        if chain:
            bad.append(f"{path} -> {' -> '.join(chain)}")
    if bad:
        print("layering: only src/transport/ may include libssh, SFTP or Boost.Process headers;"
              " move the code that needs them behind the HostSession interface:")
        for line in bad:
            print("  " + line)
        return 1
    REPO_TOP[0] = top
    broken = order_breaks(includes)
    if broken:
        print("layering: the folder order is cli -> mcp -> run/archive -> transport -> job ->"
              " remote/report -> util (docs/architecture.md); move the code, or the type it"
              " needs, down a layer:")
        for line in broken:
            print("  " + line)
        return 1
    print(f"layering: ok ({len(includes)} files checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else REPO))
