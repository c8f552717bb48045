"""The built-in sh jobs (jobs/*.sh) run as ferry runs them: the script given to a POSIX sh,
FERRY_* variables set, the run dir as cwd. Each case runs under /bin/sh and dash (and under
bash --posix and busybox sh where those are installed). nvidia-smi is a fake answering from
captured outputs in fixtures/ (see fixtures/README.md)."""

import json
import os
import re
import shutil
import subprocess
import tempfile
import tomllib
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
JOBS = os.path.join(REPO, "jobs")
FAKE_NVIDIA_SMI = os.path.join(HERE, "fake-bin", "nvidia-smi")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Everything the jobs may call; the sandbox PATH holds only these (and a fake nvidia-smi).
TOOLS = ("awk", "uname", "getconf", "nproc", "cat", "df", "id", "readlink", "sh")

NO_SMI_NOTE = "nvidia-smi not found on PATH; no NVIDIA GPU or driver visible on this host"
DRIVER_FAILURE = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                  "Make sure that the latest NVIDIA driver is installed and running.")


def _shells():
    dash = shutil.which("dash", path=SYSTEM_PATH)
    if not dash:
        raise AssertionError("dash is not installed: run ./setup.sh --deps as root")
    shells = {"/bin/sh": ["/bin/sh"], "dash": [dash]}
    bash = shutil.which("bash", path=SYSTEM_PATH)
    if bash:
        shells["bash --posix"] = [bash, "--posix"]
    busybox = shutil.which("busybox", path=SYSTEM_PATH)
    if busybox:
        shells["busybox sh"] = [busybox, "sh"]
    return shells


def _gpu(index, name, total, used, free, driver, cuda):
    return {"index": index, "name": name, "memory_total_mib": total, "memory_used_mib": used,
            "memory_free_mib": free, "driver": driver, "cuda": cuda}


H200 = [_gpu(i, "NVIDIA H200", 143771, u, f, "570.133.20", "12.8")
        for i, (u, f) in enumerate([(0, 143165), (0, 143165), (0, 143165), (130572, 12593),
                                    (130572, 12593), (0, 143165), (0, 143165), (1, 143164)])]
EXPECTED_GPUS = {
    "h200x8": {"gpus": H200},
    "h100x1": {"gpus": [_gpu(0, "NVIDIA H100 80GB HBM3", 81559, 0, 81080, "535.129.03", "12.2")]},
    "odd-name": {"gpus": [_gpu(0, 'Lab "Proto" GPU\\rev2, 96GB', None, None, None, "550.54.15", "12.4"),
                          _gpu(1, "NVIDIA L40S", 46068, 12, 45474, "550.54.15", "12.4")]},
    "driver-failure": {"gpus": [], "note": DRIVER_FAILURE, "nvidia_smi_exit": 9},
    "no-devices": {"gpus": [], "note": "No devices were found", "nvidia_smi_exit": 6},
    "odd-failure": {"gpus": [], "nvidia_smi_exit": 18,
                    "note": 'Failed to initialize NVML: "Driver/library version mismatch" path C:\\odd\\place'},
}


