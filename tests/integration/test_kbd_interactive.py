"""A host that asks for a second factor after the key (AuthenticationMethods
publickey,keyboard-interactive; docs/persistence.md, "A second factor"), against a real sshd whose
PAM stack asks one question. OpenSSH names its PAM service after its program name, so this sshd
runs through a symlink named ferry-kbd-sshd, with /etc/pam.d/ferry-kbd-sshd written here (with
the user set's digit after it for a second set of test users, whose tests run at the same time)."""
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import unittest

from ferry_harness import ferry_bin, run_ferry, run_in_pty, write_job
from sshd_fixture import USER_SET, SshServer, require_root_and_tools

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mcp"))
from mcp_harness import RawServer  # noqa: E402

CODE = "424242"
PROGRAM = f"ferry-kbd-sshd{USER_SET}"
PAM_FILE = f"/etc/pam.d/{PROGRAM}"
# pam_exec hands the answer to the script on stdin (NUL-terminated); pam_permit gives
# pam_setcred a module that succeeds (pam_exec's alone would deny the session).
PAM_STACK = """auth required pam_exec.so expose_authtok quiet {check}
auth optional pam_permit.so
account required pam_permit.so
session required pam_permit.so
password required pam_deny.so
"""
CHECK = f"#!/bin/sh\ncode=$(tr -d '\\000')\n[ \"$code\" = \"{CODE}\" ]\n"
PROMPT = b"Password:"
JOB = "print('second factor ok')\n"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def on_terminal(argv: list[str], env: dict, answer: str | None, timeout_s: float = 30):
    """argv on a pseudo-terminal (its controlling terminal: /dev/tty), `answer` typed at each
    prompt: (exit code, what the terminal showed, how many prompts came)."""
    prompts = 0

    def type_answer(fd: int, shown: bytes) -> None:
        nonlocal prompts
        if shown.count(PROMPT) > prompts:
            prompts = shown.count(PROMPT)
            if answer is not None:
                os.write(fd, answer.encode() + b"\n")

    code, shown = run_in_pty(argv, env, timeout_s, type_answer)
    return code, shown, prompts


