# ferry's python standby (src/remote/standby.py; docs/persistence.md, "The python standby")
#
# A held session's next run, started ahead while nobody waits; or a direct connection's first
# python3 job's run, started while its files go up, once the job cache is seen to hold this file.
# The session opens a channel whose command is `python3 -I -S ENTRY ferry-standby` (ENTRY: this file
# in the job cache of the run base). This process then starts, ahead too, the next job's own
# interpreter (`python3 -c ...` running BOOT, below), in a session of its own, with the environment
# a job gets from launch.sh (the login environment's PATH, HOME, USER, LANG, TERM and LC_*), stdin
# from /dev/null and SIGINT and SIGQUIT ignored, as an asynchronous command of sh gets them. BOOT
# waits on its descriptor 3. This process waits on stdin for the run's line, the one a standby sh
# gets: `exec /bin/sh RUN_DIR/launch.sh`; or, for a run whose files ferry left to it, `stage RUN_DIR
# LAUNCH JOB ENTRY SIZE` and launch.sh's SIZE bytes: it makes the run directory, the job's link to
# its job cache ENTRY and launch.sh itself, then goes on as for that line.
#
# A direct connection's only run, when this machine's note says the job cache held this file at
# its last sweep, makes no SFTP step at all (docs/run-protocol.md, "A first run without SFTP"):
# its channel's sh execs this file through ferry's verifier with `once ferry-standby` (nothing
# started ahead), and its line is `stage-first RUN_DIR LAUNCH JOB ENTRY SIZE JOB_SIZE`, then
# launch.sh's and the job's bytes: the run base is judged as ferry's SFTP steps judge it (exit 3
# when refused, before anything is made), the job cache's entry made when missing or used when
# its bytes match the job's sha256 (one not as ferry leaves it is named on stderr before the run,
# for ferry's warning, and made anew), and the run staged as above.
#
# launch.sh carries a `# ferry-standby 2 ...` line when its job may run here: no declared
# environment; its last field is the job's interpreter. Then this process does what launch.sh
# does, in the same order and with the same report (docs/run-protocol.md), starting no process
# but the job: the sentinels, params.json and the state file (umask 077), the job, the deadline
# (or USR1), stops by TERM, INT and HUP, the job's group killed at its end, the result section,
# the run directory removed (what it could not remove itself, by `rm -rf`). A python3 job is the
# interpreter started ahead, told the run directory and the FERRY_* variables: it becomes
# `python3 RUN_DIR/JOB`. Any other job (or a python3 job whose interpreter started ahead has gone)
# is started as launch.sh's `setsid env -i ... INTERPRETER RUN_DIR/JOB` starts it, the
# interpreter looked up in the login PATH. Any other line, a
# launch.sh without that line, an interpreter or setsid not found there, a login environment with
# SLURM_JOB_ID set (launch.sh passes the scheduler's variables on), or a run launch.sh refuses (its
# directory gone, params.json not written): this process execs `/bin/sh RUN_DIR/launch.sh` as the
# sh would have, with the environment it was started with and default signal dispositions.
#
# After the report of a job it ran, this process stays for the next run on the same channel: it
# ends the run's stderr with `END_MARKER stay`, starts the next interpreter ahead (after a python3
# job's run; after any other job's, the next job is taken to be like it: its interpreter is
# started when its run comes) and reads the next line. It ends with the job's code instead after a
# stop, when a process other than itself and its ancestors still holds its stdout or stderr (one
# that left the job's group could write into the next run's output), or when the run's line ended
# in ` last` (a direct connection's last run: nothing follows on this channel).
#
# Only modules that are built in or frozen are imported, and from the python's own library ctypes
# (to make this process not dumpable and its jobs' subreaper: keep_to_itself; not a `once`
# standby), _sha256 (to hash a job's cache entry: job_intact) and _socket (the interpreter's
# descriptor 3); -I -S: nothing of the user's or the run's can stand in for them. Python
# changes its own environment at start (PEP 538 sets LC_CTYPE under the C locale): the
# environment passed on is the one in /proc/self/environ, as this process got it. Without /proc
# this process ends at once, and the holder's later standbys are sh's.
import errno
import posix as os  # os's own import took 2 ms of a 22 ms start: posix and the few helpers below
import sys
import time

import _signal

LOGIN_NAMES = [b"PATH", b"HOME", b"USER", b"LANG", b"TERM", b"LC_ALL", b"LC_CTYPE", b"LC_NUMERIC",
               b"LC_TIME", b"LC_COLLATE", b"LC_MONETARY", b"LC_MESSAGES", b"LC_PAPER",
               b"LC_NAME", b"LC_ADDRESS", b"LC_TELEPHONE", b"LC_MEASUREMENT",
               b"LC_IDENTIFICATION"]
