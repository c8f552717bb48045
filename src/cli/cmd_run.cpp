#include <charconv>

#include "cli/detached.hpp"
#include "cli/execute.hpp"
#include "cli/retry.hpp"
#include "cli/targets.hpp"
#include "ferry/bundle.hpp"
#include "ferry/params.hpp"
#include "ferry/run_env.hpp"
#include "ferry/sweep.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"
#include "run/environment.hpp"

namespace ferry::cli {

namespace {

struct RunCommand {
  std::vector<std::string> jobs;
  TargetOptions target;
  std::vector<std::string> assignments;
  std::string params_file;
  std::optional<int> timeout_s;
  int parallel = 8;
  bool parallel_given = false; // -j on the command line (a job array's bound)
  bool json = false;
  bool raw_output = false;
  bool stream = false;
  bool no_stream = false;
  bool fold = false;
  bool no_fold = false;
  bool keep_remote = false;
  bool detach = false;         // --detach
  std::string keep_for = "7d"; // --keep-for
  bool no_archive = false;
  std::size_t output_cap_mib = 16;
  EnvironmentOptions environment;  // --env, --interpreter
  std::vector<std::string> sweeps; // --sweep KEY=V1,V2
  // Files alongside and files back.
  std::vector<std::string> files;
  std::uint64_t max_upload_mib = k_default_max_upload >> 20;
  std::vector<std::string> fetch;
  std::string out_dir = "ferry-out/{run_id}/{host}";
  std::uint64_t archive_outputs_max_mib = 16;
  std::optional<std::string> retry_failed; // --retry-failed [last|ID]
  std::optional<int> wait_gpus_s;          // --wait-gpus
};

// `--retry-failed`: the invocation's own jobs, parameters and hosts run again; what would choose
// others is refused rather than ignored.
Expected<ExitCode> run_retry(Context& ctx, const RunCommand& cmd)
{
  const bool target_given =
      !cmd.target.hosts.empty() || !cmd.target.hosts_file.empty() || cmd.target.local;
  if (!cmd.jobs.empty() || !cmd.assignments.empty() || !cmd.sweeps.empty() ||
      !cmd.params_file.empty() || target_given || !cmd.files.empty()) {
    return fail(ErrorKind::usage,
                "--retry-failed runs the failed runs' own jobs, parameters, files and hosts; "
                "give none of JOB, -p, --sweep, --params, --file, --host, --hosts-file, --local "
                "with it (`ferry replay RUN` runs one run elsewhere)");
  }
  RetryRequest request;
  request.invocation = *cmd.retry_failed;
  request.timeout_s = cmd.timeout_s;
  request.parallel = cmd.parallel;
  request.archive = !cmd.no_archive;
  request.keep_remote = cmd.keep_remote;
  request.environment = cmd.environment;
  request.connection = cmd.target;
  return retry_failed(ctx, request);
}

// `--params FILE` or `--params -` (standard input): its size and nesting are checked before it
// is parsed, so no input can make ferry recurse itself to death or hold more than the cap.
Expected<std::optional<nlohmann::json>> read_params_file(const std::string& path)
{
  if (path.empty()) {
    return std::optional<nlohmann::json>();
  }
  const std::string what = path == "-" ? "--params - (standard input)" : "--params " + path;
  FERRY_TRY_ASSIGN(const auto text, read_params_input(path, what));
  FERRY_TRY(check_params_json_limits(text, what));
  auto value = nlohmann::json::parse(text, nullptr, false);
  if (value.is_discarded()) {
    return fail(ErrorKind::usage, "{}: not valid JSON; give a JSON object like {{\"tp\": 8}}",
                what);
  }
  return std::optional<nlohmann::json>(std::move(value));
}

std::string key_of(const std::string& assignment)
{
  return assignment.substr(0, assignment.find('='));
}

// With several jobs, -p KEY=VALUE and --params keys go to every listed job that declares KEY;
// with one job, they all go to it (and an unknown key is refused there).
bool applies(const Job& job, std::size_t job_count, const std::string& key)
{
  return job_count == 1 || job.param(key) != nullptr;
}

Expected<nlohmann::json> params_for(const RunCommand& cmd, const Job& job, std::size_t job_count,
                                    const std::optional<nlohmann::json>& file,
                                    const std::vector<std::string>& swept = {})
{
  std::vector<std::string> own;
  std::vector<std::string> all = cmd.assignments;
  all.insert(all.end(), swept.begin(), swept.end());
  for (const auto& assignment : all) {
    if (applies(job, job_count, key_of(assignment))) {
      own.push_back(assignment);
    }
  }
  std::optional<nlohmann::json> own_file;
  if (file && file->is_object()) {
    own_file = nlohmann::json::object();
    for (const auto& [key, value] : file->items()) {
      if (applies(job, job_count, key)) {
        (*own_file)[key] = value;
      }
    }
  } else if (file) {
    own_file = *file; // resolve_params refuses what is not an object
  }
  auto params = resolve_params(job, own, own_file, "--params " + cmd.params_file);
  if (!params) {
    return fail(ErrorKind::usage, "{}: {}{}", job.name,
                swept.empty() ? "" : "--sweep: ", params.error().message);
  }
  return params;
}

Expected<void> check_keys_used(const RunCommand& cmd, const std::vector<Job>& jobs)
{
  if (jobs.size() < 2) {
    return {};
  }
  std::vector<std::pair<std::string, std::string>> keys; // option, key
  for (const auto& assignment : cmd.assignments) {
    keys.emplace_back("-p", key_of(assignment));
  }
  for (const auto& sweep : cmd.sweeps) {
    keys.emplace_back("--sweep", key_of(sweep));
  }
  for (const auto& [option, key] : keys) {
    if (std::none_of(jobs.begin(), jobs.end(),
                     [&](const Job& j) { return j.param(key) != nullptr; })) {
      return fail(ErrorKind::usage, "{} {}: none of the listed jobs has a parameter '{}'", option,
                  terminal_safe(key), terminal_safe(key));
    }
  }
  return {};
}

// One PlannedRun per job, or per job and combination of the swept values that apply to it.
Expected<std::vector<PlannedRun>> plan_runs(const RunCommand& cmd, const std::vector<Job>& jobs,
                                            const std::optional<nlohmann::json>& file)
{
  FERRY_TRY_ASSIGN(const auto sweeps, parse_sweeps(cmd.sweeps, cmd.assignments));
  std::vector<PlannedRun> runs;
  for (const auto& job : jobs) {
    std::vector<Sweep> own;
    std::copy_if(sweeps.begin(), sweeps.end(), std::back_inserter(own),
                 [&](const Sweep& sweep) { return applies(job, jobs.size(), sweep.key); });
    for (const auto& combination : sweep_combinations(own)) {
      FERRY_TRY_ASSIGN(auto params, params_for(cmd, job, jobs.size(), file, combination));
      runs.push_back({&job, std::move(params)});
    }
  }
  return runs;
}

std::vector<std::string> swept_keys(const RunCommand& cmd)
{
  std::vector<std::string> keys;
  std::transform(cmd.sweeps.begin(), cmd.sweeps.end(), std::back_inserter(keys), key_of);
  return keys;
}

// A sweep of one job over a Slurm target is one job array (docs/slurm.md), bounded by -j when
// it is given.
TargetOptions target_for(const RunCommand& cmd, const std::vector<Job>& jobs,
                         const std::vector<PlannedRun>& runs)
{
  TargetOptions target = cmd.target;
  if (!target.slurm.login.empty() && jobs.size() == 1 && !cmd.sweeps.empty() && runs.size() > 1) {
    target.slurm.array_points = static_cast<int>(runs.size());
    target.slurm.array_throttle = cmd.parallel_given ? cmd.parallel : 0;
  }
  return target;
}

// `--gpus N` on an SSH host or --local: the launcher there picks and locks N free GPUs, waiting
// up to --wait-gpus (docs/run-protocol.md, "GPUs"); taken out of `target`, whose --gpus is
// otherwise Slurm's. With --slurm, the scheduler allocates GPUs: --gpus stays its request.
Expected<void> set_gpu_options(RunOptions& options, TargetOptions& target, const RunCommand& cmd)
{
  if (!target.slurm.login.empty()) {
    if (cmd.wait_gpus_s) {
      return fail(ErrorKind::usage, "--wait-gpus is for SSH hosts and --local; under --slurm the "
                                    "scheduler allocates the GPUs and the job waits in its queue");
    }
    options.gpus_by_scheduler = true;
    return {};
  }
  if (const std::string& text = target.slurm.gpus; !text.empty()) {
    int gpus = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), gpus);
    if (ec != std::errc() || end != text.data() + text.size() || gpus < 1 || gpus > k_max_gpus) {
      return fail(ErrorKind::usage,
                  "--gpus {}: give a whole number of GPUs between 1 and {} (TYPE:N is for "
                  "--slurm)",
                  terminal_safe(target.slurm.gpus), k_max_gpus);
    }
    options.gpus = gpus;
    target.slurm.gpus.clear();
  }
  options.wait_gpus_s = cmd.wait_gpus_s.value_or(0);
  return {};
}

