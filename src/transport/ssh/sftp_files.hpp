#pragma once
// Every file operation of an SSH session, over SFTP: the run base and run directories, uploads
// written in place with O_EXCL, the result's fetch, and the cleanup.
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ferry/expected.hpp"
#include "ferry/transport.hpp"
#include "transport/ssh/base_trust.hpp"
#include "transport/ssh/handles.hpp"
#include "transport/ssh/job_cache.hpp"
#include "transport/ssh/watchdog.hpp"

namespace ferry::ssh {

// A job cache name as this session last saw it.
struct JobCacheSeen {
  bool usable = false; // a regular file of mode 0400 (the name shows it is the cache's)
  std::uint64_t size = 0;
  long long mtime = 0; // the host's clock
  std::chrono::steady_clock::time_point at{};
};
// The cache's names in a listing of the base, each with whether it is usable.
using JobCacheListing = std::vector<std::pair<JobCacheEntry, bool>>;

class SftpFiles {
public:
  // `session` is connected and authenticated; `remote_base` empty means $HOME/.cache/ferry/runs.
  // Every SFTP request is bounded by `watchdog`, and cut short `stop` asks for it.
  SftpFiles(ssh_session session, std::string label, std::string user, std::string remote_base,
            CallWatchdog& watchdog, const StopToken& stop);

  [[nodiscard]] Expected<std::string> create_run_dir();
  // The run base, resolved and judged (prepare_base) on first use.
  [[nodiscard]] Expected<std::string> run_base()
  {
    FERRY_TRY(prepare_base());
    return m_base;
  }
  // Whether this session has swept the base (its first run directory is made).
  [[nodiscard]] bool swept() const { return m_chmod_run_dirs.has_value(); }
  [[nodiscard]] Expected<void> put_file(const std::string& path, std::string_view bytes);
  // HostSession::put_job_file: a link to the job cache's entry (sftp_job_cache.cpp).
  // `discard_cached`: the entry was refused (its bytes no longer match): removed, and the job
  // uploaded into the run directory.
  [[nodiscard]] Expected<bool> put_job_file(const std::string& path, std::string_view bytes,
                                            const std::string& sha256, bool discard_cached = false);
  // For a run whose files the process kept ahead to run it makes itself (docs/persistence.md).
  // Whether a run directory may be named without being made: the base is
  // known and the session made its first (so the sweep and the umask check are done).
  [[nodiscard]] bool names_run_dirs() const
  {
    return !m_base.empty() && m_chmod_run_dirs.has_value() && !m_suspended;
  }
  [[nodiscard]] std::string new_run_dir_name() const { return run_dir_name(m_base); }
  // A new run directory's name under `base`: `BASE/ferry-YYYYMMDDTHHMMSSZ-HEX`.
  [[nodiscard]] static std::string run_dir_name(const std::string& base);
  // The session's first run directory, named ahead (a direct connection's only run, left to the
  // python standby, that it could not stage): made as create_run_dir makes one, the base judged
  // and swept; refused when the base is not the one the name is under.
  [[nodiscard]] Expected<void> create_named_run_dir(const std::string& dir);
  // Makes a run directory named by new_run_dir_name (0700, as create_run_dir makes one).
  [[nodiscard]] Expected<void> make_run_dir(const std::string& dir);
  // The job cache's entry that put_job_file would link `path` to, when the cache holds it;
  // nullopt when put_job_file would upload.
  [[nodiscard]] std::optional<std::string>
  cached_job_entry(const std::string& path, std::string_view bytes, const std::string& sha256);
  // The job cache entry that staging the run in `run_dir` (put_job_file, cached_job_entry) found
  // at its name but not as ferry leaves it (its type, owner, mode or size changed on the host),
  // and removed to make anew: its path, once; empty when there was none.
  [[nodiscard]] std::string take_refused_entry(const std::string& run_dir);
  // Files made on the host by others, removed by name at the cleanup as put_file's are.
  void note_put(const std::string& path)
  {
    m_uploaded[path.substr(0, path.rfind('/'))].push_back(path);
  }
  // A script of ferry's own in the job cache (as a job's bytes are kept): its entry's path.
  [[nodiscard]] Expected<std::string> cache_script(std::string_view file_name,
                                                   std::string_view bytes);
  // The same script's entry when the job cache holds it already (checked as a job's entry is);
  // nullopt when it would have to be uploaded. Never uploads.
  [[nodiscard]] std::optional<std::string> cached_script(std::string_view file_name,
                                                         std::string_view bytes);
  // The script's entry was refused (its bytes no longer match): removed, and taken for missing.
  void discard_script(std::string_view file_name, std::string_view bytes);
  [[nodiscard]] Expected<FetchedFile> fetch_stream(const std::string& path, const ChunkSink& sink,
                                                   std::uint64_t offset = 0);
  [[nodiscard]] Expected<void> make_dir(const std::string& path);
  [[nodiscard]] Expected<std::optional<std::vector<DirEntry>>> list_dir(const std::string& path);
  [[nodiscard]] Expected<bool> file_exists(const std::string& path);
  [[nodiscard]] Expected<void> remove_run_dir(const std::string& path);
  void forget_run_dir(const std::string& path)
  {
    m_uploaded.erase(path);
    m_cache_refused.erase(path);
  }
  // Closes the SFTP channel (the next request opens it again); false when none was open.
  bool suspend();
  // Called (the session's lock held) when the server refuses the SFTP channel: closes a channel
  // the session keeps open ahead of a run (ssh/ahead.hpp) so that SFTP can have its slot; false
  // when there is none to close.
  void on_refused(std::function<bool()> make_room) { m_make_room = std::move(make_room); }

private:
  [[nodiscard]] Expected<void> start();
  [[nodiscard]] Expected<void> prepare_base();
  // A new run directory (0700), the umask checked and the base swept when it is the session's
  // first.
  [[nodiscard]] Expected<void> make_new_run_dir(const std::string& dir);
  // A directory of the base as lstat shows it, made (0700) when missing.
  [[nodiscard]] Expected<SeenDir> make_base_dir(const std::string& dir);
  [[nodiscard]] Expected<SeenDir> look_at_dir(const std::string& dir);
  // The base and the directories above it, judged by base_chain_problem (owners once m_uid is
  // known).
  [[nodiscard]] Expected<void> judge_base() const;
  // Makes (and removes) the session's first run directory when none was made yet: its owner is
  // the user, which the base's and the job cache's owners are judged against.
  [[nodiscard]] Expected<void> know_the_user();
  [[nodiscard]] Expected<void> write_all(sftp_file file, const std::string& path,
                                         std::string_view bytes);
  // A new file (O_EXCL: never through an existing name or link) with `mode`, written in place.
  [[nodiscard]] Expected<void> write_new(const std::string& path, std::string_view bytes,
                                         unsigned mode);
  // What a look at a job cache entry found: usable; missing; or something at its name that is
  // not as ferry leaves it, now removed.
  enum class CacheLook { usable, missing, refused };
  [[nodiscard]] CacheLook job_cache_look(const std::string& name, std::size_t size);
  [[nodiscard]] bool job_cache_has(const std::string& name, std::size_t size)
  {
    return job_cache_look(name, size) == CacheLook::usable;
  }
  // job_cache_has for the job file `path` of a run: an entry refused is noted for the run
  // (take_refused_entry).
  [[nodiscard]] bool job_cache_has_for(const std::string& path, const std::string& name,
                                       std::size_t size);
  void job_cache_discard(const std::string& name);
  [[nodiscard]] std::optional<FetchedFile> not_regular(sftp_file file, const std::string& path);
  [[nodiscard]] Expected<void> job_cache_add(const std::string& name, std::string_view bytes);
  [[nodiscard]] Expected<bool> job_cache_give_up(const std::string& path, std::string_view bytes,
                                                 const Error& why);
  // From the sweep's listing of the base: what the cache holds, and what it removes.
  void job_cache_listed(const JobCacheListing& listing, long long now);
  // `until`: past it the walk stops where it is (what is left waits for a later run's sweep).
  [[nodiscard]] Expected<void> remove_tree(
      const std::string& path, bool each_call_bounded,
      std::chrono::steady_clock::time_point until = std::chrono::steady_clock::time_point::max());
  [[nodiscard]] Expected<void> remove_entries(const std::string& dir_path,
                                              std::vector<std::string>& pending,
                                              bool each_call_bounded,
                                              std::chrono::steady_clock::time_point until);
  // `now`: the host's clock, as the new run directory's mtime tells it.
  void sweep_stale(const std::string& new_dir, long long now);
  [[nodiscard]] std::optional<std::string> read_small(const std::string& path);
  [[nodiscard]] bool launcher_alive(const std::string& dir, const std::string& state);
  [[nodiscard]] CallWatchdog::Armed arm(std::string what);
  [[nodiscard]] bool mkdir_0700(const std::string& dir);
  [[nodiscard]] std::string error(std::string_view what, std::string_view path) const;
  struct ShellProbe {
    std::string output; // what the login shell's startup printed (trailing newlines cut)
    int status = -1;    // of `true`; -1 when unknown
  };
  [[nodiscard]] ShellProbe probe_login_shell();

