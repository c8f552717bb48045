// The Slurm target: a HostSession per node slot. Files go over the login node's SFTP (an SSH
// session of its own per slot); exec submits the run's job with sbatch through the submit script
// and follows it; the slots of one target share each run's allocation (docs/slurm.md).
#include <fmt/format.h>

#include "ferry/job.hpp"
#include "ferry/remote/launcher.hpp"
#include "ferry/slurm.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"
#include "transport/slurm/allocation.hpp"
#include "transport/slurm/cluster.hpp"
#include "transport/slurm/follow.hpp"

namespace ferry {

namespace {

using slurm::Follow;
using slurm::SharedAllocation;

constexpr std::string_view k_submit_script = ".ferry-submit.sh";
constexpr std::string_view k_batch_script = ".ferry-batch.sh";
constexpr std::string_view k_sbatch_args = ".ferry-sbatch-args";

// "ferry-kv_calc-3f9a1c0b": the job's name in squeue, unique so that a submission cut short
// before sbatch said the id can still be cancelled by name.
std::string slurm_job_name(std::string_view job)
{
  std::string name = "ferry-";
  for (const char c : job.substr(0, 32)) {
    name +=
        std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-' ? c : '_';
  }
  return name + "-" + random_hex(4);
}

// sbatch's arguments, one per line: ferry's fixed options, the run's checked options, the batch
// script and the run directories it gets as arguments.
std::string sbatch_args_file(const SlurmOptions& options, const std::string& job_name,
                             const std::vector<std::string>& dirs)
{
  std::vector<std::string> args = {
      "--parsable", "--job-name=" + job_name, "--output=/dev/null", "--error=/dev/null",
      "--chdir=/",  "--ntasks-per-node=1",    "--no-requeue"};
  const auto chosen = sbatch_options(options);
  args.insert(args.end(), chosen.begin(), chosen.end());
  args.push_back(dirs.front() + "/" + std::string(k_batch_script));
  args.insert(args.end(), dirs.begin(), dirs.end());
  std::string text;
  for (const auto& arg : args) {
    text += arg + "\n";
  }
  return text;
}

struct ScriptFields {
  std::string run_dir;
  std::string tag;
  std::string job_id; // empty: submit
  std::string job_name;
  std::string end_marker;
  std::string sentinel;
};

std::string submit_script(const ScriptFields& fields)
{
  return fill_template(remote_script("submit.sh"), {
                                                       {"run_dir", sh_quote(fields.run_dir)},
                                                       {"tag", sh_quote(fields.tag)},
                                                       {"job_id", sh_quote(fields.job_id)},
                                                       {"job_name", sh_quote(fields.job_name)},
                                                       {"end_marker", sh_quote(fields.end_marker)},
                                                       {"sentinel", sh_quote(fields.sentinel)},
                                                   });
}

class SlurmSession final : public HostSession {
public:
  SlurmSession(std::shared_ptr<const SlurmTarget> target, int slot,
               std::shared_ptr<SharedAllocation> allocation)
      : m_shared_target(std::move(target)), m_target(*m_shared_target), m_slot(slot),
        m_allocation(std::move(allocation)), m_login(ssh::make_remote(m_target.login))
  {
    m_login->without_job_cache();
  }
  SlurmSession(const SlurmSession&) = delete;
  SlurmSession& operator=(const SlurmSession&) = delete;
  ~SlurmSession() override
  {
    withdraw("its runs are over");
    m_allocation->leave(m_slot, "its session ended");
  }

  nlohmann::json target() const override;
  std::string label() const override;
  Expected<void> connect() override;
  // The submit script forwards the launcher's output file from the run directory after the
  // launcher has ended: the directory stays until the run is finished.
  Expected<StagedRun> stage(const RunBundle& bundle, const StopToken& stop) override;
  Expected<ExecOutcome> launch(StagedRun& run, const LaunchRequest& request) override;
  // Files alongside and files back go over the login node's SFTP: the run directory is on the
  // shared file system the nodes see.
  Expected<FetchedFile> fetch(const StagedRun& run, const std::string& rel,
                              const ChunkSink& sink) override
  {
    return m_login->fetch(run, rel, sink);
  }
  Expected<std::optional<std::vector<DirEntry>>> list(const StagedRun& run,
                                                      const std::string& rel) override
  {
    return m_login->list(run, rel);
  }
  Expected<void> finish(StagedRun& run, Finish how) override
  {
    withdraw("its run was not launched");
    return m_login->finish(run, how);
  }

private:
  // This slot's run of the current round never reached exec: the other slots must not wait.
  void withdraw(std::string_view why)
  {
    if (m_round >= 0 && !m_joined) {
      m_allocation->abandon(
          m_round, fmt::format("node slot {} of {}: {}", m_slot + 1, m_allocation->slots(), why));
      m_joined = true;
    }
  }
  void start_round(const RunBundle& bundle);
  Expected<std::string> submit_or_wait(const std::string& run_dir, const ExecRequest& request);
  Expected<ExecOutcome> follow(const ExecRequest& request, const std::string& run_dir,
                               const std::string& job_id);