constexpr long long k_max_keep_for_s = 365LL * 24 * 3600;

// --detach's --keep-for, checked; detached runs are kept in the archive to be collected. Under
// --slurm the job stays queued (docs/slurm.md, "Detached runs"): one job of one node, or a
// sweep's job array, one node a point; not an allocation of several nodes.
Expected<long long> detach_keep_for(const RunCommand& cmd, const TargetOptions& target,
                                    std::size_t sessions)
{
  if (!target.slurm.login.empty() && sessions > 1) {
    return fail(ErrorKind::usage,
                "--detach with --slurm is for jobs of one node each (one run, or a --sweep's job "
                "array), not an allocation of {} --nodes: run it without --detach",
                sessions);
  }
  if (cmd.no_archive) {
    return fail(ErrorKind::usage, "--detach needs the archive: `ferry attach` finds the run there; "
                                  "leave out --no-archive");
  }
  const auto keep_for = parse_duration_s(cmd.keep_for, k_max_keep_for_s);
  if (!keep_for) {
    return fail(ErrorKind::usage,
                "--keep-for {}: give a duration from 1s to 365d (a number of seconds, or with s, "
                "m, h, d or w: 90m, 7d)",
                terminal_safe(cmd.keep_for));
  }
  return *keep_for;
}

Expected<std::vector<Job>> find_jobs(const RunCommand& cmd, const JobPath& path)
{
  std::vector<Job> jobs;
  jobs.reserve(cmd.jobs.size());
  for (const auto& spec : cmd.jobs) {
    FERRY_TRY_ASSIGN(auto job, find_job(spec, path));
    FERRY_TRY(resolve_job_files(job, cmd.files, cmd.max_upload_mib << 20));
    jobs.push_back(std::move(job));
  }
  return jobs;
}