  ssh_session m_session;
  std::string m_label;
  std::string m_user;
  std::string m_remote_base;
  CallWatchdog& m_watchdog;
  const StopToken& m_stop;
  Sftp m_sftp;
  std::string m_base;                 // the run base, checked once per session
  std::vector<SeenDir> m_base_chain;  // the base, then the directories above it (judge_base)
  std::optional<std::uint32_t> m_uid; // the user's, on the host: the owner of the first run dir
  // Whether run directories need an explicit chmod (the server's umask takes owner bits); known
  // after the session's first, which is also when the base is swept.
  std::optional<bool> m_chmod_run_dirs;
  bool m_suspended = false; // SFTP stepped aside for an exec (MaxSessions 1)
  std::map<std::string, std::vector<std::string>> m_uploaded; // run dir -> files put there
  // Job cache entries (by name) this session listed, checked or made, and when: trusted
  // without a look for a while. A name the sweep's listing did not show is missing for as long.
  // A cache that failed once (no links on the server, a directory at an entry's name): this
  // session uploads its jobs as any file.
  std::map<std::string, JobCacheSeen> m_cache_seen;
  std::chrono::steady_clock::time_point m_cache_listed_at{};
  std::string m_cache_missing; // the name a look last found missing, and when
  std::chrono::steady_clock::time_point m_cache_missing_at{};
  bool m_cache_off = false;
  std::map<std::string, std::string> m_cache_refused; // run dir -> the entry refused staging it
  std::function<bool()> m_make_room;                  // on_refused
};

} // namespace ferry::ssh