class JobRun:
    """A private run dir like ferry's, a sandbox PATH, and the job run in it."""

    def __init__(self, test, job, *, nvidia_smi=None, python3=True, with_result=True,
                 run_dir_name="run", extra_env=None, params=None, tools=()):
        self.tmp = tempfile.mkdtemp(prefix="ferry-jobs-test-")
        test.addCleanup(shutil.rmtree, self.tmp, True)
        self.bin = os.path.join(self.tmp, "bin")
        os.mkdir(self.bin)
        for tool in TOOLS + (("python3",) if python3 else ()) + tuple(tools):
            path = shutil.which(tool, path=SYSTEM_PATH)
            test.assertIsNotNone(path, f"{tool} not installed: run ./setup.sh --deps as root")
            os.symlink(path, os.path.join(self.bin, tool))
        self.smi_log = os.path.join(self.tmp, "nvidia-smi.calls")
        if nvidia_smi:
            os.symlink(FAKE_NVIDIA_SMI, os.path.join(self.bin, "nvidia-smi"))
        self.run_dir = os.path.join(self.tmp, run_dir_name)
        os.mkdir(self.run_dir, 0o700)
        self.result = os.path.join(self.run_dir, "result.json")
        params_value = params
        params = os.path.join(self.run_dir, "params.json")
        with open(params, "w") as f:  # as ferry writes it: compact, keys sorted
            f.write(json.dumps(params_value or {}, separators=(",", ":"), sort_keys=True) + "\n")
        self.env = {"PATH": self.bin, "HOME": self.tmp, "USER": "tester", "SHELL": "/bin/zsh",
                    "FERRY_RUN_DIR": self.run_dir, "FERRY_PARAMS": params, "FERRY_JOB": job,
                    "FAKE_NVIDIA_SMI": nvidia_smi or "", "FAKE_NVIDIA_SMI_LOG": self.smi_log}
        if with_result:
            self.env["FERRY_RESULT"] = self.result
        self.env.update(extra_env or {})
        self.script = os.path.join(JOBS, job + ".sh")

    def run(self, shell_argv):
        return subprocess.run(shell_argv + [self.script], cwd=self.run_dir, env=self.env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)

    def result_json(self):
        with open(self.result) as f:
            return json.loads(f.read())

    def smi_calls(self):
        try:
            with open(self.smi_log) as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []


class Metadata(unittest.TestCase):
    def test_every_job_has_a_ferry_toml_block(self):
        jobs = sorted(f for f in os.listdir(JOBS) if f.endswith(".sh"))
        self.assertIn("gpu_probe.sh", jobs)
        self.assertIn("host_facts.sh", jobs)
        for name in jobs:
            with self.subTest(job=name):
                with open(os.path.join(JOBS, name)) as f:
                    lines = f.read().splitlines()
                self.assertEqual(lines[0], "#!/bin/sh")
                start = lines.index("# /// ferry")
                end = lines.index("# ///", start + 1)
                body = []
                for line in lines[start + 1:end]:
                    self.assertTrue(line == "#" or line.startswith("# "), line)
                    body.append(line[2:])
                meta = tomllib.loads("\n".join(body))
                self.assertIsInstance(meta["description"], str)
                self.assertTrue(meta["description"])
                self.assertEqual(meta["interpreter"], "sh")
                self.assertRegex(meta["interpreter"], r"^[A-Za-z0-9/._-]+$")
                self.assertIsInstance(meta["timeout"], int)
                self.assertGreater(meta["timeout"], 0)


