#include <algorithm>
#include <map>

#include <fmt/ranges.h>

#include "cli/execute.hpp"
#include "cli/targets.hpp"
#include "ferry/params.hpp"
#include "ferry/text.hpp"

namespace ferry::cli {

namespace {

struct CheckCommand {
  TargetOptions target;
  bool json = false;
  int parallel = 8;
};

// An interpreter the jobs on the path declare, and which jobs do. `mapped`: the config file's
// interpreters per host; a host listed there is asked about that program instead.
struct InterpreterNeed {
  std::string name;
  std::vector<std::string> jobs;
  std::map<std::string, std::string> mapped; // host label -> program used there

  [[nodiscard]] const std::string& program_for(const std::string& host) const
  {
    const auto it = mapped.find(host);
    return it == mapped.end() ? name : it->second;
  }
};

std::vector<InterpreterNeed> interpreter_needs(const JobPath& path)
{
  std::map<std::string, std::vector<std::string>> jobs_by_interpreter;
  for (const auto& listing : list_jobs(path)) {
    if (listing.valid) {
      jobs_by_interpreter[listing.interpreter].push_back(listing.name);
    }
  }
  std::vector<InterpreterNeed> needs;
  for (auto& [name, jobs] : jobs_by_interpreter) {
    needs.push_back({name, std::move(jobs), {}});
  }
  return needs;
}

// The config file's interpreters for each host (a mapped program no job needs is checked too).
void add_mapped(std::vector<InterpreterNeed>& needs, const UserConfig& config,
                const std::vector<std::unique_ptr<HostSession>>& sessions)
{
  for (const auto& session : sessions) {
    const std::string host = session->label();
    for (const auto& [name, program] : config.for_host(host).settings.interpreters) {
      auto need = std::find_if(needs.begin(), needs.end(),
                               [&](const InterpreterNeed& n) { return n.name == name; });
      if (need == needs.end()) {
        needs.push_back({name, {}, {}});
        need = std::prev(needs.end());
      }
      need->mapped[host] = program;
    }
  }
}

// host_facts' `interpreters` parameter: every program any host is asked about.
nlohmann::json programs_to_ask(const std::vector<InterpreterNeed>& needs)
{
  std::vector<std::string> programs;
  for (const auto& need : needs) {
    programs.push_back(need.name);
    for (const auto& [host, program] : need.mapped) {
      programs.push_back(program);
    }
  }
  std::sort(programs.begin(), programs.end());
  programs.erase(std::unique(programs.begin(), programs.end()), programs.end());
  return programs;
}

// host_facts asks only about the programs its `interpreters` parameter allows; check also asks
// about those the user's own jobs and config file name (a client of `ferry mcp`, or `ferry run`,
// cannot add to them).
void allow_programs(Job& host_facts, const nlohmann::json& programs)
{
  for (auto& spec : host_facts.meta.params) {
    if (spec.name == "interpreters" && spec.choices) {
      for (const auto& program : programs) {
        if (std::find(spec.choices->begin(), spec.choices->end(), program) == spec.choices->end()) {
          spec.choices->push_back(program);
        }
      }
    }
  }
}

// What one host said about each needed interpreter.
struct InterpreterFinding {
  const InterpreterNeed* need;
  std::string program;
  std::optional<std::string> path; // none: not found
  std::optional<std::string> version;
};

std::optional<std::string> string_member(const nlohmann::json& object, const char* key)
{
  if (object.is_object() && object.contains(key) && object[key].is_string()) {
    return object[key].get<std::string>();
  }
  return std::nullopt;
}

std::vector<InterpreterFinding> findings_for(const RunRecord& record,
                                             const std::vector<InterpreterNeed>& needs)
{
  const nlohmann::json none = nlohmann::json::object();
  const auto& found = record.result.is_object() ? record.result.value("interpreters", none) : none;
  std::vector<InterpreterFinding> findings;
  for (const auto& need : needs) {
    const std::string& program = need.program_for(record.host_label);
    const auto info = found.is_object() ? found.value(program, nlohmann::json()) : nullptr;
    findings.push_back(
        {&need, program, string_member(info, "path"), string_member(info, "version")});
  }
  return findings;
}

bool any_missing(const std::vector<InterpreterFinding>& findings)
{
  return std::any_of(findings.begin(), findings.end(),
                     [](const InterpreterFinding& f) { return !f.path; });
}

// "python3 3.11.2 (/usr/bin/python3)", "sh (/usr/bin/sh)", "perl missing (needed by a, b)";
// the host's bytes are shown escaped.
std::string finding_text(const InterpreterFinding& finding)
{
  std::string text = finding.need->name;
  if (finding.program != finding.need->name) {
    text += " as " + terminal_safe(finding.program);
  }
  if (!finding.path) {
    return finding.need->jobs.empty() ? fmt::format("{} missing (mapped in the config file)", text)
                                      : fmt::format("{} missing (needed by {})", text,
                                                    fmt::join(finding.need->jobs, ", "));
  }
  if (finding.version) {
    text += " " + terminal_safe(*finding.version);
  }
  return text + " (" + terminal_safe(*finding.path) + ")";
}

nlohmann::json findings_json(const std::vector<InterpreterFinding>& findings)
{
  nlohmann::json list = nlohmann::json::array();
  for (const auto& f : findings) {
    list.push_back({{"interpreter", f.need->name},
                    {"program", f.program},
                    {"found", f.path.has_value()},
                    {"path", f.path ? nlohmann::json(*f.path) : nullptr},
                    {"version", f.version ? nlohmann::json(*f.version) : nullptr},
                    {"jobs", f.need->jobs}});
  }
  return list;
}

// How the host was reached: "host key SHA256:…, auth ok, SFTP ok", or "local" for this machine.
std::string reach_text(const RunRecord& record)
{
  if (record.target.contains("local")) {
    return "local (no SSH or SFTP involved)";
  }
  const std::string key = record.target.value("host_key_sha256", "");
  return fmt::format("{}auth ok, SFTP ok", key.empty() ? "" : "host key " + key + ", ");
}

// Each host's check as one line (terminal) or one object (JSON Lines); remembers whether any
// host lacks an interpreter the jobs need.
class CheckView final : public RunObserver {
public:
  CheckView(Reporter& reporter, const std::vector<InterpreterNeed>& needs)
      : m_reporter(reporter), m_needs(needs)
  {
  }

