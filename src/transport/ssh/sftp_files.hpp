#pragma once
// Every file operation of an SSH session, over SFTP: the run base and run directories, uploads
// written in place with O_EXCL, the result's fetch, and the cleanup.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ferry/expected.hpp"
#include "transport/ssh/handles.hpp"

namespace ferry::ssh {

class SftpFiles {
public:
  // `session` is connected and authenticated; `remote_base` empty means $HOME/.cache/ferry/runs.
  SftpFiles(ssh_session session, std::string label, std::string user, std::string remote_base);

  [[nodiscard]] Expected<std::string> create_run_dir();
  [[nodiscard]] Expected<void> put_file(const std::string& path, std::string_view bytes);
  [[nodiscard]] Expected<std::optional<std::string>> fetch_file(const std::string& path,
                                                                std::size_t cap);
  [[nodiscard]] Expected<bool> file_exists(const std::string& path);
  [[nodiscard]] Expected<void> remove_run_dir(const std::string& path);

private:
  [[nodiscard]] Expected<void> start();
  [[nodiscard]] Expected<void> prepare_base();
  [[nodiscard]] Expected<void> check_base_dir(const std::string& dir, bool is_base);
  [[nodiscard]] Expected<void> write_all(sftp_file file, const std::string& path,
                                         std::string_view bytes);
  [[nodiscard]] Expected<void> remove_tree(const std::string& path, int depth);
  [[nodiscard]] std::string error(std::string_view what, std::string_view path) const;
  [[nodiscard]] std::string startup_noise();

  ssh_session m_session;
  std::string m_label;
  std::string m_user;
  std::string m_remote_base;
  Sftp m_sftp;
  std::string m_base; // the run base, checked once per session
  std::map<std::string, std::vector<std::string>> m_uploaded; // run dir -> files put there
};

} // namespace ferry::ssh