# The `# ferry-standby` line's prefix and its fields' names, in their order: standby_script()
# fills them in from the list that writes the line (src/remote/launcher.cpp), the only one. As it
# is in the source tree, unfilled, this file matches no launch.sh, and leaves every run to it.
SPEC_PREFIX = b"@standby_prefix@ "
SPEC_FIELDS = "@standby_fields@".split()
# A `once` standby's line on stderr, before the run's sentinel, when the job's entry in the job
# cache was there but not as ferry leaves it (cache_entry): `ENTRY_REFUSED ENTRY REASON`, REASON
# ENTRY_MISMATCH (its bytes) or ENTRY_UNLIKE (its type, owner, mode or size). ferry takes the
# line out of what came before the run and warns (job-cache-refused).
ENTRY_REFUSED = b"@entry_refused@"
ENTRY_MISMATCH = b"@entry_mismatch@"
ENTRY_UNLIKE = b"@entry_unlike@"
STOPS = {_signal.SIGTERM: 143, _signal.SIGINT: 130, _signal.SIGHUP: 129}
# USR1 is how launch.sh's watchdog tells it the deadline has passed; from anyone, it is the
# deadline.
WATCHED = {_signal.SIGCHLD, _signal.SIGUSR1, *STOPS}
# The jobs' watchdog, as launch.sh has one: a job that killed this process (its parent) would
# otherwise outlive its deadline. One for this process's life, not one per run: a sh in a session of
# its own (its `sh -c` forks it into the background and ends, before this process becomes its jobs'
# subreaper, so that it is nobody's child here), reading on its descriptor 3, a pipe, each run's
# `arm DEADLINE TIMEOUT GRACE JOB` (DEADLINE in seconds since the epoch) and `disarm`. The pipe's
# end (this process has gone: only it holds the other end, close-on-exec) with a run armed is when
# it acts: at the deadline (TIMEOUT s from then without `date +%s`) it stops the job's group as
# stop() would, TERM then KILL after the grace. Otherwise it ends.
WATCHDOG = (b'cd / || exit 0; { at=; '
            b'while read -r word deadline timeout grace job <&3; do case $word in '
            b'arm) at=$deadline t=$timeout g=$grace j=$job ;; *) at= ;; esac; done; '
            b'[ -n "$at" ] || exit 0; now=$(date +%s 2>/dev/null); '
            b'case $now in ""|*[!0-9]*) left=$t ;; *) left=$((at - now)) ;; esac; '
            b'[ "$left" -gt 0 ] && sleep "$left"; '
            b'kill -TERM -"$j" "$j" 2>/dev/null; sleep "$g"; kill -KILL -"$j" "$j" 2>/dev/null; } &')
WATCHDOG_LINE = [None]  # the write end of the watchdog's pipe; None once it has gone
# After a run, the next run's interpreter waits while the host's CPUs are oversubscribed: more
# than CROWDED runnable tasks for each CPU this process may use. It waits CROWDED_WAIT_S at most.
CROWDED = 8
CROWDED_WAIT_S = 30


def fsdecode(name):
    return name.decode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())


def dirname(path):
    # posixpath.dirname
    sep = b"/" if isinstance(path, bytes) else "/"
    head = path[:path.rfind(sep) + 1]
    return head.rstrip(sep) if head and head != sep * len(head) else head


def basename(path):
    return path[path.rfind(b"/" if isinstance(path, bytes) else "/") + 1:]


def S_IMODE(mode):
    return mode & 0o7777


def S_ISDIR(mode):
    return (mode & 0o170000) == 0o040000


def S_ISREG(mode):
    return (mode & 0o170000) == 0o100000


def S_ISLNK(mode):
    return (mode & 0o170000) == 0o120000


def isfile(path):
    try:
        return S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def lexists(path):
    try:
        os.lstat(path)
    except (OSError, ValueError):
        return False
    return True


def is_directory(path):
    # A directory, not a link to one.
    try:
        return S_ISDIR(os.lstat(path).st_mode)
    except (OSError, ValueError):
        return False

# What the interpreter started ahead runs: `python3 -c 'exec(__import__("os").read(3, SIZE))'`
# reads it as the first SIZE bytes on its descriptor 3. It imports nothing that a fresh
# python has not loaded already, defines no global that outlives it, and then is the job:
# sys.argv, sys.path[0], __main__ (the same module, its __file__, __cached__ and __loader__),
# the directory, the environment and the exit status are those of `python3 RUN_DIR/JOB`, and a
# traceback shows the job's frames only.
BOOT = r'''
def _ferry_boot():
    import sys, os
    main = sys.modules["__main__"]
    del main.__dict__["_ferry_boot"]
    data = b""
    while True:
        chunk = os.read(3, 65536)
        if not chunk:
            break
        data += chunk
    os.close(3)
    fields = data.split(b"\0")
    if len(fields) < 3 or len(fields) % 2 == 0:
        os._exit(0)
    run_dir, job = os.fsdecode(fields[0]), os.fsdecode(fields[1])
    os.chdir(run_dir)
    # An LC_CTYPE this python set itself at its start (PEP 538) comes after the FERRY_*
    # variables, as it does in a python started with them.
    coerced = os.environ.pop("LC_CTYPE", None) if fields[2] == b"0" else None
    for i in range(3, len(fields), 2):
        os.environ[os.fsdecode(fields[i])] = os.fsdecode(fields[i + 1])
    if coerced is not None:
        os.environ["LC_CTYPE"] = coerced
    path = job
    for _ in range(40):
        try:
            target = os.readlink(path)
        except OSError:
            break
        path = target if target.startswith("/") else os.path.dirname(path) + "/" + target
    if sys.path and sys.path[0] == "":
        del sys.path[0]
    if not sys.flags.safe_path:
        sys.path.insert(0, os.path.dirname(path))
    sys.argv[:] = [job]
    import _frozen_importlib_external
    main.__loader__ = _frozen_importlib_external.SourceFileLoader("__main__", job)
    main.__file__ = job
    main.__cached__ = None
    try:
        with open(job, "rb") as f:
            source = f.read()
    except OSError as e:
        os.write(2, ("python3: can't open file %r: [Errno %d] %s\n"
                     % (job, e.errno, e.strerror)).encode())
        os._exit(2)
    def uncaught(e):
        sys.excepthook(type(e), e, e.__traceback__)
        sys.exit(130 if isinstance(e, KeyboardInterrupt) else 1)
    try:
        code = compile(source, job, "exec", dont_inherit=True)
    except SyntaxError as e:
        uncaught(e.with_traceback(None))
    del source
    try:
        exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as e:
        uncaught(e.with_traceback(e.__traceback__.tb_next))
_ferry_boot()
'''
BOOT_CODE = BOOT.encode()


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def say(fd, data):
    # A line of the launcher's own (a sentinel, a message) on stdout or stderr. A write that fails
    # changes nothing, as a failed printf changes nothing for launch.sh: nobody reads any more (the
    # connection has gone), the run goes on, and its end removes the run directory.
    try:
        write_all(fd, data)
    except OSError:
        pass