class SecondFactor(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        require_root_and_tools()
        cls.tmp = tempfile.mkdtemp(prefix="ferry-kbd-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        os.chmod(cls.tmp, 0o755)
        check = os.path.join(cls.tmp, "check-code")
        with open(check, "w") as f:
            f.write(CHECK)
        os.chmod(check, 0o755)
        with open(PAM_FILE, "w") as f:
            f.write(PAM_STACK.format(check=check))
        cls.addClassCleanup(os.unlink, PAM_FILE)
        program = os.path.join(cls.tmp, PROGRAM)
        os.symlink("/usr/sbin/sshd", program)
        # Only the bash user is asked for the code; the zsh user logs in with its key alone.
        cls.srv = SshServer(program=program, extra_config=(
            "UsePAM yes\nKbdInteractiveAuthentication yes\n"
            "AuthenticationMethods publickey,keyboard-interactive\n"
            f"Match User {SshServer.user('zsh')}\n    AuthenticationMethods publickey\n")).start()
        cls.addClassCleanup(cls.srv.stop)
        runtime = os.path.join(cls.tmp, "runtime")
        os.mkdir(runtime, 0o700)
        cls.env = {**os.environ, "FERRY_ARCHIVE": os.path.join(cls.tmp, "archive.db"),
                   "XDG_RUNTIME_DIR": runtime, "FERRY_PERSIST": ""}
        cls.job = write_job(cls.tmp, "second", JOB)
        cls.host = cls.srv.alias("bash")
        # The fixture's config sets BatchMode yes for every host (the system ssh must never ask):
        # the tests that answer a prompt use a copy without it.
        with open(cls.srv.ssh_config) as f:
            batch = f.read()
        if "    BatchMode yes\n" not in batch:
            raise AssertionError(f"{cls.srv.ssh_config} no longer sets BatchMode yes: {batch}")
        cls.ssh_config = os.path.join(cls.tmp, "ssh_config")
        with open(cls.ssh_config, "w") as f:
            f.write(batch.replace("    BatchMode yes\n", ""))

    def tearDown(self):
        res = run_ferry("disconnect", "--list", "--json", env=self.env)
        run_ferry("disconnect", "--all", env=self.env)
        for pid in {h["pid"] for h in json.loads(res.stdout or b"[]")}:
            deadline = time.monotonic() + 10
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)

    def run_args(self, *hosts: str, config: str | None = None, job: str | None = None) -> list[str]:
        return [ferry_bin(), "run", job or self.job, "--json", "--ssh-config", config or self.ssh_config,
                *[a for h in hosts for a in ("--host", h)]]

    def without_terminal(self, argv: list[str]) -> subprocess.CompletedProcess:
        """No controlling terminal (a new session), stdin and stdout not one either."""
        return subprocess.run(argv, env=self.env, stdin=subprocess.DEVNULL, capture_output=True,
                              start_new_session=True, timeout=60)

    def set_run_dir(self, run_id: str, run_dir: str) -> None:
        """Rewrites a detached run's directory in the archive's record (a damaged record)."""
        with sqlite3.connect(self.env["FERRY_ARCHIVE"]) as db:
            (text,) = db.execute("SELECT record FROM detached_runs WHERE run_id = ?", (run_id,)).fetchone()
            record = json.loads(text)
            record["detached"]["run_dir"] = run_dir
            db.execute("UPDATE detached_runs SET record = ? WHERE run_id = ?", (json.dumps(record), run_id))

    def accepted_second_factors(self) -> int:
        return self.srv.log_text().count(f"Accepted keyboard-interactive/pam for {SshServer.user('bash')}")

    def test_prompt_once_then_the_holder_serves_without_one(self):
        before = self.accepted_second_factors()  # one sshd for the class: its log has them all
        code, shown, prompts = on_terminal(self.run_args(self.host), self.env, CODE)
        self.assertEqual((code, prompts), (0, 1), shown)
        self.assertIn(b"second factor ok", shown)
        self.assertIn(f"({self.host}) ".encode(), shown)  # the prompt names the host
        self.assertNotIn(CODE.encode(), shown)  # asked with echo off
        code, shown, prompts = on_terminal(self.run_args(self.host), self.env, CODE)
        self.assertEqual((code, prompts), (0, 0), shown)
        self.assertIn(b"second factor ok", shown)
        self.assertEqual(self.accepted_second_factors() - before, 1, self.srv.log_text()[-3000:])

    def test_no_terminal_fails_at_once_and_the_other_hosts_go_on(self):
        started = time.monotonic()
        res = self.without_terminal(self.run_args(self.host, self.srv.alias("zsh")))
        took = time.monotonic() - started
        self.assertEqual(res.returncode, 3, res)
        self.assertLess(took, 20, res)
        records = {r["target"]["host"]: r for r in map(json.loads, res.stdout.splitlines())}
        self.assertEqual(records[self.srv.alias("zsh")]["status"], "ok", records)
        failed = records[self.host]
        self.assertEqual((failed["status"], failed.get("failure")), ("error", "auth"), failed)
        self.assertIn(f"{self.host} asks for an interactive login (keyboard-interactive); run "
                      f"`ferry connect {self.host}` in a terminal first", failed["error"])

    def test_connect_on_a_terminal_then_runs_need_none(self):
        before = self.accepted_second_factors()
        connect = [ferry_bin(), "connect", self.host, "--ssh-config", self.ssh_config]
        code, shown, prompts = on_terminal(connect, self.env, CODE)
        self.assertEqual((code, prompts), (0, 1), shown)
        self.assertIn(f"{self.host}: held until ".encode(), shown)
        res = self.without_terminal(self.run_args(self.host))
        self.assertEqual(res.returncode, 0, res)
        self.assertEqual(json.loads(res.stdout)["stdout"], "second factor ok\n", res)
        self.assertEqual(self.accepted_second_factors() - before, 1)

    def test_batch_mode_on_a_terminal_is_never_prompted(self):
        before = self.accepted_second_factors()
        started = time.monotonic()
        code, shown, prompts = on_terminal(self.run_args(self.host, config=self.srv.ssh_config), self.env, CODE)
        took = time.monotonic() - started
        self.assertEqual((code, prompts), (3, 0), shown)
        self.assertLess(took, 10, shown)
        record = json.loads(shown[shown.index(b'{"'):].splitlines()[0])
        self.assertEqual((record["status"], record.get("failure")), ("error", "auth"), record)
        self.assertIn(f"{self.host} asks for an interactive login (keyboard-interactive), and BatchMode "
                      f"yes ({self.srv.ssh_config} line ", record["error"])
        self.assertIn(f"run `ferry connect {self.host}` in a terminal first with BatchMode off", record["error"])
        # As the error says: connected once without BatchMode, the BatchMode runs use that session.
        connect = [ferry_bin(), "connect", self.host, "--ssh-config", self.ssh_config]
        code, shown, prompts = on_terminal(connect, self.env, CODE)
        self.assertEqual((code, prompts), (0, 1), shown)
        code, shown, prompts = on_terminal(self.run_args(self.host, config=self.srv.ssh_config), self.env, CODE)
        self.assertEqual((code, prompts), (0, 0), shown)
        self.assertIn(b"second factor ok", shown)
        self.assertEqual(self.accepted_second_factors() - before, 1)
        # A BatchMode ssh would refuse is a config error, as for ssh, before any host is contacted.
        maybe = os.path.join(self.tmp, "ssh_config_maybe")
        with open(maybe, "w") as f:
            f.write(f"Host {self.host}\n    BatchMode maybe\nInclude {self.ssh_config}\n")
        res = self.without_terminal(self.run_args(self.host, config=maybe))
        self.assertEqual(res.returncode, 2, res)
        self.assertIn(f"ssh config {maybe} line 2: BatchMode 'maybe' is not yes or no".encode(), res.stderr)

    def test_a_wrong_code_is_an_auth_failure_naming_the_host(self):
        code, shown, prompts = on_terminal(self.run_args(self.host), self.env, "000000")
        self.assertEqual((code, prompts), (3, 1), shown)
        record = json.loads(shown[shown.index(b'{"'):].splitlines()[0])
        self.assertEqual(record.get("failure"), "auth", record)
        self.assertIn(f"{self.host}: authentication failed for user {self.srv.user('bash')}: the "
                      "server did not accept the answers", record["error"])

    def test_detached_runs_are_attached_and_stopped_through_the_held_session(self):
        # A login node with a second factor, held by `ferry connect`: ps, attach and stop with no
        # terminal use that session (issue 43 item 1, issue 44 item 2): no prompt, no new login.
        before = self.accepted_second_factors()
        connect = [ferry_bin(), "connect", self.host, "--ssh-config", self.ssh_config]
        code, shown, prompts = on_terminal(connect, self.env, CODE)
        self.assertEqual((code, prompts), (0, 1), shown)
        runs = {}
        for name, body in (("waits", "import time\ntime.sleep(1)\nprint('collected', flush=True)\n"),
                           ("long", "import time\nprint('long', flush=True)\ntime.sleep(30)\n")):
            res = self.without_terminal([*self.run_args(self.host, job=write_job(self.tmp, name, body)),
                                         "--detach"])
            self.assertEqual(res.returncode, 0, res)
            runs[name] = json.loads(res.stdout)
            self.assertEqual(runs[name]["status"], "running", runs[name])
        ferry = [ferry_bin(), "-v"]
        ssh = ["--ssh-config", self.ssh_config]
        res = self.without_terminal([*ferry, "ps", "--json", *ssh])
        self.assertEqual(res.returncode, 0, res)
        states = {row["run_id"]: row["state"] for row in map(json.loads, res.stdout.splitlines())}
        self.assertEqual(states.get(runs["long"]["run_id"]), "running", res)
        # The holder serves only run directories in the host's run base: a record that names
        # another one (damaged) is refused, and nothing there is touched.
        run_dir = runs["waits"]["detached"]["run_dir"]
        elsewhere = os.path.join(os.path.dirname(os.path.dirname(run_dir)), os.path.basename(run_dir))
        self.set_run_dir(runs["waits"]["run_id"], elsewhere)
        res = self.without_terminal([ferry_bin(), "attach", runs["waits"]["run_id"], *ssh])
        self.assertEqual(res.returncode, 1, res)
        self.assertIn(f"'{elsewhere}' is not a run directory in the run base {os.path.dirname(run_dir)}".encode(),
                      res.stderr)
        self.set_run_dir(runs["waits"]["run_id"], run_dir)
        res = self.without_terminal([*ferry, "attach", runs["waits"]["run_id"], "--json", *ssh])
        self.assertEqual(res.returncode, 0, res)
        self.assertIn(b"using the connection held by process", res.stderr)
        record = json.loads(res.stdout)
        self.assertEqual((record["status"], record["stdout"]), ("ok", "collected\n"), record)
        self.assertFalse(os.path.exists(runs["waits"]["detached"]["run_dir"]))
        res = self.without_terminal([*ferry, "stop", runs["long"]["run_id"], "--json", *ssh])
        self.assertEqual(res.returncode, 0, res)
        self.assertIn(b"using the connection held by process", res.stderr)
        record = json.loads(res.stdout)
        self.assertEqual((record["status"], record["stdout"]), ("interrupted", "long\n"), record)
        self.assertFalse(os.path.exists(runs["long"]["detached"]["run_dir"]))
        self.assertEqual(self.accepted_second_factors() - before, 1, self.srv.log_text()[-3000:])
        # Not held (disconnected): attach connects directly, which needs the second factor, and
        # with no terminal it says so; it starts no holder for itself.
        res = self.without_terminal([*self.run_args(self.host), "--detach"])
        self.assertEqual(res.returncode, 0, res)
        again = json.loads(res.stdout)["run_id"]
        run_ferry("disconnect", "--all", env=self.env)
        res = self.without_terminal([*ferry, "attach", again, *ssh])
        self.assertEqual(res.returncode, 3, res)
        self.assertIn(f"run `ferry connect {self.host}` in a terminal first".encode(), res.stderr)
        self.assertEqual(json.loads(run_ferry("disconnect", "--list", "--json", env=self.env).stdout or b"[]"), [])

    def test_mcp_calls_use_the_held_session_after_connect(self):
        # ferry mcp has no terminal: a call to a host with a second factor fails naming `ferry
        # connect`; once it is held (one prompt, on a terminal), the server's calls go through
        # the held session with no new login (docs/mcp.md, "Sessions").
        jobs = os.path.join(self.tmp, "mcp-jobs")
        os.makedirs(jobs, exist_ok=True)
        write_job(jobs, "second", JOB)
        server = RawServer(["--host", self.host, "--ssh-config", self.ssh_config, "--jobs", jobs], self.env)
        self.addCleanup(server.kill)
        server.initialize()

        def call(id_: int) -> dict:
            server.request(id_, "tools/call", {"name": "second", "arguments": {"target": self.host}})
            return server.response(id_, timeout=60)["result"]

        before = self.accepted_second_factors()
        result = call(1)
        self.assertTrue(result.get("isError"), result)
        self.assertIn(f"run `ferry connect {self.host}` in a terminal first", json.dumps(result))
        connect = [ferry_bin(), "connect", self.host, "--ssh-config", self.ssh_config]
        code, shown, prompts = on_terminal(connect, self.env, CODE)
        self.assertEqual((code, prompts), (0, 1), shown)
        for id_ in (2, 3):
            result = call(id_)
            self.assertFalse(result.get("isError"), result)
            self.assertIn("second factor ok", json.dumps(result))
        self.assertEqual(self.accepted_second_factors() - before, 1, self.srv.log_text()[-3000:])
        self.assertEqual(server.close(), 0)

    def test_connect_with_persist_0_is_a_usage_error(self):
        for args, env in ((["--persist", "0"], {}), ([], {"FERRY_PERSIST": "0"})):
            res = run_ferry("connect", self.host, *args, env={**self.env, **env})
            self.assertEqual(res.code, 2, res)
            self.assertIn(b"persist time is 0", res.stderr)


if __name__ == "__main__":
    unittest.main()
