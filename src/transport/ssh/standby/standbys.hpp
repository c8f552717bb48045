#pragma once
// What an SSH session keeps ready ahead of its runs (docs/persistence.md, "The next run's
// channel, opened ahead"): the standby channel opened before its run, the python standbys that
// stayed after runs side by side (spares), the interpreter a python standby starts ahead (its
// script kept in the host's job cache), and the files of a run held in memory for that standby
// to make (deferred staging): ssh::Ahead (ahead.hpp), the one owner of them; the decisions are
// policy.hpp's. Every call is made holding the session's lock unless it says otherwise.
#include <chrono>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "transport/ssh/ahead.hpp"
#include "transport/ssh/standby/channel.hpp"
#include "transport/ssh/standby/policy.hpp"

namespace ferry::ssh {

class Standbys final : public Ahead {
public:
  // `files`: the session's SFTP files (made on first use); `debug`: -v lines; `memo_key`: the
  // key of this machine's note of the standby's script on the host (standby/memo.hpp).
  Standbys(Channels& channels, std::function<SftpFiles&()> files,
           std::function<void(std::string_view)> debug, std::function<std::string()> memo_key)
      : m_channels(channels), m_files(std::move(files)), m_debug(std::move(debug)),
        m_memo_key(std::move(memo_key))
  {
  }

  // --- the runs planned (a direct fan-out)
  void plan(std::size_t runs, std::size_t at_once) override
  {
    m_plan.expected = runs;
    m_plan.at_once = std::max<std::size_t>(at_once, 1);
  }
  // The session's first run (`python_job`: a python3 job's): a direct connection's later python3
  // runs go to python standbys when the job cache holds the standby's script and more runs
  // follow on the session (a holder readies its own).
  void first_run(const LauncherSpec& launcher) override;
  // As a run's exec begins: whether no later run will take the python standby it runs on.
  [[nodiscard]] bool last_on_its_channel() override { return standby::last_on_its_channel(m_plan); }

  // --- files held for the python standby that will run the job
  // A new run directory's name, its files to be held, when the next run's files may wait for its
  // python standby (`names_run_dirs`: SFTP has made the session's first run directory).
  [[nodiscard]] std::optional<std::string> defer_run_dir(bool names_run_dirs) override;
  // The session's first run directory is made, and with it the sweep's listing of the base.
  void run_dir_made() override;
  // Forgets a run's held files; true when it had some (the directory was never made).
  bool forget(const std::string& run_dir) override { return m_deferred.erase(run_dir) > 0; }
  // Takes a run's launch.sh, or its job when the job cache holds it; false: not held, the
  // session makes the file over SFTP (after settle).
  [[nodiscard]] bool hold_launcher(const std::string& path, std::string_view bytes) override;
  [[nodiscard]] bool hold_job(const std::string& path, std::string_view bytes,
                              const std::string& sha256) override;
  // Makes, over SFTP, the held run directory `path` is in (or is), as the session would have.
  // `after_standby`: a standby that was given them may have made part of it before it went.
  Expected<void> settle(const std::string& path) override { return settle(path, false); }
  Expected<void> settle(const std::string& path, bool after_standby);
  // The `stage` line and launch.sh's bytes that hand a run's held files to its python standby
  // (docs/persistence.md, "Staged by the python standby"); empty when they are not held.
  [[nodiscard]] std::string stage_line(const std::string& run_dir, bool last) const override;
  // Runs the launcher as exec_launcher does, with what use_for lends it.
  [[nodiscard]] Expected<ExecOutcome> run(ssh_session session, std::string_view label,
                                          const ExecRequest& request, CallWatchdog& watchdog,
                                          std::mutex& mutex, const FreeAChannel& free_a_channel,
                                          const std::string& run_dir,
                                          const std::string& stage) override;
  // --- slots
  // Closes a spare, else the standby, whose slot a run or SFTP needs; false when none is kept.
  bool close_one() override;
  // A standby is being opened (open_next): it holds a slot.
  [[nodiscard]] bool opening() const override { return m_opening; }

  // --- a holder
  // Opens the next run's channel when there is room for it and one more (the lock released
  // while the server answers); a python standby once its script is in the job cache.
  void open_next(ssh_session session, std::unique_lock<std::mutex>& lock) override;
  // Nobody has come for a while: the spares go (held files stay: Ahead::idle).
  void idle() override { m_spares.clear(); }
  // After idle: a sh standby goes while a python one can be had, for open_next to open that.
  void refresh() override;
  // Looks at the python standby's script in the job cache (put there if missing) when a look is
  // due; false when the holder's idle steps stop here (not due, or no python standby here).
  [[nodiscard]] bool look_at_script() override;
  // Called when a run takes the standby, so that the next one opens meanwhile.
  void on_taken(std::function<void()> callback) override { m_taken = std::move(callback); }
  [[nodiscard]] Wait runs_first(bool runs_busy, standby::Clock::time_point last_activity,
                                standby::Clock::time_point started) const override
  {
    const auto wait = standby::runs_first(runs_busy, last_activity, started, standby::Clock::now());
    return {wait.for_runs, wait.until};
  }

private:
  // What a run may use of the channels kept ahead; for a run whose files are held (`dir`, handed
  // over by `stage`), what makes them.
  [[nodiscard]] StandbyUse use_for(const std::string& dir, const std::string& stage,
                                   bool& staged_by_standby);
  // The run's files were made on the host by its standby: removed by name, as uploads are.
  void made_by_standby(const std::string& dir);