def original_environment():
    # [(name, value)] as this process was given them; None without /proc.
    try:
        with open("/proc/self/environ", "rb") as f:
            block = f.read()
    except OSError:
        return None
    pairs = []
    for entry in block.split(b"\0"):
        name, equals, value = entry.partition(b"=")
        if equals and name:
            pairs.append((name, value))
    return pairs


def job_environment(environment):
    # launch.sh's set: each login name that is set, in its order; of a name given twice, the last
    # value, as /bin/sh (dash, bash) takes it.
    given = dict(environment)
    return {name: given[name] for name in LOGIN_NAMES if name in given}


def start_program(path, argv, environment):
    # A job's interpreter, as `setsid env -i ENVIRONMENT ARGV &` in launch.sh starts it: a
    # session of its own, stdin from /dev/null, SIGINT and SIGQUIT ignored (an asynchronous
    # command of sh), every other signal at its default and none blocked. By posix_spawn, which
    # glibc does without copying this process (a fork of python cost 14 ms of CPU on the
    # development VM, two thirds of a python start); glibc leaves its own internal signals 32 and
    # 33 ignored in the program it starts, which a program that uses them sets up itself (the
    # job's python started ahead has them so too). Its pid; raises OSError when the program
    # cannot be started.
    ignored = (_signal.SIGINT, _signal.SIGQUIT)
    saved = [_signal.signal(s, _signal.SIG_IGN) for s in ignored]
    try:
        return os.posix_spawn(
            path, argv, environment,
            file_actions=[(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0)],
            setsid=True, setsigmask=(),
            setsigdef=[s for s in _signal.valid_signals() if s not in ignored
                       and s not in (_signal.SIGKILL, _signal.SIGSTOP)])
    finally:
        for s, handler in zip(ignored, saved):
            _signal.signal(s, handler)


def find_program(name, environment):
    # The file `command -v NAME` names in the login environment's PATH, as launch.sh looks the
    # interpreter up; None when there is none, or when the name is one this process leaves to
    # launch.sh (a relative path, an empty PATH entry: both depend on its directory).
    def runnable(path):
        return isfile(path) and os.access(path, os.X_OK)
    if not name:
        return None
    if b"/" in name:
        return name if name.startswith(b"/") and runnable(name) else None
    for directory in job_environment(environment).get(b"PATH", b"").split(b":"):
        if not directory.startswith(b"/"):
            return None
        if runnable(directory + b"/" + name):
            return directory + b"/" + name
    return None


class Interpreter:
    # The job's python, started ahead; waits on its descriptor 3 for the run.
    def __init__(self, environment):
        self.pid = None
        self.go = None
        given = job_environment(environment)
        self.lc_ctype_given = b"LC_CTYPE" in given
        # A socket pair, not a pipe: /proc/PID/fd/3 of the interpreter (dumpable, as a job's
        # python is) cannot be opened as a socket can never be, so no other process of the user's
        # can write a run of its own into it, or read this one's (docs/persistence.md).
        try:
            import _socket
            pair = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
        except (ImportError, OSError):
            return  # no pid: the standby ends (3), and the holder's later standbys are sh's
        read, write = pair[0].detach(), pair[1].detach()
        if read == 3:
            read = os.dup(read)
            os.close(3)
        null = "/dev/null"
        ignored = (_signal.SIGINT, _signal.SIGQUIT)
        saved = [_signal.signal(s, _signal.SIG_IGN) for s in ignored]
        try:
            self.pid = os.posix_spawnp(
                "python3", ["python3", "-c", 'exec(__import__("os").read(3, %d))' % len(BOOT_CODE)],
                given,
                file_actions=[(os.POSIX_SPAWN_OPEN, 0, null, os.O_RDONLY, 0),
                              (os.POSIX_SPAWN_DUP2, read, 3)],
                setsid=True, setsigmask=(),
                setsigdef=[s for s in _signal.valid_signals() if s not in ignored
                           and s not in (_signal.SIGKILL, _signal.SIGSTOP)])
            self.go = write
            write_all(write, BOOT_CODE)  # one write, far under the socket's buffer: read whole
        except OSError:
            os.close(write)
        finally:
            os.close(read)
            for s, handler in zip(ignored, saved):
                _signal.signal(s, handler)

    def alive(self):
        if self.pid is None:
            return False
        try:
            return os.waitpid(self.pid, os.WNOHANG)[0] == 0
        except ChildProcessError:
            return False

    def dismiss(self):
        # Its descriptor 3 ends: it leaves without running anything.
        if self.go is not None:
            os.close(self.go)
            self.go = None


    def discard(self):
        # Not needed for this run: ended now and waited for. Sent away by its descriptor 3
        # alone, it would hold this channel's stdout and stderr until its own start-up is done,
        # and this process would not stay after a quick run (output_held_elsewhere).
        self.dismiss()
        if self.pid is not None:
            try:
                os.kill(self.pid, _signal.SIGKILL)  # its own session: never the job's
                os.waitpid(self.pid, 0)
            except OSError:
                pass
            self.pid = None


