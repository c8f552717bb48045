#include "cli/execute.hpp"
#include "cli/targets.hpp"
#include "ferry/params.hpp"
#include "ferry/util.hpp"

namespace ferry::cli {

namespace {

struct RunCommand {
  std::vector<std::string> jobs;
  TargetOptions target;
  std::vector<std::string> assignments;
  std::string params_file;
  std::optional<int> timeout_s;
  int parallel = 8;
  bool json = false;
  bool raw_output = false;
  bool stream = false;
  bool keep_remote = false;
  bool no_archive = false;
  std::size_t output_cap_mib = 16;
};

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
                                    const std::optional<nlohmann::json>& file)
{
  std::vector<std::string> own;
  for (const auto& assignment : cmd.assignments) {
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
    return fail(ErrorKind::usage, "{}: {}", job.name, params.error().message);
  }
  return params;
}

Expected<void> check_keys_used(const RunCommand& cmd, const std::vector<Job>& jobs)
{
  if (jobs.size() < 2) {
    return {};
  }
  for (const auto& assignment : cmd.assignments) {
    const std::string key = key_of(assignment);
    if (std::none_of(jobs.begin(), jobs.end(),
                     [&](const Job& j) { return j.param(key) != nullptr; })) {
      return fail(ErrorKind::usage, "-p {}: none of the listed jobs has a parameter '{}'", key,
                  key);
    }
  }
  return {};
}

Expected<std::vector<Job>> find_jobs(const RunCommand& cmd, const JobPath& path)
{
  std::vector<Job> jobs;
  jobs.reserve(cmd.jobs.size());
  for (const auto& spec : cmd.jobs) {
    FERRY_TRY_ASSIGN(auto job, find_job(spec, path));
    jobs.push_back(std::move(job));
  }
  return jobs;
}

Expected<ExitCode> run(Context& ctx, const RunCommand& cmd)
{
  ctx.use_json(cmd.json, TerminalOptions{cmd.raw_output, cmd.stream});
  // Everything is checked before any host is contacted: jobs, parameters, targets.
  FERRY_TRY_ASSIGN(const auto jobs, find_jobs(cmd, ctx.job_path()));
  FERRY_TRY_ASSIGN(const auto file, read_params_file(cmd.params_file));
  std::vector<PlannedRun> runs;
  for (const auto& job : jobs) {
    FERRY_TRY_ASSIGN(auto params, params_for(cmd, job, jobs.size(), file));
    runs.push_back({&job, std::move(params)});
  }
  FERRY_TRY(check_keys_used(cmd, jobs));
  FERRY_TRY_ASSIGN(auto sessions, make_sessions(ctx, cmd.target, jobs));
  RunOptions options;
  options.verbose = ctx.global.verbose;
  options.timeout_s = cmd.timeout_s;
  options.keep_remote = cmd.keep_remote;
  options.output_cap = cmd.output_cap_mib << 20;
  const int parallel = batch_parallel(cmd.target, cmd.parallel, sessions.size());
  return execute_runs(ctx, sessions, runs, options, {!cmd.no_archive, parallel}, ctx.reporter());
}

} // namespace

void add_run_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<RunCommand>();
  auto* sub = app.add_subcommand("run", "Run jobs on hosts (or here) and collect their results");
  sub->add_option("JOB", cmd->jobs, "job names on the job path, or paths to job files")->required();
  add_target_options(*sub, cmd->target);
  sub->add_option("-p,--param", cmd->assignments,
                  "KEY=VALUE, typed by the job's declaration; KEY=@FILE reads the value from FILE; "
                  "repeating a list parameter appends")
      ->allow_extra_args(false);
  sub->add_option("--params", cmd->params_file,
                  "JSON file with an object of parameters (- reads standard input)");
  sub->add_option("--timeout", cmd->timeout_s,
                  "seconds before the job is killed (default: the job's)")
      ->check(CLI::Range(1, 7 * 24 * 3600));
  sub->add_option("-j,--parallel", cmd->parallel, "hosts at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  sub->add_flag("--json", cmd->json, "print one JSON run record per line (JSON Lines)");
  sub->add_flag("--stream", cmd->stream,
                "show every host's output as it arrives, each line prefixed with its host (one "
                "host's output is always shown as it arrives); with --json, output events");
  sub->add_flag("--raw-output", cmd->raw_output,
                "write job output to a terminal as it is, control sequences included (by default "
                "they are shown escaped; ferry's own lines always are)");
  sub->add_flag("--keep-remote", cmd->keep_remote,
                "keep the run directory on the host and print its path");
  sub->add_flag("--no-archive", cmd->no_archive, "do not record the runs in the archive");
  sub->add_option("--output-cap", cmd->output_cap_mib, "MiB kept of each of stdout and stderr")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  sub->footer(R"(Examples:
  ferry run kv_calc -p model=qwen3.5-397b-a17b -p tp=8 -p kv_memory_gib=17.4
  ferry run gpu_probe host_facts --host gpu1 --host gpu2
  ferry run ./jobs/my_probe.py --hosts-file hosts.txt -j 16 --json
  ferry run gpu_probe --slurm login1 --partition gpu --gres gpu:8 --nodes 4)");
  on_chosen(*sub, ctx, [cmd, &ctx] { return run(ctx, *cmd); });
}

} // namespace ferry::cli
