"""The job's environment, the user's config file and sweeps (issue 13, items 3, 4 and 7), through
a real sshd under every test shell and on the local target: hostile values round-trip, only the
listed variables reach the job (the same set on both targets), per-host interpreters and run
bases from config.toml, and one run, record and archive row per swept combination."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from ferry_harness import SshTestCase, run_ferry, write_job  # noqa: E402
from sshd_fixture import SHELLS, USER_PREFIX  # noqa: E402

# The token's value stays out of the result (which is archived): the job returns its hash.
ENV_JOB = '''
import hashlib, json, os
env = dict(os.environ)
if "TOKEN" in env:
    env["TOKEN"] = hashlib.sha256(env["TOKEN"].encode()).hexdigest()
with open(os.environ["FERRY_RESULT"], "w", encoding="utf-8") as f:
    json.dump({"env": env}, f)
'''

JOB_ENV = '''
[env]
FROM_JOB = "job's $value"
OVERRIDDEN = "by the job"

[params.tp]
type = "int"
default = 1
[params.name]
type = "string"
default = "x"
'''

# Values a shell would reinterpret, one a variable.
HOSTILE_ENV = {
    "Q_SINGLE": "it's 'quoted' '\\''",
    "Q_DOUBLE": "say \"hi\" \"",
    "DOLLAR": "$HOME ${PATH} $(id) $$ $",
    "BACKTICK": "`id` `",
    "BACKSLASH": "a\\b\\\\c\\",
    "NEWLINES": "line1\nline2\n\n",
    "PERCENT": "%s %d %n {} {0} %%",
    "BANG": "!! !$ !-1 !",
    "UNICODE": "日本語 🚀 \u202e RTL e\u0301 \ufeff",
    "GLOB": "* ? [a-z] ~ ~root {a,b}",
    "SPACES": "  lead and trail  ",
    "EMPTY": "",
    "SEMI": "; rm -rf / ; | & < > #",
}

FERRY_VARS = {"FERRY_RUN_DIR", "FERRY_PARAMS", "FERRY_RESULT", "FERRY_JOB"}
INHERITED = {"PATH", "HOME", "USER", "LANG", "TERM"}
SECRET = "tok-3c9d1e-never-archived"


def env_args(values: dict) -> list[str]:
    args = []
    for name, value in values.items():
        args += ["--env", f"{name}={value}"]
    return args


def unexpected_names(env: dict, declared: set) -> set:
    return {n for n in env if n not in declared | FERRY_VARS | INHERITED and not n.startswith("LC_")}


class EnvBothTargets(SshTestCase):
    """Every test shell and the local target give the job the same variables."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ferry-env-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        # An absolute interpreter: a wrapper found on PATH (pyenv's shims) would add variables.
        self.job = write_job(self.dir, "envjob", ENV_JOB, interpreter="/usr/bin/python3", params=JOB_ENV)
        # ferry's own environment holds variables no job may see, and the token passed by name.
        self.extra = {"LEAKY_VAR": "must not reach the job", "SHELL": "/bin/leak",
                      "XDG_CONFIG_HOME": os.path.join(self.dir, "no-config"), "TOKEN": SECRET}
        self.args = [*env_args(HOSTILE_ENV), "--env", "OVERRIDDEN=by --env", "--env", "TOKEN",
                     "--json"]
        self.declared = set(HOSTILE_ENV) | {"FROM_JOB", "OVERRIDDEN", "TOKEN"}

    def check_run(self, r, where):
        self.assertEqual(r.code, 0, f"{where}: {r}")
        rec = r.record
        env = rec["result"]["env"]
        for name, value in HOSTILE_ENV.items():
            self.assertEqual(env.get(name), value, f"{where}: {name}")
        self.assertEqual(env["FROM_JOB"], "job's $value", where)
        self.assertEqual(env["OVERRIDDEN"], "by --env", where)
        self.assertEqual(env["TOKEN"], hashlib.sha256(SECRET.encode()).hexdigest(), where)
        self.assertEqual(unexpected_names(env, self.declared), set(), f"{where}: inherited too much")
        self.assertTrue({"PATH", "HOME"} <= set(env), f"{where}: {sorted(env)}")
        self.assertEqual(rec["env"], sorted(self.declared), where)
        # The record keeps names only: the token's value is in no record and not in the archive.
        self.assertNotIn(SECRET, json.dumps(rec), where)
        return {n for n in env if n not in INHERITED and not n.startswith("LC_")}

    def test_hostile_values_round_trip_and_only_listed_variables_reach_the_job(self):
        archive = os.path.join(self.dir, "archive.db")
        env = {**self.extra, "FERRY_ARCHIVE": archive}
        local = run_ferry("run", self.job, "--local", *self.args, env=env)
        names = {"local": self.check_run(local, "local")}
        for shell in SHELLS:
            with self.subTest(shell=shell):
                r = self.ferry("run", self.job, *self.args, shell=shell, env=env)
                names[shell] = self.check_run(r, shell)
                self.assertEqual(r.record["result"]["env"]["USER"], self.srv.user(shell))
        # The same set (beyond PATH, HOME, USER, LANG, TERM, LC_*) everywhere.
        for where, seen in names.items():
            self.assertEqual(seen, self.declared | FERRY_VARS, where)
        with sqlite3.connect(archive) as db:
            rows = db.execute("SELECT * FROM runs").fetchall()
        self.assertEqual(len(rows), 1 + len(SHELLS))
        self.assertNotIn(SECRET.encode(), open(archive, "rb").read())

    def test_bad_names_and_unset_variables_are_refused_before_any_host(self):
        env = {**self.extra, "FERRY_ARCHIVE": os.path.join(self.dir, "archive.db")}
        for arg, says in (("FERRY_JOB=x", "FERRY_JOB is ferry's own variable"),
                          ("1BAD=x", "'1BAD' is not a usable environment variable name"),
                          ("A-B=x", "'A-B' is not a usable"),
                          ("UNSET_IN_FERRY_7", "UNSET_IN_FERRY_7 is not set in ferry's environment")):
            with self.subTest(arg=arg):
                r = run_ferry("run", self.job, "--host", "unreachable.invalid", "--env", arg, env=env)
                self.assertEqual(r.code, 2, r)
                self.assertIn(says, r.stderr.decode())