class NoInterpreter:
    # None started ahead: the run before on this channel was not a python3 job's.
    pid = None
    go = None

    def alive(self):
        return False

    def dismiss(self):
        pass

    def discard(self):
        pass


PENDING = [b""]  # what stdin gave past the last line


def read_line():
    line = PENDING[0]
    while b"\n" not in line:
        chunk = os.read(0, 4096)
        if not chunk:
            return None
        line += chunk
    line, _, PENDING[0] = line.partition(b"\n")
    return line


SUBREAPER = [None]  # the C library, once keep_to_itself made this process its jobs' subreaper


def no_leftover():
    # Whether the run left no process at all: as the jobs' subreaper this process is then the
    # parent of none (ECHILD once the dead are reaped). Its group killed a moment ago, a job's
    # process may still be ending: looked at for 20 ms. Nobody else's process was ever its child:
    # `rm` and a discarded interpreter are waited for before a run's report, and the watchdog is
    # init's (start_watchdog).
    if SUBREAPER[0] is None:
        return False
    deadline = time.monotonic() + 0.02
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] != 0:
                continue  # one reaped; another may be there
        except ChildProcessError:
            return True
        except OSError:
            return False
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)


def output_held_elsewhere():
    # Whether a process other than this one and its ancestors (sshd, a login shell that did not
    # exec) still holds this channel's stdout or stderr: one that left the job's group, which
    # could write into the next run's output. None when the run left no process (no_leftover:
    # what every run of a subreaper standby costs, where the look through /proc below costs a
    # scan of every process of the host). A process killed a moment ago may not have let go
    # yet: looked at twice, 20 ms apart.
    if no_leftover():
        return False
    try:
        mine = {os.readlink("/proc/self/fd/1"), os.readlink("/proc/self/fd/2")}
        ancestors = set()
        pid = os.getpid()
        while pid > 1 and pid not in ancestors:
            ancestors.add(pid)
            with open("/proc/%d/stat" % pid, "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return True
    uid = os.getuid()
    for attempt in range(2):
        if attempt:
            time.sleep(0.02)
        held = False
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) in ancestors:
                continue
            try:
                if entry.stat().st_uid != uid:
                    continue
                for fd in os.listdir("/proc/%s/fd" % entry.name):
                    if os.readlink("/proc/%s/fd/%s" % (entry.name, fd)) in mine:
                        held = True
                        break
            except OSError:
                continue
            if held:
                break
        if not held:
            return False
    return True


def read_spec(launch):
    # The run's fields from launch.sh's `# ferry-standby` line; None when it has none.
    try:
        with open(launch, "rb") as f:
            head = f.read(16384)
    except OSError:
        return None
    return spec_of(head)


def spec_of(head):
    for line in head.split(b"\n")[:8]:
        if line.startswith(SPEC_PREFIX):
            try:
                values = [bytes.fromhex(v.decode()) for v in line[len(SPEC_PREFIX):].split(b" ")]
            except ValueError:
                return None
            if len(values) != len(SPEC_FIELDS):
                return None
            spec = dict(zip(SPEC_FIELDS, values))
            for number in ("timeout", "grace", "timeout_exit", "params_size", "frame_limit",
                           "keep"):
                if not spec[number].isdigit():
                    return None
                spec[number] = int(spec[number])
            return spec
    return None


def read_exact(size):
    # The next `size` bytes of stdin (after the line); None when it ends first.
    data = PENDING[0]
    while len(data) < size:
        chunk = os.read(0, max(65536, size - len(data)))
        if not chunk:
            return None
        data += chunk
    PENDING[0] = data[size:]
    return data[:size]


def plain_name(name):
    return name not in (b"", b".", b"..") and b"/" not in name


def stage(words, interpreter):
    # `stage RUN_DIR LAUNCH JOB ENTRY SIZE`, then SIZE bytes: launch.sh. Makes the run directory
    # (0700), the job's link to its job cache entry and launch.sh (0600, O_EXCL), as ferry's SFTP
    # steps would have, and returns launch.sh's path. A run that cannot be staged ends as a
    # launcher that cannot change into its directory does: its sentinels, the reason, 125.
    run_dir, launch_name, job_file, entry, size = words
    if (not size.isdigit() or not run_dir.startswith(b"/") or not plain_name(launch_name)
            or not plain_name(job_file)):
        interpreter.dismiss()
        say(2, b"ferry-standby: not a stage line\n")
        os._exit(125)
    payload = read_exact(int(size))
    if payload is None:
        interpreter.dismiss()
        os._exit(0)
    return make_run_files(run_dir, launch_name, job_file, entry, None, payload, interpreter)


def make_run_files(run_dir, launch_name, job_file, entry, job, payload, interpreter):
    # The run directory, the job (a link to ENTRY, or JOB's bytes when there is no entry) and
    # launch.sh (PAYLOAD); launch.sh's path.
    launch = run_dir + b"/" + launch_name
    made = False
    try:
        os.mkdir(run_dir, 0o700)
        made = True
        os.chmod(run_dir, 0o700)
        if entry is not None:
            os.symlink(entry, run_dir + b"/" + job_file)
        else:
            write_new(run_dir + b"/" + job_file, job)
        write_new(launch, payload)
    except OSError as e:
        interpreter.dismiss()
        if made:
            remove_tree(fsdecode(run_dir))
        spec = spec_of(payload[:16384])
        if spec is not None:
            say(1, spec["sentinel"] + b"\n")
            say(2, spec["sentinel"] + b"\n")
        say(2, ("ferry-standby: cannot stage the run in %s: %s\n"
                % (fsdecode(run_dir), e.strerror)).encode())
        os._exit(125)
    return fsdecode(launch)


