// `ferry replay RUN`: the archived run again, with its archived script, params and options, and
// what changed: status and exit code first, then the result (docs/cli.md).
#include <algorithm>
#include <set>

#include "cli/archive_view.hpp"
#include "cli/execute.hpp"
#include "cli/retry.hpp"
#include "cli/targets.hpp"
#include "ferry/bundle.hpp"
#include "ferry/json_diff.hpp"
#include "ferry/run_env.hpp"
#include "ferry/sessions.hpp"
#include "ferry/util.hpp"

namespace ferry::cli {

namespace {

using nlohmann::json;

struct ReplayCommand {
  std::string run;
  RunNarrowing narrow;
  TargetOptions target;
  bool json = false;
  bool current = false;               // run the job file as it is now, not the archived bytes
  std::vector<std::string> ignore;    // JSON Pointers left out of the comparison
  std::optional<int> timeout_s;       // else the archived run's
  std::optional<std::size_t> cap_mib; // else the archived run's
  std::vector<std::string> env;       // --env KEY=VALUE | KEY, as for `run`
};

// The job as the job path (or the file the run came from) has it now, beside the archived one.
struct JobNow {
  std::optional<Job> job; // nullopt: no longer found, or no longer a valid job
  std::string why_not;    // when `job` is nullopt
  std::string sha256;     // of `job`'s bytes
};

// Where the run's job is now: the file it was read from when the record says so and it is still
// there, else the job of that name on today's job path (a built-in stays a built-in).
JobNow job_now(const Context& ctx, const RunRecord& original)
{
  std::string spec = original.job;
  const json& recorded = original.options.value("job_source", json());
  const std::string source = recorded.is_string() ? recorded.get<std::string>() : std::string();
  if (source == "built-in") {
    spec = std::string(k_builtin_prefix) + original.job;
  } else if (!source.empty() && std::filesystem::is_regular_file(source)) {
    spec = source;
  }
  auto found = find_job(spec, ctx.job_path());
  if (!found) {
    return {std::nullopt, found.error().message, {}};
  }
  const std::string sha256 = sha256_hex(found->bytes);
  return {std::move(found).value(), {}, sha256};
}

// The job that runs: the archived bytes, or with --current today's file. Says on stderr when
// the two differ, with both hashes.
Expected<Job> job_to_replay(Context& ctx, const ReplayCommand& cmd, const RunRecord& original,
                            json& compare_job)
{
  JobNow now = job_now(ctx, original);
  const bool changed = now.job && now.sha256 != original.job_sha256;
  if (changed || cmd.current) {
    compare_job = {{"archived_sha256", original.job_sha256},
                   {"current_sha256", now.job ? json(now.sha256) : json(nullptr)},
                   {"replayed", cmd.current ? "current" : "archived"}};
  }
  if (cmd.current) {
    if (!now.job) {
      return fail(ErrorKind::usage, "--current: the job of run {} is not available now: {}",
                  original.run_id, now.why_not);
    }
    ctx.reporter().note(fmt::format("replaying the current job file {} (sha256 {}); run {} ran "
                                    "sha256 {}",
                                    now.job->source, now.sha256, original.run_id,
                                    original.job_sha256));
    return std::move(*now.job);
  }
  if (changed) {
    ctx.reporter().note(fmt::format(
        "job {} ({}) has changed since run {}: archived sha256 {}, now {}; replaying the "
        "archived bytes (--current replays the current file)",
        original.job, now.job->source, original.run_id, original.job_sha256, now.sha256));
  }
  if (original.script.empty()) {
    return fail(ErrorKind::failed, "run {} has no archived script bytes to replay",
                original.run_id);
  }
  return parse_job(original.job, original.script_name.empty() ? original.job : original.script_name,
                   "archived script of run " + original.run_id, original.script);
}

// The archived run's options, each unless the command line gives it anew.
RunOptions replay_options(const Context& ctx, const ReplayCommand& cmd, const RunRecord& original)
{
  RunOptions options = archived_options(original.options, cmd.timeout_s);
  options.verbose = ctx.global.verbose;
  options.replay_of = original.run_id;
  if (cmd.cap_mib) {
    options.output_cap = *cmd.cap_mib << 20;
  }
  return options;
}

// What differs between the archived run and its replay, after the ignored pointers.
struct Comparison {
  std::optional<std::pair<std::string, std::string>> status; // old, new: when they differ
  std::optional<std::pair<json, json>> exit_code;            // old, new: when they differ
  std::vector<JsonChange> changes;
  std::size_t ignored_changes = 0;