Expected<ExitCode> run(Context& ctx, const RunCommand& cmd)
{
  const std::optional<bool> fold = cmd.fold      ? std::optional(true)
                                   : cmd.no_fold ? std::optional(false)
                                                 : std::nullopt;
  ctx.use_json(cmd.json, TerminalOptions{cmd.raw_output, cmd.stream, cmd.no_stream, fold});
  if (cmd.retry_failed) {
    return run_retry(ctx, cmd);
  }
  if (cmd.jobs.empty()) {
    return fail(ErrorKind::usage, "ferry run: give a JOB (a job name on the job path, or a job "
                                  "file), or --retry-failed; `ferry jobs` lists the jobs");
  }
  // Everything is checked before any host is contacted: jobs, parameters, targets.
  FERRY_TRY_ASSIGN(const auto jobs, find_jobs(cmd, ctx.job_path()));
  if (cmd.params_file == "-" && cmd.target.hosts_file == "-") {
    return fail(ErrorKind::usage, "--params - and --hosts-file - both read standard input; give "
                                  "one of them a file");
  }
  FERRY_TRY_ASSIGN(const auto file, read_params_file(cmd.params_file));
  FERRY_TRY_ASSIGN(const auto runs, plan_runs(cmd, jobs, file));
  FERRY_TRY(check_keys_used(cmd, jobs));
  RunOptions options;
  FERRY_TRY_ASSIGN(const UserConfig* config, ctx.user_config());
  FERRY_TRY(set_run_environment(options, cmd.environment, *config));
  TargetOptions target = target_for(cmd, jobs, runs);
  FERRY_TRY(set_gpu_options(options, target, cmd));
  FERRY_TRY_ASSIGN(auto sessions, make_sessions(ctx, target, jobs));
  options.verbose = ctx.global.verbose;
  options.timeout_s = cmd.timeout_s;
  options.keep_remote = cmd.keep_remote;
  options.output_cap = cmd.output_cap_mib << 20;
  options.remote_base = cmd.target.remote_base;
  options.fetch = cmd.fetch;
  options.out_dir = cmd.out_dir;
  options.archive_outputs_max = cmd.archive_outputs_max_mib << 20;
  const int parallel = batch_parallel(cmd.target, cmd.parallel, sessions.size());
  const BatchOptions batch{!cmd.no_archive, parallel, swept_keys(cmd)};
  if (cmd.detach) {
    FERRY_TRY_ASSIGN(options.detach_keep_for_s, detach_keep_for(cmd, target, sessions.size()));
    DetachView view(ctx.reporter(), cmd.json);
    return execute_runs(ctx, sessions, runs, options, batch, view);
  }
  return execute_runs(ctx, sessions, runs, options, batch, ctx.reporter());
}