def stage_first(words, interpreter):
    # `stage-first RUN_DIR LAUNCH JOB ENTRY SIZE JOB_SIZE`, then SIZE bytes (launch.sh) and
    # JOB_SIZE bytes (the job): a direct connection's run that made no SFTP step at all. The run
    # base (RUN_DIR's parent) is judged before anything is made; one refused ends this process
    # with 3 before any line of the run, as a standby that cannot start here: ferry then stages
    # the run over SFTP, which says what is wrong.
    run_dir, launch_name, job_file, entry, size, job_size = words
    base = dirname(run_dir)
    if (not size.isdigit() or not job_size.isdigit() or not run_dir.startswith(b"/")
            or not plain_name(basename(run_dir)) or not plain_name(launch_name)
            or not plain_name(job_file) or dirname(entry) != base
            or not basename(entry).startswith(b"ferry-job-")):
        interpreter.dismiss()
        say(2, b"ferry-standby: not a stage line\n")
        os._exit(125)
    if not base_trusted(base):
        os._exit(3)
    payload = read_exact(int(size))
    job = read_exact(int(job_size)) if payload is not None else None
    if job is None:
        interpreter.dismiss()
        os._exit(0)
    if not cache_entry(entry, job):
        entry = None  # the job goes into the run directory as a file of its own
    return make_run_files(run_dir, launch_name, job_file, entry, job, payload, interpreter)


def base_trusted(base):
    # ferry's rule for the run base (src/transport/ssh/base_trust.cpp), with this process's uid as
    # the user's: the base and every directory above it up to the first of root's are real
    # directories (lstat: not links), the base this user's, those above it this user's or root's,
    # and none writable by group or others but root's sticky ones (/tmp); the base itself not
    # such a shared one.
    parts = base.split(b"/")
    if base == b"/" or parts[0] != b"" or any(p in (b"", b".", b"..") for p in parts[1:]):
        return False
    uid = os.getuid()
    path = base
    while True:
        try:
            st = os.lstat(path)
        except OSError:
            return False
        mode = S_IMODE(st.st_mode)
        if not S_ISDIR(st.st_mode):
            return False
        shared = st.st_uid == 0 and mode & 0o1000 and mode & 0o002
        if path == base:
            if shared or st.st_uid != uid or mode & 0o022:
                return False
        elif st.st_uid not in (uid, 0) or (mode & 0o022 and not shared):
            return False
        if st.st_uid == 0 or path == b"/":
            return True
        path = dirname(path)


