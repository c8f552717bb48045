// `ferry log`: the archived runs, newest first, one line each or as JSON Lines.
#include <algorithm>
#include <array>
#include <memory>

#include "cli/archive_view.hpp"
#include "cli/execute.hpp"

namespace ferry::cli {

namespace {

struct LogCommand {
  std::string job;
  std::string host;
  std::string status;
  std::string since;
  int limit = 20;
  bool json = false;
  CLI::Option* job_option = nullptr;
  CLI::Option* host_option = nullptr;
  CLI::Option* status_option = nullptr;
  CLI::Option* since_option = nullptr;
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

void print_table(const std::vector<RunSummary>& runs)
{
  using Row = std::array<std::string, 7>;
  std::vector<Row> rows;
  rows.push_back({"RUN", "STARTED", "JOB", "HOST", "STATUS", "TIME", "RESULT"});
  for (const auto& [run, result_head] : runs) {
    rows.push_back({run.run_id, started_display(run.started_at), printable(run.job),
                    printable(target_label(run)), std::string(to_string(run.status)),
                    duration_display(run.duration_s),
                    printable(result_digest(run, result_head, 60))});
  }
  std::array<std::size_t, 7> widths{};
  for (const auto& row : rows) {
    for (std::size_t c = 0; c < row.size(); ++c) {
      widths[c] = std::max(widths[c], row[c].size());
    }
  }
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c + 1 < row.size(); ++c) {
      line += fmt::format("{:<{}}  ", row[c], widths[c]);
    }
    line += row.back();
    fmt::print("{}\n", line);
  }
}

int run_log(Context& ctx, const LogCommand& cmd)
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

  auto archive = Archive::open_read_only(ctx.archive_path());
  if (!archive) {
    return report_error(archive.error());
  }
  if (cmd.json) {
    auto runs = archive->log(filter);
    if (!runs) {
      return report_error(runs.error());
    }
    for (const auto& run : *runs) {
      fmt::print("{}\n", to_json_line(to_json(run)));
    }
    return to_int(ExitCode::ok);
  }
  // The table reads only the small columns: params, results and outputs stay on disk.
  auto runs = archive->list(filter);
  if (!runs) {
    return report_error(runs.error());
  }
  if (runs->empty()) {
    const bool filtered = filter.job || filter.host || filter.status || filter.since;
    fmt::print(stderr, "ferry: {}\n",
               !archive->exists() ? fmt::format("no runs recorded yet ({} does not exist)",
                                                archive->path().string())
               : filtered         ? std::string("no runs match")
                          : fmt::format("no runs recorded yet in {}", archive->path().string()));
    return to_int(ExitCode::ok);
  }
  print_table(*runs);
  return to_int(ExitCode::ok);
}

} // namespace

void add_log_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<LogCommand>();
  CLI::App* sub = app.add_subcommand("log", "List archived runs, newest first");
  cmd->job_option = sub->add_option("--job", cmd->job, "only runs of this job");
  cmd->host_option =
      sub->add_option("--host", cmd->host, "only runs on this host (its name or the alias given)");
  cmd->status_option =
      sub->add_option("--status", cmd->status,
                      "only runs with this status: ok, failed, timeout, bad-result, "
                      "error, interrupted");
  cmd->since_option = sub->add_option(
      "--since", cmd->since,
      "only runs started at or after this UTC date or time (2026-11-29, 2026-11-29T14:12) or "
      "within this age (90m, 12h, 7d, 2w)");
  sub->add_option("--limit", cmd->limit, "show at most N runs; 0: all")->capture_default_str();
  sub->add_flag("--json", cmd->json, "one full run record per line (JSON Lines)");
  sub->footer(R"(Examples:
  ferry log
  ferry log --job kv_calc --host gpu1 --limit 5
  ferry log --status failed --since 7d
  ferry log --json --limit 0 > runs.jsonl)");
  sub->callback([&ctx, cmd] { ctx.exit_code = run_log(ctx, *cmd); });
}

} // namespace ferry::cli