// Files alongside (`--file`, `--max-upload`) and files back (`--fetch`, `--out`,
// `--archive-outputs-max`).
void add_bundle_options(CLI::App& sub, RunCommand& cmd)
{
  sub.add_option("--file", cmd.files,
                 "a file to send beside the job (repeatable); inside the current directory it "
                 "keeps its relative path, else it lands under its file name")
      ->allow_extra_args(false);
  sub.add_option("--max-upload", cmd.max_upload_mib, "MiB the job's files may come to in all")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub.add_option("--fetch", cmd.fetch,
                 "a glob of files to bring back from the run directory (repeatable), besides the "
                 "job's own `outputs`")
      ->allow_extra_args(false);
  sub.add_option("--out", cmd.out_dir, "where fetched files go; {run_id} and {host} are replaced")
      ->capture_default_str();
  sub.add_option("--archive-outputs-max", cmd.archive_outputs_max_mib,
                 "MiB of fetched files the archive keeps per run (larger ones: their hash only)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
}

void add_detach_options(CLI::App& sub, RunCommand& cmd)
{
  auto* detach = sub.add_flag(
      "--detach", cmd.detach,
      "start the runs apart from ferry, print their ids and exit at once; `ferry attach RUN` "
      "follows and collects one, `ferry ps` lists them, `ferry stop RUN` stops one");
  sub.add_option("--keep-for", cmd.keep_for,
                 "how long a finished detached run waits on its host for `ferry attach` before "
                 "the host's sweep removes it (90m, 12h, 7d)")
      ->capture_default_str()
      ->needs(detach);
}

} // namespace