  // A run's files held in memory: its job, linked from its job cache entry, and launch.sh.
  struct DeferredJob {
    std::string path;
    std::string bytes;
    std::string sha256;
    std::string entry; // its job cache entry
  };
  struct Deferred {
    std::optional<DeferredJob> job;
    std::optional<std::string> launch; // launch.sh's bytes
    // A direct connection's only run (first_run): the standby script's entry, from this
    // machine's note, which its `once` standby runs through the verifier. Nothing of the
    // session's is on the host yet: the job's bytes go with the run (docs/run-protocol.md, "A
    // first run without SFTP").
    std::string standby_entry;
  };
  // The once run's held job: its bytes, the entry the standby makes or checks.
  [[nodiscard]] bool hold_job_once(Deferred& deferred, const std::string& path,
                                   std::string_view bytes, const std::string& sha256) const;
  // settle's run directory: a once run's is the session's first (the base judged and swept).
  [[nodiscard]] Expected<void> make_held_dir(SftpFiles& files, const std::string& dir,
                                             const Deferred& deferred, bool after_standby);
  // A once run's standby whose verifier refused its script (`entry`): the file still there is
  // discarded and put there again, and the run's record warns.
  void replace_refused_script(SftpFiles& files, const std::string& entry);
  // What a once run (`standby_entry`) may use: its own python standby, for any job.
  void once_use(StandbyUse& use, const std::string& standby_entry);
  // After a once run's exec: noted as made by its standby, or (not staged by it, not stopped)
  // the note says for an hour that no standby starts there.
  void after_once(const std::string& dir, bool staged_by_standby, bool stopped);
  // Once the session has swept the base (or put the script in the job cache): this machine's
  // note of whether the job cache holds the standby's script, for a later only run.
  void note_script(const std::optional<std::string>& entry);
  [[nodiscard]] standby::Facts facts() const;
  // The line that makes a standby channel's sh the python standby (standby_boot_line); empty
  // while the script is not known to be in the job cache.
  [[nodiscard]] std::string python_boot_line() const;
  void boot_failed(int code);
  // The script's entry, now in the job cache: later python standbys boot from it.
  void set_python_command(const std::string& entry);
  // What a python standby's ready line said of the compiled code beside its script: the next
  // standby is told it, and so is this machine's note, for the connection's later sessions.
  void said_tag(const std::string& tag_sha256);
  // This machine's note told that the code beside `entry` has the sum `said`, unless `noted`
  // (what the note says, as far as this session knows) already is that.
  void note_code(const std::string& entry, const std::string& said, std::string& noted);
  [[nodiscard]] bool python_ready() const
  {
    return !m_no_python_standby && !m_python_command.empty();
  }

  Channels& m_channels;
  std::function<SftpFiles&()> m_files;
  std::function<void(std::string_view)> m_debug;
  std::function<std::string()> m_memo_key;
  // From this machine's note (first_run): the session's only run is left to a `once` standby,
  // told the sha256 of the compiled code kept beside its script when the note knows it.
  std::string m_once_entry;
  std::string m_once_tag;
  int m_once_code = -1; // how its standby ended before its ready line, if it did
  // The next run's channel, opened ahead (open_next); not counted in Channels::execs.
  StandbyChannel m_standby;
  bool m_opening = false;
  // Python standbys that stayed after runs side by side, for the next ones; closed once the
  // holder has been idle a moment (idle), or when a run needs their slot.
  std::vector<StandbyChannel> m_spares;
  // The python standby's script in the job cache (its entry's path) once it is there; set when
  // one could not be kept or started here: later standbys are sh's.
  std::string m_python_command;
  bool m_no_python_standby = false;
  // The sha256 of the compiled code the last python standby kept beside its script (its ready
  // line): the next one runs that code only when it still matches.
  std::string m_tag_sha256;
  std::string m_noted_tag; // what this machine's note says of it, as far as this session knows
  int m_script_refusals = 0;
  // What the python standby last refused (its script's entry), until a run's record says so.
  std::string m_refused;
  standby::Clock::time_point m_script_checked; // when look_at_script last looked
  std::function<void()> m_taken;               // on_taken
  bool m_first_asked = false;                  // first_run: only for the session's first run
  bool m_fan_out_python = false;
  standby::RunsPlan m_plan;
  std::map<std::string, Deferred> m_deferred; // by run directory
};

} // namespace ferry::ssh
