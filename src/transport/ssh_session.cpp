// The SSH transport: libssh for the connection, SFTP for every file, one exec channel per job
// whose command is only `/bin/sh RUN_DIR/launch.sh`.
#include <charconv>
#include <cmath>
#include <fcntl.h>
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <sstream>
#include <random>
#include <thread>

#include "ferry/sessions.hpp"
#include "ferry/shell_neutral.hpp"
#include "ferry/util.hpp"
#include "transport/known_hosts.hpp"
#include "transport/ssh_handles.hpp"

#include <libssh/callbacks.h>

namespace ferry {
namespace {

std::string fingerprint(ssh_key key)
{
  unsigned char* hash = nullptr;
  size_t length = 0;
  if (key == nullptr ||
      ssh_get_publickey_hash(key, SSH_PUBLICKEY_HASH_SHA256, &hash, &length) != SSH_OK) {
    return "SHA256:?";
  }
  char* text = ssh_get_fingerprint_hash(SSH_PUBLICKEY_HASH_SHA256, hash, length);
  ssh_clean_pubkey_hash(&hash);
  std::string result = text != nullptr ? text : "SHA256:?";
  ssh_string_free_char(text);
  return result;
}

std::string expand_home(const std::string& path)
{
  if (path.rfind("~/", 0) == 0) {
    return home_dir() + path.substr(1);
  }
  return path;
}

// The public key a known_hosts line carries; null when libssh cannot read it.
ssh::Key entry_key(const known_hosts::Entry& entry)
{
  ssh_key raw = nullptr;
  if (ssh_pki_import_pubkey_base64(entry.key_base64.c_str(), ssh_key_type_from_name(entry.key_type.c_str()),
                                   &raw) != SSH_OK) {
    return ssh::Key();
  }
  return ssh::Key(raw);
}

// The first plain entry of `entries` for host:port (hashed names included), with its file and
// line, so a "changed" message can show both fingerprints and where the old one is.
struct RecordedKey {
  std::string fingerprint;
  std::string file;
  int line = 0;
};
std::optional<RecordedKey> recorded_key(const std::vector<known_hosts::Entry>& entries,
                                        const std::string& host, unsigned port)
{
  for (const auto& entry : entries) {
    if (entry.marker != known_hosts::Marker::none || !known_hosts::host_matches(entry.hosts, host, port)) {
      continue;
    }
    if (const ssh::Key key = entry_key(entry)) {
      return RecordedKey{fingerprint(key.get()), entry.file, entry.line};
    }
  }
  return std::nullopt;
}

// The entry that revokes `key` for host:port (OpenSSH's `@revoked`), if any.
const known_hosts::Entry* revoking_entry(const std::vector<known_hosts::Entry>& entries, ssh_key key,
                                         const std::string& host, unsigned port)
{
  for (const auto& entry : entries) {
    if (entry.marker != known_hosts::Marker::revoked || !known_hosts::host_matches(entry.hosts, host, port)) {
      continue;
    }
    const ssh::Key revoked = entry_key(entry);
    if (revoked && ssh_key_cmp(revoked.get(), key, SSH_KEY_CMP_PUBLIC) == 0) {
      return &entry;
    }
  }
  return nullptr;
}

bool is_transient_connect_error(std::string_view message)
{
  for (std::string_view needle : {"refused", "timed out", "Timeout", "resolve", "unreachable",
                                  "Name or service", "Temporary failure"}) {
    if (message.find(needle) != std::string_view::npos) {
      return true;
    }
  }
  return false;
}

class SshSession final : public HostSession {
public:
  explicit SshSession(SshTarget target) : m_target(std::move(target)) {}

  nlohmann::json target() const override
  {
    // "host" is the name the user gave (an alias, say); "address" what it resolved to.
    auto spec = parse_host_spec(m_target.spec);
    return {{"host", spec ? spec->host : m_target.spec}, {"address", m_host}, {"user", m_user},
            {"port", m_port}, {"host_key_sha256", m_host_key_sha256}};
  }
  std::string label() const override { return m_target.spec; }