FAKE_PYTHON = '''#!/bin/sh
# Says which interpreter ran, then hands over to the real one.
if [ "$1" = --version ]; then echo "Python 3.99.7"; exit 0; fi
FAKE_INTERPRETER="$0" exec /usr/bin/python3 "$@"
'''

WHICH_JOB = '''
import json, os
with open(os.environ["FERRY_RESULT"], "w", encoding="utf-8") as f:
    json.dump({"interpreter": os.environ.get("FAKE_INTERPRETER"), "run_dir": os.environ["FERRY_RUN_DIR"],
               "from_config": os.environ.get("FROM_CONFIG")}, f)
'''


class ConfigFile(SshTestCase):
    """config.toml: per-host interpreters, remote_base and env; --interpreter wins; check."""

    def setUp(self):
        # Readable by the test users: the fake interpreter and the run base live here.
        self.shared = tempfile.mkdtemp(prefix="ferry-cfg-")
        self.addCleanup(shutil.rmtree, self.shared, True)
        os.chmod(self.shared, 0o1777)
        self.fake = os.path.join(self.shared, "fake-python3")
        with open(self.fake, "w") as f:
            f.write(FAKE_PYTHON)
        os.chmod(self.fake, 0o755)
        self.xdg = os.path.join(self.shared, "xdg")
        os.makedirs(os.path.join(self.xdg, "ferry"))
        self.job = write_job(self.shared, "which", WHICH_JOB)
        self.base = os.path.join(self.shared, "base-bash")
        self.write_config(f'''
[hosts."{self.srv.alias("bash")}"]
remote_base = "{self.base}"

[hosts."{USER_PREFIX}*"]
interpreters.python3 = "{self.fake}"
env.FROM_CONFIG = "config's"
remote_base = "/nonexistent/not/this/one"

[hosts.local]
interpreters.python3 = "{self.fake}"
''')
        self.env = {**self.env, "XDG_CONFIG_HOME": self.xdg}

    def write_config(self, text):
        with open(os.path.join(self.xdg, "ferry", "config.toml"), "w") as f:
            f.write(text)

    def test_per_host_interpreter_remote_base_and_env(self):
        for where, r in (("bash", self.ferry("run", self.job, "--json", shell="bash")),
                         ("local", run_ferry("run", self.job, "--local", "--json", env=self.env))):
            with self.subTest(where=where):
                self.assertEqual(r.code, 0, r)
                rec = r.record
                self.assertEqual(rec["result"]["interpreter"], self.fake)
                self.assertEqual(rec["interpreter"], self.fake)
                self.assertEqual(rec["result"]["from_config"], "config's" if where == "bash" else None)
        bash = self.ferry("run", self.job, "--json", shell="bash").record
        self.assertTrue(bash["result"]["run_dir"].startswith(self.base + "/ferry-"), bash["result"])

    def test_interpreter_option_wins_and_the_record_keeps_it(self):
        r = self.ferry("run", self.job, "--json", "--interpreter", "python3=/usr/bin/python3", shell="bash")
        self.assertEqual(r.code, 0, r)
        self.assertIsNone(r.record["result"]["interpreter"])
        self.assertEqual(r.record["interpreter"], "/usr/bin/python3")

    def test_check_shows_the_mapped_interpreter_and_its_version(self):
        jobs = os.path.join(self.shared, "jobs")
        os.makedirs(jobs)
        write_job(jobs, "needs_python", WHICH_JOB)
        r = self.ferry("check", shell="bash", env={"FERRY_JOBS_PATH": jobs})
        self.assertEqual(r.code, 0, r)
        self.assertIn(f"python3 as {self.fake} 3.99.7 ({self.fake})", r.stdout.decode())

    def test_a_bad_config_file_names_file_line_and_key(self):
        self.write_config('[hosts."gpu*"]\n\ninterpreters.python3 = "/opt/my venv/python"\n')
        r = run_ferry("run", self.job, "--local", env=self.env)
        self.assertEqual(r.code, 2, r)
        path = os.path.join(self.xdg, "ferry", "config.toml")
        self.assertIn(f'{path}:3: hosts."gpu*".interpreters.python3:', r.stderr.decode())


