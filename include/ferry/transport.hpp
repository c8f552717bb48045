#pragma once
// The seam between "what to run" and "where": a session with one host (or this machine) that
// stages files in a private run directory, executes a fixed argv, fetches files and cleans up.
// The runner, the archive and the CLI know nothing of libssh or Boost.Process.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/bundle.hpp"
#include "ferry/expected.hpp"

namespace ferry {

struct Job;

// One output stream of a job, kept up to a cap: its first and its last half; what came between
// them is counted, never stored.
struct CapturedStream {
  std::string bytes; // the first cap/2 bytes, then the last cap/2 (when the stream was longer)
  bool truncated = false;
  std::uint64_t dropped = 0;   // bytes dropped between the first and the last part
  std::string before_sentinel; // what the login shell printed before the launcher (capped)
  bool saw_sentinel = false;
  // What the launcher printed from its end marker on, past the marker, on stdout (its report:
  // see parse_launcher_report); nullopt when it never did (it did not run, or the connection
  // was lost).
  std::optional<std::string> launcher_report;
};

enum class OutputStream { out, err };

// What a job printed, passed on as it arrives (live output); called from the thread that runs
// the job.
using OutputSink = std::function<void(OutputStream, std::string_view)>;

// What a target has to say about a run while it waits or runs, for the user and not part of the
// job's output ("job 4242 pending: Resources"); called from the thread that runs the job.
using NoteSink = std::function<void(std::string_view)>;

// Feeds raw stream bytes; sets aside what precedes the launcher's sentinel line and the report
// the launcher prints after its `end_marker` (at most `report_cap` bytes; more means the job
// printed the marker itself), keeps at most `cap` bytes of the rest (its first and last half)
// and passes all of it to `sink` as it comes. Memory stays bounded however much arrives.
class OutputCapture {
public:
  static constexpr std::size_t k_default_report_cap = 64 * 1024;
  OutputCapture(std::string sentinel, std::size_t cap, std::string end_marker = {},
                std::function<void(std::string_view)> sink = {},
                std::size_t report_cap = k_default_report_cap);
  void feed(std::string_view data);
  // The launcher's sentinel has arrived (or none was expected).
  [[nodiscard]] bool started() const { return m_out.saw_sentinel; }
  // What came after the end marker so far (the launcher's report, as finish() will tell it);
  // nullopt before the marker.
  [[nodiscard]] std::optional<std::string_view> report_so_far() const;
  [[nodiscard]] CapturedStream finish() &&;

private:
  void take(std::string_view job_bytes);
  void keep(std::string_view job_bytes);