  [[nodiscard]] bool identical() const { return !status && !exit_code && changes.empty(); }
};

json optional_int(const std::optional<int>& value)
{
  return value ? json(*value) : json(nullptr);
}

Comparison compare(const RunRecord& original, const RunRecord& replayed,
                   const std::vector<std::string>& ignored)
{
  Comparison comparison;
  if (original.status != replayed.status) {
    comparison.status = {std::string(to_string(original.status)),
                         std::string(to_string(replayed.status))};
  }
  if (original.exit_code != replayed.exit_code) {
    comparison.exit_code = {optional_int(original.exit_code), optional_int(replayed.exit_code)};
  }
  auto all = json_diff(original.result, replayed.result);
  const std::size_t before = all.size();
  comparison.changes = without_ignored(std::move(all), ignored);
  comparison.ignored_changes = before - comparison.changes.size();
  return comparison;
}

json compare_json(const Comparison& comparison, const std::vector<std::string>& ignored,
                  const json& job)
{
  json list = json::array();
  for (const auto& change : comparison.changes) {
    json item = {{"path", change.path}, {"old", change.old_value}, {"new", change.new_value}};
    if (change.old_missing) {
      item["old_missing"] = true;
    }
    if (change.new_missing) {
      item["new_missing"] = true;
    }
    list.push_back(std::move(item));
  }
  json out = {{"identical", comparison.identical()}, {"changes", list}};
  if (comparison.status) {
    out["status"] = {{"old", comparison.status->first}, {"new", comparison.status->second}};
  }
  if (comparison.exit_code) {
    out["exit_code"] = {{"old", comparison.exit_code->first},
                        {"new", comparison.exit_code->second}};
  }
  if (!ignored.empty()) {
    out["ignored"] = ignored;
  }
  if (!job.is_null()) {
    out["job"] = job;
  }
  return out;
}

std::string show_value(const json& value, bool missing)
{
  return missing ? "(absent)" : to_json_line(value);
}

std::string ignored_text(const Comparison& comparison, const std::vector<std::string>& ignored)
{
  if (ignored.empty()) {
    return {};
  }
  std::string pointers;
  for (const auto& pointer : ignored) {
    pointers += (pointers.empty() ? "" : ", ") + (pointer.empty() ? "\"\"" : pointer);
  }
  return fmt::format(" (ignoring {}: {} change{})", pointers, comparison.ignored_changes,
                     comparison.ignored_changes == 1 ? "" : "s");
}

std::string diff_text(const RunRecord& record, const RunRecord& original,
                      const Comparison& comparison, const std::vector<std::string>& ignored)
{
  std::string text = record.stdout_text;
  text += fmt::format("{} @ {}: {} in {:.2f} s (replay of {}){}\n", record.job, record.host_label,
                      to_string(record.status), record.duration_s, original.run_id,
                      record.error ? " — " + *record.error : "");
  // The outcome first: a changed status or exit code matters more than any value.
  if (comparison.status) {
    text += fmt::format("status differs: {} -> {}\n", comparison.status->first,
                        comparison.status->second);
  }
  if (comparison.exit_code) {
    text += fmt::format("exit code differs: {} -> {}\n", to_json_line(comparison.exit_code->first),
                        to_json_line(comparison.exit_code->second));
  }
  const auto& changes = comparison.changes;
  if (comparison.identical()) {
    return text + "identical" + ignored_text(comparison, ignored) + "\n";
  }
  if (changes.empty()) {
    return text + "result identical" + ignored_text(comparison, ignored) + "\n";
  }
  text += fmt::format("result differs in {} place{}{}:\n", changes.size(),
                      changes.size() == 1 ? "" : "s", ignored_text(comparison, ignored));
  for (const auto& change : changes) {
    text += fmt::format("  {}: {} -> {}\n", change.path.empty() ? "/" : change.path,
                        show_value(change.old_value, change.old_missing),
                        show_value(change.new_value, change.new_missing));
  }
  return text;
}

// The new run beside the archived one: what differs.
class ReplayView final : public RunObserver {
public:
  ReplayView(Reporter& reporter, const RunRecord& original, std::vector<std::string> ignored,
             json job, std::vector<std::string> missing_env)
      : m_reporter(reporter), m_original(original), m_ignored(std::move(ignored)),
        m_job(std::move(job)), m_missing_env(std::move(missing_env))
  {
  }

  void run_finished(RunRecord& record) override
  {
    const Comparison comparison = compare(m_original, record, m_ignored);
    m_failed |= record.status != RunStatus::ok;
    m_differs |= !comparison.identical();
    if (m_reporter.format() == ReportFormat::json_lines) {
      json compared = compare_json(comparison, m_ignored, m_job);
      if (!m_missing_env.empty()) {
        compared["missing_env"] = m_missing_env;
      }
      m_reporter.record(record, {{"compare", std::move(compared)}});
    } else {
      std::string text = diff_text(record, m_original, comparison, m_ignored);
      if (!comparison.identical() && !m_missing_env.empty()) {
        text += fmt::format("(replayed without {}: run {} had {}; --env gives {})\n",
                            fmt::join(m_missing_env, ", "), m_original.run_id,
                            m_missing_env.size() == 1 ? "it" : "them",
                            m_missing_env.size() == 1 ? "it" : "them");
      }
      m_reporter.document(text, json());
    }
  }

