// The SSH transport: libssh for the connection, SFTP for every file, one exec channel per job
// whose command is only `/bin/sh RUN_DIR/launch.sh`. Each concern has a file of its own in this
// folder: options (where to go), host_key (whom to trust), auth, sftp_files, exec.
#include <optional>
#include <random>
#include <thread>

#include "ferry/host_spec.hpp"
#include "ferry/sessions.hpp"
#include "transport/ssh/auth.hpp"
#include "transport/ssh/exec.hpp"
#include "transport/ssh/host_key.hpp"
#include "transport/ssh/options.hpp"
#include "transport/ssh/sftp_files.hpp"

namespace ferry {
namespace {

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
    return {{"host", spec ? spec->host : m_target.spec},
            {"address", m_where.host},
            {"user", m_where.user},
            {"port", m_where.port},
            {"host_key_sha256", m_host_key_sha256}};
  }
  std::string label() const override { return m_target.spec; }

  Expected<void> connect() override;
  Expected<std::string> create_run_dir() override { return files().create_run_dir(); }
  Expected<void> put_file(const std::string& path, std::string_view bytes) override
  {
    return files().put_file(path, bytes);
  }
  void bind_stop(const StopToken& stop) override { m_stop = stop; }
  Expected<ExecOutcome> exec(const ExecRequest& request) override
  {
    // A host with MaxSessions 1 refuses a second channel while SFTP holds one: SFTP steps
    // aside for the exec and starts again for the fetch.
    const auto free_a_channel = [this] { return m_files && m_files->suspend(); };
    ExecRequest bounded = request;
    bounded.start_limit = watchdog().limits().call; // the login shell runs before the launcher
    return ssh::exec(m_session.get(), m_target.spec, bounded, watchdog(), free_a_channel);
  }
  Expected<FetchedFile> fetch_file(const std::string& path, std::size_t cap) override
  {
    return files().fetch_file(path, cap);
  }
  Expected<bool> file_exists(const std::string& path) override { return files().file_exists(path); }
  Expected<void> remove_run_dir(const std::string& path) override
  {
    return files().remove_run_dir(path);
  }

private:
  Expected<void> connect_once();
  ssh::SftpFiles& files()
  {
    if (!m_files) {
      m_files.emplace(m_session.get(), m_target.spec, m_where.user, m_target.remote_base,
                      watchdog(), m_stop);
    }
    return *m_files;
  }
  ssh::CallWatchdog& watchdog()
  {
    if (!m_watchdog) {
      // A blocking step may take twice the connect timeout (at least 5 s) before the host is
      // taken to have stopped answering.
      const double connect_s = m_target.connect_timeout_s > 0 ? m_target.connect_timeout_s : 10;
      ssh::CallWatchdog::Limits limits;
      limits.call =
          std::chrono::milliseconds(static_cast<long>(std::max(5.0, 2 * connect_s) * 1000));
      m_watchdog.emplace(m_session.get(), limits);
    }
    return *m_watchdog;
  }
  std::string connect_failure_hint() const
  {
    return m_target.connect_timeout_s > 0
               ? fmt::format("timeout {} s, --connect-timeout", m_target.connect_timeout_s)
               : "timeout: ConnectTimeout in the ssh config, else 10 s; --connect-timeout";
  }

  SshTarget m_target;
  StopToken m_stop;
  ssh::Session m_session;
  // After m_session: they end before the connection does.
  std::optional<ssh::CallWatchdog> m_watchdog;
  std::optional<ssh::SftpFiles> m_files;
  ssh::Resolved m_where;
  std::string m_host_key_sha256;
};

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
  m_files.reset();
  m_watchdog.reset();
  m_session.reset(ssh_new());
  if (!m_session) {
    return fail(ErrorKind::failed, "{}: cannot allocate an SSH session", m_target.spec);
  }
  ssh_session s = m_session.get();
  FERRY_TRY_ASSIGN(m_where, ssh::configure(s, m_target));
  if (ssh_connect(s) != SSH_OK) {
    return fail(ErrorKind::unreachable,
                "{}: cannot connect to {}:{}: {}; check the host name, that sshd listens on that "
                "port, and the network ({})",
                m_target.spec, m_where.host, m_where.port, ssh_get_error(s),
                connect_failure_hint());
  }
  const ssh::HostKeyPolicy policy{m_target.spec, m_target.accept_new_host_key};
  FERRY_TRY_ASSIGN(const auto offered, ssh::server_key(s, policy));
  m_host_key_sha256 = offered.fingerprint;
  FERRY_TRY(ssh::verify_host_key(s, offered, m_where, policy));
  return ssh::authenticate(s, m_target.spec, m_where.user, m_target.identity);
}

} // namespace

std::unique_ptr<HostSession> make_ssh_session(const SshTarget& target)
{
  return std::make_unique<SshSession>(target);
}

} // namespace ferry
