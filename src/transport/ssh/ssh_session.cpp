// The SSH transport: libssh for the connection, SFTP for every file, one exec channel per job
// whose command is only `/bin/sh RUN_DIR/launch.sh`. Each concern has a file of its own in this
// folder: config and options (where to go), proxy, host_key (whom to trust), identities, agent
// and auth (who we are), sftp_files, exec.
#include <atomic>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <poll.h>

#include "ferry/fd.hpp"
#include "ferry/host_spec.hpp"
#include "ferry/remote/launcher.hpp"
#include "ferry/remote/shell_neutral.hpp"
#include "ferry/sessions.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"
#include "transport/exec_request.hpp"
#include "transport/run_files.hpp"
#include "transport/ssh/ahead.hpp"
#include "transport/ssh/auth.hpp"
#include "transport/ssh/exec.hpp"
#include "transport/ssh/handshake.hpp"
#include "transport/ssh/host_key.hpp"
#include "transport/ssh/libssh_loader.hpp"
#include "transport/ssh/options.hpp"
#include "transport/ssh/proxy.hpp"
#include "transport/ssh/remote.hpp"
#include "transport/ssh/sftp_files.hpp"

namespace ferry {

// libssh 0.10 queues the disconnect message and closes the socket at once when no poll has seen
// the socket writable since the session's last write (after any write, then): the server sees
// the connection drop rather than end, and OpenSSH's sshd then takes its whole teardown where a
// disconnect ends it at once (7 ms of the host's CPU a run, docs/performance.md). Told that the
// socket is writable, libssh sends the message before the close: only when nothing of the
// session is left unsent and poll says so, so that the send cannot block.
void ssh::SessionFree::operator()(ssh_session s) const
{
  const socket_t fd = ssh_get_fd(s);
  pollfd p{fd, POLLOUT, 0};
  if (fd != SSH_INVALID_SOCKET && ssh_is_connected(s) != 0 && ssh_blocking_flush(s, 0) == SSH_OK &&
      ::poll(&p, 1, 0) == 1 && p.revents == POLLOUT) {
    ssh_set_fd_towrite(s);
  }
  ssh_disconnect(s);
  ssh_free(s);
}

namespace {

using Clock = std::chrono::steady_clock;
// How long after one of its channels ended a refused channel is taken for a slot sshd has not
// freed yet, and how often in a row that is believed before the bound is lowered anyway.
constexpr std::chrono::seconds k_slot_reaping{2};
constexpr int k_max_refusals = 50;

class SshSession final : public ssh::Remote {
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
  // Reads the ssh config (once: Match exec commands run once, as with ssh).
  Expected<void> resolve()
  {
    if (!m_resolved) {
      FERRY_TRY_ASSIGN(m_where, ssh::resolve(m_target));
      m_resolved = true;
    }
    return {};
  }
  // Several runs may use the session at once: every libssh call is made holding m_mutex. SFTP
  // calls hold it for their whole length (one SFTP channel serves them all); an exec holds it
  // only while it calls libssh, not while it waits for data.
  SessionTraits traits() const override { return {true}; }
  void plan(std::size_t runs, std::size_t at_once) override
  {
    const std::lock_guard lock(m_mutex);
    m_ahead->plan(runs, at_once);
  }
  Expected<StagedRun> stage(const RunBundle& bundle, const StopToken& stop) override;
  Expected<ExecOutcome> launch(StagedRun& run, const LaunchRequest& request) override
  {
    return exec_run(run.run_dir, launcher_request(run, request));
  }
  Expected<FetchedFile> fetch(const StagedRun& run, const std::string& rel, const ChunkSink& sink,
                              std::uint64_t offset) override
  {
    return with_sftp([&]() -> Expected<FetchedFile> {
      FERRY_TRY(m_ahead->settle(run.run_dir));
      return files().fetch_stream(run.run_dir + "/" + rel, sink, offset);
    });
  }
  Expected<std::optional<std::vector<DirEntry>>> list(const StagedRun& run,
                                                      const std::string& rel) override
  {
    return with_sftp([&]() -> Expected<std::optional<std::vector<DirEntry>>> {
      FERRY_TRY(m_ahead->settle(run.run_dir));
      return files().list_dir(rel.empty() ? run.run_dir : run.run_dir + "/" + rel);
    });
  }
  Expected<void> finish(StagedRun& run, Finish how) override
  {
    if (how == Finish::remove) {
      return remove_run_dir(run.run_dir);
    }
    forget_run_dir(run.run_dir);
    return {};
  }
  // A plain command (a scheduler's submit script): a channel of its own, never one kept ahead.
  Expected<ExecOutcome> exec(const ExecRequest& request) override;
  Expected<void> put_file(const std::string& path, std::string_view bytes) override
  {
    return with_sftp([&]() -> Expected<void> {
      FERRY_TRY(m_ahead->settle(parent_of(path)));
      return files().put_file(path, bytes);
    });
  }
  void without_job_cache() override { m_job_cache = false; }
  Expected<std::string> run_base() override
  {
    return with_sftp([&]() -> Expected<std::string> { return files().run_base(); });
  }
  std::string options_identity() const override;
  bool alive() override
  {
    // The server's end closed (its sshd restarted with a new key, say): seen on the socket
    // itself, without taking anything from it, also while another thread holds the session
    // (libssh reads nothing when nothing waits to be written, so it may still say connected).
    if (peer_closed()) {
      return false;
    }
    // A session another thread is using now (a run's or the holder's SFTP steps, which may
    // take round trips) is taken to be up: that thread finds out if it is not. A holder's hello
    // must not wait for it.
    const std::unique_lock lock(m_mutex, std::try_to_lock);
    if (!lock) {
      return true;
    }
    if (!m_session || !ssh_is_connected(m_session.get())) {
      return false;
    }
    // Reads and handles what arrived (a disconnect, a closed socket) without waiting.
    ssh_set_blocking(m_session.get(), 0);
    ssh_blocking_flush(m_session.get(), 0);
    ssh_set_blocking(m_session.get(), 1);
    return ssh_is_connected(m_session.get()) != 0;
  }
  [[nodiscard]] bool peer_closed() const
  {
    const socket_t fd = m_session ? ssh_get_fd(m_session.get()) : SSH_INVALID_SOCKET;
    pollfd p{fd, POLLRDHUP, 0};
    return fd != SSH_INVALID_SOCKET && ::poll(&p, 1, 0) > 0 &&
           (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  }
  // The key the server offered at connect, checked again: no libssh call on the session, so it
  // does not wait for a run's or the holder's SFTP steps (a holder's hello must answer soon).
  Expected<void> recheck_host_key() override
  {
    const std::lock_guard lock(m_key_mutex);
    if (!m_offered_key) {
      return fail(ErrorKind::unreachable, "{}: not connected", m_target.spec);
    }
    return ssh::classed(Unreached::host_key, verify_offered_key());
  }
  void prepare_ahead() override;
  void prepare_idle() override;
  void prepare_interpreter() override;
  void on_ahead_taken(std::function<void()> callback) override
  {
    const std::lock_guard lock(m_mutex);
    m_ahead->on_taken(std::move(callback));
  }

private:
  // A staged run's directory, named (its files held for the process that runs it, Ahead) or made
  // over SFTP.
  Expected<std::string> create_run_dir()
  {
    return with_sftp([this]() -> Expected<std::string> {
      if (auto named = m_ahead->defer_run_dir(m_files && m_files->names_run_dirs())) {
        m_staging.insert(*named);
        return std::move(*named);
      }
      auto dir = files().create_run_dir();
      if (dir) {
        m_staging.insert(*dir);
        m_ahead->run_dir_made(); // the sweep's listing told what the job cache holds
      }
      return dir;
    });
  }
  // The run's files: held in memory while the process that runs its job is to make them (the job
  // from the cache and launch.sh; Ahead), else made over SFTP.
  class Writer;
  Expected<void> remove_run_dir(const std::string& path)
  {
    return with_sftp([&]() -> Expected<void> {
      m_staging.erase(path);
      if (m_ahead->forget(path)) {
        return {}; // never made on the host
      }
      return files().remove_run_dir(path);
    });
  }
  void forget_run_dir(const std::string& path)
  {
    const std::lock_guard lock(m_mutex);
    m_ahead->forget(path);
    m_staging.erase(path);
    if (m_files) {
      m_files->forget_run_dir(path);
    }
  }
  Expected<ExecOutcome> exec_run(const std::string& run_dir, const ExecRequest& request);
  // Runs an SFTP step holding the lock; while the host allows one channel at a time, only once
  // no exec holds it.
  template <typename Step> auto with_sftp(Step step) -> decltype(step())
  {
    ++m_runs_at_sftp;
    std::unique_lock lock(m_mutex);
    const Defer done([this] { // before the lock goes
      --m_runs_at_sftp;
      m_last_run_sftp = Clock::now();
      m_changed.notify_all();
    });
    m_changed.wait(lock, [this] { return m_channels.limit > 1 || m_channels.execs == 0; });
    return step();
  }
  // Holding the lock: the holder's own SFTP steps (prepare_interpreter) wait while runs
  // make their files or run their jobs (an exec needs the lock for the job's output), from a
  // run's directory to its job's end (its client may take a while between two steps), and
  // until none has for a moment, at most a while.
  void let_runs_go_first(std::unique_lock<std::mutex>& lock);
  static std::string parent_of(const std::string& path) { return path.substr(0, path.rfind('/')); }
  Expected<void> connect_once();
  Expected<void> open_connection();
  Unexpected<Error> connection_failed(const ssh::Stepped& step);
  Expected<void> check_host_key();
  Expected<void> verify_offered_key(); // holding m_key_mutex
  // The config's story and warnings: once, not once per attempt.
  void tell_story()
  {
    if (!std::exchange(m_told, true)) {
      ssh::tell_story(m_where, m_target);
    }
  }
  void debug(std::string_view line) const
  {
    if (m_target.debug) {
      m_target.debug(line);
    }
  }
  ssh::SftpFiles& files()
  {
    if (!m_files) {
      m_files.emplace(m_session.get(), m_target.spec, m_where.user, m_target.remote_base,
                      watchdog(), m_stop);
      m_files->on_refused([this] { return m_ahead->close_one(); });
    }
    return *m_files;
  }
  ssh::CallWatchdog& watchdog()
  {
    if (!m_watchdog) {
      // A blocking step may take twice the connect timeout (at least 5 s) before the host is
      // taken to have stopped answering.
      const double connect_s = m_where.timeout_s > 0 ? m_where.timeout_s : 10;
      ssh::CallWatchdog::Limits limits;
      limits.call =
          std::chrono::milliseconds(static_cast<long>(std::max(5.0, 2 * connect_s) * 1000));
      m_watchdog.emplace(m_session.get(), limits);
    }
    return *m_watchdog;
  }
  bool free_a_channel(std::unique_lock<std::mutex>& lock, bool& refused, int& refusals);
  std::string connect_failure_hint() const
  {
    return m_target.connect_timeout_s > 0
               ? fmt::format("timeout {} s, --connect-timeout", m_target.connect_timeout_s)
               : "timeout: ConnectTimeout in the ssh config, else 10 s; --connect-timeout";
  }
  ssh::Pace pace() const { return {m_target.stop, m_where.timeout_s}; }

  SshTarget m_target;
  StopToken m_stop;
  std::unique_ptr<ssh::ProxyProcess> m_proxy; // before m_session: it outlives the connection
  ssh::Session m_session;
  // After m_session: they end before the connection does.
  std::optional<ssh::CallWatchdog> m_watchdog;
  std::optional<ssh::SftpFiles> m_files;
  ssh::Resolved m_where;
  std::string m_host_key_sha256;
  std::mutex m_key_mutex; // around m_offered_key (recheck_host_key does not take m_mutex)
  std::optional<ssh::ServerKey> m_offered_key;
  bool m_resolved = false;
  bool m_job_cache = true; // without_job_cache
  bool m_told = false;     // the config's story and warnings: once, not once per attempt
  bool m_no_retry = false; // a proxy that failed says why; trying again would not help
  std::mutex m_mutex;      // held around every libssh call once runs share the session
  std::condition_variable m_changed;
  // Runs' SFTP steps waiting for the lock or under way, and when the last of them ended
  // (let_runs_go_first).
  std::atomic<int> m_runs_at_sftp{0};
  Clock::time_point m_last_run_sftp;
  // Run directories named (create_run_dir) whose exec has not started: their runs are between
  // steps, and their client may take a moment before the next (let_runs_go_first).
  std::set<std::string> m_staging;
  ssh::Channels m_channels;
  // What is kept ready ahead of the runs. Last: its channels end first, while the connection is
  // still up.
  std::unique_ptr<ssh::Ahead> m_ahead = ssh::make_ahead(
      m_channels, [this]() -> ssh::SftpFiles& { return files(); },
      [this](std::string_view line) { debug(line); }, [this] { return options_identity(); });
};

void SshSession::prepare_ahead()
{
  std::unique_lock lock(m_mutex);
  if (!m_session || !ssh_is_connected(m_session.get())) {
    return;
  }
  m_ahead->open_next(m_session.get(), lock);
  m_changed.notify_all();
}

void SshSession::prepare_idle()
{
  {
    const std::lock_guard lock(m_mutex);
    // What stayed for runs side by side. A run staged since the idle work was wished keeps its
    // held files and its place among the runs the idle steps let go first.
    m_ahead->idle();
  }
  prepare_interpreter();
  const std::lock_guard lock(m_mutex);
  m_ahead->refresh();
}

void SshSession::let_runs_go_first(std::unique_lock<std::mutex>& lock)
{
  const auto started = Clock::now();
  const auto busy = [this] {
    return m_runs_at_sftp > 0 || m_channels.execs > 0 || !m_staging.empty();
  };
  while (true) {
    const auto wait =
        m_ahead->runs_first(busy(), std::max(m_last_run_sftp, m_channels.last_end), started);
    if (wait.for_runs) {
      m_changed.wait_until(lock, *wait.until, [&busy] { return !busy(); });
    } else if (wait.until) {
      m_changed.wait_until(lock, *wait.until);
    } else {
      return;
    }
  }
}

// Each step takes the lock for itself, after the runs' own steps: a run that comes meanwhile
// waits for one step at most.
void SshSession::prepare_interpreter()
{
  {
    std::unique_lock lock(m_mutex);
    let_runs_go_first(lock);
    if (!m_session || !ssh_is_connected(m_session.get()) || !m_ahead->look_at_script()) {
      return;
    }
  }
  // The session's first run directory checks the server's umask and sweeps the base: made
  // here, while nobody waits, so that the next run's files can be held for the process that
  // runs it.
  std::optional<std::string> made;
  {
    std::unique_lock lock(m_mutex);
    let_runs_go_first(lock);
    if (m_session && ssh_is_connected(m_session.get()) && m_files && !m_files->names_run_dirs()) {
      if (auto dir = files().create_run_dir()) {
        made = std::move(*dir);
      }
    }
  }
  std::unique_lock lock(m_mutex);
  let_runs_go_first(lock);
  if (made && m_session && ssh_is_connected(m_session.get())) {
    (void)files().remove_run_dir(*made);
  }
}

// Called holding the lock when the server refuses a run's channel. A channel of this session
// that ended a moment ago may still hold its slot (sshd frees it once it has reaped the
// command): then the bound stays and the open is tried again shortly.
bool SshSession::free_a_channel(std::unique_lock<std::mutex>& lock, bool& refused, int& refusals)
{
  // A channel still being opened ahead holds a slot too: once it is open, it goes as below.
  m_changed.wait_for(lock, std::chrono::seconds(5), [this] { return !m_ahead->opening(); });
  // A channel kept ahead takes a slot the run needs: it goes first. Its slot is free once sshd
  // has reaped what ran there (the python process and the interpreter it started take a moment):
  // until then a refusal is not taken for the server's bound.
  if (m_ahead->close_one()) {
    return true;
  }
  const bool just_freed = Clock::now() - m_channels.last_end < k_slot_reaping;
  if (m_channels.execs > 1) {
    // This session's other channels fill the server's MaxSessions: no more at once.
    if (!just_freed || ++refusals > k_max_refusals) {
      m_channels.limit = m_channels.execs - 1;
    }
    refused = true;
    return false;
  }
  // A host with MaxSessions 1 refuses a second channel while SFTP holds one: SFTP steps
  // aside for the exec and starts again for the next SFTP step.
  if (m_files && m_files->suspend()) {
    m_channels.limit = 1;
    debug("the server refused a second channel (MaxSessions 1?): SFTP closed while the job "
          "runs, reopened after it");
    return true;
  }
  return just_freed;
}

// The run directory's files, as write_run_files makes them (run_files.hpp): a job the job
// cache holds and launch.sh wait in memory for the process that is to make them, when the run
// was left to one (create_run_dir, Ahead); anything else settles the run over SFTP first.
class SshSession::Writer final : public RunDirWriter {
public:
  explicit Writer(SshSession& session) : m_session(session) {}

