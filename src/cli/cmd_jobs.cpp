#include <filesystem>

#include "cli/cli.hpp"
#include "ferry/run_record.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"

namespace ferry::cli {

namespace {

struct JobsCommand {
  std::string job;
  bool json = false;
  bool path = false;
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
  j["program"] = spec.program;
  j["pattern"] = spec.pattern ? nlohmann::json(*spec.pattern) : nlohmann::json();
  return j;
}

std::string source_cell(const JobListing& item)
{
  if (!item.shadows.empty()) {
    return item.source + " (hides the built-in)";
  }
  if (!item.shadowed_by.empty()) {
    return item.source + " (hidden by " + item.shadowed_by + ")";
  }
  return item.source;
}

nlohmann::json listing_json(const JobListing& item)
{
  nlohmann::json j = {{"name", item.name},
                      {"source", item.source},
                      {"description", item.description},
                      {"valid", item.valid},
                      {"interpreter", item.valid ? nlohmann::json(item.interpreter) : nullptr}};
  if (!item.shadows.empty()) {
    j["shadows"] = item.shadows;
  }
  if (!item.shadowed_by.empty()) {
    j["shadowed_by"] = item.shadowed_by;
  }
  return j;
}

// File names and descriptions come from whatever sits in a jobs directory: shown escaped.
Table listing_table(const std::vector<JobListing>& listing)
{
  Table table;
  table.header = {"NAME", "SOURCE", "DESCRIPTION"};
  for (const auto& item : listing) {
    table.rows.push_back({terminal_safe(item.name), terminal_safe(source_cell(item)),
                          terminal_safe(item.description)});
    table.objects.push_back(listing_json(item));
  }
  return table;
}

// `ferry jobs --path`: the directories in the order they are searched, then the built-ins.
Table path_table(const JobPath& path)
{
  Table table;
  table.header = {"ORDER", "DIRECTORY", "STATE", "ON THE PATH AS"};
  table.right_aligned = {true};
  std::size_t order = 0;
  for (std::size_t i = 0; i < path.dirs.size(); ++i) {
    std::error_code ec;
    const auto& dir = path.dirs[i];
    const std::string state = std::filesystem::is_directory(dir, ec) ? "ok"
                              : std::filesystem::exists(dir, ec)     ? "not a directory"
                                                                     : "missing";
    const std::string origin = i < path.origins.size() ? path.origins[i] : "";
    table.rows.push_back({std::to_string(++order), terminal_safe(dir.string()), state, origin});
    table.objects.push_back({{"order", order},
                             {"dir", dir.string()},
                             {"absolute", std::filesystem::absolute(dir, ec).string()},
                             {"state", state},
                             {"origin", origin}});
  }
  if (path.builtins) {
    table.rows.push_back({std::to_string(++order), "(built-in jobs)", "ok",
                          "compiled into ferry; builtin:NAME always names one"});
    table.objects.push_back(
        {{"order", order}, {"dir", nullptr}, {"state", "ok"}, {"origin", "built-in"}});
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
    line += fmt::format(" {} {}", spec.program ? "allowed programs" : "choices",
                        to_json_line(*spec.choices));
  }
  if (spec.pattern) {
    line += fmt::format(" pattern {}", *spec.pattern);
  }
  if (!spec.help.empty()) {
    line += "\n      " + spec.help;
  }
  return line + "\n";
}

// One job's page: what it is and its parameters.
std::string job_page(const Job& job, bool hides_builtin)
{
  std::string text =
      fmt::format("{} ({})\n  {}\n  interpreter: {}, timeout: {} s\n", terminal_safe(job.name),
                  terminal_safe(job.source), terminal_safe(job.meta.description),
                  job.meta.interpreter, job.meta.timeout_s);
  if (hides_builtin) {
    text += fmt::format("  hides the built-in job {0}; run that one as builtin:{0}\n", job.name);
  }
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

bool hides_builtin(const Job& job)
{
  return job.source != "built-in" &&
         find_job(std::string(k_builtin_prefix) + job.name, JobPath{{}, true, {}}).has_value();
}

Expected<ExitCode> list(Context& ctx, const JobsCommand& cmd)
{
  ctx.use_json(cmd.json);
  const JobPath path = ctx.job_path();
  if (cmd.path) {
    ctx.reporter().table(path_table(path));
    return ExitCode::ok;
  }
  if (cmd.job.empty()) {
    const JobScan scan = scan_jobs(path);
    if (ctx.global.verbose) {
      for (const auto& note : scan.notes) {
        ctx.reporter().note(terminal_safe(note));
      }
    }
    ctx.reporter().table(listing_table(scan.jobs));
    return ExitCode::ok;
  }
  FERRY_TRY_ASSIGN(const auto job, find_job(cmd.job, path));
  const bool hides = hides_builtin(job);
  auto document = job_json(job);
  if (hides) {
    document["shadows"] = std::string(k_builtin_prefix) + job.name;
  }
  ctx.reporter().document(job_page(job, hides), document);
  return ExitCode::ok;
}

struct NewCommand {
  std::string name;
  std::string lang = "python";
  std::string dir = "jobs";
  bool force = false;
  bool json = false;
};

Expected<void> check_new_name(const std::string& name)
{
  if (name.empty() ||
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
          std::string::npos) {
    return fail(ErrorKind::usage, "job name '{}' may use only letters, digits, '_' and '-'",
                terminal_safe(name));
  }
  if (name.front() == '-') {
    return fail(ErrorKind::usage,
                "job name '{}' may not start with '-': a command line would read it as an "
                "option; start it with a letter, a digit or '_'",
                name);
  }
  return {};
}

// Where a job of this name already is on the job path (a built-in counts), if anywhere.
std::optional<std::string> existing_job(const std::string& name, const JobPath& path)
{
  for (const auto& listing : list_jobs(path)) {
    if (listing.name == name) {
      return listing.source;
    }
  }
  return std::nullopt;
}

// A path as one shell word: quoted when it holds anything beyond the safe characters.
std::string shell_word(std::string path)
{
  if (path.front() == '-') {
    path = "./" + path; // not an option
  }
  if (path.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                             "/._-+,:@%=") == std::string::npos) {
    return path;
  }
  std::string quoted = "'";
  for (const char c : path) {
    quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  }
  return quoted + "'";
}

// How to run the new file: by its name when that finds it, else by its path.
std::string run_command(const std::string& name, const std::filesystem::path& file,
                        const JobPath& path)
{
  const auto found = find_job(name, path);
  std::error_code ec;
  if (found && found->source != "built-in" &&
      std::filesystem::equivalent(found->source, file, ec)) {
    return "ferry run " + name;
  }
  return "ferry run " + shell_word(file.string());
}

Expected<ExitCode> write_new(Context& ctx, const NewCommand& cmd)
{
  namespace fs = std::filesystem;
  ctx.use_json(cmd.json);
  FERRY_TRY(check_new_name(cmd.name));
  const fs::path file = fs::path(cmd.dir) / (cmd.name + (cmd.lang == "sh" ? ".sh" : ".py"));
  std::error_code ec;
  if (fs::exists(file, ec)) {
    return fail(ErrorKind::usage, "{} already exists; ferry new never overwrites a file",
                terminal_safe(file.string()));
  }
  const JobPath path = ctx.job_path();
  if (const auto other = existing_job(cmd.name, path); other && !cmd.force) {
    return fail(ErrorKind::usage,
                "there is already a job named '{}' ({}); choose another name, or pass --force to "
                "write it anyway ({})",
                cmd.name, terminal_safe(*other),
                *other == "built-in"
                    ? "the built-in then stays reachable as builtin:" + cmd.name
                    : std::string("the first on the job path wins; `ferry jobs --path` shows the "
                                  "order"));
  }
  fs::create_directories(cmd.dir, ec);
  FERRY_TRY(write_file_atomic(file, job_template(cmd.name, cmd.lang), 0644));
  const std::string run = run_command(cmd.name, file, path);
  ctx.reporter().document(
      fmt::format("wrote {}\nrun it with: {}\n", terminal_safe(file.string()), terminal_safe(run)),
      {{"path", file.string()}, {"run", run}});
  return ExitCode::ok;
}

} // namespace

void add_jobs_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<JobsCommand>();
  auto* sub = app.add_subcommand("jobs", "List jobs, or show one job's parameters");
  sub->add_option("JOB", cmd->job, "a job name, builtin:NAME or a path: show its parameters");
  sub->add_flag("--path", cmd->path, "show the directories searched for jobs, in order");
  sub->add_flag("--json", cmd->json, "JSON output");
  sub->footer(R"(Examples:
  ferry jobs
  ferry jobs kv_calc
  ferry jobs ./jobs/my_probe.py --json
  ferry jobs --path)");
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
  sub->add_flag("--force", cmd->force,
                "write it even when a job of that name exists (a file never is overwritten)");
  sub->add_flag("--json", cmd->json, "print {\"path\", \"run\"} as JSON");
  sub->footer(R"(Examples:
  ferry new my_probe
  ferry new disk_check --lang sh
  ferry new my_probe --dir ~/.config/ferry/jobs)");
  on_chosen(*sub, ctx, [cmd, &ctx] { return write_new(ctx, *cmd); });
}

} // namespace ferry::cli