  std::string m_marker; // sentinel + "\n"
  std::string m_end;    // end_marker + " ": the start of the launcher's report, not the job's
  std::size_t m_cap;
  std::function<void(std::string_view)> m_sink;
  std::size_t m_report_cap;
  CapturedStream m_out;
  std::string m_pending;     // bytes before the sentinel, not yet known to be noise
  std::string m_held;        // the last bytes, held back while they could be the end marker
  std::uint64_t m_total = 0; // the job's bytes so far
  std::string m_tail;        // a ring of the last cap/2 bytes past the first cap/2
  std::size_t m_tail_pos = 0;
  std::size_t m_tail_filled = 0;
};

// Set from the signal handler; every transport polls it while it waits.
[[nodiscard]] bool interrupt_requested();
void request_interrupt();

// Asks the runs that share it to stop, as an interrupt does for every run of the process (an
// MCP client cancelling one call, say). Copies share the flag; a default token is only ever
// stopped by an interrupt.
class StopToken {
public:
  StopToken() = default;
  [[nodiscard]] static StopToken make() { return StopToken(std::make_shared<std::atomic<bool>>()); }
  void request_stop() const
  {
    if (m_flag) {
      m_flag->store(true);
    }
  }
  // This token was stopped, or the process was interrupted.
  [[nodiscard]] bool stop_requested() const
  {
    return interrupt_requested() || (m_flag && m_flag->load());
  }

private:
  explicit StopToken(std::shared_ptr<std::atomic<bool>> flag) : m_flag(std::move(flag)) {}
  std::shared_ptr<std::atomic<bool>> m_flag;
};

struct ExecRequest {
  std::vector<std::string> argv; // shell-neutral tokens
  std::string sentinel;
  std::string end_marker; // starts the launcher's report, the end of stdout
  std::size_t output_cap = 16u << 20;
  // The launcher's report may be this long (it may carry result.json's bytes).
  std::size_t report_cap = OutputCapture::k_default_report_cap;
  // ferry's own backstop: past it, the job is signalled (the launcher's deadline comes first).
  std::chrono::steady_clock::duration deadline = std::chrono::seconds(300);
  std::chrono::steady_clock::duration grace = std::chrono::seconds(2);
  // The launcher's first line must arrive within this (the login shell runs first).
  std::chrono::steady_clock::duration start_limit = std::chrono::seconds(20);
  // The launcher's job is a python3 job that becomes the interpreter a python standby started
  // ahead (runs_on_python_standby): a run with no standby free may open a python standby of its
  // own.
  bool python_standby = false;
  // The launcher's job may run on a python standby at all (runs_on_standby: it declares no
  // environment): a holder's next standby is a python one after such a run, else a sh one.
  bool runs_on_standby = false;
  // No run follows on this session (a direct connection's last planned run): a python standby
  // that runs it ends after it rather than staying for a next one.
  bool last = false;
  StopToken stop;       // stopped: the job is stopped as on an interrupt
  OutputSink on_output; // optional: the job's output as it arrives
  NoteSink on_note;     // optional: the target's notes about the run
};

// The capture of one stream of `request`'s job, passing what arrives to its on_output. Only
// stdout carries the launcher's report; `stderr_ends` gives stderr the end marker too (a python
// standby ends a run's stderr with `END_MARKER stay` when it stays for the next run).
[[nodiscard]] OutputCapture capture_for(const ExecRequest& request, OutputStream stream,
                                        bool stderr_ends = false);

// How an exec ended.
enum class ExecEnd {
  exited,      // the launcher exited (its status in exit_code, none when a signal killed it)
  interrupted, // ferry was interrupted (SIGINT/SIGTERM) and stopped the job
  deadline,    // ferry's backstop deadline passed and it stopped the job
  no_start,    // the launcher never started within the start limit (a hanging login shell)
  lost,        // the connection was lost mid-run (why in lost_reason)
};

struct ExecOutcome {
  ExecEnd end = ExecEnd::exited;
  std::optional<int> exit_code; // nullopt: no exit status (killed by a signal, connection lost)
  CapturedStream out;
  CapturedStream err;
  std::string lost_reason;
  double start_limit_s = 0; // no_start: the limit the launcher missed
  // The launcher exited but something it left behind (a daemon that escaped the job's process
  // group) kept the output streams open; ferry stopped waiting for them.
  bool output_held_open = false;
  // A target that knows why the job did not run to its end better than an exit status can tell
  // (a scheduler stopped it at its time limit, a node could not see the run directory) says so;
  // the run then ends with this status and message.
  struct Verdict {
    enum class Kind { failed, timeout, error } kind = Kind::failed;
    std::string message;
  };
  std::optional<Verdict> verdict;
};

// How long to wait for the output streams to close once the launcher itself has exited.
inline constexpr std::chrono::milliseconds k_output_linger{1500};

// A file of the run directory as fetch_file found it.
struct FetchedFile {
  enum class Kind { missing, regular, other };
  Kind kind = Kind::missing;
  std::string bytes; // regular: its bytes (more than the cap means it is over the cap)
  std::string other; // other: what it is instead ("a directory", "a symbolic link", ...)
};

// Takes the bytes of a file as they are read (fetch_stream); an error stops the read.
using ChunkSink = std::function<Expected<void>(std::string_view)>;

class HostSession {
public:
  virtual ~HostSession() = default;

