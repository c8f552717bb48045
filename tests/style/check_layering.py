#!/usr/bin/env python3
"""Fails when code outside src/transport/ reaches libssh, SFTP or Boost.Process headers, directly
or through a project header that includes them: the runner, the archive, the CLI and the jobs
know nothing of how a session reaches its host."""

import os
import re
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FORBIDDEN = re.compile(r"^(libssh/|boost/process)")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
ALLOWED_DIR = os.path.join("src", "transport") + os.sep


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
    print(f"layering: ok ({len(includes)} files checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else REPO))
