// The Slurm target: a HostSession per node slot. Files go over the login node's SFTP (an SSH
// session of its own per slot); exec submits the run's job with sbatch through the submit script
// and follows it; the slots of one target share each run's allocation (docs/slurm.md). A sweep's
// points are one job array: they run at once on one session, each on its own fleet thread, and
// meet like node slots; then one script on one channel submits the array and follows every task
// (ArrayFollow), each point taking its own task's part.
#include <atomic>
#include <charconv>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "ferry/job.hpp"
#include "ferry/remote/launcher.hpp"
#include "ferry/slurm.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"
#include "transport/slurm/allocation.hpp"
#include "transport/slurm/array_follow.hpp"
#include "transport/slurm/cluster.hpp"
#include "transport/slurm/follow.hpp"

namespace ferry {

namespace {

using slurm::Follow;
using slurm::SharedAllocation;

constexpr std::string_view k_submit_script = ".ferry-submit.sh";
constexpr std::string_view k_array_script = ".ferry-follow-array.sh";
constexpr std::string_view k_batch_script = ".ferry-batch.sh";
constexpr std::string_view k_sbatch_args = ".ferry-sbatch-args";
// A detached run's --keep-for in seconds, for the batch script (src/remote/slurm_batch.sh).
constexpr std::string_view k_keep_for_file = ".ferry-keep-for";

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
// `array`: sbatch's --array value for a sweep's points (empty: one job).
std::string sbatch_args_file(const SlurmOptions& options, const std::string& job_name,
                             const std::vector<std::string>& dirs, const std::string& array)
{
  std::vector<std::string> args = {
      "--parsable", "--job-name=" + job_name, "--output=/dev/null", "--error=/dev/null",
      "--chdir=/",  "--ntasks-per-node=1",    "--no-requeue"};
  if (!array.empty()) {
    args.push_back("--array=" + array);
  }
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
  std::string mode; // submit.sh's: empty (a live run), detach or attach
};

// What submit.sh and follow_array.sh share: the final state of a job (src/remote/slurm_state.sh).
std::string slurm_state()
{
  return std::string(remote_script("slurm_state.sh"));
}

std::string submit_script(const ScriptFields& fields)
{
  return fill_template(remote_script("submit.sh"), {
                                                       {"slurm_state", slurm_state()},
                                                       {"run_dir", sh_quote(fields.run_dir)},
                                                       {"tag", sh_quote(fields.tag)},
                                                       {"job_id", sh_quote(fields.job_id)},
                                                       {"job_name", sh_quote(fields.job_name)},
                                                       {"end_marker", sh_quote(fields.end_marker)},
                                                       {"sentinel", sh_quote(fields.sentinel)},
                                                       {"mode", sh_quote(fields.mode)},
                                                   });
}

// The follower of a job array: `dirs` are the points' run directories, in task order.
std::string array_script(const ScriptFields& fields, const std::vector<std::string>& dirs)
{
  std::string quoted;
  for (const auto& dir : dirs) {
    quoted += (quoted.empty() ? "" : " ") + sh_quote(dir);
  }
  return fill_template(remote_script("follow_array.sh"),
                       {
                           {"slurm_state", slurm_state()},
                           {"run_dirs", quoted},
                           {"tag", sh_quote(fields.tag)},
                           {"job_name", sh_quote(fields.job_name)},
                           {"end_marker", sh_quote(fields.end_marker)},
                           {"sentinel", sh_quote(fields.sentinel)},
                       });
}

// One run's state: a session runs one at a time, except a sweep's job array, whose points run
// at once, each on a thread of its own (the fleet's lane) that stages, launches and records it.
struct RunState {
  int round = -1;
  int slot = 0; // the node slot, or the array point (its task id)
  bool joined = true;
  SlurmOptions options; // what the command line, the job and the config ask for
  int time_min = 0;     // the --time it was given
  std::string job_name;
  int timeout_s = 0;
  std::string job_id; // "4242", or "4242_3" for task 3 of array 4242
  std::string node;
  std::optional<slurm::JobEnd> end;
  std::optional<bool> run_dir_shared;
  bool detach = false;      // run --detach: submitted, then left queued...
  long long keep_for_s = 0; // ...its finished directory kept this long (--keep-for; 0: unknown)
};

// The seconds of detach_request's `SECONDS:CAP` (0 when it says none).
long long keep_for_of(const std::string& request)
{
  long long seconds = 0;
  const auto [end, error] =
      std::from_chars(request.data(), request.data() + request.size(), seconds);
  return error == std::errc() ? seconds : 0;
}

// A sweep's points submitted as one job array (not a detached point followed again: that is
// one task of an array submitted before).
bool submits_array(const SlurmTarget& target)
{
  return target.array_points > 1 && target.nodes == 1 && target.detached_job.empty();
}

// "4242_3" -> 3; -1 for a job that is no array task.
int task_of(const std::string& job_id)
{
  const auto underscore = job_id.find('_');
  int task = -1;
  if (underscore != std::string::npos) {
    std::from_chars(job_id.data() + underscore + 1, job_id.data() + job_id.size(), task);
  }
  return task;
}

// What a launcher that detached itself says (docs/run-protocol.md, "Detached runs"): a detached
// run's job has been submitted, and the runner records the run as detached.
ExecOutcome detached_outcome(const std::string& job_id)
{
  ExecOutcome outcome;
  outcome.end = ExecEnd::exited;
  outcome.exit_code = 0;
  outcome.out.saw_sentinel = true;
  outcome.out.bytes = std::string(k_detached_line) + job_id + "\n";
  return outcome;
}

// "4242_3" -> "4242"
std::string array_of(const std::string& job_id)
{
  return job_id.substr(0, job_id.find('_'));
}

class SlurmSession final : public HostSession {
public:
  SlurmSession(std::shared_ptr<const SlurmTarget> target, int slot,
               std::shared_ptr<SharedAllocation> allocation)
      : m_shared_target(std::move(target)), m_target(*m_shared_target), m_slot(slot),
        m_array(submits_array(m_target)), m_allocation(std::move(allocation)),
        m_login(ssh::make_remote(m_target.login))
  {
    m_login->without_job_cache();
    if (m_array) {
      m_follower = std::make_unique<slurm::ArrayFollow>(m_target.array_points);
    }
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
  SessionTraits traits() const override { return {m_array, m_array}; }
  Expected<void> connect() override;
  // The submit script forwards the launcher's output file from the run directory after the
  // launcher has ended: the directory stays until the run is finished.
  Expected<StagedRun> stage(const RunBundle& bundle, const StopToken& stop) override;
  Expected<ExecOutcome> launch(StagedRun& run, const LaunchRequest& request) override;
  // Files alongside and files back go over the login node's SFTP: the run directory is on the
  // shared file system the nodes see.
  Expected<FetchedFile> fetch(const StagedRun& run, const std::string& rel, const ChunkSink& sink,
                              std::uint64_t offset) override
  {
    return m_login->fetch(run, rel, sink, offset);
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
  // `ferry stop` of the detached job this session follows (SlurmTarget::detached_job): scancel of
  // that job alone (an array's task alone); the launcher on the node gets Slurm's TERM, as on a
  // live run's Ctrl-C. What was sent, for -v.
  std::string cancel_detached()
  {
    slurm::cancel_job(*m_login, m_target.detached_job);
    return "sent (scancel " + m_target.detached_job + ")";
  }

private:
  // This thread's run (see RunState); a thread that has run nothing sees an empty one.
  RunState& mine()
  {
    const std::lock_guard lock(m_runs_mutex);
    return m_runs[std::this_thread::get_id()];
  }
  const RunState& mine() const
  {
    const std::lock_guard lock(m_runs_mutex);
    const auto found = m_runs.find(std::this_thread::get_id());
    static const RunState none;
    return found == m_runs.end() ? none : found->second;
  }
  // This slot's run of the current round never reached exec: the other slots must not wait.
  void withdraw(std::string_view why)
  {
    RunState& run = mine();
    if (run.round >= 0 && !run.joined) {
      m_allocation->abandon(run.round,
                            fmt::format("{} {} of {}: {}", m_array ? "sweep point" : "node slot",
                                        run.slot + 1, m_allocation->slots(), why));
      run.joined = true;
    }
  }
  void start_round(const RunBundle& bundle);
  std::string array_spec() const;
  Expected<void> put_submission(const std::string& run_dir, const std::vector<std::string>& dirs);
  Expected<std::string> submit_or_wait(const std::string& run_dir, const ExecRequest& request);
  Expected<ExecOutcome> follow(const ExecRequest& request, const std::string& run_dir,
                               const std::string& job_id, const std::string& mode);
  Expected<ExecOutcome> reattach(const StagedRun& staged, const ExecRequest& request);
  Expected<ExecOutcome> submit_detached(const ExecRequest& request, const std::string& run_dir);
  Expected<ExecOutcome> follow_point(const ExecRequest& request, const std::string& run_dir);
  Expected<void> arm_follower(const ExecRequest& request, const std::string& run_dir);
  Expected<ExecOutcome> settle(RunState& run, slurm::Follow& follow, ExecOutcome script,
                               const std::string& run_dir);
  void on_job(std::string id);

  std::shared_ptr<const SlurmTarget> m_shared_target;
  const SlurmTarget& m_target;
  const int m_slot;
  const bool m_array; // a sweep's points as one job array
  std::shared_ptr<SharedAllocation> m_allocation;
  std::unique_ptr<ssh::Remote> m_login;
  std::unique_ptr<slurm::ArrayFollow> m_follower; // an array's (it uses m_login till it ends)
  StopToken m_stop;
  nlohmann::json m_cluster;     // `check`: what the login node says about the cluster
  int m_round = -1;             // the last round of a session that runs one run at a time
  std::atomic<int> m_points{0}; // array points staged so far
  mutable std::mutex m_runs_mutex;
  std::map<std::thread::id, RunState> m_runs;
};

nlohmann::json SlurmSession::target() const
{
  const RunState& run = mine();
  nlohmann::json login = m_login->target();
  nlohmann::json slurm = {{"login", login.value("host", m_target.login.spec)},
                          {"address", login.value("address", "")},
                          {"user", login.value("user", "")},
                          {"port", login.value("port", 0)},
                          {"host_key_sha256", login.value("host_key_sha256", "")},
                          {"options", slurm_options_json(run.options)}};
  if (run.time_min > 0) {
    slurm["time_limit_min"] = run.time_min;
  }
  if (!run.job_id.empty()) {
    slurm["job_id"] = run.job_id;
    slurm["node"] = run.node.empty() ? nlohmann::json() : nlohmann::json(run.node);
  }
  // A sweep's point, as it runs, or followed again once detached ("4242_3": task 3).
  if (m_array || (m_target.array_points > 1 && task_of(run.job_id) >= 0)) {
    slurm["array_size"] = m_target.array_points;
    slurm["array_task_id"] = m_array ? run.slot : task_of(run.job_id);
    if (!run.job_id.empty()) {
      slurm["array_job_id"] = array_of(run.job_id);
    }
  }
  if (run.end) {
    slurm["state"] = run.end->state;
    slurm["exit_code"] =
        run.end->exit_code ? nlohmann::json(*run.end->exit_code) : nlohmann::json();
    slurm["signal"] = run.end->signal ? nlohmann::json(*run.end->signal) : nlohmann::json();
    slurm["nodes"] = run.end->nodes;
    slurm["state_source"] = run.end->source;
  }
  if (run.run_dir_shared) {
    slurm["run_dir_shared"] = *run.run_dir_shared;
  }
  if (!m_cluster.is_null()) {
    slurm["cluster"] = m_cluster;
  }
  return {{"host", run.node.empty() ? slurm["login"] : nlohmann::json(run.node)}, {"slurm", slurm}};
}

std::string SlurmSession::label() const
{
  const RunState& run = mine();
  if (!run.job_id.empty()) {
    return fmt::format("slurm:{}{}", run.job_id, run.node.empty() ? "" : "/" + run.node);
  }
  if (!m_array && m_allocation->slots() > 1) {
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
  RunState& run = mine();
  run = RunState{};
  // An array's points are one round, each point a slot; otherwise each run is a round.
  run.round = m_array ? 0 : ++m_round;
  run.slot = m_array ? m_points++ : m_slot;
  run.joined = false;
  // The job's own options were checked as its file was read.
  auto read = slurm_options_from_json(bundle.scheduler.is_object() ? bundle.scheduler
                                                                   : nlohmann::json::object());
  const SlurmOptions of_job = read ? *read : SlurmOptions{};
  run.options =
      merge_slurm_options(m_target.command_line, merge_slurm_options(of_job, m_target.config));
  run.options.nodes = m_target.nodes;
  run.job_name = slurm_job_name(bundle.launcher.job_name);
  run.timeout_s = bundle.launcher.timeout_s;
}

Expected<StagedRun> SlurmSession::stage(const RunBundle& bundle, const StopToken& stop)
{
  m_stop = stop;
  start_round(bundle);
  RunBundle kept = bundle;
  kept.launcher.keep_run_dir = true; // the submit script reads the launcher's output there
  // --detach: the job stays queued apart from ferry, its launcher on the node running as for a
  // live run (a launcher that detached itself would end the batch job at once).
  RunState& run = mine();
  if (const auto detach = kept.launcher.env.find(k_launcher_detach_var);
      detach != kept.launcher.env.end()) {
    run.detach = true;
    run.keep_for_s = keep_for_of(detach->second);
    kept.launcher.env.erase(detach);
  }
  auto staged = m_login->stage(kept, stop);
  if (!staged) {
    withdraw("its run could not be staged");
  }
  return staged;
}

// "0-11", or "0-11%4" with a bound on the tasks at once.
std::string SlurmSession::array_spec() const
{
  if (!m_array) {
    return {};
  }
  const int last = m_target.array_points - 1;
  const int bound = m_target.array_throttle;
  return bound > 0 && bound <= last ? fmt::format("0-{}%{}", last, bound)
                                    : fmt::format("0-{}", last);
}

// Slot 0 submits the job for every slot's run directory (every point's, for an array); the
// others wait for its id.
Expected<std::string> SlurmSession::submit_or_wait(const std::string& run_dir,
                                                   const ExecRequest& request)
{
  RunState& run = mine();
  run.joined = true;
  FERRY_TRY_ASSIGN(const auto dirs, m_allocation->join(run.round, run.slot, run_dir, request.stop));
  if (run.slot != 0) {
    return m_allocation->job_of(run.round, request.stop);
  }
  FERRY_TRY(put_submission(run_dir, dirs));
  return std::string(); // submitted by this slot's submit script
}

// The batch script and sbatch's arguments, in the run directory of slot 0 (point 0).
Expected<void> SlurmSession::put_submission(const std::string& run_dir,
                                            const std::vector<std::string>& dirs)
{
  const RunState& run = mine();
  SlurmOptions options = run.options;
  options.time_min = run.time_min;
  FERRY_TRY(m_login->put_file(run_dir + "/" + std::string(k_batch_script),
                              remote_script("slurm_batch.sh")));
  return m_login->put_file(run_dir + "/" + std::string(k_sbatch_args),
                           sbatch_args_file(options, run.job_name, dirs, array_spec()));
}

Expected<ExecOutcome> SlurmSession::launch(StagedRun& staged, const LaunchRequest& launch)
{
  const ExecRequest request = launcher_request(staged, launch);
  const std::string& run_dir = staged.run_dir;
  if (!m_target.detached_job.empty()) {
    return reattach(staged, request);
  }
  RunState& run = mine();
  run.time_min = run.options.time_min.value_or(slurm_minutes_for(
      run.timeout_s,
      static_cast<int>(std::chrono::duration_cast<std::chrono::seconds>(request.grace).count())));
  if (run.detach) {
    return submit_detached(request, run_dir);
  }
  if (m_array) {
    return follow_point(request, run_dir);
  }
  auto job_id = submit_or_wait(run_dir, request);
  if (!job_id) {
    if (run.slot == 0) {
      m_allocation->abandon(run.round, job_id.error().message);
    }
    return Unexpected<Error>{job_id.error()};
  }
  auto outcome = follow(request, run_dir, *job_id, "");
  if (run.slot == 0) {
    // Whatever happened, the others stop waiting (a no-op once the id is out).
    m_allocation->abandon(run.round,
                          outcome ? "sbatch did not submit the job" : outcome.error().message);
  }
  return outcome;
}

// --detach: point 0 of a sweep (or the one run) submits the job, a sweep's points as one job array,
// and leaves it queued; each run is recorded with its own job, an array point with its task
// ("4242_3"), which attach, stop and ps follow alone. The run directory says how long it is kept
// once finished (--keep-for): the batch script leaves that in the launcher's state file for the
// run base's sweep (src/remote/slurm_batch.sh).
Expected<ExecOutcome> SlurmSession::submit_detached(const ExecRequest& request,
                                                    const std::string& run_dir)
{
  RunState& run = mine();
  if (run.keep_for_s > 0) {
    FERRY_TRY(m_login->put_file(run_dir + "/" + std::string(k_keep_for_file),
                                fmt::format("{}\n", run.keep_for_s)));
  }
  auto job_id = submit_or_wait(run_dir, request);
  if (!job_id) {
    if (run.slot == 0) {
      m_allocation->abandon(run.round, job_id.error().message);
    }
    return Unexpected<Error>{job_id.error()};
  }
  if (run.slot != 0) { // point 0's submit script said the array's id
    run.job_id = m_array ? fmt::format("{}_{}", *job_id, run.slot) : *job_id;
    return detached_outcome(run.job_id);
  }
  auto outcome = follow(request, run_dir, *job_id, "detach");
  m_allocation->abandon(run.round,
                        outcome ? "sbatch did not submit the job" : outcome.error().message);
  if (!outcome || outcome->end != ExecEnd::exited || run.job_id.empty()) {
    return outcome; // not submitted: as for a live run
  }
  if (m_array) {
    run.job_id += "_0";
  }
  return detached_outcome(run.job_id);
}

// A point of a job array: once every point is staged, point 0 readies the one script that submits
// the array and follows every task; each point then takes its own task's frames and keeps its own
// deadline, cancelling its task alone when it passes (Ctrl-C stops the script, which cancels the
// whole array).
Expected<ExecOutcome> SlurmSession::follow_point(const ExecRequest& request,
                                                 const std::string& run_dir)
{
  RunState& run = mine();
  run.joined = true;
  auto joined = arm_follower(request, run_dir);
  if (!joined) {
    m_follower->abandon(joined.error().message);
    return Unexpected<Error>{joined.error()};
  }
  // The job id comes on the follower's thread: it is this point's, not that thread's.
  slurm::Follow follow(request, std::string(),
                       [&run](std::string id) { run.job_id = std::move(id); });
  m_follower->enroll(run.slot, follow);
  FERRY_TRY_ASSIGN(auto script, m_follower->wait(run.slot, request.stop, [&] {
    slurm::cancel_job(*m_login, follow.job_id());
  }));
  return settle(run, follow, std::move(script), run_dir);
}

Expected<void> SlurmSession::arm_follower(const ExecRequest& request, const std::string& run_dir)
{
  const RunState& run = mine();
  FERRY_TRY_ASSIGN(const auto dirs, m_allocation->join(run.round, run.slot, run_dir, request.stop));
  if (run.slot != 0) {
    return {};
  }
  FERRY_TRY(put_submission(run_dir, dirs));
  const std::string nonce = random_hex(12);
  const ScriptFields fields{run_dir,
                            "ferry-slurm-" + nonce,
                            {},
                            run.job_name,
                            request.end_marker,
                            "ferry-submit-" + nonce,
                            {}};
  const std::string path = run_dir + "/" + std::string(k_array_script);
  FERRY_TRY(m_login->put_file(path, array_script(fields, dirs)));
  // After TERM the script cancels the array and reports every task's end.
  ExecRequest script = slurm::follower_request(request, {"/bin/sh", path}, fields.sentinel,
                                               std::chrono::seconds(30));
  script.stop = request.stop;
  m_follower->arm([this](const ExecRequest& req) { return m_login->exec(req); }, std::move(script),
                  fields.tag);
  return {};
}

// The submit script said the job's id: slot 0 passes it on to the others (for an array, the
// array's own id: each point follows its task).
void SlurmSession::on_job(std::string id)
{
  RunState& run = mine();
  run.job_id = id;
  if (run.slot == 0) {
    m_allocation->submitted(run.round, std::move(id));
  }
}

// `mode`: submit.sh's (ScriptFields).
Expected<ExecOutcome> SlurmSession::follow(const ExecRequest& request, const std::string& run_dir,
                                           const std::string& job_id, const std::string& mode)
{
  RunState& run = mine();
  const std::string nonce = random_hex(12);
  ScriptFields fields{run_dir,      "ferry-slurm-" + nonce, job_id,
                      run.job_name, request.end_marker,     "ferry-submit-" + nonce,
                      mode};
  // Each attach writes a script of its own (uploads never replace a file).
  const bool attach = mode == "attach";
  const std::string script_path =
      run_dir + "/" + (attach ? ".ferry-attach-" + nonce + ".sh" : std::string(k_submit_script));
  FERRY_TRY(m_login->put_file(script_path, submit_script(fields)));
  run.job_id = job_id;
  Follow follow(request, fields.tag, [this, attach](std::string id) {
    if (!attach) { // a job submitted before is no allocation's
      on_job(std::move(id));
    }
  });
  FERRY_TRY_ASSIGN(auto script,
                   m_login->exec(follow.script_request({"/bin/sh", script_path}, fields.sentinel)));
  return settle(run, follow, std::move(script), run_dir);
}

// `attach` or `stop` of a detached run: following is the submit script's, as for a live run, for
// the job submitted before (`stop` cancelled it first: cancel_detached).
Expected<ExecOutcome> SlurmSession::reattach(const StagedRun& staged, const ExecRequest& request)
{
  RunState& run = mine();
  run.options = m_target.command_line;
  run.time_min = m_target.command_line.time_min.value_or(0);
  run.job_id = m_target.detached_job;
  return follow(request, staged.run_dir, run.job_id, "attach");
}

// The run's part of what the script saw: its job, node and end, and the runner's outcome.
Expected<ExecOutcome> SlurmSession::settle(RunState& run, slurm::Follow& follow, ExecOutcome script,
                                           const std::string& run_dir)
{
  run.job_id = follow.job_id();
  run.node = follow.node();
  run.end = follow.end();
  if (run.end && slurm::is_final_state(run.end->state)) {
    run.run_dir_shared = !run.node.empty()                                ? std::optional(true)
                         : run.end->exit_code == slurm::k_no_run_dir_exit ? std::optional(false)
                                                                          : std::nullopt;
  }
  if (run.job_id.empty() && script.end == ExecEnd::exited) {
    const std::string said(trim(script.err.bytes));
    return fail(ErrorKind::failed, "{}: sbatch did not submit the job{}", label(),
                said.empty() ? fmt::format(" (the submit script exited with {})",
                                           script.exit_code.value_or(-1))
                             : ": " + shorten(said, 600));
  }
  slurm::NodeRun node_run;
  node_run.run_dir = run_dir;
  node_run.time_min = run.time_min;
  return follow.outcome(std::move(script), node_run);
}

} // namespace

Expected<std::string> detached_slurm_state(const SlurmTarget& target, const std::string& run_dir)
{
  auto login = ssh::make_remote(target.login);
  login->without_job_cache();
  FERRY_TRY(login->connect());
  FERRY_TRY_ASSIGN(const std::string state,
                   slurm::queue_state(*login, target.detached_job, StopToken::make()));
  if (state == "PENDING") {
    return std::string("pending");
  }
  if (!state.empty() && !slurm::is_final_state(state)) {
    return std::string("running");
  }
  StagedRun staged;
  staged.run_dir = run_dir;
  FERRY_TRY_ASSIGN(const auto listed, login->list(staged, ""));
  return std::string(listed ? "finished" : "gone");
}

Expected<std::string> cancel_detached_slurm_job(HostSession& session)
{
  auto* slurm = dynamic_cast<SlurmSession*>(&session);
  if (slurm == nullptr) {
    return fail(ErrorKind::failed, "{}: not a Slurm login node; no Slurm job to cancel",
                session.label());
  }
  return slurm->cancel_detached();
}

std::vector<std::unique_ptr<HostSession>> make_slurm_sessions(const SlurmTarget& target)
{
  auto shared = std::make_shared<const SlurmTarget>(target);
  // A job array's points meet like node slots, on the one session of a one-node target.
  const bool array = submits_array(target);
  auto allocation = std::make_shared<SharedAllocation>(array ? target.array_points : target.nodes);
  std::vector<std::unique_ptr<HostSession>> sessions;
  for (int slot = 0; slot < target.nodes; ++slot) {
    sessions.push_back(std::make_unique<SlurmSession>(shared, slot, allocation));
  }
  return sessions;
}

} // namespace ferry
