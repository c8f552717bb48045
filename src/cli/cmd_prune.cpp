// `ferry prune`: an archive that stays small (docs/archive.md, "Pruning").
#include <memory>

#include "cli/archive_view.hpp"
#include "ferry/text.hpp"

namespace ferry::cli {

namespace {

using nlohmann::json;

struct PruneCommand {
  std::optional<std::string> older_than;
  std::optional<int> keep_last;
  std::optional<std::string> max_size;
  std::optional<std::string> job;
  std::optional<std::string> host;
  bool dry_run = false;
  bool json = false;
};

Expected<PruneOptions> prune_options(const PruneCommand& cmd)
{
  if (!cmd.older_than && !cmd.keep_last && !cmd.max_size) {
    return fail(ErrorKind::usage,
                "prune needs --older-than AGE, --keep-last N or --max-size SIZE "
                "(nothing is removed without one); --dry-run shows what would go");
  }
  PruneOptions options;
  options.keep_last = cmd.keep_last;
  options.job = cmd.job;
  options.host = cmd.host;
  options.dry_run = cmd.dry_run;
  if (cmd.older_than) {
    auto before = normalize_since(*cmd.older_than);
    if (!before) {
      return fail(ErrorKind::usage,
                  "--older-than '{}': expected an age such as 90d, 12h or 2w, or a UTC date such "
                  "as 2026-11-29",
                  *cmd.older_than);
    }
    options.started_before = std::move(before).value();
  }
  if (cmd.max_size) {
    FERRY_TRY_ASSIGN(options.max_size, parse_size(*cmd.max_size, "--max-size"));
  }
  return options;
}

Table removed_table(const PruneOutcome& outcome)
{
  Table table;
  table.header = {"RUN", "STARTED", "JOB", "HOST", "SIZE"};
  table.right_aligned = {false, false, false, false, true};
  for (const auto& run : outcome.removed) {
    table.rows.push_back({run.run_id, run.started_at, terminal_safe(run.job),
                          terminal_safe(run.host_label), size_text(run.bytes)});
    table.objects.push_back({{"run_id", run.run_id},
                             {"started_at", run.started_at},
                             {"job", run.job},
                             {"host", run.host_label},
                             {"bytes", run.bytes}});
  }
  return table;
}

std::string summary_text(const PruneOutcome& outcome, bool dry_run)
{
  const std::size_t runs = outcome.removed.size();
  if (dry_run) {
    return fmt::format("would remove {} run{} ({}); nothing was changed (--dry-run)\n", runs,
                       runs == 1 ? "" : "s", size_text(outcome.removed_bytes));
  }
  const auto count = [](std::int64_t n, std::string_view one, std::string_view many) {
    return fmt::format("{} {}", n, n == 1 ? one : many);
  };
  return fmt::format(
      "removed {} ({}) and what no remaining run uses: {}, {}, {}; archive {} -> {}\n",
      count(static_cast<std::int64_t>(runs), "run", "runs"), size_text(outcome.removed_bytes),
      count(outcome.scripts_removed, "script", "scripts"),
      count(outcome.files_removed, "file sent", "files sent"),
      count(outcome.outputs_removed, "output fetched", "outputs fetched"),
      size_text(outcome.file_bytes_before), size_text(outcome.file_bytes_after));
}

json summary_json(const PruneOutcome& outcome, bool dry_run)
{
  json ids = json::array();
  for (const auto& run : outcome.removed) {
    ids.push_back(run.run_id);
  }
  return {{"dry_run", dry_run},
          {"removed", ids},
          {"removed_bytes", outcome.removed_bytes},
          {"scripts_removed", outcome.scripts_removed},
          {"files_removed", outcome.files_removed},
          {"outputs_removed", outcome.outputs_removed},
          {"file_bytes_before", outcome.file_bytes_before},
          {"file_bytes_after", outcome.file_bytes_after}};
}

Expected<ExitCode> run_prune(Context& ctx, const PruneCommand& cmd)
{
  ctx.use_json(cmd.json);
  FERRY_TRY_ASSIGN(const auto options, prune_options(cmd));
  const auto path = ctx.archive_path();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    ctx.reporter().note(fmt::format("no archive at {}; nothing to prune", path.string()));
    return ExitCode::ok;
  }
  FERRY_TRY_ASSIGN(auto archive, Archive::open(path));
  FERRY_TRY_ASSIGN(const auto outcome, archive.prune(options));
  if (cmd.dry_run && !cmd.json && !outcome.removed.empty()) {
    ctx.reporter().table(removed_table(outcome));
  }
  ctx.reporter().document(summary_text(outcome, cmd.dry_run), summary_json(outcome, cmd.dry_run));
  return ExitCode::ok;
}

} // namespace

void add_prune_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<PruneCommand>();
  CLI::App* sub = app.add_subcommand("prune", "Remove old runs from the archive and give the "
                                              "space back");
  sub->add_option("--older-than", cmd->older_than,
                  "remove runs started before this age (90d, 12h, 2w) or UTC date (2026-11-29)");
  sub->add_option("--keep-last", cmd->keep_last,
                  "keep the N newest runs (of --job/--host); alone: remove all others")
      ->check(CLI::Range(0, 1'000'000'000));
  sub->add_option(
      "--max-size", cmd->max_size,
      "remove the oldest runs until the archive's runs fit in this size (2GiB, 500MiB)");
  sub->add_option("--job", cmd->job, "only runs of this job");
  sub->add_option("--host", cmd->host, "only runs on this host (its name or the alias given)");
  sub->add_flag("--dry-run", cmd->dry_run, "list what would be removed; change nothing");
  sub->add_flag("--json", cmd->json, "the outcome as one JSON object");
  sub->footer(R"(Examples:
  ferry prune --older-than 90d --dry-run
  ferry prune --keep-last 100 --job kv_calc
  ferry prune --max-size 2GiB)");
  on_chosen(*sub, ctx, [cmd, &ctx] { return run_prune(ctx, *cmd); });
}

} // namespace ferry::cli
