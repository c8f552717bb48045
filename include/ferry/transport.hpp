#pragma once
// The seam between "what to run" and "where": a session with one host (or this machine, or a
// scheduler) that stages a run (its private run directory, the job, the launcher and the job's
// files, as the target sees fit), launches it, lets the runner fetch and list files of the run,
// and finishes it. The runner, the archive and the CLI know nothing of libssh, SFTP, channels kept
// ahead or Boost.Process; the transports keep their file and exec primitives to themselves.
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

#include "ferry/dir_entry.hpp"
#include "ferry/expected.hpp"
#include "ferry/output_stream.hpp"
#include "ferry/remote/launcher.hpp"

namespace ferry {

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

// What a job printed, passed on as it arrives (live output); called from the thread that runs
// the job.
using OutputSink = std::function<void(OutputStream, std::string_view)>;

// What a target has to say about a run while it waits or runs, for the user and not part of the
// job's output ("job 4242 pending: Resources"); called from the thread that runs the job.
using NoteSink = std::function<void(std::string_view)>;

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
  // ferry's python standby refused its own script or compiled code in the host's job cache
  // before this run (they no longer matched their sha256): what it refused, for a warning.
  std::string standby_refused;
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

// Takes the bytes of a file as they are read (fetch); an error stops the read.
using ChunkSink = std::function<Expected<void>(std::string_view)>;

// A file that travels with the job, under `path` relative to the run directory (its
// directories are made 0700 on the way).
struct RunFile {
  std::string path;
  std::string bytes;
  unsigned mode = 0600;
};

// Everything a run puts on its target, before the target has named its run directory.
struct RunBundle {
  // The launcher's fields but `run_dir`, which the target fills in (docs/run-protocol.md); its
  // `keep_run_dir` is the runner's wish (a target that reads files there after the launcher's
  // end keeps the directory anyway).
  LauncherSpec launcher;
  std::string job_bytes;
  std::string job_sha256;
  // The run goes again because its launcher refused the job's entry in the host's job cache (its
  // bytes no longer match their sha256): that entry is discarded, and the job is uploaded into
  // the run directory.
  bool job_cache_refused = false;
  std::vector<RunFile> files;
  // What a scheduler reads of the job (its `[slurm]` table, as JSON; null elsewhere).
  nlohmann::json scheduler;
};

// A run its target has staged.
struct StagedRun {
  std::string run_dir;         // absolute, on the target
  LauncherSpec launcher;       // the bundle's, its run_dir filled in (its params left out)
  bool job_from_cache = false; // the job's bytes were already on the target
  std::uint64_t id = 0;        // the target's own name for the run (what it keeps of it)
  StopToken stop;              // asks the run's later steps to end within moments
  // The job's entry in the target's job cache, found there but not as ferry leaves it (changed
  // on the host) and made anew while the run was staged: its path, for a warning; else empty.
  std::string job_cache_remade;
  // Words after `/bin/sh RUN_DIR/launch.sh` (`stop` for ferry stop); none for a run.
  std::vector<std::string> launcher_args;
};

// How a launched run is followed.
struct LaunchRequest {
  std::size_t output_cap = 16u << 20; // per stream
  // The launcher's report may be this long (it may carry result.json's bytes).
  std::size_t report_cap = 64 * 1024;
  // ferry's own backstop: past it, the job is signalled (the launcher's deadline comes first).
  std::chrono::steady_clock::duration deadline = std::chrono::seconds(300);
  std::chrono::steady_clock::duration grace = std::chrono::seconds(2);
  StopToken stop;       // stopped: the job is stopped as on an interrupt
  OutputSink on_output; // optional: the job's output as it arrives
  NoteSink on_note;     // optional: the target's notes about the run
};

// What becomes of the run directory at the end of a run.
enum class Finish {
  remove,     // removed by the target (what ferry put there and whatever the job left)
  keep,       // --keep-remote: left in place
  by_launcher // the launcher removed it (its report said so), or will once it finds nobody
              // reading (the connection was lost): nothing is sent
};

// How the runs of one session may go.
struct SessionTraits {
  // Several runs may use this session at once, from as many threads (each its own channel).
  bool concurrent_runs = false;
  // Every run of the session must be under way at once (a Slurm job array is submitted when
  // all its points are staged): each takes a lane of its own, and -j does not bound them.
  bool runs_together = false;
};

class HostSession {
public:
  virtual ~HostSession() = default;

