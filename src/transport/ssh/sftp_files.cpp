#include "transport/ssh/sftp_files.hpp"

#include <fcntl.h>

#include <fmt/format.h>

#include "ferry/remote/shell_neutral.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"

namespace ferry::ssh {

namespace {
constexpr int k_max_remove_depth = 32;
constexpr std::size_t k_noise_shown = 200;
} // namespace

SftpFiles::SftpFiles(ssh_session session, std::string label, std::string user,
                     std::string remote_base)
    : m_session(session), m_label(std::move(label)), m_user(std::move(user)),
      m_remote_base(std::move(remote_base))
{
}

std::string SftpFiles::error(std::string_view what, std::string_view path) const
{
  const int code = m_sftp ? sftp_get_error(m_sftp.get()) : -1;
  std::string_view reason;
  switch (code) {
  case SSH_FX_NO_SUCH_FILE:
    reason = "no such file or directory";
    break;
  case SSH_FX_PERMISSION_DENIED:
    reason = "permission denied";
    break;
  case SSH_FX_FILE_ALREADY_EXISTS:
    reason = "already exists";
    break;
  case 14:
    reason = "no space left on the device";
    break; // SFTP v6 codes, for servers that send them
  case 15:
    reason = "quota exceeded";
    break;
  case SSH_FX_FAILURE:
    reason = "failure (a full disk or quota also shows this way)";
    break;
  default:
    reason = ssh_get_error(m_session);
    break;
  }
  return fmt::format("{}: cannot {} {} on the host: {}", m_label, what, path, reason);
}

std::string SftpFiles::startup_noise()
{
  // Ask the login shell to run `true`: anything that comes back was printed by its startup files.
  Channel channel(ssh_channel_new(m_session));
  if (!channel || ssh_channel_open_session(channel.get()) != SSH_OK ||
      ssh_channel_request_exec(channel.get(), "true") != SSH_OK) {
    return {};
  }
  std::string noise;
  char buffer[4096];
  int n = 0;
  while ((n = ssh_channel_read_timeout(channel.get(), buffer, sizeof buffer, 0, 5000)) > 0 &&
         noise.size() < 4096) {
    noise.append(buffer, static_cast<std::size_t>(n));
  }
  ssh_channel_close(channel.get());
  return noise;
}

Expected<void> SftpFiles::start()
{
  if (m_sftp) {
    return {};
  }
  m_sftp.reset(sftp_new(m_session));
  if (!m_sftp) {
    return fail(ErrorKind::failed, "{}: cannot open an SFTP channel: {}", m_label,
                ssh_get_error(m_session));
  }
  if (sftp_init(m_sftp.get()) == SSH_OK) {
    return {};
  }
  const std::string libssh_error = ssh_get_error(m_session);
  m_sftp.reset();
  std::string noise = startup_noise();
  while (!noise.empty() && (noise.back() == '\n' || noise.back() == '\r')) {
    noise.pop_back();
  }
  if (!noise.empty()) {
    return fail(ErrorKind::failed,
                "{}: SFTP did not start because the login shell of {} prints text when it "
                "starts (\"{}\"), which corrupts the sftp-server stream. Make the shell's startup "
                "files (e.g. ~/.zshenv, ~/.bashrc, ~/.config/fish/config.fish, ~/.tcshrc) print "
                "only in interactive shells, or set `Subsystem sftp internal-sftp` in the "
                "host's sshd_config",
                m_label, m_user, std::string_view(noise).substr(0, k_noise_shown));
  }
  return fail(ErrorKind::failed,
              "{}: SFTP did not start ({}); ferry needs the sftp subsystem enabled in the host's "
              "sshd_config (`Subsystem sftp internal-sftp`)",
              m_label, libssh_error);
}

Expected<void> SftpFiles::check_base_dir(const std::string& dir, bool is_base)
{
  sftp_session sftp = m_sftp.get();
  Attributes attributes(sftp_lstat(sftp, dir.c_str()));
  if (!attributes) {
    if (sftp_mkdir(sftp, dir.c_str(), 0700) != SSH_OK &&
        sftp_get_error(sftp) != SSH_FX_FILE_ALREADY_EXISTS) {
      return fail(ErrorKind::failed, "{}", error("create the directory", dir));
    }
    attributes.reset(sftp_lstat(sftp, dir.c_str()));
    if (!attributes) {
      return fail(ErrorKind::failed, "{}", error("inspect", dir));
    }
  }
  if (attributes->type == SSH_FILEXFER_TYPE_SYMLINK) {
    return fail(ErrorKind::failed,
                "{}: {} is a symbolic link; ferry does not write through links it did not make. "
                "Remove it or set --remote-base to a real directory",
                m_label, dir);
  }
  if (attributes->type != SSH_FILEXFER_TYPE_DIRECTORY) {
    return fail(ErrorKind::failed, "{}: {} exists and is not a directory", m_label, dir);
  }
  if (is_base && (attributes->permissions & 022) != 0) {
    return fail(
        ErrorKind::failed,
        "{}: the run base {} is writable by group or others (mode {:o}); another user "
        "could tamper with runs. Fix it with `chmod 700 {}` or choose another --remote-base",
        m_label, dir, attributes->permissions & 07777, dir);
  }
  return {};
}

Expected<void> SftpFiles::prepare_base()
{
  if (!m_base.empty()) {
    return {};
  }
  FERRY_TRY(start());
  std::string base = m_remote_base;
  std::vector<std::string> to_create = {base};
  if (base.empty()) {
    CString home(sftp_canonicalize_path(m_sftp.get(), "."));
    if (!home) {
      return fail(ErrorKind::failed, "{}", error("resolve the home directory", "."));
    }
    const std::string home_path = home.get();
    base = home_path + "/.cache/ferry/runs";
    to_create = {home_path + "/.cache", home_path + "/.cache/ferry", base};
  }
  if (!is_shell_neutral_token(base + "/ferry-x")) {
    return fail(
        ErrorKind::failed,
        "{}: the run base {} has characters outside [A-Za-z0-9/._-], so the exec string "
        "would not be shell-neutral; set remote_base to a plain absolute path (--remote-base)",
        m_label, base);
  }
  for (const auto& dir : to_create) {
    FERRY_TRY(check_base_dir(dir, dir == base));
  }
  m_base = base;
  return {};
}

Expected<std::string> SftpFiles::create_run_dir()
{
  FERRY_TRY(prepare_base());
  const std::string dir = fmt::format(
      "{}/ferry-{}-{}", m_base, utc_compact(std::chrono::system_clock::now()), random_hex(16));
  if (sftp_mkdir(m_sftp.get(), dir.c_str(), 0700) != SSH_OK) {
    return fail(ErrorKind::failed, "{}", error("create the run directory", dir));
  }
  // sftp-server applies the umask; the mode is set explicitly.
  if (sftp_chmod(m_sftp.get(), dir.c_str(), 0700) != SSH_OK) {
    return fail(ErrorKind::failed, "{}", error("set mode 0700 on", dir));
  }
  return dir;
}

Expected<void> SftpFiles::write_all(sftp_file file, const std::string& path, std::string_view bytes)
{
  constexpr std::size_t chunk = 32 * 1024;
  for (std::size_t done = 0; done < bytes.size();) {
    const std::size_t n = std::min(chunk, bytes.size() - done);
    if (sftp_write(file, bytes.data() + done, n) != static_cast<ssize_t>(n)) {
      return fail(ErrorKind::failed, "{}", error("write", path));
    }
    done += n;
  }
  return {};
}

Expected<void> SftpFiles::put_file(const std::string& path, std::string_view bytes)
{
  // Written in place: the run directory is new, 0700 and ours, and O_EXCL refuses any name
  // that already exists there (a symlink included), so nothing is written through a link. No
  // temporary name and rename: that cost a round trip per file, and nothing reads the file
  // before the upload is over.
  FERRY_TRY(start());
  sftp_session sftp = m_sftp.get();
  File file(sftp_open(sftp, path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600));
  if (!file) {
    return fail(ErrorKind::failed, "{}", error("create", path));
  }
  if (auto written = write_all(file.get(), path, bytes); !written) {
    file.reset();
    sftp_unlink(sftp, path.c_str());
    return written;
  }
  if (sftp_close(file.release()) != SSH_OK) {
    auto message = error("finish writing", path);
    sftp_unlink(sftp, path.c_str());
    return fail(ErrorKind::failed, "{}", message);
  }
  m_uploaded[path.substr(0, path.rfind('/'))].push_back(path);
  return {};
}

Expected<std::optional<std::string>> SftpFiles::fetch_file(const std::string& path, std::size_t cap)
{
  FERRY_TRY(start());
  File file(sftp_open(m_sftp.get(), path.c_str(), O_RDONLY, 0));
  if (!file) {
    if (sftp_get_error(m_sftp.get()) == SSH_FX_NO_SUCH_FILE) {
      return std::optional<std::string>();
    }
    return fail(ErrorKind::failed, "{}", error("open", path));
  }
  std::string bytes;
  std::vector<char> buffer(64 * 1024);
  while (bytes.size() <= cap) {
    const ssize_t n = sftp_read(file.get(), buffer.data(), buffer.size());
    if (n < 0) {
      return fail(ErrorKind::failed, "{}", error("read", path));
    }
    if (n == 0) {
      break;
    }
    bytes.append(buffer.data(), static_cast<std::size_t>(n));
  }
  return std::optional<std::string>(std::move(bytes));
}

Expected<bool> SftpFiles::file_exists(const std::string& path)
{
  FERRY_TRY(start());
  Attributes attributes(sftp_lstat(m_sftp.get(), path.c_str()));
  if (attributes) {
    return true;
  }
  if (sftp_get_error(m_sftp.get()) == SSH_FX_NO_SUCH_FILE) {
    return false;
  }
  return fail(ErrorKind::failed, "{}", error("inspect", path));
}

Expected<void> SftpFiles::remove_tree(const std::string& path, int depth)
{
  sftp_session sftp = m_sftp.get();
  if (depth > k_max_remove_depth) {
    return fail(ErrorKind::failed, "{}: {} is nested too deeply to remove", m_label, path);
  }
  {
    Dir dir(sftp_opendir(sftp, path.c_str()));
    if (!dir) {
      return fail(ErrorKind::failed, "{}", error("list", path));
    }
    while (Attributes entry{sftp_readdir(sftp, dir.get())}) {
      const std::string name = entry->name != nullptr ? entry->name : "";
      if (name == "." || name == ".." || name.empty()) {
        continue;
      }
      const std::string child = path + "/" + name;
      if (entry->type == SSH_FILEXFER_TYPE_DIRECTORY) {
        FERRY_TRY(remove_tree(child, depth + 1));
      } else if (sftp_unlink(sftp, child.c_str()) != SSH_OK) {
        return fail(ErrorKind::failed, "{}", error("remove", child));
      }
    }
  }
  if (sftp_rmdir(sftp, path.c_str()) != SSH_OK) {
    return fail(ErrorKind::failed, "{}", error("remove the directory", path));
  }
  return {};
}

Expected<void> SftpFiles::remove_run_dir(const std::string& path)
{
  FERRY_TRY(start());
  // The usual run directory holds what ferry put there and result.json: remove those by name,
  // then the directory (half the round trips of listing it). Anything else there, a job's own
  // files or the timeout marker, makes rmdir fail, and the listing walk removes the rest.
  sftp_session sftp = m_sftp.get();
  auto known = std::move(m_uploaded[path]);
  m_uploaded.erase(path);
  known.push_back(path + "/result.json");
  for (const auto& file : known) {
    sftp_unlink(sftp, file.c_str()); // a name already gone is fine; the walk has the last word
  }
  if (sftp_rmdir(sftp, path.c_str()) == SSH_OK) {
    return {};
  }
  return remove_tree(path, 0);
}

} // namespace ferry::ssh
