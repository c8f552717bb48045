// Removing what runs leave on the host over SFTP: a run's own directory, and the sweep of stale
// ones in the run base (docs/run-protocol.md, "Clean" and "Stage"). Bounded per run: what is
// left waits for later sweeps.
#include <fcntl.h>

#include <chrono>

#include <fmt/format.h>

#include "ferry/remote/launcher.hpp"
#include "ferry/util.hpp"
#include "transport/ssh/job_cache.hpp"
#include "transport/ssh/sftp_files.hpp"

namespace ferry::ssh {

namespace {
// Cleanup runs even after a stop request, but no longer than this then.
constexpr std::chrono::seconds k_cleanup_after_stop{3};
// What removing leftovers may add to one run: the sweep of stale run directories, and the
// run's own directory when its job left a tree in it. What is left then waits for the sweeps
// of later runs, which go on from there; the run's status never depends on it.
constexpr std::chrono::seconds k_sweep_for{2};
constexpr std::chrono::seconds k_own_cleanup_for{5};
} // namespace

std::optional<std::string> SftpFiles::read_small(const std::string& path)
{
  File file(sftp_open(m_sftp.get(), path.c_str(), O_RDONLY, 0));
  if (!file) {
    return std::nullopt;
  }
  std::string bytes(4096, '\0');
  const ssize_t n = sftp_read(file.get(), bytes.data(), bytes.size());
  if (n < 0) {
    return std::nullopt;
  }
  bytes.resize(static_cast<std::size_t>(n));
  return bytes;
}

// Over SFTP, /proc tells whether the launcher still runs: its pid's command line names the run
// directory, or ends as the process a held session keeps ahead to run jobs (k_ahead_process_tail:
// it ran the launcher's work; another run's that got the pid since only keeps the directory a
// while longer). A host without /proc: the deadline alone decides.
bool SftpFiles::launcher_alive(const std::string& dir, const std::string& state)
{
  const auto pid = state_file_pid(state);
  if (!pid) {
    return false;
  }
  const auto cmdline = read_small(fmt::format("/proc/{}/cmdline", *pid));
  std::string spaced = cmdline ? *cmdline : std::string();
  std::replace(spaced.begin(), spaced.end(), '\0', ' ');
  while (!spaced.empty() && spaced.back() == ' ') {
    spaced.pop_back();
  }
  return cmdline &&
         (cmdline->find(dir) != std::string::npos || spaced.ends_with(k_ahead_process_tail));
}

// Once per session, right after this run's directory was made: the user's own run directories
// under the base that no launcher will ever remove (the launcher was killed, or never started
// because an upload broke off) are removed, and the job cache, which lives in the base, learns
// what it holds and is pruned. Best effort, bounded like any step.
void SftpFiles::sweep_stale(const std::string& new_dir, long long now)
{
  // Each step is bounded on its own (not the sweep as a whole: over a slow link a sweep of a
  // few directories takes many round trips, and it must not cost the run its connection).
  const auto sweep_until = std::chrono::steady_clock::now() + k_sweep_for;
  std::vector<std::pair<std::string, long long>> candidates;
  JobCacheListing cache;
  {
    const auto armed = arm("list the run base " + m_base);
    Dir dir(sftp_opendir(m_sftp.get(), m_base.c_str()));
    if (!dir) {
      return;
    }
    while (const Attributes entry{sftp_readdir(m_sftp.get(), dir.get())}) {
      const std::string name = entry->name != nullptr ? entry->name : "";
      if (entry->type == SSH_FILEXFER_TYPE_DIRECTORY && is_run_dir_name(name) &&
          m_base + "/" + name != new_dir) {
        candidates.emplace_back(m_base + "/" + name, entry->mtime);
      } else if (is_job_cache_name(name)) {
        const bool usable = entry->type == SSH_FILEXFER_TYPE_REGULAR &&
                            (entry->permissions & 07777) == k_job_cache_mode &&
                            trusted_file(true, entry->uid, entry->permissions, *m_uid);
        cache.push_back({{name, entry->size, static_cast<long long>(entry->mtime)}, usable});
      }
    }
  }
  job_cache_listed(cache, now);
  for (const auto& [path, modified] : candidates) {
    StaleRunCheck check{now, modified, std::nullopt, false};
    {
      const auto armed = arm("inspect " + path);
      check.state = read_small(path + "/" + k_launcher_state_file);
      check.launcher_alive = check.state && launcher_alive(path, *check.state);
    }
    if (std::chrono::steady_clock::now() > sweep_until) {
      return; // the next run's sweep goes on from here
    }
    if (is_stale_run(check) && !m_watchdog.fired()) {
      (void)remove_tree(path, true, sweep_until);
    }
  }
}

// Removes `path` and everything under it, without recursion (no depth is too deep) and without
// following links: a directory's entries first, then the directories themselves, deepest first.
// With `each_call_bounded`, every SFTP call is one bounded step of its own (over a slow link a
// walk takes many round trips; a directory of 95k files is not one step); otherwise the caller
// bounds the whole walk. Past `until` it stops, so that a huge tree costs each run a bounded
// time and the sweeps of later runs finish it (issue 45 item 5).
Expected<void> SftpFiles::remove_tree(const std::string& path, bool each_call_bounded,
                                      std::chrono::steady_clock::time_point until)
{
  std::vector<std::string> pending = {path};
  std::vector<std::string> directories;
  while (!pending.empty()) {
    const std::string dir_path = std::move(pending.back());
    pending.pop_back();
    directories.push_back(dir_path);
    FERRY_TRY(remove_entries(dir_path, pending, each_call_bounded, until));
  }
  for (auto it = directories.rbegin(); it != directories.rend(); ++it) {
    const auto removing =
        each_call_bounded ? arm("remove the directory " + *it) : CallWatchdog::Armed();
    if (sftp_rmdir(m_sftp.get(), it->c_str()) != SSH_OK) {
      return fail(ErrorKind::failed, "{}", error("remove the directory", *it));
    }
  }
  return {};
}

// One directory of remove_tree: its files removed, its directories added to `pending`.
Expected<void> SftpFiles::remove_entries(const std::string& dir_path,
                                         std::vector<std::string>& pending, bool each_call_bounded,
                                         std::chrono::steady_clock::time_point until)
{
  sftp_session sftp = m_sftp.get();
  const auto step = [&](const std::string& what) {
    return each_call_bounded ? arm(what) : CallWatchdog::Armed();
  };
  Dir dir;
  {
    const auto listing = step("list " + dir_path);
    dir.reset(sftp_opendir(sftp, dir_path.c_str()));
  }
  if (!dir) {
    return fail(ErrorKind::failed, "{}", error("list", dir_path));
  }
  for (;;) {
    if (std::chrono::steady_clock::now() > until) {
      return fail(ErrorKind::failed,
                  "{}: {} holds more than one run's cleanup removes; a later run's sweep removes "
                  "the rest",
                  m_label, dir_path);
    }
    const auto armed = step("remove what " + dir_path + " holds");
    const Attributes entry{sftp_readdir(sftp, dir.get())};
    if (!entry) {
      return {};
    }
    const std::string name = entry->name != nullptr ? entry->name : "";
    if (name == "." || name == ".." || name.empty()) {
      continue;
    }
    const std::string child = dir_path + "/" + name;
    if (entry->type == SSH_FILEXFER_TYPE_DIRECTORY) {
      pending.push_back(child);
    } else if (sftp_unlink(sftp, child.c_str()) != SSH_OK) {
      return fail(ErrorKind::failed, "{}", error("remove", child));
    }
  }
}

Expected<void> SftpFiles::remove_run_dir(const std::string& path)
{
  FERRY_TRY(start());
  // After a stop request the whole cleanup is one short bounded step; otherwise each call is
  // bounded on its own, as every other step is.
  const bool stopped = m_stop.stop_requested();
  std::optional<CallWatchdog::Armed> whole;
  if (stopped) {
    whole.emplace(m_watchdog.arm("remove " + path, nullptr, k_cleanup_after_stop));
  }
  // The usual run directory holds what ferry put there and result.json: remove those by name,
  // then the directory (half the round trips of listing it). Anything else there, a job's own
  // files or the timeout marker, makes rmdir fail, and the listing walk removes the rest.
  sftp_session sftp = m_sftp.get();
  auto known = std::move(m_uploaded[path]);
  m_uploaded.erase(path);
  std::erase_if(m_uploaded, [&](const auto& item) { return item.first.starts_with(path + "/"); });
  known.push_back(path + "/result.json");
  for (const auto& file : known) {
    const auto armed = stopped ? CallWatchdog::Armed() : arm("remove " + file);
    sftp_unlink(sftp, file.c_str()); // a name already gone is fine; the walk has the last word
  }
  {
    const auto armed = stopped ? CallWatchdog::Armed() : arm("remove " + path);
    if (sftp_rmdir(sftp, path.c_str()) == SSH_OK) {
      return {};
    }
  }
  return remove_tree(path, !stopped, std::chrono::steady_clock::now() + k_own_cleanup_for);
}

} // namespace ferry::ssh