  // {"host","user","port","host_key_sha256"} or {"local": true}
  [[nodiscard]] virtual nlohmann::json target() const = 0;
  [[nodiscard]] virtual std::string label() const = 0;
  [[nodiscard]] virtual SessionTraits traits() const { return {}; }

  [[nodiscard]] virtual Expected<void> connect() = 0;
  // How many runs this session will be given in all (a fan-out's jobs for the host), before
  // the first, and how many of them run at once (-j). Not called: unknown.
  virtual void plan(std::size_t /*runs*/, std::size_t /*at_once*/) {}
  // A new, private (0700) run directory with the bundle's files in it (or, where the target
  // knows a quicker way, whatever lets launch() run it as if they were).
  [[nodiscard]] virtual Expected<StagedRun> stage(const RunBundle& bundle,
                                                  const StopToken& stop) = 0;
  // Runs the staged launcher; the outcome once it has ended (or was stopped, or lost).
  [[nodiscard]] virtual Expected<ExecOutcome> launch(StagedRun& run,
                                                     const LaunchRequest& request) = 0;
  // The file `rel` of the run directory, read only when it is a regular file (lstat first: a
  // symbolic link, FIFO, device or directory is never opened or followed), handed to `sink`
  // piece by piece from byte `offset` on (0: the whole file; a detached run's output files are
  // read on from where the last look stopped). `bytes` of the result stays empty (fetch_capped
  // keeps them).
  [[nodiscard]] virtual Expected<FetchedFile> fetch(const StagedRun& run, const std::string& rel,
                                                    const ChunkSink& sink,
                                                    std::uint64_t offset) = 0;
  // The entries of the directory `rel` ("" for the run directory) as lstat sees them; nullopt
  // when it does not exist.
  [[nodiscard]] virtual Expected<std::optional<std::vector<DirEntry>>>
  list(const StagedRun& run, const std::string& rel) = 0;
  // The run is over: its directory removed or kept (`how`), and whatever the session kept of
  // the run forgotten.
  [[nodiscard]] virtual Expected<void> finish(StagedRun& run, Finish how) = 0;
};

// A detached run (docs/run-protocol.md, "Detached runs") followed through its files: the output
// files read on from where the last look stopped, every `poll`, until the done file is there.
struct FollowRequest {
  std::size_t output_cap = 16u << 20;
  std::size_t report_cap = 64 * 1024;
  std::chrono::milliseconds poll{500};
  // The detached launcher's pid as it said on the channel (`detached PID`), for the moment
  // before its state file names it; 0: unknown.
  long long launcher_pid = 0;
  StopToken stop;       // stopped: following ends (the job goes on)
  OutputSink on_output; // optional: the job's output as it is read
};
enum class FollowEnd {
  done,    // the launcher wrote its done file: the outcome is whole
  stopped, // the follower was stopped (Ctrl-C): nothing of the run was touched
  gone,    // the run directory is not there (collected, or removed by the sweep)
  lost,    // the launcher is gone without a done file (killed, the host restarted): the
           // outcome holds the output read so far, no exit status
};
struct Followed {
  FollowEnd end = FollowEnd::done;
  ExecOutcome outcome; // done: as a launch that ended would give it; lost: the output so far
};
[[nodiscard]] Expected<Followed> follow_detached(HostSession& session, const StagedRun& run,
                                                 const FollowRequest& request);
// A detached run as its host shows it (`ferry ps`).
enum class DetachedState {
  running,  // the launcher runs (or /proc cannot tell: never taken for lost)
  finished, // its done file is there: it waits for collection
  lost,     // its launcher is gone without a done file (killed, or the host restarted)
  gone,     // no run directory
};
// `launcher_pid` as in FollowRequest.
[[nodiscard]] Expected<DetachedState> detached_state(HostSession& session, const StagedRun& run,
                                                     long long launcher_pid);

// fetch, its bytes kept: at most `cap` + 1 of them (more than the cap means it is over it).
[[nodiscard]] Expected<FetchedFile> fetch_capped(HostSession& session, const StagedRun& run,
                                                 const std::string& rel, std::size_t cap);

} // namespace ferry