class GpuProbe(unittest.TestCase):
    def check(self, scenario, expected, **kw):
        """Runs the scenario under every shell, checks the result; returns [(job, proc)]."""
        runs = []
        for label, shell in _shells().items():
            job = JobRun(self, "gpu_probe", nvidia_smi=scenario, **kw)
            proc = job.run(shell)
            where = f"{scenario} under {label}: {proc.stderr}"
            self.assertEqual(proc.returncode, 0, where)
            self.assertEqual(proc.stderr, "", where)
            self.assertEqual(job.result_json(), expected, where)
            runs.append((job, proc))
        return runs

    def test_parses_each_fixture_exactly(self):
        for scenario in ("h200x8", "h100x1", "odd-name"):
            expected = EXPECTED_GPUS[scenario]
            for job, proc in self.check(scenario, expected):
                lines = proc.stdout.splitlines()
                self.assertEqual(len(lines), len(expected["gpus"]), proc.stdout)
                for line, gpu in zip(lines, expected["gpus"]):
                    self.assertTrue(line.startswith(f"GPU {gpu['index']}: {gpu['name']}, "), line)

    def test_h200_human_text(self):
        for _, proc in self.check("h200x8", EXPECTED_GPUS["h200x8"]):
            self.assertIn("GPU 3: NVIDIA H200, 143771 MiB total, 130572 MiB used, 12593 MiB free "
                          "(driver 570.133.20, CUDA 12.8)\n", proc.stdout)

    def test_cuda_from_version_flag_and_from_the_header_when_that_flag_is_missing(self):
        query = ("--query-gpu=index,name,memory.total,memory.used,memory.free,driver_version "
                 "--format=csv,noheader,nounits")
        for job, _ in self.check("h200x8", EXPECTED_GPUS["h200x8"]):
            self.assertEqual(job.smi_calls(), [query, "--version"])
        for job, _ in self.check("h100x1", EXPECTED_GPUS["h100x1"]):  # a driver without --version
            self.assertEqual(job.smi_calls(), [query, "--version", ""])

    def test_driver_failure_is_a_note_and_exit_0(self):
        for job, proc in self.check("driver-failure", EXPECTED_GPUS["driver-failure"]):
            self.assertIn("couldn't communicate with the NVIDIA driver", proc.stdout)
            self.assertEqual(len(job.smi_calls()), 1)
        self.check("no-devices", EXPECTED_GPUS["no-devices"])
        self.check("odd-failure", EXPECTED_GPUS["odd-failure"])  # quotes, backslashes, two lines

    def test_no_nvidia_smi_on_path(self):
        for label, shell in _shells().items():
            with self.subTest(shell=label):
                job = JobRun(self, "gpu_probe", nvidia_smi=None)
                proc = job.run(shell)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                self.assertEqual(job.result_json(), {"gpus": [], "note": NO_SMI_NOTE})
                self.assertEqual(proc.stdout, f"no GPUs: {NO_SMI_NOTE}\n")

    def test_without_ferry_result_stdout_is_the_json_document(self):
        for label, shell in _shells().items():
            for scenario in ("h200x8", "driver-failure", None):
                with self.subTest(shell=label, scenario=scenario):
                    job = JobRun(self, "gpu_probe", nvidia_smi=scenario, with_result=False)
                    proc = job.run(shell)
                    self.assertEqual(proc.returncode, 0, proc.stderr)
                    expected = EXPECTED_GPUS[scenario] if scenario else {"gpus": [], "note": NO_SMI_NOTE}
                    self.assertEqual(json.loads(proc.stdout), expected)
                    self.assertFalse(os.path.exists(job.result))


