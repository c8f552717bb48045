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
#include <random>
#include <set>
#include <thread>

#include "ferry/fd.hpp"
#include "ferry/host_spec.hpp"
#include "ferry/remote/launcher.hpp"
#include "ferry/remote/shell_neutral.hpp"
#include "ferry/sessions.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"
#include "transport/exec_request.hpp"
#include "transport/run_files.hpp"
#include "transport/ssh/auth.hpp"
#include "transport/ssh/exec.hpp"
#include "transport/ssh/host_key.hpp"
#include "transport/ssh/libssh_loader.hpp"
#include "transport/ssh/options.hpp"
#include "transport/ssh/proxy.hpp"
#include "transport/ssh/remote.hpp"
#include "transport/ssh/sftp_files.hpp"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;
// How long after one of its channels ended a refused channel is taken for a slot sshd has not
// freed yet, and how often in a row that is believed before the bound is lowered anyway.
constexpr std::chrono::seconds k_slot_reaping{2};
constexpr int k_max_refusals = 50;
// How often an idle holder looks again at the python standby's script in the job cache.
constexpr std::chrono::minutes k_script_check_every{10};
// The holder's own SFTP steps wait for the runs' (SshSession::let_runs_go_first).
constexpr std::chrono::milliseconds k_runs_quiet{20};
constexpr std::chrono::seconds k_runs_first_at_most{30};

