// `ferry log`: the archived runs, newest first, one line each or as JSON Lines.
#include <algorithm>
#include <array>
#include <memory>

#include "cli/archive_view.hpp"
#include "ferry/text.hpp"

namespace ferry::cli {

namespace {

struct LogCommand {
  std::string job;
  std::string host;
  std::string status;
  std::string since;
  std::string invocation;
  int limit = 20;
  bool json = false;
  bool stats = false;
  CLI::Option* job_option = nullptr;
  CLI::Option* host_option = nullptr;
  CLI::Option* status_option = nullptr;
  CLI::Option* since_option = nullptr;
  CLI::Option* invocation_option = nullptr;
  CLI::Option* limit_option = nullptr;
};

// "2026-11-29T14:12:15.123Z" -> "2026-11-29 14:12:15Z"
std::string started_display(std::string_view iso)
{
  std::string text(iso.substr(0, 19));
  if (text.size() == 19 && text[10] == 'T') {
    text[10] = ' ';
    text += 'Z';
  }
  return text;
}

std::string duration_display(double seconds)
{
  return seconds < 10 ? fmt::format("{:.2f}s", seconds) : fmt::format("{:.0f}s", seconds);
}

// One line per run, read from small columns only (params, results and outputs stay on disk).
Expected<Table> log_table(Archive& archive, const LogFilter& filter)
{
  Table table;
  table.header = {"RUN", "STARTED", "JOB", "HOST", "STATUS", "TIME", "RESULT"};
  FERRY_TRY_ASSIGN(const auto runs, archive.list(filter));
  for (const auto& [run, result_head] : runs) {
    table.rows.push_back({run.run_id, started_display(run.started_at), terminal_safe(run.job),
                          terminal_safe(target_label(run)), std::string(to_string(run.status)),
                          duration_display(run.duration_s),
                          terminal_safe(result_digest(run, result_head, 60))});
  }
  return table;
}

// JSON Lines: each run's whole record, a line as soon as it is read, so that memory holds one
// run however many the archive has (issue 45 item 6: 852 MB for all of them at once).
Expected<void> print_json_log(Context& ctx, Archive& archive, const LogFilter& filter)
{
  return archive.log_each(filter, [&ctx](RunRecord&& run) -> Expected<void> {
    ctx.reporter().document({}, to_json(run));
    return {};
  });
}

LogFilter filter_of(const LogCommand& cmd)
{
  LogFilter filter;
  if (*cmd.job_option) {
    filter.job = cmd.job;
  }
  if (*cmd.host_option) {
    filter.host = cmd.host;
  }
  if (*cmd.status_option) {
    filter.status = cmd.status;
  }
  if (*cmd.since_option) {
    filter.since = cmd.since;
  }
  filter.limit = cmd.limit;
  filter.with_output = cmd.json;
  return filter;
}

std::string stats_text(const Archive& archive, const ArchiveStats& stats)
{
  if (stats.runs == 0) {
    return fmt::format("archive {}: {} on disk, no runs\n", archive.path().string(),
                       size_text(stats.file_bytes));
  }
  return fmt::format("archive {}: {} on disk ({} in use), {} run{} from {} to {}, {} script{}\n"
                     "largest runs:\n",
                     archive.path().string(), size_text(stats.file_bytes),
                     size_text(stats.used_bytes), stats.runs, stats.runs == 1 ? "" : "s",
                     started_display(stats.oldest), started_display(stats.newest), stats.scripts,
                     stats.scripts == 1 ? "" : "s");
}

// `log --stats`: the whole archive, whatever the filters say.
Expected<ExitCode> run_stats(Context& ctx, bool as_json)
{
  FERRY_TRY_ASSIGN(auto archive, Archive::open_read_only(ctx.archive_path()));
  FERRY_TRY_ASSIGN(const auto stats, archive.stats());
  nlohmann::json largest = nlohmann::json::array();
  Table table;
  table.header = {"RUN", "STARTED", "JOB", "HOST", "SIZE"};
  table.right_aligned = {false, false, false, false, true};
  for (const auto& run : stats.largest) {
    table.rows.push_back({run.run_id, started_display(run.started_at), terminal_safe(run.job),
                          terminal_safe(run.host_label), size_text(run.bytes)});
    largest.push_back({{"run_id", run.run_id},
                       {"started_at", run.started_at},
                       {"job", run.job},
                       {"host", run.host_label},
                       {"bytes", run.bytes}});
  }
  ctx.reporter().document(stats_text(archive, stats), {{"path", archive.path().string()},
                                                       {"file_bytes", stats.file_bytes},
                                                       {"used_bytes", stats.used_bytes},
                                                       {"runs", stats.runs},
                                                       {"scripts", stats.scripts},
                                                       {"oldest", stats.oldest},
                                                       {"newest", stats.newest},
                                                       {"largest", largest}});
  if (!as_json && !table.rows.empty()) {
    ctx.reporter().table(table);
  }
  return ExitCode::ok;
}

Expected<ExitCode> run_log(Context& ctx, const LogCommand& cmd)
{
  ctx.use_json(cmd.json);
  if (cmd.stats) {
    return run_stats(ctx, cmd.json);
  }
  LogFilter filter = filter_of(cmd);
  FERRY_TRY_ASSIGN(auto archive, Archive::open_read_only(ctx.archive_path()));
  if (*cmd.invocation_option) {
    FERRY_TRY_ASSIGN(filter.invocation, archive.resolve_invocation(cmd.invocation));
    filter.limit = *cmd.limit_option ? cmd.limit : 0; // an invocation's runs: all of them
  }
  if (cmd.json) {
    FERRY_TRY(print_json_log(ctx, archive, filter));
    return ExitCode::ok;
  }
  FERRY_TRY_ASSIGN(auto table, log_table(archive, filter));
  if (table.rows.empty()) {
    const bool filtered =
        filter.job || filter.host || filter.status || filter.since || filter.invocation;
    ctx.reporter().note(
        !archive.exists()
            ? fmt::format("no runs recorded yet ({} does not exist)", archive.path().string())
        : filtered ? std::string("no runs match")
                   : fmt::format("no runs recorded yet in {}", archive.path().string()));
    return ExitCode::ok;
  }
  ctx.reporter().table(table);
  return ExitCode::ok;
}

} // namespace

void add_log_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<LogCommand>();
  CLI::App* sub = app.add_subcommand("log", "List archived runs, newest first");
  cmd->job_option = sub->add_option("--job", cmd->job, "only runs of this job");
  cmd->host_option =
      sub->add_option("--host", cmd->host, "only runs on this host (its name or the alias given)");
  cmd->status_option = sub->add_option(
      "--status", cmd->status,
      fmt::format("only runs with this status: {}", fmt::join(run_status_names(), ", ")));
  cmd->since_option = sub->add_option(
      "--since", cmd->since,
      "only runs started at or after this UTC date or time (2026-11-29, 2026-11-29T14:12) or "
      "within this age (90m, 12h, 7d, 2w)");
  cmd->invocation_option = sub->add_option(
      "--invocation", cmd->invocation,
      "only the runs of one `ferry run`: 'last', or its id (a run record's \"invocation\") or a "
      "unique prefix of one");
  cmd->limit_option =
      sub->add_option("--limit", cmd->limit, "show at most N runs (with --invocation: all); 0: all")
          ->capture_default_str();
  sub->add_flag("--json", cmd->json, "one full run record per line (JSON Lines)");
  sub->add_flag("--stats", cmd->stats,
                "the archive's size, run count and largest runs instead of the runs");
  sub->footer(R"(Examples:
  ferry log
  ferry log --job kv_calc --host gpu1 --limit 5
  ferry log --status failed --since 7d
  ferry log --invocation last
  ferry log --json --limit 0 > runs.jsonl
  ferry log --stats)");
  on_chosen(*sub, ctx, [cmd, &ctx] { return run_log(ctx, *cmd); });
}

} // namespace ferry::cli