SWEEP_JOB = '''
import json, os
with open(os.environ["FERRY_RESULT"], "w", encoding="utf-8") as f:
    json.dump(json.load(open(os.environ["FERRY_PARAMS"])), f)
'''


class Sweeps(SshTestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ferry-sweep-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.job = write_job(self.dir, "sweep", SWEEP_JOB, params='''
[params.tp]
type = "int"
default = 1
[params.name]
type = "string"
default = "x"
''')
        self.archive = os.path.join(self.dir, "archive.db")
        self.env = {"FERRY_ARCHIVE": self.archive, "XDG_CONFIG_HOME": os.path.join(self.dir, "none")}

    def test_every_combination_runs_on_every_target_and_is_archived(self):
        hosts = f"{self.srv.alias('bash')},{self.srv.alias('dash')}"
        r = run_ferry("run", self.job, "--host", hosts, "--ssh-config", self.srv.ssh_config,
                      "--sweep", "tp=1,2,4", "--sweep", 'name=["a,b","c"]', "--json", env=self.env)
        self.assertEqual(r.code, 0, r)
        records = r.records
        self.assertEqual(len(records), 12)
        combos = sorted((rec["target"]["user"], rec["params"]["tp"], rec["result"]["name"])
                        for rec in records)
        expected = sorted((u, tp, n) for u in (self.srv.user("bash"), self.srv.user("dash"))
                          for tp in (1, 2, 4) for n in ("a,b", "c"))
        self.assertEqual(combos, expected)
        with sqlite3.connect(self.archive) as db:
            self.assertEqual(db.execute("SELECT count(*) FROM runs").fetchone()[0], 12)

    def test_the_summary_has_a_column_per_swept_key(self):
        r = run_ferry("run", self.job, "--local", "--sweep", "tp=2,8", "--sweep", "name=p,q", env=self.env)
        self.assertEqual(r.code, 0, r)
        lines = r.stdout.decode().splitlines()
        header = next(line for line in lines if line.startswith("HOST"))
        self.assertEqual(header.split(), ["HOST", "JOB", "tp", "name", "STATUS", "TIME", "RESULT"])
        rows = [line.split()[:4] for line in lines[lines.index(header) + 1:] if line.startswith("local")]
        self.assertEqual(sorted(rows), sorted(["local", "sweep", tp, f'"{n}"'] for tp in ("2", "8") for n in "pq"))

    def test_mistakes_are_refused_before_anything_runs(self):
        for args, says in ((["-p", "tp=2", "--sweep", "tp=1,2"], "tp is given both with -p and with --sweep"),
                           (["--sweep", "tp=[]"], "the list is empty"),
                           (["--sweep", "tp="], "no values"),
                           (["--sweep", "tp=1,two"], "--sweep: "),
                           (["--sweep", "nope=1,2"], "nope")):
            with self.subTest(args=args):
                r = run_ferry("run", self.job, "--local", *args, env=self.env)
                self.assertEqual(r.code, 2, r)
                self.assertIn(says, r.stderr.decode())
        self.assertFalse(os.path.exists(self.archive), "nothing may run, so nothing is archived")


if __name__ == "__main__":
    unittest.main()
