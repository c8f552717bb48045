#include <filesystem>

#include <sys/stat.h>

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
  nlohmann::json j = {{"name", spec.name}, {"type", to_string(spec.type)}, {"required", spec.required},
                      {"help", spec.help}};
  if (spec.type == ParamType::list) {
    j["items"] = to_string(spec.items);
  }
  j["default"] = spec.default_value ? *spec.default_value : nlohmann::json();
  j["choices"] = spec.choices ? *spec.choices : nlohmann::json();
  return j;
}

int list(Context& ctx, const JobsCommand& cmd)
{
  const JobPath path = ctx.job_path();
  if (cmd.job.empty()) {
    const auto listing = list_jobs(path);
    if (cmd.json) {
      for (const auto& item : listing) {
        fmt::print("{}\n", to_json_line({{"name", item.name}, {"source", item.source},
                                         {"description", item.description}}));
      }
      return 0;
    }
    std::size_t name_w = 4, source_w = 6;
    for (const auto& item : listing) {
      name_w = std::max(name_w, item.name.size());
      source_w = std::max(source_w, item.source.size());
    }
    fmt::print("{:<{}}  {:<{}}  {}\n", "NAME", name_w, "SOURCE", source_w, "DESCRIPTION");
    for (const auto& item : listing) {
      fmt::print("{:<{}}  {:<{}}  {}\n", item.name, name_w, item.source, source_w, item.description);
    }
    return 0;
  }
  auto job = find_job(cmd.job, path);
  if (!job) {
    print_error(job.error().message);
    return to_int(ExitCode::usage);
  }
  if (cmd.json) {
    nlohmann::json params = nlohmann::json::array();
    for (const auto& spec : job->meta.params) {
      params.push_back(param_json(spec));
    }
    fmt::print("{}\n", to_json_line({{"name", job->name}, {"source", job->source},
                                     {"description", job->meta.description},
                                     {"interpreter", job->meta.interpreter},
                                     {"timeout", job->meta.timeout_s}, {"params", params}}));
    return 0;
  }
  fmt::print("{} ({})\n  {}\n  interpreter: {}, timeout: {} s\n", job->name, job->source,
             job->meta.description, job->meta.interpreter, job->meta.timeout_s);
  if (job->meta.params.empty()) {
    fmt::print("  no parameters\n");
    return 0;
  }
  fmt::print("\nPARAMETERS\n");
  for (const auto& spec : job->meta.params) {
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
    fmt::print("{}\n", line);
  }
  return 0;
}

struct NewCommand {
  std::string name;
  std::string lang = "python";
  std::string dir = "jobs";
};

int write_new(const NewCommand& cmd)
{
  namespace fs = std::filesystem;
  if (cmd.name.empty() || cmd.name.find_first_not_of(
                            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
                            std::string::npos) {
    print_error(fmt::format("job name '{}' may use only letters, digits, '_' and '-'", cmd.name));
    return to_int(ExitCode::usage);
  }
  const fs::path file = fs::path(cmd.dir) / (cmd.name + (cmd.lang == "sh" ? ".sh" : ".py"));
  std::error_code ec;
  if (fs::exists(file, ec)) {
    print_error(fmt::format("{} already exists; ferry new never overwrites a file", file.string()));
    return to_int(ExitCode::usage);
  }
  fs::create_directories(cmd.dir, ec);
  if (auto written = write_file_atomic(file, job_template(cmd.name, cmd.lang), 0644); !written) {
    print_error(written.error().message);
    return 1;
  }
  fmt::print("wrote {}\nrun it with: ferry run {}{}\n", file.string(),
             cmd.dir == "jobs" ? cmd.name : file.string(), "");
  return 0;
}

} // namespace

void add_jobs_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<JobsCommand>();
  auto* sub = app.add_subcommand("jobs", "List jobs, or show one job's parameters");
  sub->add_option("JOB", cmd->job, "a job name or path: show its parameters");
  sub->add_flag("--json", cmd->json, "JSON output");
  sub->callback([cmd, &ctx] { ctx.exit_code = list(ctx, *cmd); });
}

void add_new_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<NewCommand>();
  auto* sub = app.add_subcommand("new", "Write a ready-to-edit job file");
  sub->add_option("NAME", cmd->name, "the job's name")->required();
  sub->add_option("--lang", cmd->lang, "python or sh")->capture_default_str()->check(CLI::IsMember({"python", "sh"}));
  sub->add_option("--dir", cmd->dir, "where to write it (./jobs is on the job path)")->capture_default_str();
  sub->callback([cmd, &ctx] { ctx.exit_code = write_new(*cmd); });
}

} // namespace ferry::cli