def cache_entry(entry, job):
    # Whether the job cache's ENTRY holds the job: used only as ferry leaves one (a regular file
    # of this user's, mode 0400) whose bytes match the job's sha256, touched once a day so that
    # the cleanup sees it in use; anything else at its name is said (ENTRY_REFUSED), removed and
    # the entry made anew (a temporary name, mode 0400, O_EXCL, then renamed into place, as an
    # upload makes it).
    try:
        st = os.lstat(entry)
    except OSError:
        st = None
    if st is not None:
        as_left = (S_ISREG(st.st_mode) and st.st_uid == os.getuid()
                   and S_IMODE(st.st_mode) == 0o400 and st.st_size == len(job))
        if as_left and sha256_hex(entry) == bytes_sha256(job):
            if time.time() - st.st_mtime > 86400:
                try:
                    os.utime(entry)
                except OSError:
                    pass
            return True
        # An entry appears whole, by a rename, as ferry leaves it: anything else there was put or
        # changed by a process on the host. Said for ferry's warning, then made anew.
        say(2, ENTRY_REFUSED + entry + b" " + (ENTRY_MISMATCH if as_left else ENTRY_UNLIKE)
            + b"\n")
        try:
            os.unlink(entry)  # a directory stays: the rename onto it fails
        except OSError:
            pass
    upload = dirname(entry) + b"/.ferry-job-" + os.urandom(16).hex().encode()
    try:
        fd = os.open(upload, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
    except OSError:
        return False
    try:
        try:
            write_all(fd, job)
        finally:
            os.close(fd)
        os.rename(upload, entry)
        return True
    except OSError:
        try:
            os.unlink(upload)
        except OSError:
            pass
        return False


def write_new(path, data):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def as_sh_would(launch, environment, interpreter):
    # `exec /bin/sh LAUNCH`, as the standby's sh would have run it.
    interpreter.dismiss()
    for s in (_signal.SIGPIPE, _signal.SIGXFSZ):
        _signal.signal(s, _signal.SIG_DFL)
    _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
    if SUBREAPER[0] is not None:
        SUBREAPER[0].prctl(36, 0, 0, 0, 0)  # kept across an exec: launch.sh's sh is none
    try:
        os.execve("/bin/sh", ["/bin/sh", launch], dict(environment))
    except OSError as e:
        say(2, ("/bin/sh: %s\n" % e.strerror).encode())
        os._exit(127)


class Run:
    # `program`: the job's interpreter, started for the run (its path); None: the python
    # started ahead becomes the job.
    def __init__(self, spec, launch, interpreter, environment, program):
        self.spec = spec
        self.launch = launch
        self.job = interpreter.pid
        self.interpreter = interpreter
        self.environment = environment
        self.program = program
        self.run_dir = fsdecode(spec["run_dir"])
        self.result = self.run_dir + "/result.json"

    def prepare(self):
        # launch.sh's steps that may refuse the run: into the run directory, params.json and the
        # state file (umask 077). Taken before the sentinels rather than after (nobody can tell
        # the difference); False when launch.sh would refuse the run (its directory gone,
        # params.json not written): the run is then left to launch.sh, to refuse in its words.
        try:
            os.chdir(self.spec["run_dir"])
        except OSError:
            return False
        old = os.umask(0o077)
        try:
            return self.write_params()
        finally:
            os.umask(old)

    def start(self):
        spec = self.spec
        run_dir = spec["run_dir"]
        ferry_env = [(b"FERRY_RUN_DIR", run_dir), (b"FERRY_PARAMS", run_dir + b"/params.json"),
                     (b"FERRY_RESULT", run_dir + b"/result.json"), (b"FERRY_JOB", spec["job_name"])]
        say(1, spec["sentinel"] + b"\n")
        say(2, spec["sentinel"] + b"\n")
        if self.program is not None:
            self.start_program(ferry_env)
            self.arm_watchdog()
            return
        message = [run_dir, run_dir + b"/" + spec["job_file"],
                   b"1" if self.interpreter.lc_ctype_given else b"0"]
        for name, value in ferry_env:
            message += [name, value]
        try:
            write_all(self.interpreter.go, b"\0".join(message))
        except OSError:
            pass  # it has gone: its exit status is the job's, as a crash at start would be
        self.interpreter.dismiss()
        self.arm_watchdog()

    def arm_watchdog(self):
        if self.job is not None:
            tell_watchdog(b"arm %d %d %d %d\n" % (int(time.time()) + 1 + self.spec["timeout"],
                                                   self.spec["timeout"], self.spec["grace"], self.job))

    def disarm_watchdog(self):
        if self.job is not None:
            tell_watchdog(b"disarm\n")

    def start_program(self, ferry_env):
        # `setsid env -i LOGIN_NAMES FERRY_* INTERPRETER RUN_DIR/JOB`, from the run directory.
        environment = job_environment(self.environment)
        environment.update(ferry_env)
        argv = [self.spec["interpreter"], self.spec["run_dir"] + b"/" + self.spec["job_file"]]
        try:
            self.job = start_program(self.program, argv, environment)
        except OSError as e:
            # What `env` says and exits with when it cannot run the program it was given.
            say(2, ("env: '%s': %s\n" % (fsdecode(argv[0]), e.strerror)).encode())
            self.job = None
            self.failed = 127 if e.errno == errno.ENOENT else 126

    def write_params(self):
        spec = self.spec
        try:
            params = b""
            if spec["params_size"]:
                with open(self.launch, "rb") as launch:
                    launch.seek(-spec["params_size"], 2)
                    params = launch.read(spec["params_size"])
            with open(self.run_dir + "/params.json", "wb") as out:
                out.write(params)
        except OSError:
            return False
        try:
            with open(self.run_dir + "/" + fsdecode(spec["state_file"]), "w") as state:
                state.write("%d +%d\n" % (os.getpid(), spec["timeout"] + spec["grace"]))
        except OSError:
            pass  # best effort, as in launch.sh
        return True

    def signal_job(self, signum):
        for kill in (os.killpg, os.kill):
            try:
                kill(self.job, signum)
            except OSError:
                pass

    def reaped(self):
        try:
            pid, status = os.waitpid(self.job, os.WNOHANG)
        except ChildProcessError:
            return 0
        if pid != self.job:
            return None
        return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    def wait(self):
        # (code, cause) once the job ends, the deadline passes or a stop comes.
        deadline = time.monotonic() + self.spec["timeout"]
        if self.job is None:
            return self.failed, "exit"
        while True:
            code = self.reaped()
            if code is not None:
                return code, "exit"
            left = deadline - time.monotonic()
            if left <= 0:
                try:
                    open(self.run_dir + "/" + fsdecode(self.spec["timeout_marker"]), "w").close()
                except OSError:
                    pass
                return self.spec["timeout_exit"], "timeout"
            info = _signal.sigtimedwait(WATCHED, left)
            if info is not None and info.si_signo == _signal.SIGUSR1:
                return self.spec["timeout_exit"], "timeout"
            if info is not None and info.si_signo in STOPS:
                return STOPS[info.si_signo], "stopped"

    def stop(self):
        self.signal_job(_signal.SIGTERM)
        deadline = time.monotonic() + self.spec["grace"]
        while self.reaped() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            _signal.sigtimedwait({_signal.SIGCHLD}, left)
        self.signal_job(_signal.SIGKILL)
        try:
            os.waitpid(self.job, 0)
        except ChildProcessError:
            pass

    def result_section(self):
        # (the section's bytes, whether result.json is left for ferry to fetch)
        try:
            mode = os.lstat(self.result).st_mode
        except OSError:
            return b"result none\n", False
        if S_ISLNK(mode):
            return b"result link\n", False
        if S_ISDIR(mode):
            return b"result directory\n", False
        if not S_ISREG(mode):
            return b"result special\n", False
        limit = self.spec["frame_limit"]
        # Opened without waiting and looked at once open: a process the job left may have put a
        # FIFO (or a link) at the name since the lstat, and a plain open of a FIFO waits for a
        # writer for ever.
        try:
            fd = os.open(self.result, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError as e:
            return (b"result link\n", False) if e.errno == errno.ELOOP else (b"result fetch\n", True)
        try:
            if not S_ISREG(os.fstat(fd).st_mode):
                return b"result special\n", False
            data = b""
            while len(data) <= limit:
                chunk = os.read(fd, limit + 1 - len(data))
                if not chunk:
                    break
                data += chunk
        except OSError:
            return b"result fetch\n", True
        finally:
            os.close(fd)
        if len(data) > limit:
            return b"result fetch\n", True
        return b"result file %d\n" % len(data) + data, False

    def finish(self, code, cause, last):
        # Writes the report. Returns whether this process may stay for another run (the report
        # went out whole, the job ended or overran rather than being stopped, and nothing else
        # holds the output); else it ends with the job's code, as it does after the `last` run.
        try:
            write_all(1, b"%s %d %s\n" % (self.spec["end_marker"], code, cause.encode()))
        except OSError:
            remove_run_dir(self.run_dir, self.environment)
            os._exit(code)
        section, left = self.result_section()
        os.chdir("/")
        if self.spec["keep"] or left:
            try:
                os.unlink(self.run_dir + "/" + fsdecode(self.spec["state_file"]))
            except OSError:
                pass
            clean = b"clean kept\n"
        else:
            remove_run_dir(self.run_dir, self.environment)
            clean = b"clean failed\n" if lexists(self.run_dir) else b"clean removed\n"
        try:
            write_all(1, section + clean)
        except OSError:
            os._exit(code)
        if last or cause == "stopped" or WATCHDOG_LINE[0] is None or output_held_elsewhere():
            os._exit(code)
        return True


def sha256_module():
    # _sha2 (3.12 on) or _sha256: a fraction of hashlib's import, which loads OpenSSL.
    try:
        import _sha2 as module
    except ImportError:
        try:
            import _sha256 as module
        except ImportError:
            import hashlib as module
    return module


def bytes_sha256(data):
    return sha256_module().sha256(data).hexdigest()


def sha256_hex(path):
    # `path`'s sha256 (hex); None when it cannot be read.
    digest = sha256_module().sha256()
    try:
        with open(path, "rb") as f:
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def job_intact(spec):
    # launch.sh's check: a job file that links into the job cache runs only while its bytes match
    # the job's sha256 (a process of the user's may have changed the entry). When they do not,
    # launch.sh refuses the run in its words and ferry sends the job again.
    path = spec["run_dir"] + b"/" + spec["job_file"]
    try:
        if not S_ISLNK(os.lstat(path).st_mode) or not spec["job_sha256"]:
            return True
    except OSError:
        return True  # launch.sh says what is missing
    return sha256_hex(path) == spec["job_sha256"].decode()


def remove_tree(path, depth=64):
    # Everything under `path`, then `path` (links removed, never followed); whatever cannot go
    # stays, and the rest goes all the same. A stack, not recursion, and `depth` levels at most: a
    # job may leave a tree thousands deep, which `rm -rf` (remove_run_dir) removes in less time.
    stack = [(path, 0, False)]
    while stack:
        top, level, emptied = stack.pop()
        try:
            if emptied:
                os.rmdir(top)
            elif is_directory(top):
                stack.append((top, level, True))
                if level < depth:
                    with os.scandir(top) as entries:
                        stack.extend((entry.path, level + 1, False) for entry in entries)
            else:
                os.unlink(top)
        except OSError:
            pass


def remove_run_dir(path, environment):
    # launch.sh's `rm -rf RUN_DIR`, without a process when this one can remove it all; what is
    # left (a deep tree, one longer than a path may be, a file that would not go) is left to
    # `rm -rf` itself.
    remove_tree(path)
    if not lexists(path):
        return
    rm = find_program(b"rm", environment)
    if rm is None:
        return
    try:
        pid = os.posix_spawn(
            rm, ["rm", "-rf", path], dict(environment),
            file_actions=[(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                          (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0)],
            setsigmask=())
        os.waitpid(pid, 0)
    except OSError:
        pass


def start_watchdog(environment):
    # Started once, before keep_to_itself (see WATCHDOG); waited for until its `sh -c` has forked
    # the watchdog off and ended. Without one (it could not start, or has gone since) runs keep
    # their deadline through this process alone, which then does not stay after its run.
    try:
        read, write = os.pipe()
        if read == 3:
            read = os.dup(read)
            os.close(3)
    except OSError:
        return
    null = "/dev/null"
    try:
        pid = os.posix_spawn(
            b"/bin/sh", [b"sh", b"-c", WATCHDOG, b"ferry-watchdog"], job_environment(environment),
            file_actions=[(os.POSIX_SPAWN_OPEN, 0, null, os.O_RDONLY, 0),
                          (os.POSIX_SPAWN_OPEN, 1, null, os.O_WRONLY, 0),
                          (os.POSIX_SPAWN_OPEN, 2, null, os.O_WRONLY, 0),
                          (os.POSIX_SPAWN_DUP2, read, 3)],
            setsid=True, setsigmask=())
        os.waitpid(pid, 0)
        WATCHDOG_LINE[0] = write
    except OSError:
        os.close(write)
    finally:
        os.close(read)


def tell_watchdog(line):
    if WATCHDOG_LINE[0] is None:
        return
    try:
        write_all(WATCHDOG_LINE[0], line)
    except OSError:  # it has gone (EPIPE: python ignores SIGPIPE)
        os.close(WATCHDOG_LINE[0])
        WATCHDOG_LINE[0] = None


def keep_to_itself():
    # Not dumpable: /proc/PID/fd and /proc/PID/mem of this process are then root's, so a process
    # of the user's (a job that left one behind) can neither open this process's stdin, where the
    # next run's line and launch.sh's bytes come, nor read them from its memory. Its own /proc/self
    # is root's too from here (/proc/self/environ was read before); /proc/self/fd still answers it.
    # The job's interpreter gets the usual flag back at its exec.
    # It is also its jobs' subreaper (PR_SET_CHILD_SUBREAPER, Linux 3.4 on): what a job leaves
    # behind, a daemon of a session of its own too, becomes this process's child when its parent
    # ends, so that after a run its children alone say whether anything is left (no_leftover).
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(36, 1, 0, 0, 0) == 0:  # PR_SET_CHILD_SUBREAPER
            SUBREAPER[0] = libc
        return libc.prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE
    except (ImportError, OSError, AttributeError):
        return False


def crowded():
    # Whether the host's CPUs are oversubscribed now: /proc/loadavg's count of runnable tasks (this
    # process one of them) above CROWDED for each CPU this process may use. Unknown: not crowded.
    try:
        fd = os.open("/proc/loadavg", os.O_RDONLY)
        try:
            running = int(os.read(fd, 256).split()[3].split(b"/")[0])
        finally:
            os.close(fd)
        return running - 1 > CROWDED * len(os.sched_getaffinity(0))
    except (OSError, ValueError, IndexError, AttributeError):
        return False


def start_ahead_now():
    # After a python3 job's run, whether to start the next run's interpreter ahead now: at once,
    # unless the host's CPUs are oversubscribed (many hosts' runs sharing its CPUs, many runs of
    # one host at once), when an interpreter for a run that may never come would take CPU from the
    # runs under way. It then waits until they are not (looked at after pauses growing from 0.05
    # to 0.8 s), CROWDED_WAIT_S at most, unless the next run's line (or the end of stdin) comes
    # first: False, and that run's job then starts its interpreter itself, as after a run of a
    # job that was not python3's.
    if not crowded():
        return True
    try:
        import select
    except ImportError:
        return True
    pause, waited = 0.05, 0.0
    while waited < CROWDED_WAIT_S:
        if PENDING[0] or select.select([0], [], [], pause)[0]:
            return False
        waited += pause
        pause = min(2 * pause, 0.8)
        if not crowded():
            return True
    return True


def main():
    environment = original_environment()
    if environment is None:
        os._exit(3)
    # `once ferry-standby`: a direct connection's channel for its only run (docs/run-protocol.md,
    # "A first run without SFTP"): no interpreter is started ahead for it, and it need not keep
    # to itself (ctypes' import is a fifth of its start): nothing comes on its stdin after its
    # run's bytes, which are in the run's own files too.
    ahead = sys.argv[-2:] != ["once", "ferry-standby"]
    start_watchdog(environment)
    if ahead and not keep_to_itself():
        os._exit(3)
    while True:
        end_marker, ahead = serve(environment, ahead)
        # The run's stderr ends here too: ferry takes the channel back for its next run. A stop
        # that comes between runs ends this process, as it would end the standby sh.
        try:
            write_all(2, end_marker + b" stay\n")
        except OSError:
            os._exit(0)  # nobody reads any more (the connection has gone)
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, WATCHED)
        ahead = ahead and start_ahead_now()


def serve(environment, ahead):
    # One run: returns its end marker once it is done and this process may stay for another, and
    # whether the run was a python3 job's. Its interpreter was started ahead when `ahead` (the
    # first run, or one after a python3 job's: the next job is taken to be like the last; after a
    # run, once the host's CPUs are not oversubscribed: start_ahead_now).
    interpreter = Interpreter(environment) if ahead else NoInterpreter()
    if ahead and interpreter.pid is None:
        os._exit(3)
    line = read_line()
    if line is None:
        # The session has ended (or let this channel go): the interpreter started ahead is ended
        # now, not once its own start-up is done (tens of ms of the host's CPU for nothing).
        interpreter.discard()
        os._exit(0)
    words = line.split(b" ")
    # A line that ends in `last`: no run follows on this channel (a direct connection's last
    # run); this process ends with the job's code rather than starting an interpreter for
    # nothing.
    last = words[-1] == b"last" and (len(words), words[0]) in (
        (4, b"exec"), (7, b"stage"), (8, b"stage-first"))
    if last:
        words = words[:-1]
    if len(words) == 6 and words[0] == b"stage":
        launch = stage(words[1:], interpreter)
    elif len(words) == 7 and words[0] == b"stage-first":
        launch = stage_first(words[1:], interpreter)
    elif len(words) == 3 and words[:2] == [b"exec", b"/bin/sh"]:
        launch = fsdecode(words[2])
    else:
        interpreter.dismiss()
        say(2, b"ferry-standby: not a launcher line\n")
        os._exit(125)
    # Blocked from here: a stop that comes while the run starts is taken once the job runs.
    _signal.pthread_sigmask(_signal.SIG_BLOCK, WATCHED)
    spec = read_spec(launch)
    if (spec is None or dict(environment).get(b"SLURM_JOB_ID")
            or find_program(b"setsid", environment) is None):
        # Not a job this process runs (a declared environment), one that launch.sh would give the
        # scheduler's variables too, or one it would start without a session of its own (no
        # setsid on the login PATH).
        as_sh_would(launch, environment, interpreter)
    # A python3 job becomes the interpreter started ahead; any other job, or a python3 job with
    # none alive, is started as launch.sh starts it, once its interpreter is found as launch.sh
    # finds it (else launch.sh runs, and says it is missing).
    program = None
    if spec["interpreter"] != b"python3" or not interpreter.alive():
        program = find_program(spec["interpreter"], environment)
        if program is None:
            as_sh_would(launch, environment, interpreter)
        interpreter.discard()
    run = Run(spec, launch, interpreter, environment, program)
    if not run.prepare() or not job_intact(spec):
        as_sh_would(launch, environment, interpreter)
    run.start()
    code, cause = run.wait()
    run.disarm_watchdog()  # from here this process stops the job itself
    if run.job is None:
        pass
    elif cause == "exit":
        try:
            os.killpg(run.job, _signal.SIGKILL)  # what the job left in its group
        except OSError:
            pass
    else:
        run.stop()
    run.finish(code, cause, last)
    return spec["end_marker"], spec["interpreter"] == b"python3"


main()