  Expected<void> make_dir(const std::string& path) override
  {
    return m_session.with_sftp([&]() -> Expected<void> {
      FERRY_TRY(m_session.m_ahead->settle(path));
      return m_session.files().make_dir(path);
    });
  }
  Expected<void> put_file(const std::string& path, std::string_view bytes) override
  {
    return m_session.with_sftp([&]() -> Expected<void> {
      if (m_session.m_ahead->hold_launcher(path, bytes)) {
        return {};
      }
      FERRY_TRY(m_session.m_ahead->settle(path));
      return m_session.files().put_file(path, bytes);
    });
  }
  Expected<bool> put_job(const std::string& path, std::string_view bytes, const std::string& sha256,
                         bool discard_cached) override
  {
    if (!m_session.m_job_cache) {
      FERRY_TRY(put_file(path, bytes));
      return false;
    }
    return m_session.with_sftp([&]() -> Expected<bool> {
      if (!discard_cached && m_session.m_ahead->hold_job(path, bytes, sha256)) {
        return true;
      }
      FERRY_TRY(m_session.m_ahead->settle(path));
      return m_session.files().put_job_file(path, bytes, sha256, discard_cached);
    });
  }

private:
  SshSession& m_session;
};

Expected<StagedRun> SshSession::stage(const RunBundle& bundle, const StopToken& stop)
{
  {
    const std::lock_guard lock(m_mutex);
    m_stop = stop;
    m_ahead->first_run(bundle.launcher);
  }
  FERRY_TRY_ASSIGN(std::string dir, create_run_dir());
  Writer writer(*this);
  auto cached = write_run_files(writer, bundle, dir);
  if (!cached) {
    (void)remove_run_dir(dir); // what was made of it, if anything
    return Unexpected{cached.error()};
  }
  StagedRun run = staged_run(bundle, std::move(dir), stop);
  run.job_from_cache = *cached;
  {
    const std::lock_guard lock(m_mutex);
    if (m_files) {
      run.job_cache_remade = m_files->take_refused_entry(run.run_dir);
    }
  }
  return run;
}

Expected<ExecOutcome> SshSession::exec(const ExecRequest& request)
{
  return exec_run({}, request);
}

// `run_dir` empty: a plain command, on a channel of its own.
Expected<ExecOutcome> SshSession::exec_run(const std::string& run_dir, const ExecRequest& request)
{
  ExecRequest bounded = request;
  // A run whose files are held for the process that runs it: the line that hands them over.
  std::string stage;
  if (!run_dir.empty()) {
    {
      const std::lock_guard lock(m_mutex);
      bounded.last = m_ahead->last_on_its_channel();
      stage = m_ahead->stage_line(run_dir, bounded.last);
    }
    if (stage.empty()) {
      FERRY_TRY(with_sftp([&] { return m_ahead->settle(run_dir); }));
    }
  }
  int refusals = 0;
  ssh::CallWatchdog* dog = nullptr;
  {
    std::unique_lock lock(m_mutex);
    dog = &watchdog();
  }
  bounded.start_limit = dog->limits().call; // the login shell runs before the launcher
  while (true) {
    {
      std::unique_lock lock(m_mutex);
      m_changed.wait(lock, [this] { return m_channels.execs < m_channels.limit; });
      ++m_channels.execs;
      m_staging.erase(run_dir);
    }
    bool refused = false;
    const auto free_a_channel = [this, &refused, &refusals](std::unique_lock<std::mutex>& lock) {
      return this->free_a_channel(lock, refused, refusals);
    };
    auto outcome = run_dir.empty() ? ssh::exec(m_session.get(), m_target.spec, bounded, *dog,
                                               m_mutex, free_a_channel)
                                   : m_ahead->run(m_session.get(), m_target.spec, bounded, *dog,
                                                  m_mutex, free_a_channel, run_dir, stage);
    {
      const std::lock_guard lock(m_mutex);
      --m_channels.execs;
      m_channels.last_end = Clock::now();
    }
    m_changed.notify_all();
    if (outcome || !refused || request.stop.stop_requested() || dog->fired()) {
      return outcome;
    }
    // Refused for want of a slot: wait until one of this session's channels ends (or, when one
    // just ended, a moment for the server to free its slot).
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Expected<void> SshSession::connect()
{
  return ssh::connect_paced(
      {m_target.spec, m_target.retries, m_target.stop, m_target.debug},
      [this] { return connect_once(); }, [this] { return !m_no_retry; });
}

Unexpected<Error> SshSession::connection_failed(const ssh::Stepped& step)
{
  ssh_session s = m_session.get();
  if (step.waited == ssh::Waited::stopped) {
    return fail(ErrorKind::failed, "{}: interrupted while connecting", m_target.spec);
  }
  const bool timed_out = step.waited == ssh::Waited::timed_out;
  auto [unreached, why] = ssh::open_failure(s, timed_out, m_where.timeout_s);
  if (m_proxy) {
    const auto status = m_proxy->exit_status(timed_out ? 0 : 2000);
    const std::string said = m_proxy->stderr_text();
    m_no_retry = status.has_value();
    if (status || !said.empty()) {
      return fail(ErrorKind::unreachable, "{}: the proxy failed ({}{}): {}", m_target.spec,
                  m_where.proxy_text,
                  status ? fmt::format(", exit status {}", *status) : std::string(),
                  said.empty() ? "it wrote nothing on stderr; " + why : said);
    }
    return ssh::classed(unreached, fail(ErrorKind::unreachable,
                                        "{}: cannot connect to {}:{} through {}: {} ({})",
                                        m_target.spec, m_where.host, m_where.port,
                                        m_where.proxy_text, why, connect_failure_hint()));
  }
  if (unreached == Unreached::refused) {
    return ssh::classed(unreached, fail(ErrorKind::unreachable, "{}: at {}:{}, {}", m_target.spec,
                                        m_where.host, m_where.port, why));
  }
  return ssh::classed(
      unreached, fail(ErrorKind::unreachable,
                      "{}: cannot connect to {}:{}: {}; check the host name, that sshd listens on "
                      "that port, and the network ({})",
                      m_target.spec, m_where.host, m_where.port, why, connect_failure_hint()));
}

Expected<void> SshSession::open_connection()
{
  ssh_session s = m_session.get();
  if (!m_where.proxy_argv.empty()) {
    std::function<void(std::string)> log;
    if (m_target.debug) {
      log = [debug = m_target.debug](std::string line) { debug(line); };
    }
    FERRY_TRY_ASSIGN(m_proxy, ssh::ProxyProcess::start(m_where.proxy_argv, std::move(log)));
  }
  FERRY_TRY(
      ssh::configure(s, m_where, ssh::known_key_types(m_where), m_proxy ? m_proxy->socket() : -1));
  const auto step = ssh::step_until_done(s, pace(), SSH_AGAIN, [s] { return ssh_connect(s); });
  if (step.waited != ssh::Waited::done || step.rc != SSH_OK) {
    return connection_failed(step);
  }
  return {};
}

Expected<void> SshSession::check_host_key()
{
  FERRY_TRY_ASSIGN(auto offered, ssh::server_key(m_session.get(), m_target.spec));
  const std::lock_guard lock(m_key_mutex);
  m_host_key_sha256 = offered.fingerprint;
  m_offered_key = std::move(offered);
  return verify_offered_key();
}

Expected<void> SshSession::verify_offered_key()
{
  const auto& offered = *m_offered_key;
  FERRY_TRY_ASSIGN(const auto verdict, ssh::verify_host_key(offered, m_where, m_target.spec));
  debug(fmt::format("host key {} {} {} {}", ssh_key_type_to_char(ssh_key_type(offered.key.get())),
                    offered.fingerprint, verdict.recorded ? "recorded in" : "found in",
                    verdict.found_in));
  return {};
}

Expected<void> SshSession::connect_once()
{
  m_files.reset();
  m_watchdog.reset();
  m_session.reset();
  m_proxy.reset();
  FERRY_TRY(resolve());
  tell_story();
  FERRY_TRY(ssh::load_libssh());
  m_session.reset(ssh_new());
  if (!m_session) {
    return fail(ErrorKind::failed, "{}: cannot allocate an SSH session", m_target.spec);
  }
  // Non-blocking while connecting, so that a stop is seen within a moment; the SFTP and exec
  // code expects a blocking session afterwards.
  ssh_set_blocking(m_session.get(), 0);
  const Defer blocking([s = m_session.get()] { ssh_set_blocking(s, 1); });
  FERRY_TRY(open_connection());
  FERRY_TRY(ssh::classed(Unreached::host_key, check_host_key()));
  std::function<void(std::string)> log;
  if (m_target.debug) {
    log = [debug = m_target.debug](std::string line) { debug(line); };
  }
  auto identities = ssh::collect_identities(m_where.identities, m_where.user, log);
  // BatchMode yes: nobody is asked, as with no terminal.
  Prompter prompt = m_where.batch_mode.empty() ? m_target.prompt : Prompter{};
  return ssh::classed(Unreached::auth, ssh::authenticate(m_session.get(), std::move(identities),
                                                         {m_target.spec, m_where.user, pace(), log,
                                                          std::move(prompt), m_where.batch_mode}));
}

} // namespace

std::string SshSession::options_identity() const
{
  return ssh::options_identity(m_target, m_where);
}

std::unique_ptr<HostSession> make_ssh_session(const SshTarget& target)
{
  return std::make_unique<SshSession>(target);
}

std::unique_ptr<ssh::Remote> ssh::make_remote(const SshTarget& target)
{
  return std::make_unique<SshSession>(target);
}

Expected<std::unique_ptr<SshConnection>> make_checked_ssh_session(const SshTarget& target)
{
  auto session = std::make_unique<SshSession>(target);
  FERRY_TRY(session->resolve());
  return std::unique_ptr<SshConnection>(std::move(session));
}

} // namespace ferry
