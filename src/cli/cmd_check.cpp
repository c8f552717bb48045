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
  const auto tools = result.find("tools");
  if (tools == result.end() || !tools->is_object()) {
    return "interpreters: unknown";
  }
  std::string line;
  for (const auto& [name, info] : tools->items()) {
    std::string part = name;
    if (info.is_object() && info.value("found", false)) {
      if (info.contains("version") && info["version"].is_string()) {
        part += " " + info["version"].get<std::string>();
      }
      if (info.contains("path") && info["path"].is_string()) {
        part += " (" + info["path"].get<std::string>() + ")";
      }
    } else {
      part += " missing";
    }
    line += (line.empty() ? "" : ", ") + part;
  }
  return line;
}

// Each host's check as one line (terminal) or one object (JSON Lines).
class CheckView final : public RunObserver {
public:
  explicit CheckView(Reporter& reporter) : m_reporter(reporter) {}

  void batch_started(std::size_t total) override { m_reporter.batch_started(total); }
  void progress(const FleetProgress& progress) override { m_reporter.progress(progress); }
  void batch_finished() override { m_reporter.batch_finished(); }

  void run_finished(RunRecord& record) override
  {
    const nlohmann::json line = {
        {"host", record.host_label},
        {"target", record.target},
        {"status", record.status == RunStatus::ok ? "ok" : "failed"},
        {"error", record.error ? nlohmann::json(*record.error) : nlohmann::json()},
        {"facts", record.result}};
    m_reporter.document(text(record), line);
  }

private:
  static std::string text(const RunRecord& record)
  {
    if (auto slurm = slurm_check_text(record)) {
      return *slurm;
    }
    if (record.status != RunStatus::ok) {
      return fmt::format("{}: FAILED — {}\n", record.host_label,
                         record.error.value_or("see stderr"));
    }
    const std::string key = record.target.value("host_key_sha256", "");
    return fmt::format("{}: ok in {:.2f} s — {}{}SFTP ok, {}\n", record.host_label,
                       record.duration_s, key.empty() ? "" : "host key " + key + ", ",
                       record.target.contains("local") ? "" : "auth ok, ",
                       interpreters_line(record.result));
  }

  Reporter& m_reporter;
};

Expected<ExitCode> check(Context& ctx, const CheckCommand& cmd)
{
  ctx.use_json(cmd.json);
  FERRY_TRY_ASSIGN(const auto job, find_job("host_facts", JobPath{{}, true}));
  CheckCommand described = cmd;
  described.target.slurm.describe_cluster = true; // --slurm: version, partitions, GPU gres
  FERRY_TRY_ASSIGN(auto sessions, make_sessions(described.target));
  const std::vector<PlannedRun> runs = {{&job, nlohmann::json::object()}};
  CheckView view(ctx.reporter());
  return execute_runs(ctx, sessions, runs, RunOptions{},
                      {false, batch_parallel(cmd.target, cmd.parallel, sessions.size())}, view);
}

} // namespace

void add_check_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<CheckCommand>();
  auto* sub =
      app.add_subcommand("check", "Reach each host: host key, auth, SFTP, interpreters found");
  add_target_options(*sub, cmd->target);
  sub->add_flag("--json", cmd->json, "one JSON object per host");
  sub->add_option("-j,--parallel", cmd->parallel, "hosts at once")->capture_default_str();
  on_chosen(*sub, ctx, [cmd, &ctx] { return check(ctx, *cmd); });
}

} // namespace ferry::cli
