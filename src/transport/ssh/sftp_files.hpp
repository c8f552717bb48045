#pragma once
// Every file operation of an SSH session, over SFTP: the run base and run directories, uploads
// written in place with O_EXCL, the result's fetch, and the cleanup.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ferry/expected.hpp"
#include "ferry/transport.hpp"
#include "transport/ssh/handles.hpp"
#include "transport/ssh/watchdog.hpp"

namespace ferry::ssh {

class SftpFiles {
public:
  // `session` is connected and authenticated; `remote_base` empty means $HOME/.cache/ferry/runs.
  // Every SFTP request is bounded by `watchdog`, and cut short `stop` asks for it.
  SftpFiles(ssh_session session, std::string label, std::string user, std::string remote_base,
            CallWatchdog& watchdog, const StopToken& stop);

  [[nodiscard]] Expected<std::string> create_run_dir();
  [[nodiscard]] Expected<void> put_file(const std::string& path, std::string_view bytes);
  [[nodiscard]] Expected<FetchedFile> fetch_file(const std::string& path, std::size_t cap);
  [[nodiscard]] Expected<FetchedFile> fetch_stream(const std::string& path, const ChunkSink& sink);
  [[nodiscard]] Expected<void> make_dir(const std::string& path);
  [[nodiscard]] Expected<std::optional<std::vector<DirEntry>>> list_dir(const std::string& path);
  [[nodiscard]] Expected<bool> file_exists(const std::string& path);
  [[nodiscard]] Expected<void> remove_run_dir(const std::string& path);
  void forget_run_dir(const std::string& path) { m_uploaded.erase(path); }
  // Closes the SFTP channel (the next request opens it again); false when none was open.
  bool suspend();

private:
  [[nodiscard]] Expected<void> start();
  [[nodiscard]] Expected<void> prepare_base();
  [[nodiscard]] Expected<void> check_base_dir(const std::string& dir, bool is_base);
  [[nodiscard]] Expected<void> write_all(sftp_file file, const std::string& path,
                                         std::string_view bytes);
  [[nodiscard]] Expected<void> remove_tree(const std::string& path, bool each_call_bounded);
  void sweep_stale(const std::string& new_dir);
  [[nodiscard]] std::optional<std::string> read_small(const std::string& path);
  [[nodiscard]] bool launcher_alive(const std::string& dir, const std::string& state);
  [[nodiscard]] CallWatchdog::Armed arm(std::string what);
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
  std::string m_base; // the run base, checked once per session
  bool m_swept = false;
  bool m_suspended = false; // SFTP stepped aside for an exec (MaxSessions 1)
  std::map<std::string, std::vector<std::string>> m_uploaded; // run dir -> files put there
};

} // namespace ferry::ssh
