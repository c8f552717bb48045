#pragma once
// The remote side of the run protocol: the POSIX-sh launcher that runs a job on the host. It
// sets the FERRY_* variables, runs the interpreter on the job file (never executes the job file
// itself, so noexec mounts work) in a process group of its own, and enforces the job's timeout
// on the host, so a dropped connection cannot leave the job running. Its text is
// src/remote/launch.sh, embedded at build time (docs/run-protocol.md describes it).
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry {

inline constexpr std::size_t k_default_result_frame_limit = 8u << 20;
inline constexpr const char* k_launcher_file = "launch.sh";
// A held session's python standby (src/remote/standby.py, docs/persistence.md).
inline constexpr const char* k_standby_script = "standby.py";

struct LauncherSpec {
  std::string run_dir;     // absolute, shell-neutral
  std::string job_file;    // file name inside run_dir
  std::string job_name;    // FERRY_JOB (quoted, may hold anything)
  std::string interpreter; // shell-neutral name or absolute path
  int timeout_s = 300;
  int grace_s = 2;      // between TERM and KILL
  std::string sentinel; // printed first on stdout and stderr; what precedes it is not the job's
  // Starts the launcher's report on stdout. When that write fails, nobody is reading any more
  // (the connection was lost), so the launcher removes the run directory itself.
  std::string end_marker;
  // params.json travels as the last bytes of the launcher's own file (one upload fewer); the
  // launcher writes them out before the job starts.
  std::string params;
  // A regular result.json up to this size comes back framed after the end line; a larger one
  // is left for ferry to fetch.
  std::size_t result_frame_limit = k_default_result_frame_limit;
  // --keep-remote, or files still to fetch (outputs, --fetch): the launcher leaves the run
  // directory to ferry.
  bool keep_run_dir = false;
  // The declared variables (checked names); the launcher adds PATH, HOME, USER, LANG, TERM,
  // LC_* and FERRY_*, and the job inherits nothing else.
  std::map<std::string, std::string> env;
  // The job's sha256 (hex): a job file that is a link into the host's job cache runs only while
  // its bytes still match it; empty: no check.
  std::string job_sha256;
};

// Exit statuses the launcher itself uses.
inline constexpr int k_launcher_timeout_exit = 124;
inline constexpr int k_launcher_no_interpreter_exit = 127;
inline constexpr const char* k_launcher_timeout_marker = ".ferry-timeout";
// "PID DEADLINE" (epoch seconds) while the launcher runs; see StaleRun.
inline constexpr const char* k_launcher_state_file = ".ferry-launcher";
inline constexpr const char* k_launcher_no_interpreter_prefix = "ferry-launcher: interpreter ";
// The launcher refused a job file from the job cache whose bytes no longer match their sha256
// (or could not be hashed): `PREFIX ENTRY REASON` on stderr, this exit status, nothing run.
inline constexpr int k_launcher_cache_refused_exit = 125;
inline constexpr const char* k_launcher_cache_refused_prefix =
    "ferry-launcher: the job cache entry ";

// --gpus (docs/run-protocol.md, "GPUs"): the launcher picks and locks this many free GPUs before
// the job starts. The request travels in the spec's `env` under k_launcher_gpus_var, whose value is
// gpu_request(): every target carries a spec's env as it is (a connection holder's wire included),
// and no declared variable can have that name (FERRY_* are ferry's). make_launcher takes it out of
// the job's variables; a spec with it runs on launch.sh, never on a python standby.
inline constexpr const char* k_launcher_gpus_var = "FERRY_GPUS";
[[nodiscard]] std::string gpu_request(int gpus, int wait_s);
// A GPU nvidia-smi shows with less than this many MiB used (and no compute process) is free.
inline constexpr int k_gpu_memory_free_mib = 1024;
// The launcher found too few free GPUs (or no nvidia-smi): `PREFIX WHY` on stderr, this exit
// status, the job never started.
inline constexpr int k_launcher_gpus_refused_exit = 75;
inline constexpr const char* k_launcher_gpus_refused_prefix = "ferry-launcher: GPUs: ";

// --detach (docs/run-protocol.md, "Detached runs"): the launcher starts itself again apart from
// the channel and exits at once. The request travels in the spec's `env` as the GPU request does:
// k_launcher_detach_var's value is detach_request(): the seconds the finished run waits for
// collection, and the output cap the host keeps each output file within (its first and last half).
// The detached launcher's stdout and stderr go to the output files, its report too; the done file
// ("CODE CAUSE", CAUSE `early` when the job never started) is renamed into place last.
inline constexpr const char* k_launcher_detach_var = "FERRY_DETACH";
[[nodiscard]] std::string detach_request(long long keep_for_s, std::size_t output_cap);
inline constexpr const char* k_detached_stdout = ".ferry-stdout";
inline constexpr const char* k_detached_stderr = ".ferry-stderr";
inline constexpr const char* k_detached_done = ".ferry-done";
// What the launcher says on the channel when it detached: "detached PID".
inline constexpr std::string_view k_detached_line = "detached ";
// The launcher's argument for `ferry stop`; it answers "stop sent|finished|gone".
inline constexpr const char* k_launcher_stop_arg = "stop";

[[nodiscard]] std::string make_launcher(const LauncherSpec& spec);

// How the launcher says the job ended, after the end marker on stdout:
//   CODE CAUSE\n                 (CAUSE: exit, timeout or stopped)
//   gpus INDEX UUID ...\n        (only when the launcher locked GPUs for the job: --gpus)
//   result KIND [SIZE]\n         (KIND: none, file, fetch, link, directory, special)
//   SIZE bytes of result.json    (only for `file`)
//   clean removed|kept|failed\n  (whether the launcher removed the run directory)
// The size comes before the bytes and nothing but the clean line may follow them, so a result
// holding any bytes at all (the end marker included) is read back unambiguously.
enum class LauncherCause { exited, timeout, stopped };
enum class ReportedResult {
  unknown,   // no (or a garbled) result section: ferry fetches result.json itself
  none,      // no result.json
  file,      // a regular file; its bytes are in the report
  fetch,     // a regular file too large for the frame (or unreadable): ferry fetches it
  link,      // a symbolic link: never read
  directory, // never read
  special,   // a FIFO, socket or device: never opened
};
struct PickedGpu {
  int index = 0;    // nvidia-smi's (CUDA_DEVICE_ORDER=PCI_BUS_ID)
  std::string uuid; // [A-Za-z0-9-]
  bool operator==(const PickedGpu&) const = default;
};
struct LauncherReport {
  int code = 0;
  LauncherCause cause = LauncherCause::exited;
  ReportedResult result = ReportedResult::unknown;
  std::string result_bytes;     // file: the bytes of result.json
  bool run_dir_removed = false; // the launcher removed the run directory after the report
  std::vector<PickedGpu> gpus;  // the GPUs the job was given (--gpus)
};
// The report as the launcher prints it ("CODE CAUSE\n" alone is a report without a result
// section); nullopt when even its first line is not one.
[[nodiscard]] std::optional<LauncherReport> parse_launcher_report(std::string_view text);
// Whether `text` is a whole report: the end line, the result section and the clean line, and
// nothing after (a python standby that stays for the next run writes nothing more on stdout).
[[nodiscard]] bool is_whole_launcher_report(std::string_view text);

// 'text' quoted for POSIX sh (single quotes; ' becomes '\'').
[[nodiscard]] std::string sh_quote(std::string_view text);

// `script` with every @name@ replaced by fields.at(name) in one pass (a value is never scanned
// again). An @ that starts no known field is kept as it is.
[[nodiscard]] std::string fill_template(std::string_view script,
                                        const std::map<std::string, std::string>& fields);

// Whether a run directory left on a host may be removed: never while its launcher lives or
// before its deadline; a directory no launcher ever started only after a day. Times are the
// host's (epoch seconds); `state` is the launcher's state file, if any: "PID +SECONDS" (the
// most the run may take, counted from the directory's mtime) or, from older launchers, "PID
// DEADLINE".
struct StaleRunCheck {
  long long now = 0;      // the host's clock
  long long modified = 0; // the directory's mtime
  std::optional<std::string> state;
  bool launcher_alive = false;
};
[[nodiscard]] bool is_stale_run(const StaleRunCheck& check);
// The launcher's pid from its state file, if it names one.
[[nodiscard]] std::optional<long> state_file_pid(std::string_view state);
// "ferry-YYYYMMDDTHHMMSSZ-<32 hex>": the name of a run directory ferry creates.
[[nodiscard]] bool is_run_dir_name(std::string_view name);

// Whether a python standby runs this launcher's job itself (no declared environment:
// launch.sh's second line says so), starting its interpreter as launch.sh would.
[[nodiscard]] bool runs_on_standby(const LauncherSpec& spec);
// Whether that job is a python3 job, which becomes the interpreter a python standby started
// ahead (interpreter `python3`).
[[nodiscard]] bool runs_on_python_ahead(const LauncherSpec& spec);
// How the command line of a held session's python standby ends ("python3 -I -S ENTRY
// ferry-standby", its words joined by spaces): a launcher's pid that now names it still runs.
inline constexpr std::string_view k_ahead_process_tail = " ferry-standby";

// A script of src/remote/ by file name ("launch.sh"), as embedded at build time.
[[nodiscard]] std::string_view remote_script(std::string_view file_name);
// The python standby as it goes into a host's job cache (k_standby_script): a loader that keeps
// its compiled code beside it, and src/remote/standby.py.
[[nodiscard]] std::string_view standby_script();

} // namespace ferry
