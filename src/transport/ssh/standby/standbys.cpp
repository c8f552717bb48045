#include "transport/ssh/standby/standbys.hpp"

#include <utility>

#include "ferry/remote/launcher.hpp"
#include "ferry/remote/shell_neutral.hpp"
#include "ferry/remote/standby_boot.hpp"
#include "ferry/util.hpp"
#include "transport/ssh/job_cache.hpp"
#include "transport/ssh/standby/memo.hpp"

namespace ferry::ssh {
namespace {

std::string parent_of(const std::string& path)
{
  return path.substr(0, path.rfind('/'));
}

// The largest job whose bytes go to a once standby on its channel; a larger one goes over SFTP.
constexpr std::size_t k_max_staged_job = 4U << 20;

// The name of this build's standby script in a job cache.
const std::string& standby_entry_name()
{
  static const std::string name = job_cache_name(sha256_hex(standby_script()), k_standby_script);
  return name;
}

} // namespace

standby::Facts Standbys::facts() const
{
  standby::Facts facts;
  facts.python_ready = python_ready();
  facts.channel_limit = m_channels.limit;
  facts.execs = m_channels.execs;
  facts.has_standby = static_cast<bool>(m_standby);
  facts.spares = m_spares.size();
  facts.deferred = m_deferred.size();
  return facts;
}

void Standbys::first_run(const LauncherSpec& launcher)
{
  if (std::exchange(m_first_asked, true)) {
    return;
  }
  m_fan_out_python = standby::fans_out_python(runs_on_python_ahead(launcher), m_plan);
  // A direct connection's only run, and this machine's note says the host's job cache held the
  // standby's script at its last sweep, lately: no SFTP at all.
  if (m_plan.expected == 1) {
    if (auto memo = recall_standby(m_memo_key(), standby_entry_name());
        memo && !memo->entry.empty()) {
      m_once_entry = std::move(memo->entry);
      m_once_tag = std::move(memo->tag_sha256);
      m_debug(fmt::format("the run is staged by a python standby, without SFTP (its script {} "
                          "was in the job cache at this machine's last sweep)",
                          m_once_entry));
    }
  }
}

std::optional<std::string> Standbys::defer_run_dir(bool names_run_dirs)
{
  if (!m_once_entry.empty()) {
    std::string dir = SftpFiles::run_dir_name(parent_of(m_once_entry));
    m_deferred[dir].standby_entry = std::exchange(m_once_entry, {});
    return dir;
  }
  standby::Facts now = facts();
  now.names_run_dirs = names_run_dirs;
  if (!standby::defers_staging(now)) {
    return std::nullopt;
  }
  std::string dir = m_files().new_run_dir_name();
  m_deferred[dir];
  return dir;
}

// A direct fan-out's later python3 runs go to python standbys when the job cache holds the
// standby's script (docs/run-protocol.md, "Exec"); it is not uploaded for that.
void Standbys::run_dir_made()
{
  note_script(m_files().cached_script(k_standby_script, standby_script()));
  if (!m_fan_out_python || m_no_python_standby || !m_python_command.empty()) {
    return;
  }
  const auto entry = m_files().cached_script(k_standby_script, standby_script());
  if (entry && is_shell_neutral_token(*entry)) {
    set_python_command(*entry);
    m_debug("python3 jobs go to python standbys (their script is in the job cache)");
  }
}

void Standbys::set_python_command(const std::string& entry)
{
  m_python_command = entry;
  // The compiled code kept beside the script, as an earlier standby of this connection's
  // said it (this machine's note), until this session's own standby says.
  if (m_tag_sha256.empty()) {
    if (auto memo = recall_standby(m_memo_key(), standby_entry_name());
        memo && memo->entry == entry) {
      m_tag_sha256 = memo->tag_sha256;
      m_noted_tag = m_tag_sha256;
    }
  }
}

void Standbys::said_tag(const std::string& tag_sha256)
{
  m_tag_sha256 = tag_sha256;
  note_code(m_python_command, tag_sha256, m_noted_tag);
}

void Standbys::note_code(const std::string& entry, const std::string& said, std::string& noted)
{
  if (!entry.empty() && said != noted) {
    remember_standby_code(m_memo_key(), entry, said);
    noted = said;
  }
}

bool Standbys::hold_launcher(const std::string& path, std::string_view bytes)
{
  const std::string dir = parent_of(path);
  const auto it = m_deferred.find(dir);
  if (it == m_deferred.end() || !it->second.job || it->second.launch ||
      path != dir + "/" + k_launcher_file) {
    return false;
  }
  it->second.launch = std::string(bytes);
  return true;
}

bool Standbys::hold_job(const std::string& path, std::string_view bytes, const std::string& sha256)
{
  const auto it = m_deferred.find(parent_of(path));
  if (it == m_deferred.end() || it->second.job || it->second.launch) {
    return false;
  }
  if (!it->second.standby_entry.empty()) {
    return hold_job_once(it->second, path, bytes, sha256);
  }
  auto entry = m_files().cached_job_entry(path, bytes, sha256);
  if (!entry) {
    return false;
  }
  it->second.job = DeferredJob{path, std::string(bytes), sha256, std::move(*entry)};
  return true;
}

bool Standbys::hold_job_once(Deferred& deferred, const std::string& path, std::string_view bytes,
                             const std::string& sha256) const
{
  // Its bytes go with the run; the standby makes the cache's entry when it lacks it.
  const std::string name = job_cache_name(sha256, path.substr(path.rfind('/') + 1));
  if (name.empty() || bytes.size() > k_max_staged_job || sha256_hex(bytes) != sha256) {
    return false;
  }
  deferred.job =
      DeferredJob{path, std::string(bytes), sha256, parent_of(deferred.standby_entry) + "/" + name};
  return true;
}

Expected<void> Standbys::settle(const std::string& path, bool after_standby)
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
  SftpFiles& files = m_files();
  FERRY_TRY(make_held_dir(files, dir, deferred, after_standby));
  if (deferred.job) {
    FERRY_TRY(files.put_job_file(deferred.job->path, deferred.job->bytes, deferred.job->sha256));
  }
  if (deferred.launch) {
    FERRY_TRY(files.put_file(dir + "/" + k_launcher_file, *deferred.launch));
  }
  return {};
}

