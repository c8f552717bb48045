#include <filesystem>

#include "cli/cli.hpp"
#include "ferry/run_record.hpp"
#include "ferry/util.hpp"

namespace ferry::cli {

namespace {

struct JobsCommand {
  std::string job;
  bool json = false;
};

nlohmann::json param_json(const ParamSpec& spec)
{
  nlohmann::json j = {{"name", spec.name},
                      {"type", to_string(spec.type)},
                      {"required", spec.required},
                      {"help", spec.help}};
  if (spec.type == ParamType::list) {
    j["items"] = to_string(spec.items);
  }
  j["default"] = spec.default_value ? *spec.default_value : nlohmann::json();
  j["choices"] = spec.choices ? *spec.choices : nlohmann::json();
  return j;
}

Table listing_table(const std::vector<JobListing>& listing)
{
  Table table;
  table.header = {"NAME", "SOURCE", "DESCRIPTION"};
  for (const auto& item : listing) {
    table.rows.push_back({item.name, item.source, item.description});
    table.objects.push_back(
        {{"name", item.name}, {"source", item.source}, {"description", item.description}});
  }
  return table;
}

std::string param_line(const ParamSpec& spec)
{
  std::string type(to_string(spec.type));
  if (spec.type == ParamType::list) {
    type += fmt::format(" of {}", to_string(spec.items));
  }
  std::string line = fmt::format("  {} ({})", spec.name, type);
  if (spec.required) {
    line += " required";
  } else if (spec.default_value) {
    line += fmt::format(" default {}", to_json_line(*spec.default_value));
  }
  if (spec.choices) {
    line += fmt::format(" choices {}", to_json_line(*spec.choices));
  }
  if (!spec.help.empty()) {
    line += "\n      " + spec.help;
  }
  return line + "\n";
}

// One job's page: what it is and its parameters.
std::string job_page(const Job& job)
{
  std::string text =
      fmt::format("{} ({})\n  {}\n  interpreter: {}, timeout: {} s\n", job.name, job.source,
                  job.meta.description, job.meta.interpreter, job.meta.timeout_s);
  if (job.meta.params.empty()) {
    return text + "  no parameters\n";
  }
  text += "\nPARAMETERS\n";
  for (const auto& spec : job.meta.params) {
    text += param_line(spec);
  }
  return text;
}

nlohmann::json job_json(const Job& job)
{
  nlohmann::json params = nlohmann::json::array();
  for (const auto& spec : job.meta.params) {
    params.push_back(param_json(spec));
  }
  return {{"name", job.name},
          {"source", job.source},
          {"description", job.meta.description},
          {"interpreter", job.meta.interpreter},
          {"timeout", job.meta.timeout_s},
          {"params", params}};
}

Expected<ExitCode> list(Context& ctx, const JobsCommand& cmd)
{
  ctx.use_json(cmd.json);
  const JobPath path = ctx.job_path();
  if (cmd.job.empty()) {
    ctx.reporter().table(listing_table(list_jobs(path)));
    return ExitCode::ok;
  }
  FERRY_TRY_ASSIGN(const auto job, find_job(cmd.job, path));
  ctx.reporter().document(job_page(job), job_json(job));
  return ExitCode::ok;
}

struct NewCommand {
  std::string name;
  std::string lang = "python";
  std::string dir = "jobs";
};

Expected<ExitCode> write_new(Context& ctx, const NewCommand& cmd)
{
  namespace fs = std::filesystem;
  if (cmd.name.empty() || cmd.name.find_first_not_of(
                              "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
                              std::string::npos) {
    return fail(ErrorKind::usage, "job name '{}' may use only letters, digits, '_' and '-'",
                cmd.name);
  }
  const fs::path file = fs::path(cmd.dir) / (cmd.name + (cmd.lang == "sh" ? ".sh" : ".py"));
  std::error_code ec;
  if (fs::exists(file, ec)) {
    return fail(ErrorKind::usage, "{} already exists; ferry new never overwrites a file",
                file.string());
  }
  fs::create_directories(cmd.dir, ec);
  FERRY_TRY(write_file_atomic(file, job_template(cmd.name, cmd.lang), 0644));
  const std::string run_as = cmd.dir == "jobs" ? cmd.name : file.string();
  ctx.reporter().document(
      fmt::format("wrote {}\nrun it with: ferry run {}\n", file.string(), run_as),
      {{"path", file.string()}, {"run", "ferry run " + run_as}});
  return ExitCode::ok;
}

} // namespace

void add_jobs_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<JobsCommand>();
  auto* sub = app.add_subcommand("jobs", "List jobs, or show one job's parameters");
  sub->add_option("JOB", cmd->job, "a job name or path: show its parameters");
  sub->add_flag("--json", cmd->json, "JSON output");
  on_chosen(*sub, ctx, [cmd, &ctx] { return list(ctx, *cmd); });
}

void add_new_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<NewCommand>();
  auto* sub = app.add_subcommand("new", "Write a ready-to-edit job file");
  sub->add_option("NAME", cmd->name, "the job's name")->required();
  sub->add_option("--lang", cmd->lang, "python or sh")
      ->capture_default_str()
      ->check(CLI::IsMember({"python", "sh"}));
  sub->add_option("--dir", cmd->dir, "where to write it (./jobs is on the job path)")
      ->capture_default_str();
  on_chosen(*sub, ctx, [cmd, &ctx] { return write_new(ctx, *cmd); });
}

} // namespace ferry::cli
