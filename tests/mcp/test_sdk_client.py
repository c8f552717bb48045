"""`ferry mcp` driven by the official MCP TypeScript SDK client (mcp_client.mjs): initialize,
the tool list checked against the jobs' metadata, kv_calc on the local target, a probe with
hostile string parameters on a real sshd under every test shell (byte-identical), a timeout, a
cancellation that leaves no process or run directory, bad arguments (the command line's
messages), a failing job, live output, resources, and the archive rows all of it leaves."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

from mcp_harness import (HERE, RawServer, archive_rows, ferry_bin, job_block, pid_alive,
                         run_client, wait_until, write_job, write_test_jobs)

sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from ferry_harness import HOSTILE  # noqa: E402
from sshd_fixture import SHELLS, SshServer  # noqa: E402

CLIENT = {"name": "ferry-mcp-test", "version": "1.2.3"}
READY = re.compile(r"ready pid=(\d+) dir=(\S+)")
RUN_TOOLS = ["ferry_run_state", "ferry_run_output", "ferry_run_result", "ferry_run_stop"]
SCHEMA_TYPES = {"int": "integer", "float": "number", "bool": "boolean", "string": "string",
                "list": "array"}


def run_ids(result: dict) -> list[str]:
    return [c["uri"].removeprefix("ferry://runs/") for c in result["content"]
            if c["type"] == "resource_link" and "/outputs/" not in c["uri"]]


def text_of(result: dict) -> str:
    return "".join(c["text"] for c in result["content"] if c["type"] == "text")


def expected_param_schema(param: dict) -> dict:
    """A parameter's JSON Schema as `ferry jobs NAME --json` describes it."""
    schema = {}
    if param["type"] != "json":
        schema["type"] = SCHEMA_TYPES[param["type"]]
    if param["type"] == "list":
        schema["items"] = {"type": SCHEMA_TYPES[param["items"]]}
        if param["choices"] is not None:
            schema["items"]["enum"] = param["choices"]
    elif param["choices"] is not None:
        schema["enum"] = param["choices"]
    if param["pattern"] is not None:
        (schema["items"] if param["type"] == "list" else schema)["pattern"] = f"^(?:{param['pattern']})$"
    if param["default"] is not None:
        schema["default"] = param["default"]
    description = param["help"]
    if param["type"] == "json":
        description = (description + " " if description else "") + "(any JSON value)"
    if description:
        schema["description"] = description
    return schema