Expected<void> Standbys::make_held_dir(SftpFiles& files, const std::string& dir,
                                       const Deferred& deferred, bool after_standby)
{
  if (!deferred.standby_entry.empty()) {
    // The session's first SFTP step: the base judged (a refused one named as ever) and swept.
    // A once standby makes nothing before it has judged the base, and removes what it made
    // when it cannot go on: nothing of it to remove here.
    FERRY_TRY(files.create_named_run_dir(dir));
    if (m_once_code == k_standby_refused_exit) {
      replace_refused_script(files, deferred.standby_entry);
    }
    run_dir_made();
    return {};
  }
  if (after_standby) {
    (void)files.remove_run_dir(dir); // what the standby made before it went, if anything
  }
  return files.make_run_dir(dir);
}

// The verifier ends with 4 when the script cannot be read or no longer matches its sha256. A file
// still at its name was changed on the host since ferry put it there or this machine's note
// named it (one that is gone was only pruned: the next look puts it back): it is discarded, put
// there again over the session's SFTP (so that no later run, nor the next connection, trips on
// it) and warned of.
void Standbys::replace_refused_script(SftpFiles& files, const std::string& entry)
{
  if (const auto there = files.file_exists(entry); !there || !*there) {
    m_refused.clear();
    return;
  }
  m_refused = entry;
  files.discard_script(k_standby_script, standby_script());
  const auto back = files.cache_script(k_standby_script, standby_script());
  m_debug(fmt::format("warning: the python standby's script {} no longer matches its sha256 (a "
                      "process of this user changed it); it is discarded and {}",
                      entry,
                      back ? std::string("sent again")
                           : fmt::format("could not be sent again: {}", back.error().message)));
}