class HostFacts(unittest.TestCase):
    def check_shape(self, facts, job):
        self.assertEqual(set(facts), {"hostname", "os", "kernel", "arch", "cpus", "memory", "disk",
                                      "tools", "interpreters", "user", "shell", "sh"})
        for key in ("hostname", "os", "kernel", "arch", "user", "shell", "sh"):
            self.assertIsInstance(facts[key], str, key)
            self.assertTrue(facts[key], key)
        uname = os.uname()
        self.assertEqual(facts["hostname"], uname.nodename)
        self.assertEqual(facts["kernel"], f"{uname.sysname} {uname.release}")
        self.assertEqual(facts["arch"], uname.machine)
        self.assertEqual(facts["cpus"], os.cpu_count())
        self.assertEqual(set(facts["memory"]), {"total_mib", "available_mib"})
        for v in facts["memory"].values():
            self.assertIsInstance(v, int)
            self.assertGreater(v, 0)
        self.assertLessEqual(facts["memory"]["available_mib"], facts["memory"]["total_mib"])
        disk = facts["disk"]
        self.assertEqual(set(disk), {"path", "mount", "total_mib", "free_mib"})
        self.assertEqual(disk["path"], job.run_dir)
        self.assertTrue(os.path.ismount(disk["mount"]), disk["mount"])
        st = os.statvfs(job.run_dir)
        self.assertEqual(disk["total_mib"], st.f_blocks * st.f_frsize // 1024 // 1024)
        # The free space is the same file system's (its total matches exactly), but it moves
        # while the suite's other tests run beside this one (CI runs them in parallel; the
        # bounded-memory output tests write and remove hundreds of MiB): a tolerance of 2 GiB
        # still catches a wrong unit or a wrong field.
        self.assertGreaterEqual(disk["free_mib"], 0)
        self.assertLessEqual(disk["free_mib"], disk["total_mib"])
        self.assertAlmostEqual(disk["free_mib"], st.f_bavail * st.f_frsize // 1024 // 1024, delta=2048)
        self.assertEqual(facts["sh"], os.path.realpath(shutil.which("sh", path=SYSTEM_PATH)))
        with open("/etc/os-release") as f:
            pretty = re.search(r'^PRETTY_NAME="?(.*?)"?$', f.read(), re.M).group(1)
        self.assertEqual(facts["os"], pretty)

    def test_facts_with_python3_and_nvidia_smi(self):
        for label, shell in _shells().items():
            with self.subTest(shell=label):
                job = JobRun(self, "host_facts", nvidia_smi="h200x8")
                proc = job.run(shell)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                self.assertEqual(proc.stderr, "")
                facts = job.result_json()
                self.check_shape(facts, job)
                py = facts["tools"]["python3"]
                self.assertEqual(py["path"], os.path.join(job.bin, "python3"))
                real = subprocess.run([py["path"], "--version"], capture_output=True, text=True)
                self.assertEqual("Python " + py["version"], (real.stdout or real.stderr).strip())
                self.assertEqual(facts["tools"]["nvidia-smi"], {"path": os.path.join(job.bin, "nvidia-smi")})
                self.assertEqual((facts["user"], facts["shell"]), (subprocess.run(
                    ["id", "-un"], capture_output=True, text=True).stdout.strip(), "/bin/zsh"))
                self.assertIn("python3:    " + py["path"], proc.stdout)
                self.assertIn("nvidia-smi: " + os.path.join(job.bin, "nvidia-smi"), proc.stdout)

    def test_facts_without_python3_or_nvidia_smi(self):
        for label, shell in _shells().items():
            with self.subTest(shell=label):
                job = JobRun(self, "host_facts", python3=False)
                proc = job.run(shell)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                facts = job.result_json()
                self.check_shape(facts, job)
                self.assertEqual(facts["tools"], {"python3": None, "nvidia-smi": None})
                self.assertIn("python3:    not found", proc.stdout)

    def test_interpreters_asked_for_come_back_with_path_and_version(self):
        """What `ferry check` asks: each name or absolute path in the `interpreters` parameter,
        found on PATH (or not), its version from `--version`; with and without `timeout`."""
        perl = shutil.which("perl", path=SYSTEM_PATH)
        self.assertIsNotNone(perl, "perl is not installed")
        real_perl = subprocess.run([perl, "-e", "printf '%vd', $^V"], capture_output=True, text=True).stdout
        asked = ["python3", "sh", "ferry-missing-interp", perl, "$(touch pwned)", "-x", "a b", "a,b"]
        for tools in ((), ("timeout",)):
            for label, shell in _shells().items():
                with self.subTest(shell=label, tools=tools):
                    job = JobRun(self, "host_facts", params={"interpreters": asked}, tools=tools)
                    proc = job.run(shell)
                    self.assertEqual(proc.returncode, 0, proc.stderr)
                    facts = job.result_json()
                    self.check_shape(facts, job)
                    py = os.path.join(job.bin, "python3")
                    self.assertEqual(facts["interpreters"], {
                        "python3": {"path": py, "version": facts["tools"]["python3"]["version"]},
                        "sh": {"path": os.path.join(job.bin, "sh"), "version": None},
                        "ferry-missing-interp": None,
                        perl: {"path": perl, "version": real_perl},
                    })
                    self.assertFalse(os.path.exists(os.path.join(job.run_dir, "pwned")))
                    self.assertIn(f"interpreters: python3 {py} (", proc.stdout)
                    self.assertIn("ferry-missing-interp not found", proc.stdout)

    def test_no_interpreters_asked_for_gives_an_empty_object(self):
        job = JobRun(self, "host_facts")
        proc = job.run(["/bin/sh"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(job.result_json()["interpreters"], {})
        self.assertNotIn("interpreters:", proc.stdout)

    def test_awkward_values_are_escaped(self):
        shell_value = '/odd "shell" \\ with\ttab\nand newline $HOME `id`'
        for label, shell in _shells().items():
            with self.subTest(shell=label):
                job = JobRun(self, "host_facts", run_dir_name='run "dir" \\ x $y',
                             extra_env={"SHELL": shell_value})
                proc = job.run(shell)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                facts = job.result_json()
                self.assertEqual(facts["shell"], shell_value)
                self.assertEqual(facts["disk"]["path"], job.run_dir)

    def test_without_ferry_result_stdout_is_the_json_document(self):
        for label, shell in _shells().items():
            with self.subTest(shell=label):
                job = JobRun(self, "host_facts", with_result=False)
                proc = job.run(shell)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                self.check_shape(json.loads(proc.stdout), job)
                self.assertFalse(os.path.exists(job.result))


def fake_tool(job: JobRun, name: str, script: str) -> None:
    """A stand-in for `name` in the job's sandbox PATH (replacing a real one linked there)."""
    path = os.path.join(job.bin, name)
    if os.path.lexists(path):
        os.unlink(path)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + script)
    os.chmod(path, 0o755)


# Text a host's logs and process table may hold: quotes, a backslash, a tab, an escape
# sequence, UTF-8. The result must stay valid JSON, bytes outside printable ASCII shown as '?'.
AWKWARD = 'say "hi" \\ back\ttab \x1b[31mred caf\u00e9'
AWKWARD_SHOWN = 'say "hi" \\ back\ttab ?[31mred caf??'


class Diagnostics(unittest.TestCase):
    """The read-only diagnostics set (issue 42.11): disk_usage, memory_usage, kernel_log,
    service_log: their results' shape, escaping, and the notes when a source is unreadable."""

    def run_job(self, job: JobRun, shell=("/bin/sh",)):
        proc = job.run(list(shell))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return job.result_json(), proc.stdout

    def test_disk_usage_lists_every_filesystem_df_reports(self):
        for label, shell in _shells().items():
            with self.subTest(shell=label):
                job = JobRun(self, "disk_usage")
                result, text = self.run_job(job, shell)
                mounts = {fs["mount"]: fs for fs in result["filesystems"]}
                self.assertIn("/", mounts)
                st = os.statvfs("/")
                self.assertEqual(mounts["/"]["total_mib"], st.f_blocks * st.f_frsize // 1024 // 1024)
                for fs in result["filesystems"]:
                    self.assertEqual(set(fs), {"filesystem", "mount", "total_mib", "used_mib",
                                               "free_mib", "used_percent"})
                    self.assertTrue(0 <= fs["used_percent"] <= 100, fs)
                self.assertIn(" MiB free", text)
        job = JobRun(self, "disk_usage")
        fake_tool(job, "df", "printf 'Filesystem 1024-blocks Used Available Capacity Mounted on\\n'\n"
                             f"printf '%s 2048 1024 1024 50%% /mnt/my disk\\n' '{AWKWARD}'\n")
        result, _ = self.run_job(job)
        # df's columns are split on blanks: the tab comes back as one space.
        self.assertEqual(result["filesystems"], [{"filesystem": AWKWARD_SHOWN.replace("\t", " "),
                                                  "mount": "/mnt/my disk",
                                                  "total_mib": 2, "used_mib": 1, "free_mib": 1,
                                                  "used_percent": 50}])

    def test_memory_usage_gives_totals_and_the_ten_largest_processes(self):
        job = JobRun(self, "memory_usage", tools=("ps",))
        result, text = self.run_job(job)
        self.assertGreater(result["total_mib"], 0)
        self.assertLessEqual(result["available_mib"], result["total_mib"])
        rss = [p["rss_mib"] for p in result["top"]]
        self.assertTrue(1 <= len(rss) <= 10, result["top"])
        self.assertEqual(rss, sorted(rss, reverse=True))
        self.assertIn("MiB available", text)
        lines = "".join(f"{pid} {pid * 1024} proc{pid}\\n" for pid in range(1, 13))
        fake_tool(job, "ps", f"printf '{lines}'\nprintf '99 99999 %s\\n' '{AWKWARD}'\n")
        result, _ = self.run_job(job)
        self.assertEqual([p["pid"] for p in result["top"]], [99, 12, 11, 10, 9, 8, 7, 6, 5, 4])
        self.assertEqual(result["top"][0], {"pid": 99, "rss_mib": 97, "command": AWKWARD_SHOWN})

    def test_kernel_log_from_dmesg_else_the_journal_else_a_note(self):
        dmesg_denied = "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1\n"
        lines = "".join(f"[{i}.0] line {i}\\n" for i in range(1, 31))
        job = JobRun(self, "kernel_log", params={"lines": 20}, tools=("tail", "head"))
        fake_tool(job, "dmesg", f"printf '{lines}'\nprintf '%s\\n' '{AWKWARD}'\n")
        result, _ = self.run_job(job)
        self.assertEqual(result["source"], "dmesg")
        self.assertEqual(result["lines"], [f"[{i}.0] line {i}" for i in range(12, 31)] + [AWKWARD_SHOWN])
        fake_tool(job, "dmesg", dmesg_denied)
        fake_tool(job, "journalctl", 'printf "%s\\n" "$*" >"$FERRY_RUN_DIR/journal.args"\necho "kernel: hello"\n')
        result, _ = self.run_job(job)
        self.assertEqual((result["source"], result["lines"]), ("journal", ["kernel: hello"]))
        with open(os.path.join(job.run_dir, "journal.args")) as f:
            self.assertEqual(f.read().split(), ["-k", "-n", "20", "--no-pager", "-q", "-o", "short-iso"])
        fake_tool(job, "journalctl", "echo 'No journal files were found.' >&2; exit 1\n")
        result, text = self.run_job(job)
        self.assertEqual((result["source"], result["lines"]), (None, []))
        self.assertEqual(result["note"], "kernel messages are not readable here (dmesg: dmesg: read kernel "
                                         "buffer failed: Operation not permitted; journalctl: No journal "
                                         "files were found.)")
        self.assertIn("note: kernel messages are not readable here", text)

    def test_service_log_asks_for_the_unit_and_checks_its_name_again(self):
        job = JobRun(self, "service_log", params={"service": "nginx.service", "lines": 100},
                     tools=("head",))
        fake_tool(job, "systemctl", 'echo "$*" >"$FERRY_RUN_DIR/systemctl.args"; echo active\n')
        fake_tool(job, "journalctl", 'printf "%s\\n" "$*" >"$FERRY_RUN_DIR/journal.args"\n'
                                     f"printf '%s\\n' 'started' '{AWKWARD}'\n")
        for label, shell in _shells().items():
            with self.subTest(shell=label):
                result, text = self.run_job(job, shell)
                self.assertEqual(result, {"service": "nginx.service", "state": "active",
                                          "lines": ["started", AWKWARD_SHOWN]})
                with open(os.path.join(job.run_dir, "journal.args")) as f:
                    self.assertEqual(f.read().split(), ["-u", "nginx.service", "-n", "100", "--no-pager",
                                                        "-q", "-o", "short-iso"])
                self.assertTrue(text.startswith("nginx.service: active\n"), text)
        for bad in ("-o", "../x", "a b", "a;b", ""):
            with self.subTest(service=bad):
                job = JobRun(self, "service_log", params={"service": bad})
                proc = job.run(["/bin/sh"])
                self.assertEqual(proc.returncode, 2, proc.stdout)
                self.assertIn("the service must be a unit name", proc.stderr)


if __name__ == "__main__":
    unittest.main()