  Expected<void> connect() override;
  Expected<std::string> create_run_dir() override;
  Expected<void> put_file(const std::string& path, std::string_view bytes) override;
  Expected<ExecOutcome> exec(const ExecRequest& request) override;
  Expected<std::optional<std::string>> fetch_file(const std::string& path, std::size_t cap) override;
  Expected<bool> file_exists(const std::string& path) override;
  Expected<void> remove_run_dir(const std::string& path) override;

private:
  Expected<void> connect_once();
  Expected<void> check_host_key();
  Expected<void> authenticate();
  Expected<void> start_sftp();
  Expected<void> prepare_base();
  [[nodiscard]] std::string sftp_error(std::string_view what, std::string_view path) const;
  [[nodiscard]] std::string startup_noise();
  Expected<void> remove_tree(const std::string& path, int depth);

  SshTarget m_target;
  ssh::Session m_session;
  ssh::Sftp m_sftp;
  std::string m_host;
  std::string m_user;
  unsigned m_port = 22;
  std::string m_host_key_sha256;
  std::string m_known_hosts;
  std::string m_global_known_hosts;
  std::string m_base; // the run base, checked once per session
  std::map<std::string, std::vector<std::string>> m_uploaded; // run dir -> files put there
};

Expected<HostSpec> parse_spec_or_fail(const std::string& spec)
{
  return parse_host_spec(spec);
}

Expected<void> SshSession::connect()
{
  std::mt19937 jitter(std::random_device{}());
  for (int attempt = 0;; ++attempt) {
    auto connected = connect_once();
    if (connected || attempt >= m_target.retries || interrupt_requested() ||
        connected.error().kind != ErrorKind::unreachable ||
        !is_transient_connect_error(connected.error().message)) {
      return connected;
    }
    // Back off 200–600 ms (doubling) so many clients retrying do not hit sshd in lockstep.
    std::uniform_int_distribution<int> ms(200, 600);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms(jitter) << std::min(attempt, 3)));
  }
}

