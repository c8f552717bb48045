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
    nlohmann::json item = {{"path", change.path}, {"old", change.old_value}, {"new", change.new_value}};
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

int replay(Context& ctx, const ReplayCommand& cmd)
{
  auto archive = Archive::open(ctx.archive_path());
  if (!archive) {
    print_error(archive.error().message);
    return 1;
  }
  // The archived bytes are run as they are: a script that no longer matches its sha256 is refused.
  auto original = archive->load(cmd.run, LoadOptions{.verify_blobs = true});
  if (!original) {
    print_error(original.error().message);
    return original.error().kind == ErrorKind::usage ? to_int(ExitCode::usage) : 1;
  }
  if (original->script.empty()) {
    print_error(fmt::format("run {} has no archived script bytes to replay", original->run_id));
    return 1;
  }
  // The archived bytes run, never today's copy of the job.
  auto job = parse_job(original->job, original->script_name.empty() ? original->job : original->script_name,
                       "archived script of run " + original->run_id, original->script);
  if (!job) {
    print_error(job.error().message);
    return to_int(ExitCode::usage);
  }
  TargetOptions target = cmd.target;
  const bool target_given = !target.hosts.empty() || !target.hosts_file.empty() || target.local;
  if (!target_given && !original->target.value("local", false)) {
    target.hosts = {original->host_label.empty() ? original->target.value("host", "") : original->host_label};
  }
  auto sessions = make_sessions(target);
  if (!sessions) {
    print_error(sessions.error().message);
    return to_int(ExitCode::usage);
  }
  RunOptions options;
  options.verbose = ctx.global.verbose;
  options.replay_of = original->run_id;
  ReportOptions report;
  report.quiet_stdout = true;
  std::vector<PlannedRun> runs = {{&*job, original->params}};
  bool differs = false;
  bool failed = false;
  install_interrupt_handlers();
  const int code = execute_runs(ctx, *sessions, runs, options, report, [&](const RunRecord& record) {
    const auto changes = json_diff(original->result, record.result);
    failed |= record.status != RunStatus::ok;
    differs |= !changes.empty();
    if (cmd.json) {
      write_json_line(stdout, record, {{"compare", compare_json(changes)}});
      return;
    }
    std::fwrite(record.stdout_text.data(), 1, record.stdout_text.size(), stdout);
    fmt::print("{} @ {}: {} in {:.2f} s (replay of {}){}\n", record.job, record.host_label,
               to_string(record.status), record.duration_s, original->run_id,
               record.error ? " — " + *record.error : "");
    if (record.status != RunStatus::ok) {
      return;
    }
    if (changes.empty()) {
      fmt::print("identical\n");
      return;
    }
    fmt::print("result differs in {} place{}:\n", changes.size(), changes.size() == 1 ? "" : "s");
    for (const auto& change : changes) {
      fmt::print("  {}: {} -> {}\n", change.path.empty() ? "/" : change.path,
                 show_value(change.old_value, change.old_missing),
                 show_value(change.new_value, change.new_missing));
    }
  });
  if (code == to_int(ExitCode::interrupted) || code == to_int(ExitCode::unreachable)) {
    return code;
  }
  if (failed) {
    return to_int(ExitCode::run_failed);
  }
  return to_int(differs ? ExitCode::replay_differs : ExitCode::ok);
}

} // namespace

void add_replay_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<ReplayCommand>();
  auto* sub = app.add_subcommand("replay", "Re-run a run's archived script and params, compare the results");
  sub->add_option("RUN", cmd->run, "run id, a unique prefix of one, or `last`")->required();
  add_target_options(*sub, cmd->target);
  sub->add_flag("--json", cmd->json, "the new run record plus \"compare\"");
  sub->callback([cmd, &ctx] { ctx.exit_code = replay(ctx, *cmd); });
}

} // namespace ferry::cli