  std::shared_ptr<const SlurmTarget> m_shared_target;
  const SlurmTarget& m_target;
  const int m_slot;
  std::shared_ptr<SharedAllocation> m_allocation;
  std::unique_ptr<ssh::Remote> m_login;
  StopToken m_stop;
  nlohmann::json m_cluster; // `check`: what the login node says about the cluster
  // The current run.
  int m_round = -1;
  bool m_joined = true;
  SlurmOptions m_options; // what the command line, the job and the config ask for
  int m_time_min = 0;     // the --time it was given
  std::string m_job_name;
  int m_timeout_s = 0;
  std::string m_job_id;
  std::string m_node;
  std::optional<slurm::JobEnd> m_end;
  std::optional<bool> m_run_dir_shared;
};

nlohmann::json SlurmSession::target() const
{
  nlohmann::json login = m_login->target();
  nlohmann::json slurm = {{"login", login.value("host", m_target.login.spec)},
                          {"address", login.value("address", "")},
                          {"user", login.value("user", "")},
                          {"port", login.value("port", 0)},
                          {"host_key_sha256", login.value("host_key_sha256", "")},
                          {"options", slurm_options_json(m_options)}};
  if (m_time_min > 0) {
    slurm["time_limit_min"] = m_time_min;
  }
  if (!m_job_id.empty()) {
    slurm["job_id"] = m_job_id;
    slurm["node"] = m_node.empty() ? nlohmann::json() : nlohmann::json(m_node);
  }
  if (m_end) {
    slurm["state"] = m_end->state;
    slurm["exit_code"] = m_end->exit_code ? nlohmann::json(*m_end->exit_code) : nlohmann::json();
    slurm["signal"] = m_end->signal ? nlohmann::json(*m_end->signal) : nlohmann::json();
    slurm["nodes"] = m_end->nodes;
    slurm["state_source"] = m_end->source;
  }
  if (m_run_dir_shared) {
    slurm["run_dir_shared"] = *m_run_dir_shared;
  }
  if (!m_cluster.is_null()) {
    slurm["cluster"] = m_cluster;
  }
  return {{"host", m_node.empty() ? slurm["login"] : nlohmann::json(m_node)}, {"slurm", slurm}};
}

std::string SlurmSession::label() const
{
  if (!m_job_id.empty()) {
    return fmt::format("slurm:{}{}", m_job_id, m_node.empty() ? "" : "/" + m_node);
  }
  if (m_allocation->slots() > 1) {
    return fmt::format("slurm:{}#{}", m_target.login.spec, m_slot + 1);
  }
  return "slurm:" + m_target.login.spec;
}

Expected<void> SlurmSession::connect()
{
  auto connected = m_login->connect();
  if (connected) {
    connected = slurm::ping_controller(*m_login, m_target.login.spec, m_stop);
  }
  if (connected && m_target.describe_cluster) {
    m_cluster = slurm::describe_cluster(*m_login, m_stop);
  }
  if (!connected) {
    m_allocation->leave(m_slot, connected.error().message);
  }
  return connected;
}

void SlurmSession::start_round(const RunBundle& bundle)
{
  withdraw("its run could not be staged");
  ++m_round;
  m_joined = false;
  // The job's own options were checked as its file was read.
  auto read = slurm_options_from_json(bundle.scheduler.is_object() ? bundle.scheduler
                                                                   : nlohmann::json::object());
  const SlurmOptions of_job = read ? *read : SlurmOptions{};
  m_options =
      merge_slurm_options(m_target.command_line, merge_slurm_options(of_job, m_target.config));
  m_options.nodes = m_target.nodes;
  m_job_name = slurm_job_name(bundle.launcher.job_name);
  m_timeout_s = bundle.launcher.timeout_s;
  m_time_min = 0;
  m_job_id.clear();
  m_node.clear();
  m_end.reset();
  m_run_dir_shared.reset();
}

Expected<StagedRun> SlurmSession::stage(const RunBundle& bundle, const StopToken& stop)
{
  m_stop = stop;
  start_round(bundle);
  RunBundle kept = bundle;
  kept.launcher.keep_run_dir = true; // the submit script reads the launcher's output there
  auto staged = m_login->stage(kept, stop);
  if (!staged) {
    withdraw("its run could not be staged");
  }
  return staged;
}

// Slot 0 submits the job for every slot's run directory; the others wait for its id.
Expected<std::string> SlurmSession::submit_or_wait(const std::string& run_dir,
                                                   const ExecRequest& request)
{
  m_joined = true;
  FERRY_TRY_ASSIGN(const auto dirs, m_allocation->join(m_round, m_slot, run_dir, request.stop));
  if (m_slot != 0) {
    return m_allocation->job_of(m_round, request.stop);
  }
  SlurmOptions options = m_options;
  options.time_min = m_time_min;
  FERRY_TRY(m_login->put_file(run_dir + "/" + std::string(k_batch_script),
                              remote_script("slurm_batch.sh")));
  FERRY_TRY(m_login->put_file(run_dir + "/" + std::string(k_sbatch_args),
                              sbatch_args_file(options, m_job_name, dirs)));
  return std::string(); // submitted by this slot's submit script
}

Expected<ExecOutcome> SlurmSession::launch(StagedRun& run, const LaunchRequest& launch)
{
  const ExecRequest request = launcher_request(run, launch);
  const std::string& run_dir = run.run_dir;
  m_time_min = m_options.time_min.value_or(slurm_minutes_for(
      m_timeout_s,
      static_cast<int>(std::chrono::duration_cast<std::chrono::seconds>(request.grace).count())));
  auto job_id = submit_or_wait(run_dir, request);
  if (!job_id) {
    if (m_slot == 0) {
      m_allocation->abandon(m_round, job_id.error().message);
    }
    return Unexpected<Error>{job_id.error()};
  }
  auto outcome = follow(request, run_dir, *job_id);
  if (m_slot == 0) {
    // Whatever happened, the others stop waiting (a no-op once the id is out).
    m_allocation->abandon(m_round,
                          outcome ? "sbatch did not submit the job" : outcome.error().message);
  }
  return outcome;
}

Expected<ExecOutcome> SlurmSession::follow(const ExecRequest& request, const std::string& run_dir,
                                           const std::string& job_id)
{
  const std::string nonce = random_hex(12);
  ScriptFields fields{run_dir,    "ferry-slurm-" + nonce, job_id,
                      m_job_name, request.end_marker,     "ferry-submit-" + nonce};
  FERRY_TRY(m_login->put_file(run_dir + "/" + std::string(k_submit_script), submit_script(fields)));
  m_job_id = job_id;
  Follow follow(request, fields.tag, [this](std::string id) {
    m_job_id = id;
    if (m_slot == 0) {
      m_allocation->submitted(m_round, std::move(id));
    }
  });
  FERRY_TRY_ASSIGN(auto script, m_login->exec(follow.script_request(
                                    {"/bin/sh", run_dir + "/" + std::string(k_submit_script)},
                                    fields.sentinel)));
  m_job_id = follow.job_id();
  m_node = follow.node();
  m_end = follow.end();
  if (m_end && slurm::is_final_state(m_end->state)) {
    m_run_dir_shared = !m_node.empty()                                ? std::optional(true)
                       : m_end->exit_code == slurm::k_no_run_dir_exit ? std::optional(false)
                                                                      : std::nullopt;
  }
  if (m_job_id.empty() && script.end == ExecEnd::exited) {
    const std::string said(trim(script.err.bytes));
    return fail(ErrorKind::failed, "{}: sbatch did not submit the job{}", label(),
                said.empty() ? fmt::format(" (the submit script exited with {})",
                                           script.exit_code.value_or(-1))
                             : ": " + shorten(said, 600));
  }
  slurm::NodeRun run;
  run.run_dir = run_dir;
  run.time_min = m_time_min;
  return follow.outcome(std::move(script), run);
}

} // namespace

std::vector<std::unique_ptr<HostSession>> make_slurm_sessions(const SlurmTarget& target)
{
  auto shared = std::make_shared<const SlurmTarget>(target);
  auto allocation = std::make_shared<SharedAllocation>(target.nodes);
  std::vector<std::unique_ptr<HostSession>> sessions;
  for (int slot = 0; slot < target.nodes; ++slot) {
    sessions.push_back(std::make_unique<SlurmSession>(shared, slot, allocation));
  }
  return sessions;
}

} // namespace ferry