Expected<void> SshSession::connect_once()
{
  m_sftp.reset();
  m_session.reset(ssh_new());
  if (!m_session) {
    return fail(ErrorKind::failed, "{}: cannot allocate an SSH session", m_target.spec);
  }
  ssh_session s = m_session.get();
  FERRY_TRY_ASSIGN(auto spec, parse_spec_or_fail(m_target.spec));
  ssh_options_set(s, SSH_OPTIONS_HOST, spec.host.c_str());
  if (!spec.user.empty()) {
    ssh_options_set(s, SSH_OPTIONS_USER, spec.user.c_str());
  }
  const std::string config = m_target.ssh_config.empty() ? std::string() : expand_home(m_target.ssh_config);
  if (!config.empty()) {
    std::error_code ec;
    if (!std::filesystem::exists(config, ec)) {
      return fail(ErrorKind::usage, "ssh config {} does not exist (--ssh-config)", config);
    }
  }
  // ferry's default wait, before the config so that its ConnectTimeout wins over it.
  const long default_timeout_s = 10;
  ssh_options_set(s, SSH_OPTIONS_TIMEOUT, &default_timeout_s);
  if (ssh_options_parse_config(s, config.empty() ? nullptr : config.c_str()) != SSH_OK) {
    return fail(ErrorKind::usage, "{}: cannot parse the ssh config {}: {}", m_target.spec,
                config.empty() ? "~/.ssh/config" : config, ssh_get_error(s));
  }
  // Command-line values win over the config, as with ssh(1); the port must come after parsing.
  if (!spec.user.empty()) {
    ssh_options_set(s, SSH_OPTIONS_USER, spec.user.c_str());
  }
  if (spec.port != 0) {
    ssh_options_set(s, SSH_OPTIONS_PORT, &spec.port);
  }
  const int nodelay = 1;
  ssh_options_set(s, SSH_OPTIONS_NODELAY, &nodelay);
  if (m_target.connect_timeout_s > 0) {
    const long timeout_s = std::max(1L, static_cast<long>(std::ceil(m_target.connect_timeout_s)));
    ssh_options_set(s, SSH_OPTIONS_TIMEOUT, &timeout_s);
  }
  if (!m_target.known_hosts.empty()) {
    const std::string file = expand_home(m_target.known_hosts);
    ssh_options_set(s, SSH_OPTIONS_KNOWNHOSTS, file.c_str());
    // An explicit file is the only one consulted: no system-wide list behind the user's back.
    ssh_options_set(s, SSH_OPTIONS_GLOBAL_KNOWNHOSTS, "/dev/null");
  }
  if (!m_target.identity.empty()) {
    const std::string file = expand_home(m_target.identity);
    std::error_code ec;
    if (!std::filesystem::exists(file, ec)) {
      return fail(ErrorKind::usage, "identity file {} does not exist (--identity)", file);
    }
    ssh_options_set(s, SSH_OPTIONS_ADD_IDENTITY, file.c_str());
  }

  char* value = nullptr;
  if (ssh_options_get(s, SSH_OPTIONS_HOST, &value) == SSH_OK) {
    m_host = value;
    ssh_string_free_char(value);
  }
  if (ssh_options_get(s, SSH_OPTIONS_USER, &value) == SSH_OK) {
    m_user = value;
    ssh_string_free_char(value);
  }
  ssh_options_get_port(s, &m_port);
  m_known_hosts = expand_home(m_target.known_hosts.empty() ? "~/.ssh/known_hosts" : m_target.known_hosts);
  if (ssh_options_get(s, SSH_OPTIONS_KNOWNHOSTS, &value) == SSH_OK) {
    m_known_hosts = value;
    ssh_string_free_char(value);
  }
  m_global_known_hosts = "/etc/ssh/ssh_known_hosts";
  if (ssh_options_get(s, SSH_OPTIONS_GLOBAL_KNOWNHOSTS, &value) == SSH_OK) {
    m_global_known_hosts = value;
    ssh_string_free_char(value);
  }

  if (ssh_connect(s) != SSH_OK) {
    return fail(ErrorKind::unreachable,
                "{}: cannot connect to {}:{}: {}; check the host name, that sshd listens on that "
                "port, and the network ({})",
                m_target.spec, m_host, m_port, ssh_get_error(s),
                m_target.connect_timeout_s > 0
                    ? fmt::format("timeout {} s, --connect-timeout", m_target.connect_timeout_s)
                    : "timeout: ConnectTimeout in the ssh config, else 10 s; --connect-timeout");
  }
  FERRY_TRY(check_host_key());
  FERRY_TRY(authenticate());
  return {};
}