std::string Standbys::stage_line(const std::string& run_dir, bool last) const
{
  const auto it = m_deferred.find(run_dir);
  if (it == m_deferred.end() || !it->second.job || !it->second.launch) {
    return {};
  }
  const Deferred& deferred = it->second;
  if (!deferred.standby_entry.empty()) {
    return fmt::format("stage-first {} {} {} {} {} {}{}\n", run_dir, k_launcher_file,
                       deferred.job->path.substr(run_dir.size() + 1), deferred.job->entry,
                       deferred.launch->size(), deferred.job->bytes.size(), last ? " last" : "") +
           *deferred.launch + deferred.job->bytes;
  }
  return fmt::format("stage {} {} {} {} {}{}\n", run_dir, k_launcher_file,
                     deferred.job->path.substr(run_dir.size() + 1), deferred.job->entry,
                     deferred.launch->size(), last ? " last" : "") +
         *deferred.launch;
}

void Standbys::made_by_standby(const std::string& dir)
{
  if (const auto it = m_deferred.find(dir); it != m_deferred.end()) {
    m_files().note_put(it->second.job->path);
    m_files().note_put(dir + "/" + k_launcher_file);
    m_deferred.erase(it);
  }
}

StandbyUse Standbys::use_for(const std::string& dir, const std::string& stage,
                             bool& staged_by_standby)
{
  StandbyUse use{&m_standby,
                 &m_no_python_standby,
                 [this] {
                   // Only when this run is the session's one exec: among runs side by side the
                   // standby would take a slot one of them needs. A sh standby starts in a
                   // moment: it waits for the run's end.
                   if (m_channels.execs == 1 && m_taken && python_ready()) {
                     m_taken();
                   }
                 },
                 &m_spares,
                 m_no_python_standby ? std::string() : python_boot_line(),
                 {},
                 nullptr,
                 nullptr,
                 [this] { return m_channels.limit > 1; },
                 [this](int code) { boot_failed(code); },
                 [this](const std::string& tag_sha256) { said_tag(tag_sha256); }};
  const auto it = dir.empty() ? m_deferred.end() : m_deferred.find(dir);
  if (it == m_deferred.end()) {
    return use;
  }
  if (!it->second.standby_entry.empty()) {
    once_use(use, it->second.standby_entry);
  }
  use.stage = stage;
  use.settle = [this, dir](bool after_standby) { return settle(dir, after_standby); };
  use.staged_by_standby = &staged_by_standby;
  return use;
}

void Standbys::once_use(StandbyUse& use, const std::string& standby_entry)
{
  // Booted through the verifier, as every python standby; its refusal (or any other end before
  // its ready line) is noted for after the exec, not taken as the session's standbys' (there
  // are none: nothing of the script is discarded over SFTP while the run waits).
  // The compiled code beside the script is used when its sha256 is the one a standby gave
  // earlier (the note); else the standby compiles and writes it, and says its sum.
  use.python_command = standby_boot_line(standby_entry, m_once_tag, true);
  use.any_job = true;
  m_once_code = -1;
  use.boot_failed = [this](int code) { m_once_code = code; };
  // Its ready line says the code is there, whether or not the run then goes to it.
  use.booted = [this, standby_entry](const std::string& tag_sha256) {
    if (!tag_sha256.empty()) {
      note_code(standby_entry, tag_sha256, m_once_tag);
    }
  };
}

void Standbys::after_once(const std::string& dir, bool staged_by_standby, bool stopped)
{
  if (staged_by_standby) {
    made_by_standby(dir);
    return;
  }
  if (stopped) {
    return;
  }
  // It could not start there (no python3, its script gone or not matching, a base it refused):
  // the run went over SFTP, and so do the next ones while the note says so.
  standby_failed(m_memo_key());
  // The exit status is known when it ended before its ready line (4: its script refused).
  m_debug(fmt::format("the python standby did not stage the run{}; the run was staged over SFTP",
                      m_once_code == -1 ? std::string()
                                        : fmt::format(" (it ended with {})", m_once_code)));
}

void Standbys::note_script(const std::optional<std::string>& entry)
{
  if (entry && is_shell_neutral_token(*entry)) {
    remember_standby(m_memo_key(), *entry);
  } else {
    forget_standby(m_memo_key());
  }
}

bool Standbys::close_one()
{
  switch (standby::to_close(facts())) {
  case standby::Close::spare:
    m_spares.pop_back();
    break;
  case standby::Close::standby:
    m_standby.reset();
    break;
  case standby::Close::none:
    return false;
  }
  m_channels.last_end = standby::Clock::now();
  return true;
}

