#include "transport/ssh/sftp_files.hpp"

#include <fcntl.h>

#include <algorithm>

#include <thread>

#include <fmt/format.h>

#include "ferry/remote/launcher.hpp"
#include "ferry/remote/shell_neutral.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"

namespace ferry::ssh {

namespace {
constexpr std::size_t k_noise_shown = 200;
} // namespace

SftpFiles::SftpFiles(ssh_session session, std::string label, std::string user,
                     std::string remote_base, CallWatchdog& watchdog, const StopToken& stop)
    : m_session(session), m_label(std::move(label)), m_user(std::move(user)),
      m_remote_base(std::move(remote_base)), m_watchdog(watchdog), m_stop(stop)
{
}

CallWatchdog::Armed SftpFiles::arm(std::string what)
{
  return m_watchdog.arm(std::move(what), &m_stop);
}

std::string SftpFiles::error(std::string_view what, std::string_view path) const
{
  if (const auto cut = m_watchdog.fired()) {
    return fmt::format("{}: cannot {} {} on the host: {}", m_label, what, path, *cut);
  }
  if (ssh_is_connected(m_session) == 0) {
    // The server's last status says nothing of this step: the connection is gone (its sshd
    // stopped, or the network), not the disk full that SSH_FX_FAILURE would suggest.
    return fmt::format("{}: cannot {} {} on the host: connection lost", m_label, what, path);
  }
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

SftpFiles::ShellProbe SftpFiles::probe_login_shell()
{
  // Ask the login shell to run `true`: anything that comes back was printed by its startup
  // files, and a failure means it runs no command at all.
  const auto armed = arm("ask the login shell to run `true`");
  Channel channel(ssh_channel_new(m_session));
  ShellProbe probe;
  if (!channel || ssh_channel_open_session(channel.get()) != SSH_OK ||
      ssh_channel_request_exec(channel.get(), "true") != SSH_OK) {
    return probe;
  }
  char buffer[4096];
  for (int is_stderr = 0; is_stderr < 2; ++is_stderr) {
    int n = 0;
    while (probe.output.size() < 4096 &&
           (n = ssh_channel_read_timeout(channel.get(), buffer, sizeof buffer, is_stderr, 5000)) >
               0) {
      probe.output.append(buffer, static_cast<std::size_t>(n));
    }
  }
  probe.status = ssh_channel_get_exit_status(channel.get());
  ssh_channel_close(channel.get());
  while (!probe.output.empty() && (probe.output.back() == '\n' || probe.output.back() == '\r')) {
    probe.output.pop_back();
  }
  return probe;
}

Expected<void> SftpFiles::start()
{
  if (m_sftp) {
    return {};
  }
  const bool was_suspended = std::exchange(m_suspended, false);
  {
    const auto armed = arm("open an SFTP channel");
    m_sftp.reset(sftp_new(m_session));
    // A refused open: a channel the session keeps ahead may hold the slot (a host with MaxSessions
    // 1), and goes. sshd frees a channel's slot only once it has reaped its command, so the open is
    // tried again, briefly, after an exec or a channel kept ahead let one go.
    const bool made_room = !m_sftp && m_make_room && m_make_room();
    for (int wait_ms = 20;
         !m_sftp && wait_ms <= 640 && !m_watchdog.fired() && (was_suspended || made_room);
         wait_ms *= 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
      m_sftp.reset(sftp_new(m_session));
    }
  }
  if (!m_sftp) {
    const std::string why = m_watchdog.fired().value_or(ssh_get_error(m_session));
    if (why.find("subsystem failed") != std::string::npos) {
      // The server refused the subsystem request itself: no `Subsystem sftp` line in its
      // sshd_config (or one it cannot start).
      return fail(ErrorKind::failed,
                  "{}: the host has no SFTP (its sshd refused the sftp subsystem); ferry needs "
                  "the sftp subsystem enabled in the host's sshd_config (`Subsystem sftp "
                  "internal-sftp`)",
                  m_label);
    }
    return fail(ErrorKind::failed, "{}: cannot open an SFTP channel: {}", m_label, why);
  }
  {
    const auto armed = arm("start SFTP");
    if (sftp_init(m_sftp.get()) == SSH_OK) {
      return {};
    }
  }
  const std::string libssh_error = ssh_get_error(m_session);
  m_sftp.reset();
  if (const auto cut = m_watchdog.fired()) {
    return fail(ErrorKind::failed,
                "{}: SFTP did not start: {}. With an external sftp-server the login shell of {} "
                "starts it: check that the shell's startup files do not wait for input or hang",
                m_label, *cut, m_user);
  }
  const ShellProbe probe = probe_login_shell();
  if (probe.status > 0) {
    return fail(ErrorKind::failed,
                "{}: SFTP did not start, and the login shell of {} runs no command (`true` exited "
                "with status {}{}): the account's shell may be /bin/false or nologin. ferry needs "
                "an account whose login shell runs commands",
                m_label, m_user, probe.status,
                probe.output.empty()
                    ? ""
                    : fmt::format(", saying \"{}\"",
                                  std::string_view(probe.output).substr(0, k_noise_shown)));
  }
  const std::string& noise = probe.output;
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

bool SftpFiles::suspend()
{
  if (!m_sftp) {
    return false;
  }
  m_sftp.reset(); // sends the channel's close; nothing waits for an answer
  m_suspended = true;
  return true;
}

namespace {
SeenDir seen_dir(const std::string& path, const sftp_attributes_struct& attributes)
{
  const SeenDir::Type type = attributes.type == SSH_FILEXFER_TYPE_DIRECTORY
                                 ? SeenDir::Type::directory
                             : attributes.type == SSH_FILEXFER_TYPE_SYMLINK ? SeenDir::Type::link
                                                                            : SeenDir::Type::other;
  return {path, type, attributes.uid, attributes.permissions & 07777};
}
} // namespace

Expected<SeenDir> SftpFiles::make_base_dir(const std::string& dir)
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
    // The server's umask took some of the owner's bits (it can only take bits away).
    if (attributes->type == SSH_FILEXFER_TYPE_DIRECTORY &&
        (attributes->permissions & 07777) != 0700) {
      if (sftp_chmod(sftp, dir.c_str(), 0700) != SSH_OK) {
        return fail(ErrorKind::failed, "{}", error("set mode 0700 on", dir));
      }
      attributes->permissions = (attributes->permissions & ~07777U) | 0700;
    }
  }
  return seen_dir(dir, *attributes);
}

Expected<SeenDir> SftpFiles::look_at_dir(const std::string& dir)
{
  const Attributes attributes(sftp_lstat(m_sftp.get(), dir.c_str()));
  if (!attributes) {
    return fail(ErrorKind::failed, "{}", error("inspect", dir));
  }
  return seen_dir(dir, *attributes);
}

Expected<void> SftpFiles::judge_base() const
{
  if (auto problem = base_chain_problem(m_base_chain, m_uid, m_user)) {
    return fail(ErrorKind::failed, "{}: {}", m_label, *problem);
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
    const auto armed = arm("resolve the home directory");
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
  // One bounded step per directory: over a slow link the whole walk takes many round trips.
  // Made top down, judged bottom up (the base first), then the directories above them up to the
  // first of root's.
  std::vector<SeenDir> chain;
  for (const auto& dir : to_create) {
    const auto armed = arm("prepare the run base " + dir);
    FERRY_TRY_ASSIGN(auto seen, make_base_dir(dir));
    chain.insert(chain.begin(), std::move(seen));
  }
  for (auto above = parent_dir(to_create.front());
       above && chain.back().type == SeenDir::Type::directory && walk_above(chain.back());
       above = parent_dir(*above)) {
    const auto armed = arm("inspect " + *above + ", above the run base");
    FERRY_TRY_ASSIGN(auto seen, look_at_dir(*above));
    chain.push_back(std::move(seen));
  }
  m_base_chain = std::move(chain);
  FERRY_TRY(judge_base());
  m_base = base;
  return {};
}

std::string SftpFiles::run_dir_name(const std::string& base)
{
  return fmt::format("{}/ferry-{}-{}", base, utc_compact(std::chrono::system_clock::now()),
                     random_hex(16));
}

bool SftpFiles::mkdir_0700(const std::string& dir)
{
  return sftp_mkdir(m_sftp.get(), dir.c_str(), 0700) == SSH_OK;
}

Expected<void> SftpFiles::make_run_dir(const std::string& dir)
{
  FERRY_TRY(start());
  const auto armed = arm("create the run directory");
  if (!mkdir_0700(dir)) {
    return fail(ErrorKind::failed, "{}", error("create the run directory", dir));
  }
  if (m_chmod_run_dirs.value_or(true) && sftp_chmod(m_sftp.get(), dir.c_str(), 0700) != SSH_OK) {
    return fail(ErrorKind::failed, "{}", error("set mode 0700 on", dir));
  }
  return {};
}

Expected<std::string> SftpFiles::create_run_dir()
{
  FERRY_TRY(prepare_base());
  // The base may be known from an earlier run while SFTP stepped aside for an exec (MaxSessions
  // 1): start it again before the mkdir.
  FERRY_TRY(start());
  std::string dir = new_run_dir_name();
  FERRY_TRY(make_new_run_dir(dir));
  return dir;
}

Expected<void> SftpFiles::create_named_run_dir(const std::string& dir)
{
  FERRY_TRY(prepare_base());
  if (dir.substr(0, dir.rfind('/')) != m_base) {
    return fail(ErrorKind::failed,
                "{}: the run base is {} now, not {} as an earlier run of this machine found it; "
                "run again",
                m_label, m_base, dir.substr(0, dir.rfind('/')));
  }
  FERRY_TRY(start());
  return make_new_run_dir(dir);
}

Expected<void> SftpFiles::make_new_run_dir(const std::string& dir)
{
  const auto armed = arm("create the run directory");
  if (!mkdir_0700(dir)) {
    return fail(ErrorKind::failed, "{}", error("create the run directory", dir));
  }
  // sftp-server applies its umask, which can only take bits away from 0700: the session's first
  // directory shows whether it leaves 0700 (the usual case: no chmod from then on) or takes
  // some of the owner's (then every directory is set to 0700 explicitly).
  long long created = 0;
  if (!m_chmod_run_dirs) {
    const Attributes attributes(sftp_lstat(m_sftp.get(), dir.c_str()));
    if (!attributes) {
      return fail(ErrorKind::failed, "{}", error("inspect", dir));
    }
    m_chmod_run_dirs = (attributes->permissions & 07777) != 0700;
    created = static_cast<long long>(attributes->mtime);
    // The session's first directory is the user's: its owner tells who that is on the host, and
    // the base is judged again, owners included, before anything there is run or trusted.
    m_uid = attributes->uid;
    if (auto judged = judge_base(); !judged) {
      sftp_rmdir(m_sftp.get(), dir.c_str());
      m_base.clear();
      m_chmod_run_dirs.reset();
      return judged;
    }
  }
  if (*m_chmod_run_dirs && sftp_chmod(m_sftp.get(), dir.c_str(), 0700) != SSH_OK) {
    return fail(ErrorKind::failed, "{}", error("set mode 0700 on", dir));
  }
  if (created != 0) {
    sweep_stale(dir, created);
  }
  return {};
}

Expected<void> SftpFiles::write_all(sftp_file file, const std::string& path, std::string_view bytes)
{
  constexpr std::size_t chunk = 32 * 1024;
  for (std::size_t done = 0; done < bytes.size();) {
    const std::size_t n = std::min(chunk, bytes.size() - done);
    const auto armed = arm("write " + path);
    if (sftp_write(file, bytes.data() + done, n) != static_cast<ssize_t>(n)) {
      return fail(ErrorKind::failed, "{}", error("write", path));
    }
    done += n;
  }
  return {};
}

Expected<void> SftpFiles::put_file(const std::string& path, std::string_view bytes)
{
  FERRY_TRY(write_new(path, bytes, 0600));
  m_uploaded[path.substr(0, path.rfind('/'))].push_back(path); // removed by name at the cleanup
  return {};
}

Expected<void> SftpFiles::write_new(const std::string& path, std::string_view bytes, unsigned mode)
{
  // Written in place: the run directory is new, 0700 and ours, and O_EXCL refuses any name
  // that already exists there (a symlink included), so nothing is written through a link. No
  // temporary name and rename: that cost a round trip per file, and nothing reads the file
  // before the upload is over.
  FERRY_TRY(start());
  sftp_session sftp = m_sftp.get();
  File file;
  {
    const auto armed = arm("create " + path);
    file.reset(sftp_open(sftp, path.c_str(), O_WRONLY | O_CREAT | O_EXCL, mode));
  }
  if (!file) {
    return fail(ErrorKind::failed, "{}", error("create", path));
  }
  if (auto written = write_all(file.get(), path, bytes); !written) {
    const auto armed = arm("remove " + path);
    file.reset();
    sftp_unlink(sftp, path.c_str());
    return written;
  }
  const auto armed = arm("finish writing " + path);
  if (sftp_close(file.release()) != SSH_OK) {
    auto message = error("finish writing", path);
    sftp_unlink(sftp, path.c_str());
    return fail(ErrorKind::failed, "{}", message);
  }
  return {};
}

namespace {
std::string_view sftp_type_name(int type)
{
  switch (type) {
  case SSH_FILEXFER_TYPE_DIRECTORY:
    return "a directory";
  case SSH_FILEXFER_TYPE_SYMLINK:
    return "a symbolic link";
  case SSH_FILEXFER_TYPE_SPECIAL:
    return "a FIFO, socket or device";
  default:
    return "not a regular file";
  }
}
} // namespace

// What the open file is when it is not a regular file (it was swapped since its lstat).
std::optional<FetchedFile> SftpFiles::not_regular(sftp_file file, const std::string& path)
{
  const auto armed = arm("inspect " + path);
  const Attributes attributes(sftp_fstat(file));
  if (attributes && attributes->type == SSH_FILEXFER_TYPE_REGULAR) {
    return std::nullopt;
  }
  return FetchedFile{FetchedFile::Kind::other,
                     {},
                     attributes ? std::string(sftp_type_name(attributes->type))
                                : std::string("a file that cannot be inspected")};
}

Expected<FetchedFile> SftpFiles::fetch_stream(const std::string& path, const ChunkSink& sink,
                                              std::uint64_t offset)
{
  FERRY_TRY(start());
  File file;
  {
    // lstat first: a FIFO would block sftp-server's open forever, a link could lead anywhere.
    const auto armed = arm("inspect " + path);
    const Attributes attributes(sftp_lstat(m_sftp.get(), path.c_str()));
    if (!attributes) {
      if (sftp_get_error(m_sftp.get()) == SSH_FX_NO_SUCH_FILE && !m_watchdog.fired()) {
        return FetchedFile{};
      }
      return fail(ErrorKind::failed, "{}", error("inspect", path));
    }
    if (attributes->type != SSH_FILEXFER_TYPE_REGULAR) {
      return FetchedFile{
          FetchedFile::Kind::other, {}, std::string(sftp_type_name(attributes->type))};
    }
    // Read-write: a FIFO that a process put at the name since the lstat then opens at once,
    // where a read-only open would block sftp-server (and with it the session) until a writer
    // came. Only a file the lstat saw without owner write is opened read-only (its word must
    // do); one it saw writable that now refuses a write is no longer the file it saw.
    const bool writable = (attributes->permissions & 0200U) != 0;
    file.reset(sftp_open(m_sftp.get(), path.c_str(), O_RDWR, 0));
    if (!file && sftp_get_error(m_sftp.get()) == SSH_FX_PERMISSION_DENIED && !m_watchdog.fired()) {
      if (writable) {
        return FetchedFile{
            FetchedFile::Kind::other, {}, std::string("a file replaced since it was inspected")};
      }
      file.reset(sftp_open(m_sftp.get(), path.c_str(), O_RDONLY, 0));
    }
  }
  if (!file) {
    return fail(ErrorKind::failed, "{}", error("open", path));
  }
  if (auto other = not_regular(file.get(), path)) {
    return std::move(*other);
  }
  // Where the read starts: libssh keeps the offset itself (no round trip).
  if (sftp_seek64(file.get(), offset) != 0) {
    return fail(ErrorKind::failed, "{}", error("seek in", path));
  }
  std::vector<char> buffer(64 * 1024);
  for (;;) {
    ssize_t n = 0;
    {
      const auto armed = arm("read " + path);
      n = sftp_read(file.get(), buffer.data(), buffer.size());
    }
    if (n < 0) {
      return fail(ErrorKind::failed, "{}", error("read", path));
    }
    if (n == 0) {
      break;
    }
    FERRY_TRY(sink(std::string_view(buffer.data(), static_cast<std::size_t>(n))));
  }
  const auto armed = arm("close " + path);
  file.reset();
  return FetchedFile{FetchedFile::Kind::regular, {}, {}};
}

Expected<void> SftpFiles::make_dir(const std::string& path)
{
  FERRY_TRY(start());
  const auto armed = arm("create the directory " + path);
  // mkdir fails on any name that exists, a link included: nothing is created through a link.
  if (sftp_mkdir(m_sftp.get(), path.c_str(), 0700) != SSH_OK) {
    return fail(ErrorKind::failed, "{}", error("create the directory", path));
  }
  if (sftp_chmod(m_sftp.get(), path.c_str(), 0700) != SSH_OK) {
    return fail(ErrorKind::failed, "{}", error("set mode 0700 on", path));
  }
  return {};
}

Expected<std::optional<std::vector<DirEntry>>> SftpFiles::list_dir(const std::string& path)
{
  FERRY_TRY(start());
  const auto armed = arm("list " + path);
  Dir dir(sftp_opendir(m_sftp.get(), path.c_str()));
  if (!dir) {
    if (sftp_get_error(m_sftp.get()) == SSH_FX_NO_SUCH_FILE && !m_watchdog.fired()) {
      return std::optional<std::vector<DirEntry>>();
    }
    return fail(ErrorKind::failed, "{}", error("list", path));
  }
  std::vector<DirEntry> entries;
  // readdir's attributes come from lstat on OpenSSH's sftp-server: a link shows as a link.
  while (const Attributes item{sftp_readdir(m_sftp.get(), dir.get())}) {
    const std::string name = item->name != nullptr ? item->name : "";
    if (name.empty() || name == "." || name == "..") {
      continue;
    }
    DirEntry entry{name, DirEntry::Kind::other, item->size, {}};
    if (item->type == SSH_FILEXFER_TYPE_REGULAR) {
      entry.kind = DirEntry::Kind::file;
    } else if (item->type == SSH_FILEXFER_TYPE_DIRECTORY) {
      entry.kind = DirEntry::Kind::dir;
    } else {
      entry.what = sftp_type_name(item->type);
    }
    entries.push_back(std::move(entry));
  }
  return std::optional(std::move(entries));
}

Expected<bool> SftpFiles::file_exists(const std::string& path)
{
  FERRY_TRY(start());
  const auto armed = arm("inspect " + path);
  Attributes attributes(sftp_lstat(m_sftp.get(), path.c_str()));
  if (attributes) {
    return true;
  }
  if (sftp_get_error(m_sftp.get()) == SSH_FX_NO_SUCH_FILE && !m_watchdog.fired()) {
    return false;
  }
  return fail(ErrorKind::failed, "{}", error("inspect", path));
}

} // namespace ferry::ssh
