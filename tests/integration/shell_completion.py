"""Completion as the shells themselves do it: a real interactive bash and zsh on a
pseudo-terminal (the test types a line and a Tab, and the shell's own line editor splits the
words and calls ferry's completion function), and fish's own engine through `complete -C`.

Each session reports what the completion offered for a line as the words it would leave on the
line (bash: COMPREPLY applied to the word being completed; zsh: every match compadd accepts,
with its ignored prefix; fish: the candidates without their descriptions)."""

from __future__ import annotations

import os
import pty
import select
import shutil
import signal
import subprocess
import tempfile
import time

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def shell_path(name: str) -> str:
    path = shutil.which(name, path=SYSTEM_PATH)
    if not path:
        raise AssertionError(f"{name} is not installed: run ./setup.sh --deps as root")
    return path


class PtyShell:
    """An interactive shell on a pseudo-terminal. Each completion is a line, a Tab, and a wait
    (bounded) for the file the shell's test hook writes when the completion is done."""

    def __init__(self, argv: list[str], env: dict, cwd: str, setup: str):
        self.tmp = tempfile.mkdtemp(prefix="ferry-completion-")
        self.out = os.path.join(self.tmp, "offered")
        env = {**env, "FERRY_TEST_OUT": self.out, "TERM": "dumb"}
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the shell
            os.chdir(cwd)
            os.execve(argv[0], argv, env)
        self.setup_file = os.path.join(self.tmp, "setup")
        with open(self.setup_file, "w") as f:
            f.write(setup + "\ntouch \"$FERRY_TEST_OUT.ready\"\n")
        self.send(f"source {self.setup_file}\n".encode())
        self.wait_for(self.out + ".ready")

    def send(self, data: bytes):
        os.write(self.fd, data)

    def drain(self):
        while select.select([self.fd], [], [], 0)[0]:
            try:
                if not os.read(self.fd, 65536):
                    return
            except OSError:
                return

    def wait_for(self, path: str, timeout: float = 30):
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise AssertionError(f"the shell did not finish completing within {timeout} s")
            select.select([self.fd], [], [], 0.05)
            self.drain()

    def complete(self, line: str) -> list[str]:
        if os.path.exists(self.out):
            os.unlink(self.out)
        self.send(line.encode() + b"\t")
        self.wait_for(self.out)
        self.send(b"\x15")  # Ctrl-U: drop the line for the next one
        with open(self.out, encoding="utf-8") as f:
            return [w for w in f.read().split("\n") if w]

    def line_after_tab(self, line: str) -> str:
        """The line as the shell's line editor holds it after LINE and one Tab (bash only: the
        session binds Ctrl-X Ctrl-L to write it)."""
        for stale in (self.out, self.out + ".line"):
            if os.path.exists(stale):
                os.unlink(stale)
        self.send(line.encode() + b"\t")
        self.wait_for(self.out)
        self.send(b"\x18\x0c")
        self.wait_for(self.out + ".line")
        self.send(b"\x15")
        with open(self.out + ".line", encoding="utf-8") as f:
            return f.read()

    def close(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)
        os.close(self.fd)
        shutil.rmtree(self.tmp, ignore_errors=True)


def bash_session(env: dict, cwd: str, script: str) -> PtyShell:
    # The hook wraps _ferry and writes each reply as the word it would leave on the line:
    # readline replaces the text after the word's last COMP_WORDBREAKS character (bash's own,
    # as shipped: the session does not set it), or from it when it is $ or @, with the reply. Ctrl-X Ctrl-L writes the line
    # as readline holds it, for line_after_tab.
    setup = f"""
source {script}
complete -p ferry > "$FERRY_TEST_OUT.registered"
printf '%s' "$COMP_WORDBREAKS" > "$FERRY_TEST_OUT.wordbreaks"
_ferry_test() {{
    _ferry "$@"
    local line=${{COMP_LINE:0:COMP_POINT}} r
    local replaced=${{line##*[$COMP_WORDBREAKS]}} before
    before=${{line%"$replaced"}}
    case $before in
    *@ | *\\$) replaced=${{before: -1}}$replaced ;;  # readline's special prefixes stay in the word
    esac
    for r in "${{COMPREPLY[@]}}"; do
        r="${{line%"$replaced"}}$r"
        printf '%s\\n' "${{r##* }}"
    done > "$FERRY_TEST_OUT.tmp"
    mv "$FERRY_TEST_OUT.tmp" "$FERRY_TEST_OUT"
}}
complete -F _ferry_test ferry
bind -x '"\\C-x\\C-l": printf "%s" "$READLINE_LINE" > "$FERRY_TEST_OUT.line.tmp"; mv "$FERRY_TEST_OUT.line.tmp" "$FERRY_TEST_OUT.line"'
"""
    return PtyShell([shell_path("bash"), "--norc", "--noprofile", "-i"], env, cwd, setup)


def zsh_session(env: dict, cwd: str, script: str) -> PtyShell:
    # compadd is wrapped to record every match it accepts; a Tab widget marks the end.
    setup = f"""
unsetopt auto_list auto_menu list_beep
bindkey -e
autoload -U compinit && compinit -u -D
source {script}
compadd() {{
  if [[ ${{@[1,(i)(-|--)]}} == *-(O|A|D)\\ * ]]; then
    builtin compadd "$@"
    return
  fi
  local -a __hits
  local __h
  builtin compadd -A __hits "$@"
  for __h in $__hits; do print -r -- "$IPREFIX$__h"; done >> "$FERRY_TEST_OUT.tmp"
  builtin compadd "$@"
}}
_ferry_test_tab() {{
  rm -f "$FERRY_TEST_OUT.tmp"
  zle complete-word
  touch "$FERRY_TEST_OUT.tmp"
  mv "$FERRY_TEST_OUT.tmp" "$FERRY_TEST_OUT"
}}
zle -N _ferry_test_tab
bindkey '^I' _ferry_test_tab
"""
    return PtyShell([shell_path("zsh"), "-f", "-i"], env, cwd, setup)


def fish_complete(env: dict, cwd: str, script: str, lines: list[str]) -> dict[str, list[str]]:
    """fish's own completion engine for each line (`complete -C`), in one fish process."""
    marker = "--ferry-test-end--"
    program = f"source {script}\nfor line in $argv\n complete -C $line\n echo {marker}\nend\n"
    proc = subprocess.run([shell_path("fish"), "--no-config", "-c", program, *lines], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise AssertionError(f"fish failed: {proc.stderr}")
    chunks = proc.stdout.split(marker + "\n")
    return {line: [c.split("\t")[0] for c in chunk.splitlines() if c]
            for line, chunk in zip(lines, chunks)}