void Standbys::open_next(ssh_session session, std::unique_lock<std::mutex>& lock)
{
  if (!standby::opens_ahead(facts())) {
    return;
  }
  // Nobody waits for it, and the session's SFTP steps hold the lock for whole round trips: a
  // slow link's standby may take many of them. A python standby once its script is in the job
  // cache (look_at_script), unless one could not start here.
  const std::string python_command = python_ready() ? python_boot_line() : std::string();
  m_opening = true;
  int code = -1;
  auto standby = open_standby(session, lock, std::chrono::minutes(1), python_command, &code);
  m_opening = false;
  if (!standby && code != -1 && !python_command.empty()) {
    boot_failed(code);
  }
  if (standby && is_python(standby)) {
    said_tag(standby->tag_sha256);
  }
  if (standby && !m_standby) {
    m_standby = std::move(standby);
  }
}

void Standbys::refresh()
{
  if (m_standby && !is_python(m_standby) && python_ready()) {
    m_standby.reset(); // a sh standby: the next open_next opens a python one
  }
}

bool Standbys::look_at_script()
{
  if (m_no_python_standby) {
    return false;
  }
  // The script's place in the job cache is looked at again every few minutes (the cache is
  // pruned by other runs' sweeps), not at every idle moment: a look is an SFTP round trip.
  const auto now = standby::Clock::now();
  if (!standby::script_look_due(!m_python_command.empty(), now, m_script_checked)) {
    return false;
  }
  m_script_checked = now;
  auto entry = m_files().cache_script(k_standby_script, standby_script());
  if (!entry || !is_shell_neutral_token(*entry)) {
    m_no_python_standby = true;
    m_python_command.clear();
    m_debug("no python standby: its script cannot be kept in the job cache");
    return false;
  }
  note_script(std::optional<std::string>(*entry));
  set_python_command(*entry);
  return true;
}

std::string Standbys::python_boot_line() const
{
  return m_python_command.empty() ? std::string()
                                  : standby_boot_line(m_python_command, m_tag_sha256);
}

// A python standby that ended before its ready line: its script in the job cache was refused
// (rewritten since ferry put it there: discarded and put there again at once, as for a direct
// connection's only run, so that no disconnect leaves it gone; once a session: a second
// refusal, or a standby that cannot start here, leaves the session's later standbys to sh).
void Standbys::boot_failed(int code)
{
  if (code == k_standby_refused_exit && m_script_refusals++ == 0) {
    replace_refused_script(m_files(), m_python_command); // says whether it was refused
    m_python_command.clear();
    m_tag_sha256.clear();
    m_script_checked = {};
    return;
  }
  if (code == k_standby_refused_exit) {
    m_refused = m_python_command;
  }
  if (code == k_standby_refused_exit || code == 2 || code == 3 || code == 126 || code == 127) {
    m_no_python_standby = true;
    m_python_command.clear();
    m_debug(fmt::format("no python standby: it ended with {} before it was ready", code));
  }
}

Expected<ExecOutcome> Standbys::run(ssh_session session, std::string_view label,
                                    const ExecRequest& request, CallWatchdog& watchdog,
                                    std::mutex& mutex, const FreeAChannel& free_a_channel,
                                    const std::string& run_dir, const std::string& stage)
{
  bool staged_by_standby = false;
  bool once = false;
  StandbyUse use;
  {
    const std::lock_guard lock(mutex);
    use = use_for(stage.empty() ? std::string() : run_dir, stage, staged_by_standby);
    once = use.any_job;
  }
  auto outcome = exec_launcher(session, label, request, watchdog, mutex, free_a_channel, use);
  const std::lock_guard lock(mutex);
  if (once) {
    after_once(run_dir, staged_by_standby, request.stop.stop_requested());
  } else if (staged_by_standby) {
    made_by_standby(run_dir);
  }
  if (outcome && !m_refused.empty()) {
    outcome->standby_refused = std::exchange(m_refused, {});
  }
  return outcome;
}

std::unique_ptr<Ahead> make_ahead(Channels& channels, std::function<SftpFiles&()> files,
                                  std::function<void(std::string_view)> debug,
                                  std::function<std::string()> memo_key)
{
  return std::make_unique<Standbys>(channels, std::move(files), std::move(debug),
                                    std::move(memo_key));
}

} // namespace ferry::ssh
