#include "cli/execute.hpp"
#include "cli/targets.hpp"
#include "ferry/json_diff.hpp"
#include "ferry/sessions.hpp"

namespace ferry::cli {

namespace {

struct ReplayCommand {
  std::string run;
  TargetOptions target;
  bool json = false;
};

nlohmann::json compare_json(const std::vector<JsonChange>& changes)
{
  nlohmann::json list = nlohmann::json::array();
  for (const auto& change : changes) {
    nlohmann::json item = {
        {"path", change.path}, {"old", change.old_value}, {"new", change.new_value}};
    if (change.old_missing) {
      item["old_missing"] = true;
    }
    if (change.new_missing) {
      item["new_missing"] = true;
    }
    list.push_back(std::move(item));
  }
  return {{"identical", changes.empty()}, {"changes", list}};
}

std::string show_value(const nlohmann::json& value, bool missing)
{
  return missing ? "(absent)" : to_json_line(value);
}

std::string diff_text(const RunRecord& record, const RunRecord& original,
                      const std::vector<JsonChange>& changes)
{
  std::string text = record.stdout_text;
  text += fmt::format("{} @ {}: {} in {:.2f} s (replay of {}){}\n", record.job, record.host_label,
                      to_string(record.status), record.duration_s, original.run_id,
                      record.error ? " — " + *record.error : "");
  if (record.status != RunStatus::ok) {
    return text;
  }
  if (changes.empty()) {
    return text + "identical\n";
  }
  text += fmt::format("result differs in {} place{}:\n", changes.size(),
                      changes.size() == 1 ? "" : "s");
  for (const auto& change : changes) {
    text += fmt::format("  {}: {} -> {}\n", change.path.empty() ? "/" : change.path,
                        show_value(change.old_value, change.old_missing),
                        show_value(change.new_value, change.new_missing));
  }
  return text;
}

// The new run beside the archived one: the difference in the result.
class ReplayView final : public RunObserver {
public:
  ReplayView(Reporter& reporter, const RunRecord& original)
      : m_reporter(reporter), m_original(original)
  {
  }

  void run_finished(RunRecord& record) override
  {
    const auto changes = json_diff(m_original.result, record.result);
    m_failed |= record.status != RunStatus::ok;
    m_differs |= !changes.empty();
    if (m_reporter.format() == ReportFormat::json_lines) {
      m_reporter.record(record, {{"compare", compare_json(changes)}});
    } else {
      m_reporter.document(diff_text(record, m_original, changes), nlohmann::json());
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
  return target;
}

Expected<ExitCode> replay(Context& ctx, const ReplayCommand& cmd)
{
  ctx.use_json(cmd.json);
  FERRY_TRY_ASSIGN(auto archive, Archive::open(ctx.archive_path()));
  // The archived bytes are run as they are: a script that no longer matches its sha256 is refused.
  FERRY_TRY_ASSIGN(const auto original, archive.load(cmd.run, LoadOptions{.verify_blobs = true}));
  if (original.script.empty()) {
    return fail(ErrorKind::failed, "run {} has no archived script bytes to replay",
                original.run_id);
  }
  // The archived bytes run, never today's copy of the job.
  FERRY_TRY_ASSIGN(const auto job,
                   parse_job(original.job,
                             original.script_name.empty() ? original.job : original.script_name,
                             "archived script of run " + original.run_id, original.script));
  const TargetOptions target = replay_target(cmd, original);
  FERRY_TRY_ASSIGN(auto sessions, make_sessions(ctx, target, std::span<const Job>(&job, 1)));
  RunOptions options;
  options.verbose = ctx.global.verbose;
  options.replay_of = original.run_id;
  const std::vector<PlannedRun> runs = {{&job, original.params}};
  ReplayView view(ctx.reporter(), original);
  const BatchOptions batch{true, batch_parallel(target, BatchOptions{}.parallel, sessions.size())};
  return view.exit_code(execute_runs(ctx, sessions, runs, options, batch, view));
}

} // namespace

void add_replay_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<ReplayCommand>();
  auto* sub = app.add_subcommand("replay",
                                 "Re-run a run's archived script and params, compare the results");
  sub->add_option("RUN", cmd->run, "run id, a unique prefix of one, or `last`")->required();
  add_target_options(*sub, cmd->target);
  sub->add_flag("--json", cmd->json, "the new run record plus \"compare\"");
  on_chosen(*sub, ctx, [cmd, &ctx] { return replay(ctx, *cmd); });
}

} // namespace ferry::cli