  [[nodiscard]] ExitCode exit_code(ExitCode batch) const
  {
    if (batch == ExitCode::interrupted || batch == ExitCode::unreachable) {
      return batch;
    }
    if (m_failed) {
      return ExitCode::run_failed;
    }
    return m_differs ? ExitCode::replay_differs : ExitCode::ok;
  }

private:
  Reporter& m_reporter;
  const RunRecord& m_original;
  std::vector<std::string> m_ignored;
  json m_job;
  std::vector<std::string> m_missing_env; // names the archived run had and the replay lacks
  bool m_failed = false;
  bool m_differs = false;
};

// The archived run's own target, unless the command line names one.
TargetOptions replay_target(const ReplayCommand& cmd, const RunRecord& original)
{
  TargetOptions target = cmd.target;
  use_archived_slurm_target(target, original);
  if (!target.slurm.login.empty()) {
    return target;
  }
  const bool target_given = !target.hosts.empty() || !target.hosts_file.empty() || target.local;
  if (!target_given && !original.target.value("local", false)) {
    target.hosts = {original.host_label.empty() ? original.target.value("host", "")
                                                : original.host_label};
  }
  if (target.remote_base.empty()) {
    const json& base = original.options.value("remote_base", json());
    target.remote_base = base.is_string() ? base.get<std::string>() : std::string();
  }
  return target;
}

// --ignore's pointers, checked, then the job's own `volatile` ones.
Expected<std::vector<std::string>> ignored_pointers(const ReplayCommand& cmd, const Job& job)
{
  std::vector<std::string> ignored;
  for (const auto& pointer : cmd.ignore) {
    if (!is_json_pointer(pointer)) {
      return fail(ErrorKind::usage,
                  "--ignore '{}': not a JSON Pointer; give one like /cwd or /gpus/0/temp ('' "
                  "ignores the whole result)",
                  pointer);
    }
    ignored.push_back(pointer);
  }
  for (const auto& pointer : job.meta.volatile_pointers) {
    if (std::find(ignored.begin(), ignored.end(), pointer) == ignored.end()) {
      ignored.push_back(pointer);
    }
  }
  return ignored;
}

// The variables the archived run was given (the record keeps their names only) that nothing
// gives the replay on some target: neither the job's [env], nor the config file for that host,
// nor --env.
std::vector<std::string> missing_env(const RunRecord& original, const Job& job,
                                     const RunOptions& options,
                                     const std::vector<std::unique_ptr<HostSession>>& sessions)
{
  std::set<std::string> missing;
  for (const auto& session : sessions) {
    const EnvVars from_config = options.host_settings(session->label()).env;
    for (const auto& name : original.env) {
      if (!job.meta.env.contains(name) && !from_config.contains(name) &&
          !options.env.contains(name)) {
        missing.insert(name);
      }
    }
  }
  return {missing.begin(), missing.end()};
}

std::string missing_env_note(const RunRecord& original, const std::vector<std::string>& missing)
{
  const std::string names = fmt::format("{}", fmt::join(missing, ", "));
  return fmt::format("run {} was given {} {}, whose value{} the archive never keeps; the replay "
                     "runs without {} — pass --env {} (ferry's own value) or --env {}=VALUE",
                     original.run_id, missing.size() == 1 ? "the variable" : "the variables", names,
                     missing.size() == 1 ? "" : "s", missing.size() == 1 ? "it" : "them",
                     missing.front(), missing.front());
}

Expected<ExitCode> replay(Context& ctx, const ReplayCommand& cmd)
{
  ctx.use_json(cmd.json);
  FERRY_TRY_ASSIGN(auto archive, Archive::open(ctx.archive_path()));
  // Archived bytes are run only as they were archived: a script that no longer matches its
  // sha256 is refused.
  FERRY_TRY_ASSIGN(const auto original,
                   archive.load(cmd.run, LoadOptions{.verify_blobs = true, .narrow = cmd.narrow}));
  json compare_job;
  FERRY_TRY_ASSIGN(auto job, job_to_replay(ctx, cmd, original, compare_job));
  if (!cmd.current) {
    // The files that travelled with it, as archived (and verified); --current sends today's.
    FERRY_TRY_ASSIGN(job.files, archived_files(original));
  } else {
    FERRY_TRY(resolve_job_files(job, {}, k_default_max_upload));
  }
  FERRY_TRY_ASSIGN(auto ignored, ignored_pointers(cmd, job));
  const TargetOptions target = replay_target(cmd, original);
  FERRY_TRY_ASSIGN(auto sessions, make_sessions(ctx, target, std::span<const Job>(&job, 1)));
  RunOptions options = replay_options(ctx, cmd, original);
  options.remote_base = target.remote_base;
  options.gpus_by_scheduler = !target.slurm.login.empty();
  // The config file applies as for `run`. --env values were never archived, so they are not
  // replayed (the record names them): the command line gives them again, and the names nothing
  // gives now are said before anything runs.
  FERRY_TRY_ASSIGN(options.env, env_from_options(cmd.env));
  FERRY_TRY_ASSIGN(const UserConfig* config, ctx.user_config());
  options.host_settings = [config](std::string_view host) {
    return config->for_host(host).settings;
  };
  const auto missing = missing_env(original, job, options, sessions);
  if (!missing.empty()) {
    ctx.reporter().note(missing_env_note(original, missing));
  }
  const std::vector<PlannedRun> runs = {{&job, original.params}};
  ReplayView view(ctx.reporter(), original, std::move(ignored), std::move(compare_job), missing);
  const BatchOptions batch{
      true, batch_parallel(target, BatchOptions{}.parallel, sessions.size()), {}};
  return view.exit_code(execute_runs(ctx, sessions, runs, options, batch, view));
}

} // namespace

RunOptions archived_options(const nlohmann::json& recorded, std::optional<int> timeout_s)
{
  RunOptions options;
  options.timeout_s = timeout_s;
  if (!options.timeout_s && recorded.value("timeout_s", json()).is_number_integer()) {
    options.timeout_s = recorded["timeout_s"].get<int>();
  }
  if (recorded.value("output_cap", json()).is_number_unsigned()) {
    options.output_cap = recorded["output_cap"].get<std::size_t>();
  }
  if (recorded.value("result_cap", json()).is_number_unsigned()) {
    options.result_cap = recorded["result_cap"].get<std::size_t>();
  }
  if (recorded.value("grace_s", json()).is_number_integer()) {
    options.grace_s = recorded["grace_s"].get<int>();
  }
  if (recorded.value("gpus", json()).is_number_integer()) {
    options.gpus = recorded["gpus"].get<int>();
    const json wait_s = recorded.value("wait_gpus_s", json());
    options.wait_gpus_s = wait_s.is_number_integer() ? wait_s.get<int>() : 0;
  }
  return options;
}

Expected<std::vector<BundleFile>> archived_files(const RunRecord& original)
{
  std::vector<BundleFile> files;
  for (const auto& item : original.files) {
    const std::string sha256 = item.value("sha256", "");
    const auto blob = original.blobs.find(sha256);
    if (blob == original.blobs.end()) {
      return fail(ErrorKind::failed,
                  "run {} has no archived bytes for its file {}; it cannot be "
                  "replayed as it ran",
                  original.run_id, item.value("path", ""));
    }
    files.push_back({item.value("path", ""), 0600, sha256, blob->second});
  }
  return files;
}

void add_replay_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<ReplayCommand>();
  auto* sub = app.add_subcommand("replay", "Re-run a run's archived script, params and options, "
                                           "and say what changed");
  sub->add_option("RUN", cmd->run, run_ref_help)->required();
  // `--host` picks where the replay runs; `--from-host` picks which run `last` means.
  add_narrowing_options(*sub, cmd->narrow, "--from-host");
  add_target_options(*sub, cmd->target);
  sub->add_flag("--current", cmd->current,
                "run the job file as it is now instead of the archived bytes");
  sub->add_option("--ignore", cmd->ignore,
                  "JSON Pointer into the result to leave out of the comparison (repeatable)")
      ->allow_extra_args(false);
  sub->add_option("--timeout", cmd->timeout_s,
                  "seconds before the job is killed (default: the "
                  "archived run's)")
      ->check(CLI::Range(1, 7 * 24 * 3600));
  sub->add_option("--env", cmd->env,
                  "KEY=VALUE in the job's environment (repeatable); KEY alone passes ferry's own "
                  "value. The archive keeps names only: give again what the run had")
      ->allow_extra_args(false);
  sub->add_option("--output-cap", cmd->cap_mib,
                  "MiB kept of each of stdout and stderr (default: the archived run's)")
      ->check(CLI::Range(1, 1024));
  sub->add_flag("--json", cmd->json, "the new run record plus \"compare\"");
  sub->footer(R"(Examples:
  ferry replay last
  ferry replay 3f9a --host gpu2 --json
  ferry replay last --job host_facts --ignore /uptime_s
  ferry replay last --current
  ferry replay last --env HF_TOKEN)");
  on_chosen(*sub, ctx, [cmd, &ctx] { return replay(ctx, *cmd); });
}

} // namespace ferry::cli