Expected<void> SshSession::check_host_key()
{
  ssh_session s = m_session.get();
  ssh_key raw_key = nullptr;
  if (ssh_get_server_publickey(s, &raw_key) != SSH_OK) {
    return fail(ErrorKind::unreachable, "{}: the server sent no host key", m_target.spec);
  }
  ssh::Key key(raw_key);
  m_host_key_sha256 = fingerprint(key.get());
  const std::string name = known_hosts::lookup_name(m_host, m_port);
  const auto entries = known_hosts::read_files({m_known_hosts, m_global_known_hosts});

  // libssh 0.10 does not read @revoked lines: a revoked key is refused here first, whatever
  // else the files say and with --accept-new-host-key too, as ssh(1) refuses it.
  if (const auto* revoked = revoking_entry(entries, key.get(), m_host, m_port)) {
    return fail(ErrorKind::unreachable,
                "{}: the server's host key {} is REVOKED ({} line {}: @revoked); refusing to "
                "connect. The key may be compromised: ask the host's owner for its new key",
                m_target.spec, m_host_key_sha256, revoked->file, revoked->line);
  }

  const auto state = ssh_session_is_known_server(s);
  switch (state) {
  case SSH_KNOWN_HOSTS_OK: return {};
  case SSH_KNOWN_HOSTS_CHANGED:
  case SSH_KNOWN_HOSTS_OTHER: {
    const auto recorded = recorded_key(entries, m_host, m_port);
    return fail(ErrorKind::unreachable,
                "{}: host key changed: the server offers {} but {}{} records {}; refusing to "
                "connect (this could be an attack). If the host was really re-keyed, remove the "
                "old entry (ssh-keygen -R '{}' -f {}) and connect again",
                m_target.spec, m_host_key_sha256, recorded ? recorded->file : m_known_hosts,
                recorded ? fmt::format(" line {}", recorded->line) : "",
                recorded ? recorded->fingerprint : "another key", name,
                recorded ? recorded->file : m_known_hosts);
  }
  case SSH_KNOWN_HOSTS_UNKNOWN:
  case SSH_KNOWN_HOSTS_NOT_FOUND: {
    if (m_target.accept_new_host_key) {
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(m_known_hosts).parent_path(), ec);
      if (ssh_session_update_known_hosts(s) != SSH_OK) {
        return fail(ErrorKind::unreachable, "{}: cannot record the host key in {}: {}",
                    m_target.spec, m_known_hosts, ssh_get_error(s));
      }
      return {};
    }
    // A @cert-authority line vouches only for certificates; libssh 0.10 negotiates plain host
    // keys, so such a line cannot admit this server (ssh(1) with no certificate says the same).
    std::string ca_note;
    for (const auto& entry : entries) {
      if (entry.marker == known_hosts::Marker::cert_authority &&
          known_hosts::host_matches(entry.hosts, m_host, m_port)) {
        ca_note = fmt::format(". {} line {} trusts a certificate authority for this host, but "
                              "ferry checks plain host keys only (no host certificates): record "
                              "the host's own key",
                              entry.file, entry.line);
        break;
      }
    }
    return fail(ErrorKind::unreachable,
                "{}: host key unknown ({}; not in {}); refusing to connect{}. Check the "
                "fingerprint with the host's owner, then run again with --accept-new-host-key to "
                "record it",
                m_target.spec, m_host_key_sha256, m_known_hosts, ca_note);
  }
  case SSH_KNOWN_HOSTS_ERROR:
  default:
    return fail(ErrorKind::unreachable, "{}: cannot check the host key against {}: {}",
                m_target.spec, m_known_hosts, ssh_get_error(s));
  }
}

Expected<void> SshSession::authenticate()
{
  ssh_session s = m_session.get();
  // Public keys first (agent, then key files): asking for "none" first, as ssh(1) does, costs
  // a round trip that almost never succeeds; it is still tried when the keys are refused.
  if (ssh_userauth_publickey_auto(s, nullptr, nullptr) == SSH_AUTH_SUCCESS ||
      ssh_userauth_none(s, nullptr) == SSH_AUTH_SUCCESS) {
    return {};
  }
  return fail(ErrorKind::unreachable,
              "{}: authentication failed for user {} (tried the ssh agent and {}); load the key "
              "into ssh-agent or pass --identity FILE",
              m_target.spec, m_user,
              m_target.identity.empty() ? "the default keys in ~/.ssh" : m_target.identity);
}

std::string SshSession::sftp_error(std::string_view what, std::string_view path) const
{
  const int code = m_sftp ? sftp_get_error(m_sftp.get()) : -1;
  std::string_view reason;
  switch (code) {
  case SSH_FX_NO_SUCH_FILE: reason = "no such file or directory"; break;
  case SSH_FX_PERMISSION_DENIED: reason = "permission denied"; break;
  case SSH_FX_FILE_ALREADY_EXISTS: reason = "already exists"; break;
  case 14: reason = "no space left on the device"; break; // SFTP v6 codes, for servers that send them
  case 15: reason = "quota exceeded"; break;
  case SSH_FX_FAILURE: reason = "failure (a full disk or quota also shows this way)"; break;
  default: reason = ssh_get_error(m_session.get()); break;
  }
  return fmt::format("{}: cannot {} {} on the host: {}", m_target.spec, what, path, reason);
}