class McpTestCase(unittest.TestCase):
    """A temp dir with the test jobs, an archive and a run base; self.client(steps) runs the SDK
    client against `ferry mcp` with self.target_args."""

    target_args: list[str] = ["--local"]

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="ferry-mcp-sdk-")
        cls.jobs = os.path.join(cls.tmp, "jobs")
        os.mkdir(cls.jobs)
        cls.job_paths = write_test_jobs(cls.jobs)
        cls.runs = os.path.join(cls.tmp, "runs")
        os.mkdir(cls.runs)
        cls.archive = os.path.join(cls.tmp, "archive.db")
        cls.env = {"TMPDIR": cls.runs, "XDG_CONFIG_HOME": os.path.join(cls.tmp, "config"),
                   "FERRY_JOBS_PATH": "", "FERRY_ARCHIVE": cls.archive}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def client(self, steps: list[dict]) -> dict:
        report = run_client(["mcp", *self.target_args, "--jobs", self.jobs,
                             "--archive", self.archive], steps, self.env)
        self.assertEqual(report["errors"], [], report["stderr"][-3000:])
        return report

    def ferry(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([ferry_bin(), "--jobs-dir", self.jobs, *args], capture_output=True,
                              env={**os.environ, **self.env}, text=True, timeout=120)

    def row(self, run_id: str) -> dict:
        rows = [r for r in archive_rows(self.archive) if r["run_id"] == run_id]
        self.assertEqual(len(rows), 1, f"run {run_id} archived {len(rows)} times")
        self.assertEqual(rows[0]["client"], CLIENT)
        return rows[0]

    def one_run(self, step: dict, status: str = "ok") -> tuple[dict, dict]:
        """The result of a call that ran once, and its archive row."""
        self.assertIn("result", step, step)
        result = step["result"]
        self.assertEqual(result["isError"], status != "ok", text_of(result))
        ids = run_ids(result)
        self.assertEqual(len(ids), 1, result)
        row = self.row(ids[0])
        self.assertEqual(row["status"], status, row)
        return result, row

    def assert_cancelled(self, report: dict, step: int, job: str, target: str):
        """The call was cancelled by the client, the run archived as interrupted, and nothing of
        the job is left: no process, no run directory."""
        call = report["steps"][step]
        self.assertIn("error", call, call)
        self.assertIn("the test cancels this call", call["error"]["message"])
        self.assertIn("resource", report["steps"][step + 1], report["steps"][step + 1])
        ready = [READY.search(log["data"]["line"]) for log in call["logs"]
                 if "line" in log.get("data", {})]
        ready = [m for m in ready if m]
        self.assertTrue(ready, call["logs"])
        pid, run_dir = int(ready[0].group(1)), ready[0].group(2)
        self.assertTrue(wait_until(lambda: not pid_alive(pid), 30), f"job process {pid} survives")
        self.assertFalse(os.path.exists(run_dir), f"{run_dir} left behind")
        row = self.row(report["steps"][step + 1]["resource"]["name"])
        self.assertEqual((row["job"], row["host_label"], row["status"], row["error"]),
                         (job, target, "interrupted", "interrupted; the job was stopped"))
        # A cancelled request gets no response: the SDK would have reported an unknown id.
        self.assertEqual(report["errors"], [])


class Local(McpTestCase):
    def test_initialize_and_tools_match_the_jobs(self):
        report = self.client([{"op": "listTools"}])
        self.assertEqual(report["protocolVersion"], "2025-11-25")  # the SDK asks for its latest
        self.assertEqual(report["serverVersion"]["name"], "ferry")
        self.assertIn("no tool for free-form commands", report["instructions"])
        self.assertEqual(set(report["capabilities"]), {"tools", "resources", "logging", "tasks"})
        self.assertEqual(report["capabilities"]["tasks"],
                         {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}})
        tools = {t["name"]: t for t in report["steps"][0]["result"]["tools"]}
        names = [json.loads(line)["name"] for line in self.ferry("jobs", "--json").stdout.splitlines()]
        self.assertIn("kv_calc", names)
        # One tool per job, and the tools for detached runs.
        self.assertEqual(sorted(tools), sorted(names + RUN_TOOLS))
        for name in RUN_TOOLS:
            self.assertNotIn("execution", tools[name])  # not offered as tasks
            self.assertEqual(tools.pop(name)["inputSchema"]["required"], ["run"])
        for name, tool in tools.items():
            with self.subTest(tool=name):
                self.assertEqual(tool["execution"], {"taskSupport": "optional"})
                meta = json.loads(self.ferry("jobs", name, "--json").stdout)
                properties = {p["name"]: expected_param_schema(p) for p in meta["params"]}
                properties["target"] = {
                    "anyOf": [{"type": "string", "enum": ["local", "all"]},
                              {"type": "array", "items": {"type": "string", "enum": ["local"]},
                               "minItems": 1, "uniqueItems": True}],
                    "default": "local",
                    "description": tool["inputSchema"]["properties"]["target"]["description"]}
                properties["detach"] = {
                    "type": "boolean", "default": False,
                    "description": tool["inputSchema"]["properties"]["detach"]["description"]}
                self.assertIn("ferry_run_result", properties["detach"]["description"])
                expected = {"type": "object", "properties": properties,
                            "additionalProperties": False}
                required = [p["name"] for p in meta["params"] if p["required"] and p["default"] is None]
                if required:
                    expected["required"] = required
                self.assertEqual(tool["inputSchema"], expected)
                self.assertTrue(tool["description"].startswith(meta["description"]))
                for param in meta["params"]:
                    self.assertIn(f"- {param['name']} (", tool["description"])
                if name in self.job_paths and "result_schema" in job_block(self.job_paths[name]):
                    declared = job_block(self.job_paths[name])["result_schema"]
                    runs = tool["outputSchema"]["properties"]["runs"]["items"]
                    self.assertEqual(runs["properties"]["result"], declared)
                else:
                    self.assertNotIn("outputSchema", tool)
        self.assertIn("outputSchema", tools["echo"])

    def test_kv_calc_locally_matches_the_command_line(self):
        args = {"model": "qwen3.5-397b-a17b", "tp": 8, "kv_memory_gib": 17.4}
        report = self.client([{"op": "call", "name": "kv_calc", "arguments": args, "progress": True},
                              {"op": "readResource", "fromStep": 0}])
        result, row = self.one_run(report["steps"][0])
        self.assertIn("local: ok (exit 0", text_of(result))
        cli = self.ferry("run", "kv_calc", "--local", "--no-archive", "--json",
                         *[f"-p{k}={v}" for k, v in args.items()])
        self.assertEqual(cli.returncode, 0, cli.stderr)
        expected = json.loads(cli.stdout)
        self.assertEqual(row["params"], expected["params"])
        self.assertEqual(row["result"], expected["result"])
        self.assertEqual(row["job_sha256"], expected["job_sha256"])
        self.assertIn("result: " + json.dumps(expected["result"], separators=(",", ":"))[:40],
                      text_of(result))
        progress = report["steps"][0]["progress"]
        self.assertGreaterEqual(len(progress), 1, progress)  # started (the response ends it)
        self.assertEqual(progress[0]["message"], "local: kv_calc started")
        values = [p["progress"] for p in progress]
        self.assertEqual(values, sorted(set(values)))  # strictly increasing
        resource = json.loads(report["steps"][1]["result"]["contents"][0]["text"])
        self.assertEqual(resource["run_id"], row["run_id"])
        self.assertEqual(resource["result"], expected["result"])
        self.assertEqual(resource["client"], CLIENT)
        self.assertEqual(os.listdir(self.runs), [])

    def test_structured_result_and_targets(self):
        args = {"text": "hello", "items": ["a", "b"], "blob": {"k": [1, None]}}
        report = self.client([
            {"op": "call", "name": "echo", "arguments": args},
            {"op": "call", "name": "echo", "arguments": {**args, "target": "all"}},
            {"op": "call", "name": "echo", "arguments": {**args, "target": "local"}},
        ])
        for step in report["steps"]:
            result, row = self.one_run(step)
            (run,) = result["structuredContent"]["runs"]
            self.assertEqual((run["target"], run["status"], run["exit_code"], run["run_id"]),
                             ("local", "ok", 0, row["run_id"]))
            self.assertEqual(run["result"]["params"]["text"], "hello")
            self.assertEqual(run["result"]["params"]["blob"], {"k": [1, None]})
            self.assertEqual(row["params"], run["result"]["params"])

    def test_a_call_may_name_a_list_of_targets(self):
        """`target` as a list runs on those targets only, in the server's order; a closed port on
        127.0.0.1 is the second target, so no sshd is needed (issue 42.11)."""
        down = "127.0.0.1:9"
        args = ["mcp", "--host", down, "--local", "--ssh-config", "none", "--retries", "0",
                "--known-hosts", os.path.join(self.tmp, "known_hosts"), "--jobs", self.jobs,
                "--archive", self.archive]
        calls = [["local"], ["local", down], [], ["local", "local"], ["gpu9"], [1]]
        report = run_client(args, [{"op": "call", "name": "echo",
                                    "arguments": {"text": "x", "target": t}} for t in calls],
                            self.env)
        self.assertEqual(report["errors"], [], report["stderr"][-3000:])
        only_local, both = report["steps"][0]["result"], report["steps"][1]["result"]
        self.assertEqual([r["target"] for r in only_local["structuredContent"]["runs"]], ["local"])
        self.assertFalse(only_local["isError"], text_of(only_local))
        runs = both["structuredContent"]["runs"]
        self.assertEqual([(r["target"], r["status"]) for r in runs], [(down, "error"), ("local", "ok")])
        self.assertTrue(both["isError"])
        refusals = [text_of(step["result"]) for step in report["steps"][2:]]
        self.assertEqual(refusals, [
            f"echo: argument 'target' is an empty list; name at least one of {down}, local",
            "echo: argument 'target' lists \"local\" twice",
            f"echo: argument 'target' lists \"gpu9\", which is not a target; the targets are {down}, local",
            f"echo: argument 'target' lists 1, which is not a target; the targets are {down}, local",
        ])

    def test_fetched_files_are_resources_with_their_local_paths_not_dropped_in_the_cwd(self):
        """A job's `outputs` come back as resource links (text, or base64 for other bytes), the
        tool result names where they were saved, and nothing lands in the directory the client
        started the server in (issue 42.11)."""
        client_cwd = tempfile.mkdtemp(prefix="ferry-mcp-cwd-", dir=self.tmp)
        args = ["mcp", "--local", "--jobs", self.jobs, "--archive", self.archive]
        report = run_client(args, [
            {"op": "call", "name": "writer", "arguments": {}},
            {"op": "readResource", "fromStep": 0, "match": "/outputs/out/report.txt"},
            {"op": "readResource", "fromStep": 0, "match": "/outputs/out/blob%20bin.dat"},
        ], self.env, cwd=client_cwd)
        self.assertEqual(report["errors"], [], report["stderr"][-3000:])
        result, row = self.one_run(report["steps"][0])
        saved = os.path.join(os.path.dirname(self.archive), "outputs", row["run_id"])
        for line in (f"fetched files, saved under {saved}:\n", "\n  out/blob bin.dat (256 bytes)\n",
                     "\n  out/report.txt (19 bytes)\n"):
            self.assertIn(line, text_of(result))
        links = {c["name"]: c for c in result["content"] if c["type"] == "resource_link"}
        self.assertEqual(links["out/report.txt"]["uri"],
                         f"ferry://runs/{row['run_id']}/outputs/out/report.txt")
        self.assertIn(f"on this machine at {saved}/out/report.txt", links["out/report.txt"]["description"])
        self.assertEqual(links["out/blob bin.dat"]["size"], 256)
        text = report["steps"][1]["result"]["contents"][0]
        self.assertEqual((text["mimeType"], text["text"]), ("text/plain", "hello from the run\n"))
        blob = report["steps"][2]["result"]["contents"][0]
        self.assertEqual(blob["mimeType"], "application/octet-stream")
        self.assertEqual(base64.b64decode(blob["blob"]), bytes(range(256)))
        with open(os.path.join(saved, "out", "report.txt")) as f:
            self.assertEqual(f.read(), "hello from the run\n")
        self.assertEqual(os.listdir(client_cwd), [])

    def test_the_tools_do_not_depend_on_the_clients_working_directory(self):
        client_cwd = tempfile.mkdtemp(prefix="ferry-mcp-cwd-", dir=self.tmp)
        os.mkdir(os.path.join(client_cwd, "jobs"))
        write_job(os.path.join(client_cwd, "jobs"), "from_the_cwd", "print(1)\n")
        report = run_client(["mcp", "--local", "--jobs", self.jobs, "--archive", self.archive],
                            [{"op": "listTools"}], self.env, cwd=client_cwd)
        names = {t["name"] for t in report["steps"][0]["result"]["tools"]}
        self.assertIn("echo", names)
        self.assertNotIn("from_the_cwd", names)
        # --jobs naming it (relative to where the server starts) is the way to serve it.
        report = run_client(["mcp", "--local", "--jobs", "jobs", "--archive", self.archive],
                            [{"op": "listTools"}], self.env, cwd=client_cwd)
        self.assertIn("from_the_cwd", {t["name"] for t in report["steps"][0]["result"]["tools"]})

    def test_bad_arguments_give_the_command_line_messages(self):
        before = len(archive_rows(self.archive)) if os.path.exists(self.archive) else 0
        cases = [{"text": 5}, {}, {"text": "x", "bogus": 1}, {"text": "x", "mode": "medium"},
                 {"text": "x", "flags": [4]}, {"text": "x", "count": 1.5}]
        report = self.client([{"op": "call", "name": "echo", "arguments": a} for a in cases]
                             + [{"op": "call", "name": "echo",
                                 "arguments": {"text": "x", "target": "gpu9"}}])
        params_file = os.path.join(self.tmp, "params.json")
        for arguments, step in zip(cases, report["steps"]):
            with self.subTest(arguments=arguments):
                with open(params_file, "w") as f:
                    json.dump(arguments, f)
                cli = self.ferry("run", "echo", "--local", "--params", params_file)
                self.assertEqual(cli.returncode, 2, cli.stderr)
                message = cli.stderr.strip().removeprefix("ferry: error: ")
                self.assertTrue(step["result"]["isError"])
                self.assertEqual(text_of(step["result"]),
                                 message.replace(f"--params {params_file}", "arguments"))
        last = report["steps"][-1]["result"]
        self.assertTrue(last["isError"])
        self.assertEqual(text_of(last), "echo: argument 'target' must be one of local, all or a "
                                        "list of targets, not \"gpu9\"")
        after = len(archive_rows(self.archive)) if os.path.exists(self.archive) else 0
        self.assertEqual(after, before)  # refused before anything ran: nothing archived

    def test_a_client_cannot_name_a_program_for_host_facts_to_run(self):
        """host_facts runs each of its `interpreters` as `PROGRAM --version`: a client may name
        only the job's allow-list, never a path or a program of its choosing (issue 45.4)."""
        mark = os.path.join(self.tmp, "evil-ran")
        evil = os.path.join(self.tmp, "evil")
        with open(evil, "w") as f:
            f.write(f"#!/bin/sh\ntouch {mark}\necho 'evil 6.6.6'\n")
        os.chmod(evil, 0o755)
        before = len(archive_rows(self.archive)) if os.path.exists(self.archive) else 0
        names = [evil, "../x", "evilprog", "-c"]
        report = self.client([{"op": "call", "name": "host_facts",
                               "arguments": {"interpreters": ["sh", name]}} for name in names])
        for name, step in zip(names, report["steps"]):
            with self.subTest(program=name):
                self.assertTrue(step["result"]["isError"], step)
                self.assertEqual(
                    text_of(step["result"]),
                    f"host_facts: parameter 'interpreters' names programs to run on the host, "
                    f"and {json.dumps(name)} is not one the job allows; allowed: "
                    + json.dumps(self.allowed_interpreters(), separators=(",", ":")))
        self.assertFalse(os.path.exists(mark), "a client-named program ran")
        after = len(archive_rows(self.archive)) if os.path.exists(self.archive) else 0
        self.assertEqual(after, before)  # refused before anything ran
        tools = {t["name"]: t for t in self.client([{"op": "listTools"}])["steps"][0]["result"]["tools"]}
        schema = tools["host_facts"]["inputSchema"]["properties"]["interpreters"]
        self.assertEqual(schema["items"]["enum"], self.allowed_interpreters())

    def allowed_interpreters(self) -> list[str]:
        meta = json.loads(self.ferry("jobs", "host_facts", "--json").stdout)
        (param,) = [p for p in meta["params"] if p["name"] == "interpreters"]
        self.assertTrue(param["program"])
        self.assertIn("python3", param["choices"])
        return param["choices"]

    def test_control_bytes_never_reach_the_client_as_text(self):
        """The tool result's text, the live log lines and a resource's text show a job's control,
        C1 and bidi characters escaped; the structured result would carry them as data."""
        report = self.client([{"op": "setLevel", "level": "info"},
                              {"op": "call", "name": "painter", "arguments": {}},
                              {"op": "readResource", "fromStep": 1}])
        result, row = self.one_run(report["steps"][1], "failed")
        record = json.loads(report["steps"][2]["result"]["contents"][0]["text"])
        self.assertIn("\x1b]52;c;ZXZpbA==\x07", record["stdout"])  # archived as it came
        texts = [text_of(result)]
        texts += [log["data"]["line"] for log in report["steps"][1]["logs"] if "line" in log["data"]]
        texts += [c["text"] for c in report["steps"][2]["result"]["contents"]]
        self.assertGreaterEqual(len(texts), 4, report["steps"][1])
        for text in texts:
            self.assertIn("evil", text)
            self.assertNotRegex(text, "[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
        self.assertIn("stdout:\n\\x1b]52;c;ZXZpbA==", texts[0])

    def test_detached_call_returns_the_run_id_and_the_run_tools_follow_it(self):
        """detach: true answers while the job still runs; the run tools give its state and its
        output so far, and its result once it ends, collected as `ferry attach` collects it:
        archived as a normal call's run, its run directory removed (issue 44.4)."""
        gate = os.path.join(self.tmp, "gate-result")
        run = {"runFromStep": 1}
        report = self.client([
            {"op": "listTools"},  # the SDK checks structuredContent against the outputSchema
            {"op": "call", "name": "gated", "arguments": {"gate": gate, "detach": True}},
            {"op": "call", "name": "ferry_run_state", "arguments": {}, **run},
            {"op": "call", "name": "ferry_run_output", "arguments": {}, **run,
             "untilText": "waiting for the gate", "tries": 50},
            {"op": "call", "name": "ferry_run_result", "arguments": {}, **run},
            {"op": "run", "argv": ["touch", gate]},
            {"op": "call", "name": "ferry_run_result", "arguments": {"wait_s": 30}, **run},
            {"op": "call", "name": "ferry_run_state", "arguments": {}, **run},
        ])
        started = report["steps"][1]["result"]
        self.assertFalse(started["isError"], text_of(started))
        (run_info,) = started["structuredContent"]["runs"]
        run_id = run_info["run_id"]
        self.assertEqual((run_info["target"], run_info["status"], run_info["exit_code"]),
                         ("local", "running", None))
        self.assertIn(f"local: running (detached), run {run_id}", text_of(started))
        # The launcher's `detached PID` line is not the job's output: no live line for it.
        self.assertEqual(report["steps"][1]["logs"], [])
        state = report["steps"][2]["result"]
        self.assertEqual((state["structuredContent"]["state"], state["structuredContent"]["job"]),
                         ("running", "gated"))
        self.assertIn(f"run {run_id} (gated on local", text_of(state))
        output = report["steps"][3]["result"]
        self.assertEqual(output["structuredContent"]["state"], "running")
        self.assertIn("stdout:\nwaiting for the gate\n", text_of(output))
        self.assertNotIn("through the gate", text_of(output))
        early = report["steps"][4]["result"]
        self.assertFalse(early["isError"], text_of(early))
        self.assertEqual(early["structuredContent"], {"run_id": run_id, "state": "running"})
        self.assertIn("still running", text_of(early))
        # Collected: the result as the job call would have given it, and archived so.
        result, row = self.one_run(report["steps"][6])
        self.assertEqual(run_ids(result), [run_id])
        self.assertIn("local: ok (exit 0", text_of(result))
        self.assertEqual(result["structuredContent"]["runs"][0]["result"], {"opened": True})
        self.assertEqual(row["result"], {"opened": True})
        self.assertIn("stdout:\nwaiting for the gate\nthrough the gate\n", text_of(result))
        log = self.ferry("log", "--json")
        self.assertIn(run_id, log.stdout, log.stderr)
        self.assertTrue(report["steps"][7]["result"]["isError"])
        self.assertIn(f"no detached run '{run_id}'", text_of(report["steps"][7]["result"]))
        self.assertEqual(self.ferry("ps", "--json").stdout.count(run_id), 0)
        self.assertEqual(os.listdir(self.runs), [])

    def test_detached_run_stopped_and_bad_run_arguments(self):
        """ferry_run_stop stops a detached run as `ferry stop` does: the job's process ends, the
        run is archived as interrupted, its run directory removed."""
        report = self.client([
            {"op": "call", "name": "waiter", "arguments": {"detach": True}},
            {"op": "call", "name": "ferry_run_output", "arguments": {}, "runFromStep": 0,
             "untilText": "ready pid=", "tries": 50},
            {"op": "call", "name": "ferry_run_stop", "arguments": {}, "runFromStep": 0},
            {"op": "call", "name": "echo", "arguments": {"text": "x", "detach": 1}},
            {"op": "call", "name": "ferry_run_state", "arguments": {}},
            {"op": "call", "name": "ferry_run_result", "arguments": {"run": "x", "wait_s": -1}},
            {"op": "call", "name": "ferry_run_state", "arguments": {"run": "nosuchrun"}},
        ])
        ready = READY.search(text_of(report["steps"][1]["result"]))
        self.assertIsNotNone(ready, report["steps"][1])
        result, row = self.one_run(report["steps"][2], "interrupted")
        self.assertEqual(row["job"], "waiter")
        self.assertIn("stopped by `ferry stop`", row["error"])
        self.assertIn("stdout:\nready pid=", text_of(result))
        self.assertTrue(wait_until(lambda: not pid_alive(int(ready.group(1))), 30), ready.group(0))
        self.assertFalse(os.path.exists(ready.group(2)), ready.group(2))
        refusals = [text_of(step["result"]) for step in report["steps"][3:]]
        self.assertEqual(refusals[:3], [
            "echo: argument 'detach' must be true or false, not 1",
            "ferry_run_state: argument 'run' is required: the run id a call with detach: true "
            "returned, a unique prefix of it, or \"last\"",
            "ferry_run_result: argument 'wait_s' must be a whole number of seconds from 0 to "
            "600, not -1"])
        self.assertIn("no detached run 'nosuchrun'", refusals[3])
        self.assertTrue(all(step["result"]["isError"] for step in report["steps"][3:]))
        self.assertEqual(os.listdir(self.runs), [])

    def test_job_called_as_a_task_is_a_detached_run(self):
        """A job tool called as an MCP task (the SDK's experimental tasks API) answers at once
        with a task that is its detached run: tasks/get says working, tasks/result waits for it
        and returns the job's result, collected as ferry_run_result collects it; tasks/cancel of
        a second task stops its run, archived as interrupted (issue 44.4)."""
        gate = os.path.join(self.tmp, "gate-task")
        report = self.client([
            {"op": "listTools"},
            {"op": "callTask", "name": "gated", "arguments": {"gate": gate}},
            {"op": "getTask", "taskFromStep": 1},
            {"op": "callTask", "name": "waiter", "arguments": {}},
            {"op": "call", "name": "ferry_run_output", "arguments": {}, "taskFromStep": 3,
             "untilText": "ready pid=", "tries": 50},
            {"op": "cancelTask", "taskFromStep": 3},
            {"op": "listTasks"},
            {"op": "run", "argv": ["touch", gate]},
            {"op": "taskResult", "taskFromStep": 1},
            {"op": "getTask", "taskFromStep": 1},
            {"op": "getTask", "taskFromStep": 3},
            {"op": "taskResult", "taskFromStep": 3},
            {"op": "cancelTask", "taskFromStep": 1},
            {"op": "callTask", "name": "ferry_run_state", "arguments": {"run": "last"}},
        ])
        steps = report["steps"]
        task = steps[1]["result"]["task"]
        self.assertEqual(task["status"], "working", steps[1])
        self.assertEqual(steps[2]["result"]["status"], "working", steps[2])
        self.assertEqual(steps[2]["result"]["taskId"], task["taskId"])
        # The task is the run: its id is the run's, archived under it once collected.
        result, row = self.one_run(steps[8])
        self.assertEqual(run_ids(result), [task["taskId"]])
        self.assertEqual(result["structuredContent"]["runs"][0]["result"], {"opened": True})
        self.assertEqual(row["result"], {"opened": True})
        self.assertIn("stdout:\nwaiting for the gate\nthrough the gate\n", text_of(result))
        self.assertEqual(result["_meta"]["io.modelcontextprotocol/related-task"],
                         {"taskId": task["taskId"]})
        self.assertEqual(steps[9]["result"]["status"], "completed", steps[9])
        # The second task, cancelled: its job's process stopped, its run archived interrupted.
        ready = READY.search(text_of(steps[4]["result"]))
        self.assertIsNotNone(ready, steps[4])
        cancelled = steps[3]["result"]["task"]["taskId"]
        self.assertEqual(steps[5]["result"]["status"], "cancelled", steps[5])
        self.assertEqual(steps[10]["result"]["status"], "cancelled", steps[10])
        stopped, row = self.one_run(steps[11], "interrupted")
        self.assertEqual(run_ids(stopped), [cancelled])
        self.assertEqual(row["job"], "waiter")
        self.assertTrue(wait_until(lambda: not pid_alive(int(ready.group(1))), 30), ready.group(0))
        listed = {t["taskId"]: t["status"] for t in steps[6]["result"]["tasks"]}
        self.assertEqual(listed, {task["taskId"]: "working", cancelled: "cancelled"})
        # An ended task cannot be cancelled; the run tools are not tasks.
        self.assertIn("has ended already (completed)", steps[12]["error"]["message"])
        self.assertIn("not offered as a task", steps[13]["error"]["message"])
        self.assertEqual(os.listdir(self.runs), [])

    def test_a_task_an_earlier_server_started_is_taken_up_and_its_end_is_notified(self):
        """A client that comes back to a new `ferry mcp` with the taskId of a task the previous
        one started: tasks/get and tasks/result reach its detached run (found in the archive),
        tasks/list lists it from then on, and the server tells the client when the task's
        status changes (notifications/tasks/status); an id that is no detached run is refused
        with -32602; ferry_run_result asked again answers from the archive."""
        gate = os.path.join(self.tmp, "gate-adopted")
        first = self.client([{"op": "callTask", "name": "gated", "arguments": {"gate": gate}}])
        task = first["steps"][0]["result"]["task"]
        self.assertEqual(task["status"], "working", first["steps"][0])
        with open(gate, "w"):
            pass
        report = self.client([
            {"op": "getTask", "taskId": task["taskId"], "untilStatus": "completed", "tries": 60},
            {"op": "taskResult", "taskId": task["taskId"]},
            {"op": "listTasks"},
            {"op": "getTask", "taskId": "20200101T000000Z-00000000"},
            {"op": "call", "name": "ferry_run_result", "arguments": {"run": task["taskId"]}},
        ])
        steps = report["steps"]
        self.assertEqual(steps[0]["result"]["status"], "completed", steps[0])
        self.assertEqual(steps[0]["result"]["createdAt"], self.row_started(task["taskId"]))
        result, row = self.one_run(steps[1])
        self.assertEqual(run_ids(result), [task["taskId"]])
        self.assertEqual(row["result"], {"opened": True})
        self.assertEqual([t["taskId"] for t in steps[2]["result"]["tasks"]], [task["taskId"]])
        self.assertIn("neither a task it started nor a detached run", steps[3]["error"]["message"])
        # Asked again once collected: the same answer, from the archive.
        self.assertEqual(steps[4]["result"], {k: v for k, v in result.items() if k != "_meta"})
        told = [m["params"] for m in report["received"]
                if m.get("method") == "notifications/tasks/status"]
        self.assertEqual([(t["taskId"], t["status"]) for t in told],
                         [(task["taskId"], "completed")], told)
        self.assertEqual(set(told[0]), set(steps[0]["result"]), told[0])

    def test_a_task_collected_by_ferry_run_result_ends_as_its_run_did(self):
        """A task's run collected by the run tool rather than tasks/result: the task ends as
        its run did (tasks/get, tasks/result answer from the archive), and the change is told."""
        gate = os.path.join(self.tmp, "gate-open")
        with open(gate, "w"):
            pass
        report = self.client([
            {"op": "callTask", "name": "gated", "arguments": {"gate": gate}},
            {"op": "call", "name": "ferry_run_result", "arguments": {"wait_s": 60},
             "taskFromStep": 0},
            {"op": "getTask", "taskFromStep": 0},
            {"op": "taskResult", "taskFromStep": 0},
        ])
        steps = report["steps"]
        task = steps[0]["result"]["task"]["taskId"]
        result, _ = self.one_run(steps[1])
        self.assertEqual(run_ids(result), [task])
        self.assertEqual(steps[2]["result"]["status"], "completed", steps[2])
        self.assertEqual(run_ids(steps[3]["result"]), [task])
        received = report["received"]
        told = [(i, m["params"]["taskId"], m["params"]["status"]) for i, m in enumerate(received)
                if m.get("method") == "notifications/tasks/status"]
        self.assertEqual([t[1:] for t in told], [(task, "completed")])
        # Told as the run tool collected it, before its answer (not when tasks/get found out).
        answered = next(i for i, m in enumerate(received)
                        if "structuredContent" in m.get("result", {}))
        self.assertLess(told[0][0], answered)

    def row_started(self, run_id: str) -> str:
        return self.row(run_id)["started_at"]

    def test_failing_job(self):
        report = self.client([{"op": "call", "name": "boom", "arguments": {}}])
        result, row = self.one_run(report["steps"][0], "failed")
        text = text_of(result)
        self.assertIn("local: failed (exit 3", text)
        self.assertIn("error: the job exited with status 3: boom: the disk is on fire", text)
        self.assertIn("stdout:\nabout to fail\n", text)
        self.assertEqual(row["exit_code"], 3)

    def test_timeout(self):
        report = self.client([{"op": "call", "name": "sleepy", "arguments": {}}])
        result, row = self.one_run(report["steps"][0], "timeout")
        self.assertIn("local: timeout", text_of(result))
        self.assertIn("ran past its 1 s timeout", text_of(result))
        self.assertEqual(os.listdir(self.runs), [])

    def test_cancellation_leaves_nothing(self):
        report = self.client([
            {"op": "call", "name": "waiter", "arguments": {}, "progress": True,
             "cancelOnLine": "ready pid="},
            {"op": "waitRun", "job": "waiter", "target": "local", "status": "interrupted"},
            # The SDK's own request timeout cancels the same way.
            {"op": "call", "name": "waiter", "arguments": {}, "timeoutMs": 3000},
            {"op": "waitRun", "job": "waiter", "target": "local", "status": "interrupted"},
            {"op": "ping"},
        ])
        self.assert_cancelled(report, 0, "waiter", "local")
        self.assertIn("Request timed out", report["steps"][2]["error"]["message"])
        self.assertIn("cancelled by the client", report["stderr"])
        self.assertTrue(wait_until(lambda: os.listdir(self.runs) == [], 30), os.listdir(self.runs))

    def test_live_output_is_rate_limited_and_follows_the_log_level(self):
        report = self.client([
            {"op": "setLevel", "level": "info"},
            {"op": "call", "name": "chatty", "arguments": {}, "progress": True},
            {"op": "setLevel", "level": "warning"},
            {"op": "call", "name": "chatty", "arguments": {}},
        ])
        logs = report["steps"][1]["logs"]
        lines = [log["data"]["line"] for log in logs if "line" in log["data"]]
        skipped = sum(log["data"].get("skipped_lines", 0) for log in logs)
        self.assertTrue(all(log["level"] == "info" and log["logger"] == "ferry" for log in logs))
        self.assertEqual(lines[0], "line 0")
        self.assertLess(len(lines), 400)  # 400 lines at once go over the rate
        self.assertEqual(len(lines) + skipped, 400)
        self.assertEqual(report["steps"][3]["logs"], [])
        self.one_run(report["steps"][3])

    def test_config_file_env_and_options_apply_as_for_run(self):
        """The config file's [hosts.local] env.PATH finds a fake nvidia-smi, its variables and
        --env/--interpreter reach the job: the MCP calls and `ferry run` give the same results."""
        config = os.path.join(self.tmp, "config-env")
        os.makedirs(os.path.join(config, "ferry"), exist_ok=True)
        fake_bin = os.path.abspath(os.path.join(HERE, "..", "jobs", "fake-bin"))
        with open(os.path.join(config, "ferry", "config.toml"), "w") as f:
            f.write(f'[hosts.local]\nenv.PATH = "{fake_bin}:/usr/bin:/bin"\n'
                    'env.FAKE_NVIDIA_SMI = "h100x1"\nenv.GREETING = "from the config"\n')
        python3 = shutil.which("python3")
        self.assertIsNotNone(python3)
        options = ["--env", "TOKEN", "--interpreter", f"python3={python3}"]
        env = {**self.env, "XDG_CONFIG_HOME": config, "TOKEN": "t0ken"}
        report = run_client(["mcp", "--local", "--jobs", self.jobs, "--archive", self.archive,
                             *options], [{"op": "call", "name": "gpu_probe", "arguments": {}},
                                         {"op": "call", "name": "environ", "arguments": {}}], env)
        self.assertEqual(report["errors"], [], report["stderr"][-3000:])
        for step, job in zip(report["steps"], ("gpu_probe", "environ")):
            with self.subTest(job=job):
                result, row = self.one_run(step)
                cli = subprocess.run([ferry_bin(), "--jobs-dir", self.jobs, "run", job, "--local",
                                      "--no-archive", "--json", *options], capture_output=True,
                                     env={**os.environ, **env}, text=True, timeout=120)
                self.assertEqual(cli.returncode, 0, cli.stderr)
                expected = json.loads(cli.stdout)
                self.assertEqual(row["result"], expected["result"])
                self.assertEqual((row["interpreter"], row["env"]),
                                 (expected["interpreter"], expected["env"]))
        gpus = self.row(run_ids(report["steps"][0]["result"])[0])["result"]["gpus"]
        self.assertEqual([g["name"] for g in gpus], ["NVIDIA H100 80GB HBM3"])
        seen = self.row(run_ids(report["steps"][1]["result"])[0])["result"]
        self.assertEqual(seen["env"], {"GREETING": "from the config", "TOKEN": "t0ken"})
        self.assertEqual(seen["nvidia_smi"], os.path.join(fake_bin, "nvidia-smi"))

    def test_resources_list_the_archived_runs(self):
        report = self.client([
            {"op": "call", "name": "echo", "arguments": {"text": "for the resource"}},
            {"op": "listResources"},
            {"op": "readResource", "fromStep": 0},
        ])
        _, row = self.one_run(report["steps"][0])
        uris = [r["uri"] for r in report["steps"][1]["result"]["resources"]]
        self.assertIn(f"ferry://runs/{row['run_id']}", uris)
        content = report["steps"][2]["result"]["contents"][0]
        self.assertEqual(content["mimeType"], "application/json")
        record = json.loads(content["text"])
        self.assertEqual(record["params"]["text"], "for the resource")
        self.assertEqual(record["stdout"], "echoed 8 params\n")


class OverSsh(McpTestCase):
    """Targets: the test sshd's user under every shell, and this machine."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.srv = SshServer(sftp="internal").start()
        cls.target_args = ["--ssh-config", cls.srv.ssh_config, "--local"]
        for shell in SHELLS:
            cls.target_args += ["--host", cls.srv.alias(shell)]

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        super().tearDownClass()

    def test_hostile_parameters_are_byte_identical_under_every_shell(self):
        args = {"text": "\n".join(HOSTILE[:-1]), "items": HOSTILE, "blob": {"nested": HOSTILE[:6]}}
        steps = [{"op": "call", "name": "echo", "arguments": {**args, "target": self.srv.alias(s)}}
                 for s in SHELLS]
        steps.append({"op": "call", "name": "echo", "arguments": {**args, "target": "all"}})
        steps.append({"op": "call", "name": "host_facts", "arguments": {"target": self.srv.alias("zsh")}})
        report = self.client(steps)
        for shell, step in zip(SHELLS, report["steps"]):
            with self.subTest(shell=shell):
                result, row = self.one_run(step)
                (run,) = result["structuredContent"]["runs"]
                self.assertEqual(run["target"], self.srv.alias(shell))
                for key, value in args.items():
                    self.assertEqual(run["result"]["params"][key], value)
                    self.assertEqual(row["params"][key], value)
                self.assertEqual(row["target"]["host"], self.srv.alias(shell))
        everywhere = report["steps"][len(SHELLS)]["result"]
        self.assertFalse(everywhere["isError"], text_of(everywhere))
        runs = everywhere["structuredContent"]["runs"]
        self.assertEqual([r["target"] for r in runs],
                         [self.srv.alias(s) for s in SHELLS] + ["local"])
        for run in runs:
            self.assertEqual(run["result"]["params"]["items"], HOSTILE)
            self.assertEqual(self.row(run["run_id"])["status"], "ok")
        facts, _ = self.one_run(report["steps"][-1])
        self.assertIn("ok (exit 0", text_of(facts))

    def test_one_session_per_host_reused_and_reconnected(self):
        user = self.srv.user("dash")
        before = self.srv.count_accepted(user)
        target = {"target": self.srv.alias("dash")}
        kill = ("import sys; sys.path.insert(0, sys.argv[1]); from sshd_fixture import SshServer; "
                "SshServer.kill_user_processes(sys.argv[2])")
        report = self.client([
            {"op": "call", "name": "echo", "arguments": {"text": "1", **target}},
            {"op": "call", "name": "echo", "arguments": {"text": "2", **target}},
            {"op": "run", "argv": [sys.executable, "-c", kill,
                                   os.path.join(HERE, "..", "integration"), user]},
            {"op": "call", "name": "echo", "arguments": {"text": "3", **target}},
        ])
        self.one_run(report["steps"][0])
        self.one_run(report["steps"][1])
        self.one_run(report["steps"][3])  # the session died while idle: a new one ran it
        self.assertEqual(self.srv.count_accepted(user) - before, 2)

    def test_cancellation_over_ssh_leaves_nothing(self):
        steps = []
        for shell in SHELLS:
            steps.append({"op": "call", "name": "waiter", "arguments": {"target": self.srv.alias(shell)},
                          "cancelOnLine": "ready pid="})
            steps.append({"op": "waitRun", "job": "waiter", "target": self.srv.alias(shell),
                          "status": "interrupted"})
        report = self.client(steps)
        for i, shell in enumerate(SHELLS):
            with self.subTest(shell=shell):
                self.assert_cancelled(report, 2 * i, "waiter", self.srv.alias(shell))
                self.assertEqual(SshServer.run_dirs(self.srv.user(shell)), [])

    def test_detached_run_over_ssh_outlives_its_server_and_is_stopped(self):
        """A run detached on an SSH target goes on after the server that started it exits; the
        next server's run tools find it on its host and stop it, leaving nothing there."""
        target = {"target": self.srv.alias("bash")}
        started = self.client([{"op": "call", "name": "waiter", "arguments": {**target, "detach": True}}])
        (run,) = started["steps"][0]["result"]["structuredContent"]["runs"]
        self.assertEqual(run["status"], "running", started["steps"][0])
        report = self.client([
            {"op": "call", "name": "ferry_run_output", "arguments": {"run": run["run_id"]},
             "untilText": "ready pid=", "tries": 50},
            {"op": "call", "name": "ferry_run_state", "arguments": {"run": run["run_id"][-8:]}},
            {"op": "call", "name": "ferry_run_stop", "arguments": {"run": run["run_id"]}},
        ])
        self.assertIn("ready pid=", text_of(report["steps"][0]["result"]))
        self.assertEqual(report["steps"][1]["result"]["structuredContent"]["state"], "running")
        _, row = self.one_run(report["steps"][2], "interrupted")
        self.assertEqual(row["host_label"], self.srv.alias("bash"))
        self.assertEqual(SshServer.run_dirs(self.srv.user("bash")), [])

    def test_client_disappears_mid_call_over_ssh(self):
        server = RawServer([*self.target_args, "--jobs", self.jobs, "--archive", self.archive],
                           self.env)
        self.addCleanup(server.kill)
        server.initialize()
        server.request(1, "tools/call", {"name": "waiter", "arguments": {"target": self.srv.alias("fish")}})
        pid = run_dir = None
        for _ in range(200):
            message = server.read()
            match = READY.search(message.get("params", {}).get("data", {}).get("line", ""))
            if match:
                pid, run_dir = int(match.group(1)), match.group(2)
                break
        self.assertIsNotNone(pid)
        server.proc.stdin.close()
        server.proc.stdout.close()
        self.assertEqual(server.proc.wait(60), 0)
        self.assertTrue(wait_until(lambda: not pid_alive(pid), 30), f"job process {pid} survives")
        self.assertFalse(os.path.exists(run_dir), f"{run_dir} left behind")
        rows = [r for r in archive_rows(self.archive) if r["job"] == "waiter"
                and r["host_label"] == self.srv.alias("fish")]
        self.assertEqual(rows[-1]["status"], "interrupted")
        self.assertEqual(rows[-1]["client"], {"name": "raw-test", "version": "0.0.1"})


if __name__ == "__main__":
    unittest.main()
