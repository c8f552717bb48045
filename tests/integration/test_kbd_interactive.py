"""A host that asks for a second factor after the key (AuthenticationMethods
publickey,keyboard-interactive; docs/persistence.md, "A second factor"), against a real sshd whose
PAM stack asks one question. OpenSSH names its PAM service after its program name, so this sshd
runs through a symlink named ferry-kbd-sshd, with /etc/pam.d/ferry-kbd-sshd written here."""
import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest

from ferry_harness import ferry_bin, run_ferry, run_in_pty, write_job
from sshd_fixture import SshServer, require_root_and_tools

CODE = "424242"
PROGRAM = "ferry-kbd-sshd"
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
        # Only ferryt-bash is asked for the code; ferryt-zsh logs in with its key alone.
        cls.srv = SshServer(program=program, extra_config=(
            "UsePAM yes\nKbdInteractiveAuthentication yes\n"
            "AuthenticationMethods publickey,keyboard-interactive\n"
            "Match User ferryt-zsh\n    AuthenticationMethods publickey\n")).start()
        cls.addClassCleanup(cls.srv.stop)
        runtime = os.path.join(cls.tmp, "runtime")
        os.mkdir(runtime, 0o700)
        cls.env = {**os.environ, "FERRY_ARCHIVE": os.path.join(cls.tmp, "archive.db"),
                   "XDG_RUNTIME_DIR": runtime, "FERRY_PERSIST": ""}
        cls.job = write_job(cls.tmp, "second", JOB)
        cls.host = cls.srv.alias("bash")

    def tearDown(self):
        res = run_ferry("disconnect", "--list", "--json", env=self.env)
        run_ferry("disconnect", "--all", env=self.env)
        for pid in {h["pid"] for h in json.loads(res.stdout or b"[]")}:
            deadline = time.monotonic() + 10
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)

    def run_args(self, *hosts: str) -> list[str]:
        return [ferry_bin(), "run", self.job, "--json", "--ssh-config", self.srv.ssh_config,
                *[a for h in hosts for a in ("--host", h)]]

    def without_terminal(self, argv: list[str]) -> subprocess.CompletedProcess:
        """No controlling terminal (a new session), stdin and stdout not one either."""
        return subprocess.run(argv, env=self.env, stdin=subprocess.DEVNULL, capture_output=True,
                              start_new_session=True, timeout=60)

    def accepted_second_factors(self) -> int:
        return self.srv.log_text().count("Accepted keyboard-interactive/pam for ferryt-bash")

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
        connect = [ferry_bin(), "connect", self.host, "--ssh-config", self.srv.ssh_config]
        code, shown, prompts = on_terminal(connect, self.env, CODE)
        self.assertEqual((code, prompts), (0, 1), shown)
        self.assertIn(f"{self.host}: held until ".encode(), shown)
        res = self.without_terminal(self.run_args(self.host))
        self.assertEqual(res.returncode, 0, res)
        self.assertEqual(json.loads(res.stdout)["stdout"], "second factor ok\n", res)
        self.assertEqual(self.accepted_second_factors() - before, 1)

    def test_a_wrong_code_is_an_auth_failure_naming_the_host(self):
        code, shown, prompts = on_terminal(self.run_args(self.host), self.env, "000000")
        self.assertEqual((code, prompts), (3, 1), shown)
        record = json.loads(shown[shown.index(b'{"'):].splitlines()[0])
        self.assertEqual(record.get("failure"), "auth", record)
        self.assertIn(f"{self.host}: authentication failed for user {self.srv.user('bash')}: the "
                      "server did not accept the answers", record["error"])

    def test_connect_with_persist_0_is_a_usage_error(self):
        for args, env in ((["--persist", "0"], {}), ([], {"FERRY_PERSIST": "0"})):
            res = run_ferry("connect", self.host, *args, env={**self.env, **env})
            self.assertEqual(res.code, 2, res)
            self.assertIn(b"persist time is 0", res.stderr)


if __name__ == "__main__":
    unittest.main()