std::string SshSession::startup_noise()
{
  // Ask the login shell to run `true`: anything that comes back was printed by its startup files.
  ssh::Channel channel(ssh_channel_new(m_session.get()));
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

Expected<void> SshSession::start_sftp()
{
  if (m_sftp) {
    return {};
  }
  m_sftp.reset(sftp_new(m_session.get()));
  if (!m_sftp) {
    return fail(ErrorKind::failed, "{}: cannot open an SFTP channel: {}", m_target.spec,
                ssh_get_error(m_session.get()));
  }
  if (sftp_init(m_sftp.get()) != SSH_OK) {
    const std::string libssh_error = ssh_get_error(m_session.get());
    m_sftp.reset();
    std::string noise = startup_noise();
    if (!noise.empty()) {
      while (!noise.empty() && (noise.back() == '\n' || noise.back() == '\r')) {
        noise.pop_back();
      }
      return fail(ErrorKind::failed,
                  "{}: SFTP did not start because the login shell of {} prints text when it "
                  "starts (\"{}\"), which corrupts the sftp-server stream. Make the shell's startup "
                  "files (e.g. ~/.zshenv, ~/.bashrc, ~/.config/fish/config.fish, ~/.tcshrc) print "
                  "only in interactive shells, or set `Subsystem sftp internal-sftp` in the "
                  "host's sshd_config",
                  m_target.spec, m_user, noise.substr(0, 200));
    }
    return fail(ErrorKind::failed,
                "{}: SFTP did not start ({}); ferry needs the sftp subsystem enabled in the host's "
                "sshd_config (`Subsystem sftp internal-sftp`)",
                m_target.spec, libssh_error);
  }
  return {};
}

Expected<void> SshSession::prepare_base()
{
  if (!m_base.empty()) {
    return {};
  }
  FERRY_TRY(start_sftp());
  sftp_session sftp = m_sftp.get();
  std::string base = m_target.remote_base;
  std::vector<std::string> to_create;
  if (base.empty()) {
    ssh::CString home(sftp_canonicalize_path(sftp, "."));
    if (!home) {
      return fail(ErrorKind::failed, "{}", sftp_error("resolve the home directory", "."));
    }
    const std::string home_dir_path = home.get();
    base = home_dir_path + "/.cache/ferry/runs";
    to_create = {home_dir_path + "/.cache", home_dir_path + "/.cache/ferry", base};
  } else {
    to_create = {base};
  }
  if (!is_shell_neutral_token(base + "/ferry-x")) {
    return fail(ErrorKind::failed,
                "{}: the run base {} has characters outside [A-Za-z0-9/._-], so the exec string "
                "would not be shell-neutral; set remote_base to a plain absolute path (--remote-base)",
                m_target.spec, base);
  }
  for (const auto& dir : to_create) {
    ssh::Attributes attributes(sftp_lstat(sftp, dir.c_str()));
    if (!attributes) {
      if (sftp_mkdir(sftp, dir.c_str(), 0700) != SSH_OK &&
          sftp_get_error(sftp) != SSH_FX_FILE_ALREADY_EXISTS) {
        return fail(ErrorKind::failed, "{}", sftp_error("create the directory", dir));
      }
      attributes.reset(sftp_lstat(sftp, dir.c_str()));
      if (!attributes) {
        return fail(ErrorKind::failed, "{}", sftp_error("inspect", dir));
      }
    }
    if (attributes->type == SSH_FILEXFER_TYPE_SYMLINK) {
      return fail(ErrorKind::failed,
                  "{}: {} is a symbolic link; ferry does not write through links it did not make. "
                  "Remove it or set --remote-base to a real directory",
                  m_target.spec, dir);
    }
    if (attributes->type != SSH_FILEXFER_TYPE_DIRECTORY) {
      return fail(ErrorKind::failed, "{}: {} exists and is not a directory", m_target.spec, dir);
    }
    if (dir == base && (attributes->permissions & 022) != 0) {
      return fail(ErrorKind::failed,
                  "{}: the run base {} is writable by group or others (mode {:o}); another user "
                  "could tamper with runs. Fix it with `chmod 700 {}` or choose another --remote-base",
                  m_target.spec, dir, attributes->permissions & 07777, dir);
    }
  }
  m_base = base;
  return {};
}

Expected<std::string> SshSession::create_run_dir()
{
  FERRY_TRY(prepare_base());
  const std::string dir = fmt::format("{}/ferry-{}-{}", m_base,
                                      utc_compact(std::chrono::system_clock::now()), random_hex(16));
  if (sftp_mkdir(m_sftp.get(), dir.c_str(), 0700) != SSH_OK) {
    return fail(ErrorKind::failed, "{}", sftp_error("create the run directory", dir));
  }
  // sftp-server applies the umask; the mode is set explicitly.
  if (sftp_chmod(m_sftp.get(), dir.c_str(), 0700) != SSH_OK) {
    return fail(ErrorKind::failed, "{}", sftp_error("set mode 0700 on", dir));
  }
  return dir;
}

Expected<void> SshSession::put_file(const std::string& path, std::string_view bytes)
{
  // Written in place: the run directory is new, 0700 and ours, and O_EXCL refuses any name
  // that already exists there (a symlink included), so nothing is written through a link. No
  // temporary name and rename: that cost a round trip per file, and nothing reads the file
  // before the upload is over.
  FERRY_TRY(start_sftp());
  sftp_session sftp = m_sftp.get();
  ssh::File file(sftp_open(sftp, path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600));
  if (!file) {
    return fail(ErrorKind::failed, "{}", sftp_error("create", path));
  }
  constexpr std::size_t chunk = 32 * 1024;
  for (std::size_t done = 0; done < bytes.size();) {
    const std::size_t n = std::min(chunk, bytes.size() - done);
    if (sftp_write(file.get(), bytes.data() + done, n) != static_cast<ssize_t>(n)) {
      auto message = sftp_error("write", path);
      file.reset();
      sftp_unlink(sftp, path.c_str());
      return fail(ErrorKind::failed, "{}", message);
    }
    done += n;
  }
  if (sftp_close(file.release()) != SSH_OK) {
    auto message = sftp_error("finish writing", path);
    sftp_unlink(sftp, path.c_str());
    return fail(ErrorKind::failed, "{}", message);
  }
  m_uploaded[path.substr(0, path.rfind('/'))].push_back(path);
  return {};
}

namespace {
// Filled from libssh's callbacks: the launcher's exit is known without blocking, so a job that
// exited while a stray process holds its output open does not keep ferry waiting.
struct ExitWatch {
  bool exited = false;
  std::optional<int> status;
  std::chrono::steady_clock::time_point at;
};
void on_exit_status(ssh_session, ssh_channel, int status, void* userdata)
{
  auto* watch = static_cast<ExitWatch*>(userdata);
  watch->exited = true;
  watch->status = status;
  watch->at = std::chrono::steady_clock::now();
}
void on_exit_signal(ssh_session, ssh_channel, const char*, int, const char*, const char*, void* userdata)
{
  auto* watch = static_cast<ExitWatch*>(userdata);
  watch->exited = true;
  watch->at = std::chrono::steady_clock::now();
}
} // namespace

Expected<ExecOutcome> SshSession::exec(const ExecRequest& request)
{
  FERRY_TRY_ASSIGN(auto command, shell_neutral_command(request.argv));
  ssh_session s = m_session.get();
  ssh::Channel channel(ssh_channel_new(s));
  if (!channel || ssh_channel_open_session(channel.get()) != SSH_OK) {
    return fail(ErrorKind::failed, "{}: cannot open a channel: {}", m_target.spec, ssh_get_error(s));
  }
  ExitWatch watch;
  ssh_channel_callbacks_struct callbacks{};
  callbacks.userdata = &watch;
  callbacks.channel_exit_status_function = on_exit_status;
  callbacks.channel_exit_signal_function = on_exit_signal;
  ssh_callbacks_init(&callbacks);
  ssh_set_channel_callbacks(channel.get(), &callbacks);
  if (ssh_channel_request_exec(channel.get(), command.c_str()) != SSH_OK) {
    return fail(ErrorKind::failed, "{}: cannot start `{}`: {}", m_target.spec, command,
                ssh_get_error(s));
  }
  ssh::Event event(ssh_event_new());
  ssh_event_add_session(event.get(), s);

  ExecOutcome outcome;
  OutputCapture out(request.sentinel, request.output_cap, request.end_marker);
  OutputCapture err(request.sentinel, request.output_cap);
  std::vector<char> buffer(64 * 1024);
  const auto start = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> termed_at;
  bool killed = false;
  while (true) {
    bool got_data = false;
    for (int is_stderr = 0; is_stderr < 2; ++is_stderr) {
      while (true) {
        const int n = ssh_channel_read_nonblocking(channel.get(), buffer.data(),
                                                   static_cast<uint32_t>(buffer.size()), is_stderr);
        if (n == SSH_ERROR) {
          if (!ssh_channel_is_eof(channel.get()) && !ssh_channel_is_closed(channel.get())) {
            outcome.lost = fmt::format("reading the job's output failed: {}", ssh_get_error(s));
          }
          break;
        }
        if (n <= 0) {
          break;
        }
        got_data = true;
        (is_stderr ? err : out).feed(std::string_view(buffer.data(), static_cast<std::size_t>(n)));
      }
    }
    if (outcome.lost || ssh_channel_is_eof(channel.get()) || ssh_channel_is_closed(channel.get())) {
      break;
    }
    if (!ssh_is_connected(s)) {
      outcome.lost = "the connection was closed";
      break;
    }
    const auto now = std::chrono::steady_clock::now();
    if (watch.exited && now - watch.at > k_output_linger) {
      outcome.output_held_open = true;
      break;
    }
    if (!termed_at && (interrupt_requested() || now - start > request.deadline)) {
      outcome.interrupted = interrupt_requested();
      outcome.deadline_passed = !outcome.interrupted;
      // OpenSSH >= 7.9 kills the session's process group; the launcher forwards it to the job.
      ssh_channel_request_send_signal(channel.get(), "TERM");
      termed_at = now;
    } else if (termed_at && !killed && now - *termed_at > request.grace + std::chrono::seconds(3)) {
      ssh_channel_request_send_signal(channel.get(), "KILL");
      killed = true;
    } else if (killed && now - *termed_at > request.grace + std::chrono::seconds(8)) {
      outcome.lost = "the job did not stop after TERM and KILL";
      break;
    }
    if (!got_data && ssh_event_dopoll(event.get(), 100) == SSH_ERROR && !ssh_is_connected(s)) {
      outcome.lost = fmt::format("the connection dropped: {}", ssh_get_error(s));
      break;
    }
  }
  ssh_event_remove_session(event.get(), s);
  if (!outcome.lost) {
    if (!watch.exited && !outcome.output_held_open) {
      // EOF came first; the status follows right behind it.
      const int status = ssh_channel_get_exit_status(channel.get());
      if (status >= 0) {
        watch.status = status;
      }
    }
    outcome.exit_code = watch.status;
    ssh_channel_close(channel.get());
  }
  ssh_remove_channel_callbacks(channel.get(), &callbacks);
  outcome.out = std::move(out).finish();
  outcome.err = std::move(err).finish();
  return outcome;
}

Expected<std::optional<std::string>> SshSession::fetch_file(const std::string& path, std::size_t cap)
{
  FERRY_TRY(start_sftp());
  ssh::File file(sftp_open(m_sftp.get(), path.c_str(), O_RDONLY, 0));
  if (!file) {
    if (sftp_get_error(m_sftp.get()) == SSH_FX_NO_SUCH_FILE) {
      return std::optional<std::string>();
    }
    return fail(ErrorKind::failed, "{}", sftp_error("open", path));
  }
  std::string bytes;
  std::vector<char> buffer(64 * 1024);
  while (bytes.size() <= cap) {
    const ssize_t n = sftp_read(file.get(), buffer.data(), buffer.size());
    if (n < 0) {
      return fail(ErrorKind::failed, "{}", sftp_error("read", path));
    }
    if (n == 0) {
      break;
    }
    bytes.append(buffer.data(), static_cast<std::size_t>(n));
  }
  return std::optional<std::string>(std::move(bytes));
}

Expected<bool> SshSession::file_exists(const std::string& path)
{
  FERRY_TRY(start_sftp());
  ssh::Attributes attributes(sftp_lstat(m_sftp.get(), path.c_str()));
  if (attributes) {
    return true;
  }
  if (sftp_get_error(m_sftp.get()) == SSH_FX_NO_SUCH_FILE) {
    return false;
  }
  return fail(ErrorKind::failed, "{}", sftp_error("inspect", path));
}

Expected<void> SshSession::remove_tree(const std::string& path, int depth)
{
  sftp_session sftp = m_sftp.get();
  if (depth > 32) {
    return fail(ErrorKind::failed, "{}: {} is nested too deeply to remove", m_target.spec, path);
  }
  {
    ssh::Dir dir(sftp_opendir(sftp, path.c_str()));
    if (!dir) {
      return fail(ErrorKind::failed, "{}", sftp_error("list", path));
    }
    while (ssh::Attributes entry{sftp_readdir(sftp, dir.get())}) {
      const std::string name = entry->name != nullptr ? entry->name : "";
      if (name == "." || name == ".." || name.empty()) {
        continue;
      }
      const std::string child = path + "/" + name;
      if (entry->type == SSH_FILEXFER_TYPE_DIRECTORY) {
        FERRY_TRY(remove_tree(child, depth + 1));
      } else if (sftp_unlink(sftp, child.c_str()) != SSH_OK) {
        return fail(ErrorKind::failed, "{}", sftp_error("remove", child));
      }
    }
  }
  if (sftp_rmdir(sftp, path.c_str()) != SSH_OK) {
    return fail(ErrorKind::failed, "{}", sftp_error("remove the directory", path));
  }
  return {};
}

Expected<void> SshSession::remove_run_dir(const std::string& path)
{
  FERRY_TRY(start_sftp());
  // The usual run directory holds what ferry put there and result.json: remove those by name,
  // then the directory (half the round trips of listing it). Anything else there, a job's own
  // files or the timeout marker, makes rmdir fail, and the listing walk removes the rest.
  sftp_session sftp = m_sftp.get();
  auto known = std::move(m_uploaded[path]);
  m_uploaded.erase(path);
  known.push_back(path + "/result.json");
  for (const auto& file : known) {
    sftp_unlink(sftp, file.c_str()); // a name already gone is fine; the walk below has the last word
  }
  if (sftp_rmdir(sftp, path.c_str()) == SSH_OK) {
    return {};
  }
  return remove_tree(path, 0);
}

} // namespace

