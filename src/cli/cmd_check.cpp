#include "cli/execute.hpp"
#include "cli/targets.hpp"

namespace ferry::cli {

namespace {

struct CheckCommand {
  TargetOptions target;
  bool json = false;
  int parallel = 8;
};

// "python3 3.11.2 (/usr/bin/python3)" / "nvidia-smi missing" from host_facts' result.
std::string interpreters_line(const nlohmann::json& result)
{
  std::vector<std::string> parts;
  const auto tools = result.find("tools");
  if (tools == result.end() || !tools->is_object()) {
    return "interpreters: unknown";
  }
  for (const auto& [name, info] : tools->items()) {
    if (info.is_object() && info.value("found", false)) {
      std::string part = name;
      if (info.contains("version") && info["version"].is_string()) {
        part += " " + info["version"].get<std::string>();
      }
      if (info.contains("path") && info["path"].is_string()) {
        part += " (" + info["path"].get<std::string>() + ")";
      }
      parts.push_back(part);
    } else {
      parts.push_back(name + " missing");
    }
  }
  std::string line;
  for (const auto& part : parts) {
    line += (line.empty() ? "" : ", ") + part;
  }
  return line;
}

int check(Context& ctx, const CheckCommand& cmd)
{
  auto job = find_job("host_facts", JobPath{{}, true});
  if (!job) {
    print_error(job.error().message);
    return 1;
  }
  auto sessions = make_sessions(cmd.target);
  if (!sessions) {
    print_error(sessions.error().message);
    return to_int(ExitCode::usage);
  }
  std::vector<PlannedRun> runs = {{&*job, nlohmann::json::object()}};
  ReportOptions report;
  report.archive = false;
  report.quiet_stdout = true;
  report.parallel = cmd.parallel;
  install_interrupt_handlers();
  return execute_runs(ctx, *sessions, runs, RunOptions{}, report, [&](const RunRecord& record) {
    nlohmann::json line = {{"host", record.host_label}, {"target", record.target},
                           {"status", record.status == RunStatus::ok ? "ok" : "failed"},
                           {"error", record.error ? nlohmann::json(*record.error) : nlohmann::json()},
                           {"facts", record.result}};
    if (cmd.json) {
      fmt::print("{}\n", to_json_line(line));
      return;
    }
    if (record.status != RunStatus::ok) {
      fmt::print("{}: FAILED — {}\n", record.host_label, record.error.value_or("see stderr"));
      return;
    }
    const std::string key = record.target.value("host_key_sha256", "");
    fmt::print("{}: ok in {:.2f} s — {}{}SFTP ok, {}\n", record.host_label, record.duration_s,
               key.empty() ? "" : "host key " + key + ", ",
               record.target.contains("local") ? "" : "auth ok, ", interpreters_line(record.result));
  });
}

} // namespace

void add_check_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<CheckCommand>();
  auto* sub = app.add_subcommand("check", "Reach each host: host key, auth, SFTP, interpreters found");
  add_target_options(*sub, cmd->target);
  sub->add_flag("--json", cmd->json, "one JSON object per host");
  sub->add_option("-j,--parallel", cmd->parallel, "hosts at once")->capture_default_str();
  sub->callback([cmd, &ctx] { ctx.exit_code = check(ctx, *cmd); });
}

} // namespace ferry::cli
