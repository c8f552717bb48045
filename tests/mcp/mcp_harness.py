"""Helpers for the `ferry mcp` tests: the SDK client driver, a raw JSON-RPC session, the test
jobs, and the archive (Python 3 standard library only).

The ferry binary comes from $FERRY_BIN, the SDK client script from $FERRY_MCP_CLIENT (ctest sets
both); anything missing fails loudly with what to run."""

from __future__ import annotations

import json
import os
import select
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))

from ferry_harness import SANITIZED, ferry_bin, write_job  # noqa: E402

__all__ = ["SANITIZED", "ferry_bin", "write_job", "run_client", "RawServer", "archive_rows",
           "job_block", "wait_until", "pid_alive", "TEST_JOBS"]


def client_script() -> str:
    path = os.environ.get("FERRY_MCP_CLIENT") or os.path.join(HERE, "mcp_client.mjs")
    sdk = os.path.join(os.path.dirname(path), "node_modules", "@modelcontextprotocol", "sdk")
    if not os.path.isdir(sdk):
        raise AssertionError(f"the MCP SDK is not installed next to {path}: run the ctest fixture "
                             "mcp_sdk_install, or `npm ci` in tests/mcp")
    if not shutil.which("node"):
        raise AssertionError("node is missing: run ./setup.sh as root (Debian packages nodejs, npm)")
    return path