Expected<HostSpec> parse_host_spec(std::string_view spec)
{
  HostSpec result;
  std::string_view rest = spec;
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
    result.user = std::string(rest.substr(0, at));
    rest.remove_prefix(at + 1);
  }
  std::string_view port_text;
  if (!rest.empty() && rest.front() == '[') {
    const auto close = rest.find(']');
    if (close == std::string_view::npos) {
      return fail(ErrorKind::usage, "host '{}': missing ']' after an IPv6 address", spec);
    }
    result.host = std::string(rest.substr(1, close - 1));
    rest.remove_prefix(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') {
        return fail(ErrorKind::usage, "host '{}': expected ':PORT' after ']'", spec);
      }
      port_text = rest.substr(1);
    }
  } else if (const auto colon = rest.find(':'); colon != std::string_view::npos &&
                                                rest.find(':', colon + 1) == std::string_view::npos) {
    result.host = std::string(rest.substr(0, colon));
    port_text = rest.substr(colon + 1);
  } else {
    result.host = std::string(rest);
  }
  if (result.host.empty()) {
    return fail(ErrorKind::usage, "host '{}': no host name ([user@]host[:port])", spec);
  }
  if (!port_text.empty() || (spec.find(':') != std::string_view::npos && port_text.empty() &&
                             result.host.find(':') == std::string::npos)) {
    unsigned port = 0;
    const auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (port_text.empty() || ec != std::errc() || ptr != port_text.data() + port_text.size() ||
        port == 0 || port > 65535) {
      return fail(ErrorKind::usage, "host '{}': the port must be a number from 1 to 65535", spec);
    }
    result.port = port;
  }
  return result;
}

std::unique_ptr<HostSession> make_ssh_session(const SshTarget& target)
{
  return std::make_unique<SshSession>(target);
}

} // namespace ferry