  // {"host","user","port","host_key_sha256"} or {"local": true}
  [[nodiscard]] virtual nlohmann::json target() const = 0;
  [[nodiscard]] virtual std::string label() const = 0;

  [[nodiscard]] virtual Expected<void> connect() = 0;
  // Whether several runs may use this session at once, from as many threads (each its own
  // channel); false: one run at a time.
  [[nodiscard]] virtual bool concurrent_runs() const { return false; }
  // The job the next run stages, its timeout, and whether its launcher may run on a python
  // standby (runs_on_python_standby): a scheduler reads the job's own options (its `[slurm]`
  // table) from it; an SSH session's first run opens its channel ahead of its exec (a python
  // standby for such a job, when the host's job cache holds the standby's script). Called
  // before create_run_dir.
  virtual void prepare_run(const Job& /*job*/, int /*timeout_s*/, bool /*python_standby*/) {}
  // How many runs this session will be given in all (a fan-out's jobs for the host), before the
  // first, and how many of them run at once (-j): a python standby that stays after its run
  // serves the run that starts as its run ends, so the runs with fewer than `at_once` runs after
  // them end theirs with them rather than starting an interpreter for nothing. Not called:
  // unknown, and a python standby stays.
  virtual void expect_runs(std::size_t /*runs*/, std::size_t /*at_once*/) {}
  // Whether the launcher may remove the run directory itself once it has reported; false when
  // the target still reads files there after the launcher's end (a scheduler's output file).
  [[nodiscard]] virtual bool launcher_cleans_up() const { return true; }
  // What later calls honour as a request to stop (a run's own token; the process's interrupt is
  // always honoured): blocking steps end within a few seconds of it.
  virtual void bind_stop(const StopToken& /*stop*/) {}
  // A new, private (0700) run directory; returns its absolute path.
  [[nodiscard]] virtual Expected<std::string> create_run_dir() = 0;
  // Writes a 0600 file under a temporary name and renames it into place.
  [[nodiscard]] virtual Expected<void> put_file(const std::string& path,
                                                std::string_view bytes) = 0;
  // The job's own file at `path` in a run directory: where the target keeps a cache of job
  // files (SSH: docs/run-protocol.md, "The job cache"), a link to the cached copy of these
  // bytes, uploaded to the cache first when missing; elsewhere written as put_file does.
  // True when the cache already held them.
  [[nodiscard]] virtual Expected<bool> put_job_file(const std::string& path, std::string_view bytes,
                                                    const std::string& /*sha256*/)
  {
    FERRY_TRY(put_file(path, bytes));
    return false;
  }
  [[nodiscard]] virtual Expected<ExecOutcome> exec(const ExecRequest& request) = 0;
  // The file, read only when it is a regular file (lstat first: a symbolic link, FIFO, device
  // or directory is never opened or followed), at most `cap` + 1 bytes of it.
  [[nodiscard]] virtual Expected<FetchedFile> fetch_file(const std::string& path,
                                                         std::size_t cap) = 0;
  // The same rules as fetch_file, the bytes handed to `sink` piece by piece (no copy is held);
  // `bytes` of the result stays empty.
  [[nodiscard]] virtual Expected<FetchedFile> fetch_stream(const std::string& path,
                                                           const ChunkSink& sink) = 0;
  // A new 0700 directory; one that exists already (a link included) is an error.
  [[nodiscard]] virtual Expected<void> make_dir(const std::string& path) = 0;
  // The entries of a directory as lstat sees them; nullopt when it does not exist.
  [[nodiscard]] virtual Expected<std::optional<std::vector<DirEntry>>>
  list_dir(const std::string& path) = 0;
  [[nodiscard]] virtual Expected<bool> file_exists(const std::string& path) = 0;
  [[nodiscard]] virtual Expected<void> remove_run_dir(const std::string& path) = 0;
  // The launcher removed the run directory itself: whatever the session remembers of it can go.
  virtual void forget_run_dir(const std::string& /*path*/) {}
};

} // namespace ferry