// The python standby's command: its script ENTRY in the job cache (docs/run-protocol.md, "Exec").
std::string python_standby_command(const std::string& entry)
{
  return "python3 -I -S " + entry + " ferry-standby";
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
    m_runs_expected = runs;
    m_runs_at_once = std::max<std::size_t>(at_once, 1);
  }
  Expected<StagedRun> stage(const RunBundle& bundle, const StopToken& stop) override;
  Expected<ExecOutcome> launch(StagedRun& run, const LaunchRequest& request) override
  {
    return exec_run(run.run_dir, launcher_request(run, request));
  }
  Expected<FetchedFile> fetch(const StagedRun& run, const std::string& rel,
                              const ChunkSink& sink) override
  {
    return with_sftp([&]() -> Expected<FetchedFile> {
      FERRY_TRY(settle_deferred(run.run_dir));
      return files().fetch_stream(run.run_dir + "/" + rel, sink);
    });
  }
  Expected<std::optional<std::vector<DirEntry>>> list(const StagedRun& run,
                                                      const std::string& rel) override
  {
    return with_sftp([&]() -> Expected<std::optional<std::vector<DirEntry>>> {
      FERRY_TRY(settle_deferred(run.run_dir));
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
  // A plain command (a scheduler's submit script): a channel of its own, never a standby.
  Expected<ExecOutcome> exec(const ExecRequest& request) override;
  Expected<void> put_file(const std::string& path, std::string_view bytes) override
  {
    return with_sftp([&]() -> Expected<void> {
      FERRY_TRY(settle_deferred(parent_of(path)));
      return files().put_file(path, bytes);
    });
  }
  void without_job_cache() override { m_job_cache = false; }
  void prepare_files() override
  {
    (void)with_sftp([&]() -> Expected<bool> { return files().file_exists("/"); });
  }
  std::string options_identity() const override;
  bool alive() override
  {
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
  // The key the server offered at connect, checked again: no libssh call on the session, so it
  // does not wait for a run's or the holder's SFTP steps (a holder's hello must answer soon).
  Expected<void> recheck_host_key() override
  {
    const std::lock_guard lock(m_key_mutex);
    if (!m_offered_key) {
      return fail(ErrorKind::unreachable, "{}: not connected", m_target.spec);
    }
    return verify_offered_key();
  }
  void prepare_exec() override;
  void prepare_idle() override;
  void prepare_python_standby() override;
  // The session's first run: a direct connection's later python3 runs go to python standbys
  // when the job cache holds the standby's script and more runs follow on the session (a holder
  // readies its own). Holding the lock.
  void prepare_first_run(bool python_standby)
  {
    if (!std::exchange(m_first_asked, true)) {
      // Not for a session's only run: on its own, the standby's two python starts cost the host
      // what launch.sh's helpers would; its gain is the later runs', on the standbys that stay.
      m_fan_out_python = python_standby && m_runs_expected != 1;
    }
  }
  void on_standby_taken(std::function<void()> callback) override
  {
    const std::lock_guard lock(m_mutex);
    m_standby_taken = std::move(callback);
  }

private:
  // A staged run's directory, named (a run left to its python standby) or made over SFTP.
  Expected<std::string> create_run_dir()
  {
    return with_sftp([this]() -> Expected<std::string> {
      if (defers_staging()) {
        std::string dir = files().new_run_dir_name();
        m_deferred[dir];
        m_staging.insert(dir);
        return dir;
      }
      auto dir = files().create_run_dir();
      if (dir) {
        m_staging.insert(*dir);
        note_python_standby(); // the sweep's listing told what the job cache holds
      }
      return dir;
    });
  }
  // The run's files: kept in memory while its python standby is to make them (the job from the
  // cache and launch.sh), else made over SFTP.
  class Writer;
  Expected<void> remove_run_dir(const std::string& path)
  {
    return with_sftp([&]() -> Expected<void> {
      m_staging.erase(path);
      if (m_deferred.erase(path) > 0) {
        return {}; // never made on the host
      }
      return files().remove_run_dir(path);
    });
  }
  void forget_run_dir(const std::string& path)
  {
    const std::lock_guard lock(m_mutex);
    m_deferred.erase(path);
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
    m_changed.wait(lock, [this] { return m_channel_limit > 1 || m_execs == 0; });
    return step();
  }
  // Holding the lock: the holder's own SFTP steps (prepare_python_standby) wait while runs
  // make their files or run their jobs (an exec needs the lock for the job's output), from a
  // run's directory to its job's end (its client may take a while between two steps), and
  // until none has for a moment, at most a while.
  void let_runs_go_first(std::unique_lock<std::mutex>& lock);
  // A run directory whose files a python standby is to make (docs/persistence.md, "Staged by
  // the python standby"): named by create_run_dir, filled by put_job_file and put_file, handed
  // to the standby by exec; made over SFTP (settle_deferred) when anything else needs it.
  struct DeferredJob {
    std::string path;
    std::string bytes;
    std::string sha256;
    std::string entry; // its job cache entry
  };
  struct Deferred {
    std::optional<DeferredJob> job;
    std::optional<std::string> launch; // launch.sh's bytes
  };
  static std::string parent_of(const std::string& path) { return path.substr(0, path.rfind('/')); }
  // Holding the lock, as a run's exec begins: whether no later run will take the python standby
  // it runs on, which then ends with it. Runs start as others end (-j), so a standby that stays
  // serves the run that starts `m_runs_at_once` runs later, if there is one; one that stays for
  // nothing would start an interpreter that only the connection's close ends.
  [[nodiscard]] bool last_on_its_channel()
  {
    if (m_runs_expected == 0) {
      return false; // unknown (a holder's): standbys stay
    }
    m_runs_started = std::min(m_runs_started + 1, m_runs_expected);
    return m_runs_expected - m_runs_started < m_runs_at_once;
  }
  // Holding the lock: whether the next run's files may wait for its standby.
  [[nodiscard]] bool defers_staging()
  {
    return !m_python_command.empty() && !m_no_python_standby && m_channel_limit > 2 &&
           m_deferred.size() < k_max_deferred && m_files && m_files->names_run_dirs();
  }
  // Holding the lock: makes, over SFTP, the deferred run directory `path` is in (or is), as
  // create_run_dir, put_job_file and put_file would have. `after_standby`: a standby that was
  // given them may have made part of it before it went.
  Expected<void> settle_deferred(const std::string& path, bool after_standby = false);
  // The `stage` line and launch.sh's bytes for a run whose files a python standby may make
  // (`dir` set to its run directory); empty when there is none.
  // The `stage` line and launch.sh's bytes for a run in `run_dir` whose files its python
  // standby is to make; empty when they were made over SFTP.
  std::string stage_line(const ExecRequest& request, const std::string& run_dir);
  void staged_by_the_standby(const std::string& dir);
  // Holding the lock: standby_use, and for a run whose files wait (`dir`, handed over by
  // `stage`) what makes them.
  ssh::StandbyUse standby_use_for(const std::string& dir, const std::string& stage,
                                  bool& staged_by_standby);
  Expected<void> connect_once();
  Expected<void> open_connection();
  Unexpected<Error> connection_failed(const ssh::Stepped& step);
  Expected<void> check_host_key();
  Expected<void> verify_offered_key(); // holding m_key_mutex
  void tell_story();
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
      m_files->on_refused([this] { return close_a_standby(); });
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
  // Holding the lock: closes a spare, else the standby, whose slot a run or SFTP needs; false
  // when the session keeps none.
  bool close_a_standby();
  void note_python_standby();
  ssh::StandbyUse standby_use();
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
  int m_execs = 0; // exec channels open now
  // Runs' SFTP steps waiting for the lock or under way, and when the last of them ended
  // (let_runs_go_first).
  std::atomic<int> m_runs_at_sftp{0};
  Clock::time_point m_last_run_sftp;
  // Run directories named (create_run_dir) whose exec has not started: their runs are between
  // steps, and their client may take a moment before the next (let_runs_go_first).
  std::set<std::string> m_staging;
  // How many exec channels the host takes at once: learnt from a refused channel (the server's
  // MaxSessions, less the SFTP channel); 1 also means SFTP must wait for the exec.
  int m_channel_limit = std::numeric_limits<int>::max();
  Clock::time_point m_last_exec_end; // when an exec channel of this session last ended
  // The next run's channel, opened ahead (prepare_exec); not counted in m_execs. Last: it ends
  // first, while the connection is still up.
  ssh::StandbyChannel m_standby;
  bool m_first_asked = false; // prepare_first_run: only for the session's first run
  // A direct fan-out's python3 runs may go to python standbys (prepare_first_run).
  bool m_fan_out_python = false;
  // Runs this session will be given (expect_runs; 0: unknown), how many at once, and execs
  // begun: the python standbys of the last `m_runs_at_once` end with their runs
  // (ExecRequest::last; last_on_its_channel).
  std::size_t m_runs_expected = 0;
  std::size_t m_runs_at_once = 1;
  std::size_t m_runs_started = 0;
  std::map<std::string, Deferred> m_deferred; // by run directory
  static constexpr std::size_t k_max_deferred = 64;
  // Python standbys that stayed after runs side by side, for the next ones; closed once the
  // holder has been idle a moment (prepare_idle), or when a run needs their slot.
  std::vector<ssh::StandbyChannel> m_spares;
  // The python standby's command once its script is in the job cache (prepare_idle); set when
  // one could not be kept or started here: later standbys are sh's.
  std::string m_python_command;
  Clock::time_point m_script_checked; // when prepare_idle last looked at its place in the cache
  bool m_no_python_standby = false;
  std::function<void()> m_standby_taken; // on_standby_taken
  bool m_standby_opening = false;        // prepare_exec is opening one (it holds a slot)
  // The next standby is a python one whenever one can be had here (it runs a job that declares
  // an environment through launch.sh, and stages its files all the same). Holding the lock.
  [[nodiscard]] bool next_standby_python() const
  {
    return !m_no_python_standby && !m_python_command.empty();
  }
};

void SshSession::prepare_exec()
{
  std::unique_lock lock(m_mutex);
  // Only with room for it and one more channel: a standby never keeps a run waiting.
  if (m_standby || !m_session || !ssh_is_connected(m_session.get()) ||
      m_channel_limit - m_execs < 2) {
    return;
  }
  // Nobody waits for it, and the session's SFTP steps hold the lock for whole round trips: a
  // slow link's standby may take many of them. A python standby once its script is in the job
  // cache (prepare_idle), unless one could not start here.
  const std::string python_command = next_standby_python() ? m_python_command : std::string();
  m_standby_opening = true;
  auto standby = ssh::open_standby(m_session.get(), lock, std::chrono::minutes(1), python_command);
  m_standby_opening = false;
  if (standby && !m_standby) {
    m_standby = std::move(standby);
  }
  m_changed.notify_all();
}

void SshSession::prepare_idle()
{
  {
    const std::lock_guard lock(m_mutex);
    m_spares.clear();   // what stayed for runs side by side goes once nobody runs
    m_deferred.clear(); // runs whose client went before their exec
    m_staging.clear();
  }
  prepare_python_standby();
  const std::lock_guard lock(m_mutex);
  if (m_standby && !ssh::is_python(m_standby) && next_standby_python()) {
    m_standby.reset(); // a sh standby: the next prepare_exec opens a python one
  }
}

void SshSession::let_runs_go_first(std::unique_lock<std::mutex>& lock)
{
  const auto until = Clock::now() + k_runs_first_at_most;
  while (Clock::now() < until) {
    if (m_runs_at_sftp > 0 || m_execs > 0 || !m_staging.empty()) {
      m_changed.wait_until(
          lock, until, [this] { return m_runs_at_sftp == 0 && m_execs == 0 && m_staging.empty(); });
      continue;
    }
    const auto quiet = std::max(m_last_run_sftp, m_last_exec_end) + k_runs_quiet;
    if (Clock::now() >= quiet) {
      return;
    }
    m_changed.wait_until(lock, quiet);
  }
}

// Each step takes the lock for itself, after the runs' own steps: a run that comes meanwhile
// waits for one step at most.
void SshSession::prepare_python_standby()
{
  {
    std::unique_lock lock(m_mutex);
    let_runs_go_first(lock);
    if (m_no_python_standby || !m_session || !ssh_is_connected(m_session.get())) {
      return;
    }
    // The script's place in the job cache is looked at again every few minutes (the cache is
    // pruned by other runs' sweeps), not at every idle moment: a look is an SFTP round trip.
    const auto now = Clock::now();
    if (!m_python_command.empty() && now - m_script_checked < k_script_check_every) {
      return;
    }
    m_script_checked = now;
    auto entry = files().cache_script(k_standby_script, standby_script());
    if (!entry || !is_shell_neutral_token(*entry)) {
      m_no_python_standby = true;
      m_python_command.clear();
      debug("no python standby: its script cannot be kept in the job cache");
      return;
    }
    m_python_command = python_standby_command(*entry);
  }
  // The session's first run directory checks the server's umask and sweeps the base: made
  // here, while nobody waits, so that the next run's can be left to its standby.
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

// Called holding the lock once the session's first run directory is made, and with it the
// sweep's listing of the base: a direct fan-out's later python3 runs go to python standbys when
// the job cache holds the standby's script (docs/run-protocol.md, "Exec"); it is not uploaded for
// that.
void SshSession::note_python_standby()
{
  if (!m_fan_out_python || m_no_python_standby || !m_python_command.empty()) {
    return;
  }
  const auto entry = files().cached_script(k_standby_script, standby_script());
  if (entry && is_shell_neutral_token(*entry)) {
    m_python_command = python_standby_command(*entry);
    debug("python3 jobs go to python standbys (their script is in the job cache)");
  }
}

// Called holding the lock when the server refuses a run's channel. A channel of this session
// that ended a moment ago may still hold its slot (sshd frees it once it has reaped the
// command): then the bound stays and the open is tried again shortly.
bool SshSession::free_a_channel(std::unique_lock<std::mutex>& lock, bool& refused, int& refusals)
{
  // A standby still being opened holds a slot too: once it is open, it goes as below.
  m_changed.wait_for(lock, std::chrono::seconds(5), [this] { return !m_standby_opening; });
  // A spare, else the standby, takes a slot the run needs: it goes first. Its slot is free once
  // sshd has reaped what ran there (a python standby's two processes take a moment): until then
  // a refusal is not taken for the server's bound.
  if (close_a_standby()) {
    return true;
  }
  const bool just_freed = Clock::now() - m_last_exec_end < k_slot_reaping;
  if (m_execs > 1) {
    // This session's other channels fill the server's MaxSessions: no more at once.
    if (!just_freed || ++refusals > k_max_refusals) {
      m_channel_limit = m_execs - 1;
    }
    refused = true;
    return false;
  }
  // A host with MaxSessions 1 refuses a second channel while SFTP holds one: SFTP steps
  // aside for the exec and starts again for the next SFTP step.
  if (m_files && m_files->suspend()) {
    m_channel_limit = 1;
    debug("the server refused a second channel (MaxSessions 1?): SFTP closed while the job "
          "runs, reopened after it");
    return true;
  }
  return just_freed;
}

bool SshSession::close_a_standby()
{
  if (!m_spares.empty()) {
    m_spares.pop_back();
  } else if (m_standby) {
    m_standby.reset();
  } else {
    return false;
  }
  m_last_exec_end = Clock::now();
  return true;
}

// What a run may use of the standbys, holding the lock.
ssh::StandbyUse SshSession::standby_use()
{
  return {&m_standby,
          &m_no_python_standby,
          [this] {
            // Only when this run is the session's one exec: among runs side by side the
            // standby would take a slot one of them needs. A sh standby starts in a moment: it
            // waits for the run's end.
            if (m_execs == 1 && m_standby_taken && next_standby_python()) {
              m_standby_taken();
            }
          },
          &m_spares,
          m_no_python_standby ? std::string() : m_python_command,
          {},
          nullptr,
          nullptr,
          [this] { return m_channel_limit > 1; }};
}

Expected<void> SshSession::settle_deferred(const std::string& path, bool after_standby)
{
  auto it = m_deferred.find(path);
  if (it == m_deferred.end()) {
    it = m_deferred.find(parent_of(path));
  }
  if (it == m_deferred.end()) {
    return {};
  }
  const std::string dir = it->first;
  const Deferred deferred = std::move(it->second);
  m_deferred.erase(it);
  if (after_standby) {
    (void)files().remove_run_dir(dir); // what the standby made before it went, if anything
  }
  FERRY_TRY(files().make_run_dir(dir));
  if (deferred.job) {
    FERRY_TRY(files().put_job_file(deferred.job->path, deferred.job->bytes, deferred.job->sha256));
  }
  if (deferred.launch) {
    FERRY_TRY(files().put_file(dir + "/" + k_launcher_file, *deferred.launch));
  }
  return {};
}

std::string SshSession::stage_line(const ExecRequest& request, const std::string& run_dir)
{
  const std::lock_guard lock(m_mutex);
  const auto it = m_deferred.find(run_dir);
  if (it == m_deferred.end() || !it->second.job || !it->second.launch) {
    return {};
  }
  const Deferred& deferred = it->second;
  return fmt::format("stage {} {} {} {} {}{}\n", run_dir, k_launcher_file,
                     deferred.job->path.substr(run_dir.size() + 1), deferred.job->entry,
                     deferred.launch->size(), request.last ? " last" : "") +
         *deferred.launch;
}

// Holding the lock: the run's files were made on the host by its standby; removed by name, as
// uploads are, if ferry cleans up after all.
void SshSession::staged_by_the_standby(const std::string& dir)
{
  if (const auto it = m_deferred.find(dir); it != m_deferred.end()) {
    files().note_put(it->second.job->path);
    files().note_put(dir + "/" + k_launcher_file);
    m_deferred.erase(it);
  }
}

ssh::StandbyUse SshSession::standby_use_for(const std::string& dir, const std::string& stage,
                                            bool& staged_by_standby)
{
  ssh::StandbyUse standby = standby_use();
  const auto it = dir.empty() ? m_deferred.end() : m_deferred.find(dir);
  if (it == m_deferred.end()) {
    return standby;
  }
  standby.stage = stage;
  standby.settle = [this, dir](bool after_standby) { return settle_deferred(dir, after_standby); };
  standby.staged_by_standby = &staged_by_standby;
  return standby;
}

// The run directory's files, as write_run_files makes them (run_files.hpp): a job the job
// cache holds and launch.sh wait in memory for the python standby that is to make them, when
// the run was left to one (create_run_dir); anything else settles the run over SFTP first.
class SshSession::Writer final : public RunDirWriter {
public:
  explicit Writer(SshSession& session) : m_session(session) {}

  Expected<void> make_dir(const std::string& path) override
  {
    return m_session.with_sftp([&]() -> Expected<void> {
      FERRY_TRY(m_session.settle_deferred(path));
      return m_session.files().make_dir(path);
    });
  }
  Expected<void> put_file(const std::string& path, std::string_view bytes) override
  {
    return m_session.with_sftp([&]() -> Expected<void> {
      const std::string dir = parent_of(path);
      auto& deferred = m_session.m_deferred;
      if (const auto it = deferred.find(dir); it != deferred.end() && it->second.job &&
                                              !it->second.launch &&
                                              path == dir + "/" + k_launcher_file) {
        it->second.launch = std::string(bytes);
        return {};
      }
      FERRY_TRY(m_session.settle_deferred(path));
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
      auto& deferred = m_session.m_deferred;
      if (const auto it = deferred.find(parent_of(path));
          it != deferred.end() && !it->second.job && !it->second.launch && !discard_cached) {
        if (auto entry = m_session.files().cached_job_entry(path, bytes, sha256)) {
          it->second.job = DeferredJob{path, std::string(bytes), sha256, std::move(*entry)};
          return true;
        }
      }
      FERRY_TRY(m_session.settle_deferred(path));
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
    prepare_first_run(runs_on_python_standby(bundle.launcher));
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
  std::string stage;
  // The run directory whose files wait for a python standby (standby_use_for keeps a reference
  // to it while the run lasts).
  std::string staged_dir;
  if (!run_dir.empty()) {
    {
      const std::lock_guard lock(m_mutex);
      bounded.last = last_on_its_channel();
    }
    // A run whose files wait for a python standby: the line that hands them to it.
    stage = stage_line(bounded, run_dir);
    if (!stage.empty()) {
      staged_dir = run_dir;
    } else {
      FERRY_TRY(with_sftp([&] { return settle_deferred(run_dir); }));
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
      m_changed.wait(lock, [this] { return m_execs < m_channel_limit; });
      ++m_execs;
      m_staging.erase(run_dir);
    }
    bool refused = false;
    const auto free_a_channel = [this, &refused, &refusals](std::unique_lock<std::mutex>& lock) {
      return this->free_a_channel(lock, refused, refusals);
    };
    ssh::StandbyUse standby;
    bool staged_by_standby = false;
    if (!run_dir.empty()) {
      const std::lock_guard lock(m_mutex);
      standby = standby_use_for(staged_dir, stage, staged_by_standby);
    }
    auto outcome =
        ssh::exec(m_session.get(), m_target.spec, bounded, *dog, m_mutex, free_a_channel, standby);
    {
      const std::lock_guard lock(m_mutex);
      --m_execs;
      m_last_exec_end = Clock::now();
      if (staged_by_standby) {
        staged_by_the_standby(run_dir);
      }
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
  std::mt19937 jitter(std::random_device{}());
  for (int attempt = 0;; ++attempt) {
    auto connected = connect_once();
    if (connected || attempt >= m_target.retries || m_target.stop.stop_requested() || m_no_retry ||
        connected.error().kind != ErrorKind::unreachable ||
        !is_transient_connect_error(connected.error().message)) {
      return connected;
    }
    // Back off 200–600 ms (doubling) so many clients retrying do not hit sshd in lockstep; a
    // stop ends the wait.
    std::uniform_int_distribution<int> ms(200, 600);
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(ms(jitter) << std::min(attempt, 3));
    while (std::chrono::steady_clock::now() < until) {
      if (m_target.stop.stop_requested()) {
        return connected;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

void SshSession::tell_story()
{
  if (m_told) {
    return;
  }
  m_told = true;
  if (m_target.warn) {
    for (const auto& warning : m_where.warnings) {
      m_target.warn(warning);
    }
  }
  if (!m_target.debug) {
    return;
  }
  for (const auto& file : m_where.config_files) {
    debug(fmt::format("read ssh config {}", file));
  }
  for (const auto& block : m_where.blocks) {
    debug(fmt::format("applying {}", block));
  }
  debug(fmt::format("connecting to {} port {} as {}{}", m_where.host, m_where.port, m_where.user,
                    m_where.proxy_text.empty() ? "" : " through " + m_where.proxy_text));
  std::string files;
  for (const auto& file : m_where.user_known_hosts) {
    files += " " + file;
  }
  for (const auto& file : m_where.global_known_hosts) {
    files += " " + file;
  }
  debug(fmt::format("host key looked up as {} in{}{}", m_where.known_hosts_name, files,
                    m_where.accept_new ? "; a new key is recorded (accept-new)" : ""));
  debug(m_where.identities.agent_socket.empty()
            ? std::string("no ssh agent")
            : fmt::format("ssh agent from {}", m_where.identities.agent_origin));
}

Unexpected<Error> SshSession::connection_failed(const ssh::Stepped& step)
{
  ssh_session s = m_session.get();
  if (step.waited == ssh::Waited::stopped) {
    return fail(ErrorKind::failed, "{}: interrupted while connecting", m_target.spec);
  }
  const std::string why = step.waited == ssh::Waited::timed_out
                              ? fmt::format("timed out after {} s", m_where.timeout_s)
                              : terminal_safe(ssh_get_error(s));
  if (m_proxy) {
    const auto status = m_proxy->exit_status(step.waited == ssh::Waited::timed_out ? 0 : 2000);
    const std::string said = m_proxy->stderr_text();
    m_no_retry = status.has_value();
    if (status || !said.empty()) {
      return fail(ErrorKind::unreachable, "{}: the proxy failed ({}{}): {}", m_target.spec,
                  m_where.proxy_text,
                  status ? fmt::format(", exit status {}", *status) : std::string(),
                  said.empty() ? "it wrote nothing on stderr; " + why : said);
    }
    return fail(ErrorKind::unreachable, "{}: cannot connect to {}:{} through {}: {} ({})",
                m_target.spec, m_where.host, m_where.port, m_where.proxy_text, why,
                connect_failure_hint());
  }
  return fail(ErrorKind::unreachable,
              "{}: cannot connect to {}:{}: {}; check the host name, that sshd listens on that "
              "port, and the network ({})",
              m_target.spec, m_where.host, m_where.port, why, connect_failure_hint());
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
  FERRY_TRY(check_host_key());
  std::function<void(std::string)> log;
  if (m_target.debug) {
    log = [debug = m_target.debug](std::string line) { debug(line); };
  }
  auto identities = ssh::collect_identities(m_where.identities, m_where.user, log);
  return ssh::authenticate(m_session.get(), std::move(identities),
                           {m_target.spec, m_where.user, pace(), log});
}

} // namespace

std::string SshSession::options_identity() const
{
  const auto paths = [](const std::vector<ssh::NamedFile>& files) {
    std::vector<std::string> out;
    for (const auto& file : files) {
      out.push_back(file.path);
    }
    return out;
  };
  nlohmann::json algorithms = nlohmann::json::array();
  for (const auto& [option, value] : m_where.algorithms) {
    algorithms.push_back({static_cast<int>(option), value.args});
  }
  const nlohmann::json identity = {
      {"spec", m_target.spec},
      {"host", m_where.host},
      {"user", m_where.user},
      {"port", m_where.port},
      {"known_hosts_name", m_where.known_hosts_name},
      {"user_known_hosts", m_where.user_known_hosts},
      {"global_known_hosts", m_where.global_known_hosts},
      {"accept_new", m_where.accept_new || m_target.accept_new_host_key},
      {"hash_known_hosts", m_where.hash_known_hosts},
      {"proxy", m_where.proxy_argv},
      {"identities", paths(m_where.identities.files)},
      {"certificates", paths(m_where.identities.certificates)},
      {"default_identities", paths(m_where.identities.defaults)},
      {"identities_only", m_where.identities.identities_only},
      {"agent", m_where.identities.agent_socket},
      {"host_key_algorithms", m_where.host_key_algorithms},
      {"algorithms", algorithms},
      {"timeout_s", m_where.timeout_s},
      {"remote_base", m_target.remote_base},
  };
  return identity.dump();
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