void add_run_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<RunCommand>();
  auto* sub = app.add_subcommand("run", "Run jobs on hosts (or here) and collect their results");
  sub->add_option("JOB", cmd->jobs, "job names on the job path, or paths to job files");
  sub->add_option("--retry-failed", cmd->retry_failed,
                  "run again the runs of an earlier invocation (last, or its id) that did not end "
                  "ok, on their hosts, with their archived job bytes and parameters")
      ->expected(0, 1)
      ->default_str("last");
  add_target_options(*sub, cmd->target);
  sub->add_option("-p,--param", cmd->assignments,
                  "KEY=VALUE, typed by the job's declaration; KEY=@FILE reads the value from FILE; "
                  "repeating a list parameter appends (any other is given once)")
      ->allow_extra_args(false);
  add_environment_options(*sub, cmd->environment);
  sub->add_option("--sweep", cmd->sweeps,
                  "KEY=V1,V2,... runs the job once per value, typed like -p (repeatable: every "
                  "combination); KEY=[JSON list] for values with commas")
      ->allow_extra_args(false);
  sub->add_option("--params", cmd->params_file,
                  "JSON file with an object of parameters (- reads standard input)");
  sub->add_option("--timeout", cmd->timeout_s,
                  "seconds before the job is killed (default: the job's)")
      ->check(CLI::Range(1, 7 * 24 * 3600));
  auto* parallel = sub->add_option("-j,--parallel", cmd->parallel,
                                   "runs at once (across hosts, and on one host's session; a "
                                   "Slurm sweep's array tasks at once)")
                       ->capture_default_str()
                       ->check(CLI::Range(1, 256));
  sub->add_flag("--json", cmd->json, "print one JSON run record per line (JSON Lines)");
  auto* stream = sub->add_flag(
      "--stream", cmd->stream,
      fmt::format("show every host's output as it arrives, each line prefixed with its host (the "
                  "default on a terminal with up to {} hosts; one host's output is always shown "
                  "as it arrives); with --json, output events",
                  k_stream_hosts));
  sub->add_flag("--no-stream", cmd->no_stream,
                "with several hosts, show each run's output as one block when it ends, even on a "
                "terminal")
      ->excludes(stream);
  auto* fold = sub->add_flag(
      "--fold", cmd->fold,
      fmt::format("end with hosts folded by the sameness of their results (gpu[17,42]: driver "
                  "\"535.154\" instead of \"550.54\"), the default with more than {} hosts",
                  k_fold_hosts));
  sub->add_flag("--no-fold", cmd->no_fold, "end with one summary row per run, however many hosts")
      ->excludes(fold);
  sub->add_flag("--raw-output", cmd->raw_output,
                "write job output to a terminal as it is, control sequences included (by default "
                "they are shown escaped; ferry's own lines always are)");
  sub->add_flag("--keep-remote", cmd->keep_remote,
                "keep the run directory on the host and print its path");
  sub->add_flag("--no-archive", cmd->no_archive, "do not record the runs in the archive");
  add_detach_options(*sub, *cmd);
  sub->add_option("--output-cap", cmd->output_cap_mib, "MiB kept of each of stdout and stderr")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  add_bundle_options(*sub, *cmd);
  sub->add_option("--wait-gpus", cmd->wait_gpus_s,
                  "seconds to wait for --gpus (or the job's gpus) to be free on the host, "
                  "looking every 2 s (default 0: fail at once)")
      ->check(CLI::Range(0, 24 * 3600))
      ->group("Target");
  sub->footer(R"(Examples:
  ferry run kv_calc -p model=qwen3.5-397b-a17b -p tp=8 -p kv_memory_gib=17.4
  ferry run gpu_probe host_facts --host gpu1 --host gpu2
  ferry run ./jobs/my_probe.py --hosts-file hosts.txt -j 16 --json
  ferry run gpu_probe --host 'gpu[01-16]' --host @a100 -j 16
  ferry run gpu_probe --slurm login1 --partition gpu --gres gpu:8 --nodes 4
  ferry run train.py --host gpu1 --gpus 2 --wait-gpus 600)");
  on_chosen(*sub, ctx, [cmd, parallel, &ctx] {
    cmd->parallel_given = parallel->count() > 0;
    return run(ctx, *cmd);
  });
}

} // namespace ferry::cli
