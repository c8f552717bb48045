"""`ferry mcp` spoken to in raw JSON-RPC lines: the protocol's edge cases (malformed JSON,
batches, unknown methods, oversized and deeply nested messages, requests before initialize and
after shutdown), ping and cancellation while a call runs, and a client that disappears mid-call.
Every line ferry writes to stdout must be one JSON-RPC 2.0 message (RawServer.read checks)."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import tempfile
import time
import unittest

from mcp_harness import RawServer, archive_rows, pid_alive, wait_until, write_job, write_test_jobs

READY = re.compile(r"ready pid=(\d+) dir=(\S+)")


class Protocol(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="ferry-mcp-raw-")
        cls.jobs = os.path.join(cls.tmp, "jobs")
        os.mkdir(cls.jobs)
        write_test_jobs(cls.jobs)
        # Ignores SIGTERM, so the launcher needs its KILL: the server stays busy shutting down.
        write_job(cls.jobs, "stubborn", '''
trap '' TERM
echo "ready pid=$$ dir=$FERRY_RUN_DIR"
sleep 100
''', interpreter="sh", timeout=120)
        cls.runs = os.path.join(cls.tmp, "runs")
        os.mkdir(cls.runs)
        cls.archive = os.path.join(cls.tmp, "archive.db")
        cls.env = {"TMPDIR": cls.runs, "XDG_CONFIG_HOME": os.path.join(cls.tmp, "config"),
                   "FERRY_JOBS_PATH": ""}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def server(self) -> RawServer:
        server = RawServer(["--local", "--jobs", self.jobs, "--archive", self.archive], self.env)
        self.addCleanup(server.kill)
        return server

    def error_of(self, server: RawServer, id_, code: int) -> str:
        message = server.response(id_)
        self.assertIn("error", message, message)
        self.assertEqual(message["error"]["code"], code, message)
        return message["error"]["message"]

    def wait_ready(self, server: RawServer) -> tuple[int, str]:
        """Reads notifications until the job says it is ready; its pid and run dir."""
        for _ in range(200):
            message = server.read()
            line = message.get("params", {}).get("data", {}).get("line", "")
            if message.get("method") == "notifications/message" and READY.search(line):
                match = READY.search(line)
                return int(match.group(1)), match.group(2)
        raise AssertionError("the job never said it was ready")

    def assert_stopped(self, pid: int, run_dir: str, run_id_job: str = "waiter"):
        self.assertTrue(wait_until(lambda: not pid_alive(pid), 30), f"job process {pid} survives")
        self.assertFalse(os.path.exists(run_dir), f"run directory {run_dir} left behind")
        self.assertEqual(os.listdir(self.runs), [], "something left in the run base")

    def interrupted_row(self, job: str, before: int):
        found = []

        def row():
            found[:] = [r for r in archive_rows(self.archive)[before:] if r["job"] == job]
            return bool(found)
        self.assertTrue(wait_until(row, 30), f"no archived run of {job}")
        self.assertEqual(found[-1]["status"], "interrupted", found[-1])
        self.assertEqual(found[-1]["client"], {"name": "raw-test", "version": "0.0.1"})
        return found[-1]

    def rows(self) -> int:
        return len(archive_rows(self.archive)) if os.path.exists(self.archive) else 0

    # ------------------------------------------------------------------------------------------

    def test_version_negotiation(self):
        for asked, answered in [("2025-06-18", "2025-06-18"), ("2025-11-25", "2025-11-25"),
                                ("2024-11-05", "2025-06-18"), ("1999-01-01", "2025-06-18")]:
            with self.subTest(asked=asked):
                server = self.server()
                result = server.initialize(asked)["result"]
                self.assertEqual(result["protocolVersion"], answered)
                self.assertEqual(result["serverInfo"]["name"], "ferry")
                self.assertEqual("description" in result["serverInfo"], answered == "2025-11-25")
                self.assertIn("no tool for free-form commands", result["instructions"])
                self.assertEqual(server.close(), 0)

    def test_jobs_that_cannot_be_tools_are_left_out(self):
        jobs = os.path.join(self.tmp, "odd-jobs")
        os.mkdir(jobs)
        write_job(jobs, "fine", "print(1)\n")
        write_job(jobs, "picky", "print(1)\n", params='[params.target]\ntype = "string"')
        write_job(jobs, "has space", "print(1)\n")
        write_job(jobs, "shapeless", "print(1)\n", params='result_schema = "object"')
        write_job(jobs, "ferry_run_state", "print(1)\n")
        write_job(jobs, "detacher", "print(1)\n", params='[params.detach]\ntype = "bool"')
        server = RawServer(["--local", "--jobs", jobs, "--archive", self.archive], self.env)
        self.addCleanup(server.kill)
        server.initialize()
        server.request(1, "tools/list")
        names = [t["name"] for t in server.response(1)["result"]["tools"]]
        self.assertIn("fine", names)
        self.assertEqual([n for n in names if n in ("picky", "has space", "shapeless", "detacher")], [])
        self.assertEqual(names.count("ferry_run_state"), 1)  # ferry's own tool, not the job
        self.assertEqual(server.close(), 0)
        stderr = server.stderr_text()
        self.assertIn("job picky left out: it declares a parameter named 'target'", stderr)
        self.assertIn("job has space left out: its name is not a valid MCP tool name", stderr)
        self.assertIn("job shapeless left out:", stderr)
        self.assertIn("job ferry_run_state left out: ferry mcp has a tool of that name", stderr)
        self.assertIn("job detacher left out: it declares a parameter named 'detach'", stderr)
        self.assertIn("result_schema must be a table", stderr)

    def test_malformed_and_unknown(self):
        server = self.server()
        server.request(1, "ping")
        self.assertEqual(server.response(1)["result"], {})  # ping works before initialize
        server.request(2, "tools/list")
        self.assertIn("not initialized", self.error_of(server, 2, -32600))
        server.initialize()
        server.send_raw(b'{"jsonrpc": "2.0", "id": 3, "method": \n')
        self.assertIn("not valid JSON", self.error_of(server, None, -32700))
        server.send_raw(b'{"jsonrpc":"2.0","id":4,"method":"ping","params":{"x":"\xff\xfe"}}\n')
        self.assertIn("not valid JSON", self.error_of(server, None, -32700))
        server.send_raw(b"[" * 100_000 + b"]" * 100_000 + b"\n")
        self.assertIn("nests deeper", self.error_of(server, None, -32700))
        server.send([{"jsonrpc": "2.0", "id": 5, "method": "ping"}])
        self.assertIn("batches are not supported", self.error_of(server, None, -32600))
        server.send({"id": 6, "method": "ping"})
        self.assertIn('"jsonrpc": "2.0"', self.error_of(server, None, -32600))
        server.send({"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"})
        self.assertIn("string or an integer", self.error_of(server, None, -32600))
        server.send({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": [1, 2]})
        self.assertIn("must be an object", self.error_of(server, 7, -32602))
        server.request(8, "no/such/method")
        self.assertIn("Method not found: no/such/method", self.error_of(server, 8, -32601))
        server.send({"jsonrpc": "2.0", "method": "notifications/no_such_thing"})  # ignored
        server.send({"jsonrpc": "2.0", "id": 99, "result": {}})  # a response to nothing: ignored
        server.request("nine", "ping")
        self.assertEqual(server.response("nine")["result"], {})
        server.request(10, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                          "clientInfo": {"name": "x", "version": "1"}})
        self.assertIn("already initialized", self.error_of(server, 10, -32600))
        server.request(11, "logging/setLevel", {"level": "loud"})
        self.assertIn("one of debug", self.error_of(server, 11, -32602))
        server.request(12, "resources/read", {"uri": "ferry://runs/../../etc/passwd"})
        self.assertIn("no such resource", self.error_of(server, 12, -32002))
        server.request(13, "resources/read", {"uri": "ferry://runs/20260101T000000Z-00000000"})
        self.assertIn("no archived run", self.error_of(server, 13, -32002))
        server.request(14, "tools/call", {"name": "rm", "arguments": {}})
        self.assertIn("Unknown tool: rm", self.error_of(server, 14, -32602))
        server.request(15, "tools/call", {"name": "echo", "arguments": [1]})
        result = server.response(15)["result"]
        self.assertTrue(result["isError"])
        self.assertIn("arguments must be a JSON object", result["content"][0]["text"])
        self.assertEqual(server.close(), 0)

    def test_oversized_message_is_refused_and_the_server_goes_on(self):
        server = self.server()
        server.initialize()
        huge = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                           "params": {"name": "echo", "arguments": {"text": "x" * (5 << 20)}}})
        server.send_raw(huge.encode() + b"\n")
        self.assertIn("larger than", self.error_of(server, None, -32600))
        server.request(2, "ping")
        self.assertEqual(server.response(2)["result"], {})
        self.assertEqual(server.close(), 0)

    def test_ping_and_cancellation_while_a_call_runs(self):
        before = self.rows()
        server = self.server()
        server.initialize()
        server.request(5, "tools/call", {"name": "waiter", "arguments": {}})
        pid, run_dir = self.wait_ready(server)
        server.request(6, "ping")  # a running call must not hold up ping
        self.assertEqual(server.response(6)["result"], {})
        server.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                     "params": {"requestId": 5, "reason": "changed my mind"}})
        row = self.interrupted_row("waiter", before)
        self.assertEqual(row["error"], "interrupted; the job was stopped")
        self.assert_stopped(pid, run_dir)
        server.request(7, "ping")
        # Nothing answers the cancelled request: the next response is the ping's.
        self.assertEqual(server.response(7)["result"], {})
        server.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                     "params": {"requestId": 5}})  # already over: ignored
        server.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}})
        self.assertEqual(server.close(), 0)
        self.assertIn("cancelled by the client: changed my mind", server.stderr_text())

    def test_client_disappears_mid_call(self):
        before = self.rows()
        server = self.server()
        server.initialize()
        server.request(1, "tools/call", {"name": "waiter", "arguments": {}})
        pid, run_dir = self.wait_ready(server)
        server.proc.stdin.close()  # the client is gone: no input, nobody reading
        server.proc.stdout.close()
        self.assertEqual(server.proc.wait(30), 0)
        self.interrupted_row("waiter", before)
        self.assert_stopped(pid, run_dir)

    def test_requests_after_shutdown(self):
        before = self.rows()
        server = self.server()
        server.initialize()
        server.request(1, "tools/call", {"name": "stubborn", "arguments": {}})
        pid, run_dir = self.wait_ready(server)
        server.proc.send_signal(signal.SIGTERM)
        self.wait_stderr(server, "interrupted: stopping the running calls")
        server.request(2, "tools/list")
        self.assertIn("shutting down", self.error_of(server, 2, -32600))
        result = server.response(1)["result"]
        self.assertTrue(result["isError"])
        self.assertIn("local: interrupted", result["content"][0]["text"])
        server.proc.stdin.close()
        self.assertEqual(server.proc.wait(30), 130)
        self.interrupted_row("stubborn", before)
        self.assert_stopped(pid, run_dir)

    def wait_stderr(self, server: RawServer, text: str, timeout: float = 30):
        seen = b""
        deadline = time.monotonic() + timeout
        while text.encode() not in seen:
            left = deadline - time.monotonic()
            self.assertGreater(left, 0, f"ferry mcp never wrote {text!r}; stderr: {seen!r}")
            ready, _, _ = select.select([server.proc.stderr], [], [], left)
            if ready:
                chunk = os.read(server.proc.stderr.fileno(), 65536)
                self.assertTrue(chunk, f"stderr closed before {text!r}: {seen!r}")
                seen += chunk


if __name__ == "__main__":
    unittest.main()
