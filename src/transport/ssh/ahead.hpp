#pragma once
// What an SSH session keeps ready ahead of its runs (docs/persistence.md, "The next run's
// channel, opened ahead"): the next run's channel opened before it, the channels that stayed
// after runs side by side, the process that starts the next job's interpreter ahead (its script
// kept in the host's job cache), and the files of a run held in memory for that process to make.
// SshSession keeps the connection, SFTP and plain exec, and asks this at each step; the one
// implementation and its decisions sit in the folder beside this header. Every call is made holding
// the session's lock unless it says otherwise.
#include <chrono>
#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "ferry/expected.hpp"
#include "ferry/remote/launcher.hpp"
#include "transport/exec_request.hpp"
#include "transport/ssh/exec.hpp"
#include "transport/ssh/sftp_files.hpp"

namespace ferry::ssh {

// The session's exec channels, which what is kept ahead shares with plain exec.
struct Channels {
  // How many exec channels the host takes at once: learnt from a refused channel (the server's
  // MaxSessions, less the SFTP channel); 1 also means SFTP must wait for the exec.
  int limit = std::numeric_limits<int>::max();
  int execs = 0;                                  // exec channels open now
  std::chrono::steady_clock::time_point last_end; // when one of them last ended
};

class Ahead {
public:
  virtual ~Ahead() = default;

  // --- the runs planned (a direct fan-out)
  virtual void plan(std::size_t runs, std::size_t at_once) = 0;
  // The session's first run: a direct connection's later python3 runs may start their
  // interpreter ahead when the job cache holds its script and more runs follow on the session (a
  // holder readies its own).
  virtual void first_run(const LauncherSpec& launcher) = 0;
  // As a run's exec begins: whether no later run will take the channel it runs on, which then
  // ends with it (ExecRequest::last).
  [[nodiscard]] virtual bool last_on_its_channel() = 0;

  // --- a run's files held for the process that will run its job
  // A new run directory's name, its files to be held, when the next run's files may wait
  // (`names_run_dirs`: SFTP has made the session's first run directory).
  [[nodiscard]] virtual std::optional<std::string> defer_run_dir(bool names_run_dirs) = 0;
  // The session's first run directory is made, and with it the sweep's listing of the base.
  virtual void run_dir_made() = 0;
  // Forgets a run's held files; true when it had some (the directory was never made).
  virtual bool forget(const std::string& run_dir) = 0;
  // Takes a run's launch.sh, or its job when the job cache holds it; false: not held, the
  // session makes the file over SFTP (after settle).
  [[nodiscard]] virtual bool hold_launcher(const std::string& path, std::string_view bytes) = 0;
  [[nodiscard]] virtual bool hold_job(const std::string& path, std::string_view bytes,
                                      const std::string& sha256) = 0;
  // Makes, over SFTP, the held run directory `path` is in (or is), as the session would have.
  [[nodiscard]] virtual Expected<void> settle(const std::string& path) = 0;
  // The line that hands a run's held files over; empty when they are not held.
  [[nodiscard]] virtual std::string stage_line(const std::string& run_dir, bool last) const = 0;

  // --- runs
  // Runs a staged run's launcher (not holding the lock): on a channel kept ahead, else on a new
  // channel. `stage`: stage_line's, for the run in `run_dir`.
  [[nodiscard]] virtual Expected<ExecOutcome>
  run(ssh_session session, std::string_view label, const ExecRequest& request,
      CallWatchdog& watchdog, std::mutex& mutex, const FreeAChannel& free_a_channel,
      const std::string& run_dir, const std::string& stage) = 0;

  // --- slots
  // Closes a channel kept ahead whose slot a run or SFTP needs; false when none is kept.
  virtual bool close_one() = 0;
  // A channel is being opened ahead (open_next): it holds a slot.
  [[nodiscard]] virtual bool opening() const = 0;

  // --- a holder
  // Opens the next run's channel when there is room for it and one more (the lock released
  // while the server answers).
  virtual void open_next(ssh_session session, std::unique_lock<std::mutex>& lock) = 0;
  // Nobody has come for a while: the channels kept for runs side by side go. Files held for a
  // run stay until its exec or its finish (a client that goes finishes its runs): the idle work
  // was wished while nobody ran, and may come once a run has been staged meanwhile.
  virtual void idle() = 0;
  // After idle: a plain channel opened ahead goes while one that starts the interpreter can be
  // had, for open_next to open that.
  virtual void refresh() = 0;
  // Looks at the interpreter's script in the job cache (put there if missing) when a look is
  // due; false when the holder's idle steps stop here (not due, or none can be kept here).
  [[nodiscard]] virtual bool look_at_script() = 0;
  // Called when a run takes the channel opened ahead, so that the next one opens meanwhile.
  virtual void on_taken(std::function<void()> callback) = 0;
  // The holder's own SFTP steps let the runs go first: whether a step waits for the runs to be no
  // longer busy, and until when at most; no time: it goes now. `started`: when it began to wait.
  struct Wait {
    bool for_runs = false;
    std::optional<std::chrono::steady_clock::time_point> until;
  };
  [[nodiscard]] virtual Wait runs_first(bool runs_busy,
                                        std::chrono::steady_clock::time_point last_activity,
                                        std::chrono::steady_clock::time_point started) const = 0;
};

// `files`: the session's SFTP files (made on first use); `debug`: -v lines; `memo_key`: what
// this machine's note of the host's standby script is kept under (the connection's options,
// the run base among them).
[[nodiscard]] std::unique_ptr<Ahead> make_ahead(Channels& channels,
                                                std::function<SftpFiles&()> files,
                                                std::function<void(std::string_view)> debug,
                                                std::function<std::string()> memo_key);

} // namespace ferry::ssh