def run_client(args: list[str], steps: list[dict], env: dict | None = None,
               timeout: float = 300, cwd: str | None = None) -> dict:
    """Runs `ferry ARGS` under the SDK client through `steps` (the server started in `cwd`,
    default this directory); returns the driver's report."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"command": ferry_bin(), "args": args, "env": env or {}, "steps": steps,
                   "cwd": cwd}, f)
        scenario = f.name
    try:
        proc = subprocess.run(["node", client_script(), scenario], capture_output=True,
                              timeout=timeout, cwd=HERE)
    finally:
        os.unlink(scenario)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise AssertionError(f"the SDK client failed ({proc.returncode}):\n"
                             f"{proc.stderr.decode(errors='replace')[-4000:]}")
    report = json.loads(proc.stdout)
    if "fatal" in report:
        raise AssertionError(f"the SDK client failed: {report['fatal']}\nserver stderr:\n"
                             f"{report.get('stderr', '')[-4000:]}")
    if SANITIZED and ("ERROR: AddressSanitizer" in report["stderr"]
                      or "runtime error:" in report["stderr"]):
        raise AssertionError("sanitizer report from ferry mcp:\n" + report["stderr"][-6000:])
    return report


class RawServer:
    """`ferry mcp ARGS` on pipes, spoken to in raw JSON-RPC lines."""

    def __init__(self, args: list[str], env: dict | None = None):
        self.proc = subprocess.Popen([ferry_bin(), "mcp", *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env={**os.environ, **(env or {})})
        self.lines: list[bytes] = []  # every line the server wrote to stdout
        self._buffer = b""

    def send_raw(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, message: dict) -> None:
        self.send_raw(json.dumps(message).encode() + b"\n")

    def request(self, id_, method: str, params: dict | None = None) -> None:
        message = {"jsonrpc": "2.0", "id": id_, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)

    def read(self, timeout: float = 30) -> dict:
        """The next message on stdout; each must be one JSON-RPC 2.0 object on one line."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no message from ferry mcp within {timeout} s")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
                if not chunk:
                    raise AssertionError("ferry mcp closed its stdout; stderr:\n" + self.stderr_text())
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        self.lines.append(line)
        message = json.loads(line)
        assert message.get("jsonrpc") == "2.0", line
        return message

    def response(self, id_, timeout: float = 30) -> dict:
        """The response to request `id_`, skipping notifications."""
        while True:
            message = self.read(timeout)
            if "method" not in message:
                assert message.get("id") == id_, f"expected the response to {id_!r}, got {message}"
                return message

    def initialize(self, version: str = "2025-06-18") -> dict:
        self.request(0, "initialize", {"protocolVersion": version, "capabilities": {},
                                       "clientInfo": {"name": "raw-test", "version": "0.0.1"}})
        answer = self.response(0)
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return answer

    def close(self, timeout: float = 30) -> int:
        """Ends the input, waits for ferry to exit and checks what it wrote after: still only
        JSON-RPC messages, one a line."""
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        code = self.proc.wait(timeout)
        rest = self._buffer + self.proc.stdout.read()
        self.proc.stdout.close()
        for line in rest.splitlines():
            self.lines.append(line)
            assert json.loads(line).get("jsonrpc") == "2.0", line
        assert not rest or rest.endswith(b"\n"), rest[-200:]
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe and not pipe.closed:
                try:
                    pipe.close()
                except BrokenPipeError:
                    pass

    def stderr_text(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stderr.read().decode(errors="replace")


def archive_rows(path: str) -> list[dict]:
    """Every run in the archive, as its JSON record plus the host_label column."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT record, host_label, params, result FROM runs ORDER BY started_at").fetchall()
    # params and the result have columns of their own (JSON text), the rest is the record.
    return [{**json.loads(record), "host_label": label,
             "params": json.loads(params) if params is not None else {},
             "result": json.loads(result) if result is not None else None}
            for record, label, params, result in rows]


def job_block(path: str) -> dict:
    """The `/// ferry` block of a job file, read with Python's own TOML parser."""
    lines, inside = [], False
    with open(path, encoding="utf-8") as f:
        for line in f:
            body = line[1:].removeprefix(" ").rstrip("\n") if line.startswith("#") else None
            if body is not None and body.strip() == "/// ferry":
                inside = True
            elif inside and body is not None and body.strip() == "///":
                break
            elif inside:
                lines.append(body)
    return tomllib.loads("\n".join(lines))


def wait_until(predicate, timeout_s: float = 30, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].split()[0] != "Z"
    except OSError:
        return False


# The jobs the tests serve, written into a jobs directory by write_test_jobs().
TEST_JOBS = {
    # Echoes its parameters; declares a result schema, so the tool has an outputSchema.
    "echo": dict(body='''
import json, os
with open(os.environ["FERRY_PARAMS"], encoding="utf-8") as f:
    params = json.load(f)
with open(os.environ["FERRY_RESULT"], "w", encoding="utf-8") as f:
    json.dump({"params": params, "job": os.environ["FERRY_JOB"]}, f)
print("echoed", len(params), "params")
''', params='''
[params.text]
type = "string"
required = true
help = "any text"
[params.items]
type = "list"
default = []
[params.blob]
type = "json"
[params.mode]
type = "string"
choices = ["fast", "slow"]
default = "fast"
[params.count]
type = "int"
default = 2
[params.ratio]
type = "float"
[params.flags]
type = "list"
items = "int"
choices = [1, 2, 3]
default = [1]
[params.verbose]
type = "bool"
default = false
[result_schema]
type = "object"
required = ["params", "job"]
[result_schema.properties.job]
type = "string"
[result_schema.properties.params]
type = "object"
'''),
    # Fails with a message on stderr.
    "boom": dict(interpreter="sh", body='''
echo "about to fail"
echo "boom: the disk is on fire" >&2
exit 3
'''),
    # Runs past its 1 s timeout.
    "sleepy": dict(interpreter="sh", timeout=1, body='''
echo "sleeping"
sleep 30
'''),
    # Says so, then waits (up to 30 s) for the file `gate` to appear: a test decides when it
    # ends (a detached run, looked at while it runs).
    "gated": dict(body='''
import json, os, time
with open(os.environ["FERRY_PARAMS"], encoding="utf-8") as f:
    gate = json.load(f)["gate"]
print("waiting for the gate", flush=True)
deadline = time.time() + 30
while not os.path.exists(gate) and time.time() < deadline:
    time.sleep(0.1)
print("through the gate", flush=True)
with open(os.environ["FERRY_RESULT"], "w", encoding="utf-8") as f:
    json.dump({"opened": os.path.exists(gate)}, f)
''', params='''
[params.gate]
type = "string"
required = true
[result_schema]
type = "object"
required = ["opened"]
'''),
    # Says where it runs, then waits to be stopped.
    "waiter": dict(timeout=120, body='''
import os, sys, time
print(f"ready pid={os.getpid()} dir={os.environ['FERRY_RUN_DIR']}", flush=True)
time.sleep(100)
'''),
    # Tells what it runs with: variables, PATH, the nvidia-smi found on it, its interpreter.
    "environ": dict(body='''
import json, os, shutil, sys
with open(os.environ["FERRY_RESULT"], "w", encoding="utf-8") as f:
    json.dump({"env": {n: os.environ.get(n) for n in ("GREETING", "TOKEN")},
               "path": os.environ.get("PATH"), "nvidia_smi": shutil.which("nvidia-smi"),
               "python": sys.executable}, f)
'''),
    # Prints control sequences, C1 and bidi characters on stdout and stderr, then fails.
    "painter": dict(body='''
import sys
text = "\\x1b]52;c;ZXZpbA==\\x07\\x1b[2J\\u009b31m\\x7f\\u202eevil\\u2066x"
print(text, flush=True)
print(text, file=sys.stderr, flush=True)
sys.exit(3)
'''),
    # Writes two files it declares as `outputs`: one text, one binary.
    "writer": dict(body='''
import os
os.makedirs("out", exist_ok=True)
with open("out/report.txt", "w") as f:
    f.write("hello from the run\\n")
with open("out/blob bin.dat", "wb") as f:
    f.write(bytes(range(256)))
''', params='''
outputs = ["out/*"]
'''),
    # Prints many lines at once: the live output is rate-limited.
    "chatty": dict(body='''
import sys
for i in range(400):
    print(f"line {i}")
sys.stdout.flush()
'''),
}


def write_test_jobs(directory: str) -> dict:
    """The TEST_JOBS as files in `directory`; returns name -> path."""
    paths = {}
    for name, spec in TEST_JOBS.items():
        paths[name] = write_job(directory, name, spec["body"],
                                interpreter=spec.get("interpreter", "python3"),
                                timeout=spec.get("timeout", 60), params=spec.get("params", ""))
    return paths