  void batch_started(const BatchInfo& batch) override { m_reporter.batch_started(batch); }
  void progress(const FleetProgress& progress) override { m_reporter.progress(progress); }
  void batch_finished() override { m_reporter.batch_finished(); }

  void run_finished(RunRecord& record) override
  {
    const auto findings = findings_for(record, m_needs);
    const bool ok = record.status == RunStatus::ok;
    m_missing |= ok && any_missing(findings);
    const std::string status = !ok ? "failed" : any_missing(findings) ? "missing" : "ok";
    const nlohmann::json line = {
        {"host", record.host_label},
        {"target", record.target},
        {"status", status},
        {"error", record.error ? nlohmann::json(*record.error) : nlohmann::json()},
        {"interpreters", ok ? findings_json(findings) : nlohmann::json()},
        {"facts", record.result}};
    m_reporter.document(text(record, findings), line);
  }

  [[nodiscard]] bool missing() const { return m_missing; }

private:
  static std::string text(const RunRecord& record, const std::vector<InterpreterFinding>& found)
  {
    if (auto slurm = slurm_check_text(record)) {
      return *slurm;
    }
    const std::string host = terminal_safe(record.host_label);
    if (record.status != RunStatus::ok) {
      return fmt::format("{}: FAILED — {}\n", host,
                         terminal_safe(record.error.value_or("see stderr")));
    }
    std::vector<std::string> parts;
    std::vector<std::string> missing;
    for (const auto& finding : found) {
      parts.push_back(finding_text(finding));
      if (!finding.path) {
        missing.push_back(finding.need->name);
      }
    }
    const std::string status =
        missing.empty() ? "ok" : fmt::format("MISSING {}", fmt::join(missing, ", "));
    const auto smi = string_member(record.result.value("tools", nlohmann::json::object())
                                       .value("nvidia-smi", nlohmann::json::object()),
                                   "path");
    return fmt::format("{}: {} in {:.2f} s — {}; {}; nvidia-smi {}\n", host, status,
                       record.duration_s, reach_text(record),
                       parts.empty() ? "no interpreters needed"
                                     : fmt::format("{}", fmt::join(parts, ", ")),
                       smi ? terminal_safe(*smi) : "not found");
  }

  Reporter& m_reporter;
  const std::vector<InterpreterNeed>& m_needs;
  bool m_missing = false;
};

Expected<ExitCode> check(Context& ctx, const CheckCommand& cmd)
{
  // Check shows one line per host, never job output: as whole blocks, so a terminal keeps the
  // progress line whatever the number of hosts.
  ctx.use_json(cmd.json, TerminalOptions{false, false, true, {}});
  // Always the built-in: a host_facts on the job path cannot change what check reports.
  FERRY_TRY_ASSIGN(auto job, find_job(std::string(k_builtin_prefix) + "host_facts", {}));
  auto needs = interpreter_needs(ctx.job_path());
  TargetOptions target = cmd.target;
  target.slurm.describe_cluster = true; // --slurm: version, partitions, GPU gres
  // check tests the way in (host key, authentication): a direct connection, not a held one,
  // unless --persist asks otherwise.
  if (!target.persist_s) {
    target.persist_s = 0;
  }
  FERRY_TRY_ASSIGN(auto sessions, make_sessions(ctx, target));
  FERRY_TRY_ASSIGN(const UserConfig* config, ctx.user_config());
  add_mapped(needs, *config, sessions);
  const nlohmann::json programs = programs_to_ask(needs);
  allow_programs(job, programs);
  FERRY_TRY_ASSIGN(auto params, resolve_params(job, {}, nlohmann::json{{"interpreters", programs}},
                                               "the interpreters the jobs need"));
  const std::vector<PlannedRun> runs = {{&job, std::move(params)}};
  // The config file's environment applies as for `run` (its env.PATH finds the programs).
  RunOptions options;
  FERRY_TRY(set_run_environment(options, {}, *config));
  CheckView view(ctx.reporter(), needs);
  const ExitCode code =
      execute_runs(ctx, sessions, runs, options,
                   {false, batch_parallel(target, cmd.parallel, sessions.size()), {}}, view);
  return code == ExitCode::ok && view.missing() ? ExitCode::run_failed : code;
}

} // namespace

void add_check_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<CheckCommand>();
  auto* sub = app.add_subcommand(
      "check", "Reach each host: host key, auth, SFTP, and the interpreters the jobs need");
  add_target_options(*sub, cmd->target);
  sub->add_flag("--json", cmd->json, "one JSON object per host");
  sub->add_option("-j,--parallel", cmd->parallel, "hosts at once")->capture_default_str();
  sub->footer(R"(Exits 1 when a host lacks an interpreter that a job on the job path declares.

Examples:
  ferry check --host gpu1,gpu2
  ferry check --hosts-file hosts.txt --accept-new-host-key)");
  on_chosen(*sub, ctx, [cmd, &ctx] { return check(ctx, *cmd); });
}

} // namespace ferry::cli
