#include "cli/slurm_cli.hpp"

#include <filesystem>
#include <set>

#include <toml++/toml.h>

#include "cli/cli.hpp"
#include "cli/targets.hpp"
#include "ferry/host_spec.hpp"
#include "ferry/slurm.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"
#include "run/detached_runs.hpp"

namespace ferry::cli {

namespace {

Expected<SlurmOptions> command_line_options(const SlurmCli& cli)
{
  SlurmOptions options;
  if (!cli.partition.empty()) {
    FERRY_TRY_ASSIGN(options.partition, check_slurm_partition(cli.partition, "--partition"));
  }
  if (!cli.gres.empty() && !cli.gpus.empty()) {
    return fail(ErrorKind::usage, "--gres and --gpus exclude each other: --gres gpu:8 asks for "
                                  "8 GPUs per node, --gpus 8 for 8 in the whole job");
  }
  if (!cli.gres.empty()) {
    FERRY_TRY_ASSIGN(options.gres, check_slurm_gres(cli.gres, "--gres"));
  }
  if (!cli.gpus.empty()) {
    FERRY_TRY_ASSIGN(options.gpus, check_slurm_gpus(cli.gpus, "--gpus"));
  }
  if (!cli.account.empty()) {
    FERRY_TRY_ASSIGN(options.account, check_slurm_account(cli.account, "--account"));
  }
  if (cli.time_min) {
    FERRY_TRY_ASSIGN(options.time_min, check_slurm_time(*cli.time_min, "--time"));
  }
  if (cli.nodes) {
    FERRY_TRY_ASSIGN(options.nodes, check_slurm_nodes(*cli.nodes, "--nodes"));
  }
  for (const auto& arg : cli.args) {
    FERRY_TRY_ASSIGN(auto checked, check_slurm_arg(arg, "--slurm-arg"));
    options.args.push_back(std::move(checked));
  }
  return options;
}

// --nodes, else what the jobs' [slurm] tables say (they must agree), else the config's, else 1.
Expected<int> node_count(const SlurmOptions& command_line, const SlurmOptions& config,
                         std::span<const Job> jobs)
{
  if (command_line.nodes) {
    return *command_line.nodes;
  }
  std::set<int> asked;
  for (const auto& job : jobs) {
    if (job.meta.slurm.nodes) {
      asked.insert(*job.meta.slurm.nodes);
    }
  }
  if (asked.size() > 1) {
    return fail(ErrorKind::usage,
                "the jobs ask for different numbers of nodes in their [slurm] tables; run them "
                "separately or give --nodes N");
  }
  return asked.empty() ? config.nodes.value_or(1) : *asked.begin();
}

// A `[slurm]` value as set_slurm_option takes it: a string, an integer or a list of strings.
nlohmann::json option_json(const toml::node& option)
{
  if (const auto* text = option.as_string()) {
    return text->get();
  }
  if (const auto* number = option.as_integer()) {
    return number->get();
  }
  nlohmann::json value;
  if (const auto* list = option.as_array()) {
    value = nlohmann::json::array();
    for (const auto& item : *list) {
      value.push_back(item.is_string() ? nlohmann::json(*item.value<std::string>())
                                       : nlohmann::json());
    }
  }
  return value;
}

Expected<SlurmOptions> config_table(const toml::table& table, const std::string& path)
{
  SlurmOptions options;
  for (const auto& [key, value] : table) {
    if (key.str() == "hosts" || key.str() == "archive") {
      continue; // the other sections of the file, read (and checked) by their own readers
    }
    if (key.str() != "slurm" || !value.is_table()) {
      return fail(ErrorKind::usage,
                  "{}:{}: unknown key '{}' in the config file (known: [hosts.\"PATTERN\"], "
                  "[slurm], [archive])",
                  path, value.source().begin.line, key.str());
    }
    for (const auto& [name, option] : *value.as_table()) {
      if (auto set = set_slurm_option(options, name.str(), option_json(option)); !set) {
        return fail(ErrorKind::usage, "{}:{}: {}", path, option.source().begin.line,
                    set.error().message);
      }
    }
  }
  return options;
}

bool has_slurm_key(const nlohmann::json& target)
{
  return target.contains("slurm");
}

} // namespace

bool SlurmCli::options_given() const
{
  return !partition.empty() || !gres.empty() || !gpus.empty() || !account.empty() ||
         time_min.has_value() || nodes.has_value() || !args.empty();
}

void add_slurm_options(CLI::App& command, SlurmCli& slurm)
{
  command
      .add_option("--slurm", slurm.login,
                  "run through Slurm: LOGIN is the login node, as for --host (docs/slurm.md)")
      ->group("Slurm");
  command.add_option("--partition", slurm.partition, "Slurm partition(s)")->group("Slurm");
  command.add_option("--gres", slurm.gres, "generic resources per node, e.g. gpu:8")
      ->group("Slurm");
  command
      .add_option("--gpus", slurm.gpus,
                  "GPUs: on an SSH host or --local (`run`), N free ones picked and locked for the "
                  "run (1-64); with --slurm, for the whole job: N or TYPE:N")
      ->group("Slurm");
  command
      .add_option("--time", slurm.time_min,
                  "Slurm time limit in minutes (default: the job's timeout, rounded up)")
      ->group("Slurm");
  command.add_option("--account", slurm.account, "Slurm account to charge")->group("Slurm");
  command.add_option("--nodes", slurm.nodes, "run once on each of N nodes of one allocation")
      ->group("Slurm");
  command
      .add_option("--slurm-arg", slurm.args,
                  "a further sbatch option, --slurm-arg=--NAME=VALUE (allowed names in "
                  "docs/slurm.md); repeatable")
      ->group("Slurm");
}

Expected<void> check_slurm_combination(const TargetOptions& target, bool hosts_given)
{
  const SlurmCli& slurm = target.slurm;
  if (slurm.login.empty()) {
    if (slurm.options_given()) {
      return fail(ErrorKind::usage, "--partition, --gres, --gpus, --time, --account, --nodes and "
                                    "--slurm-arg need --slurm LOGIN");
    }
    return {};
  }
  if (hosts_given || target.local) {
    return fail(ErrorKind::usage, "--slurm excludes --host, --hosts-file and --local");
  }
  return {};
}

std::string user_config_path()
{
  return env_or("XDG_CONFIG_HOME", home_dir() + "/.config") + "/ferry/config.toml";
}

Expected<SlurmOptions> config_slurm_options(const std::string& path)
{
  std::error_code missing;
  if (!std::filesystem::exists(path, missing)) {
    return SlurmOptions{};
  }
  FERRY_TRY_ASSIGN(const auto text, read_file(path));
  try {
    return config_table(toml::parse(text, path), path);
  } catch (const toml::parse_error& e) {
    return fail(ErrorKind::usage, "{}:{}: invalid TOML: {}", path, e.source().begin.line,
                e.description());
  }
}

Expected<std::vector<std::unique_ptr<HostSession>>>
make_slurm_target_sessions(Context& ctx, const TargetOptions& target, std::span<const Job> jobs)
{
  FERRY_TRY(parse_host_spec(target.slurm.login));
  SlurmTarget slurm;
  slurm.login = ssh_target_for(ctx, target, target.slurm.login);
  // The ssh config is read now, so that one ssh would refuse is a usage error before any contact.
  FERRY_TRY(make_checked_ssh_session(slurm.login));
  FERRY_TRY_ASSIGN(slurm.command_line, command_line_options(target.slurm));
  if (target.slurm.archived) {
    SlurmOptions archived = *target.slurm.archived;
    archived.nodes.reset(); // a replay re-runs one run: one node, unless --nodes says more
    slurm.command_line = merge_slurm_options(slurm.command_line, archived);
  }
  FERRY_TRY_ASSIGN(slurm.config, config_slurm_options(user_config_path()));
  FERRY_TRY_ASSIGN(slurm.nodes, node_count(slurm.command_line, slurm.config, jobs));
  slurm.describe_cluster = target.slurm.describe_cluster;
  if (slurm.nodes == 1) {
    slurm.array_points = target.slurm.array_points;
    slurm.array_throttle = target.slurm.array_throttle;
  }
  return make_slurm_sessions(slurm);
}

int batch_parallel(const TargetOptions& target, int parallel, std::size_t sessions)
{
  return target.slurm.login.empty() ? parallel : std::max(parallel, static_cast<int>(sessions));
}

namespace {

// "4242", or "4242_3" (task 3 of job array 4242).
bool is_job_id(std::string_view id)
{
  const auto digits = [](std::string_view part) {
    return !part.empty() && part.find_first_not_of("0123456789") == std::string_view::npos;
  };
  const auto underscore = id.find('_');
  return underscore == std::string_view::npos
             ? digits(id)
             : digits(id.substr(0, underscore)) && digits(id.substr(underscore + 1));
}

// The target a detached run was submitted to, as its record keeps it, following its job (a
// sweep's point: its task of the array).
Expected<SlurmTarget> detached_target(Context& ctx, const HostTargets& ssh, const RunRecord& run)
{
  const nlohmann::json& slurm = run.target["slurm"];
  const std::string login = slurm.value("login", std::string());
  const std::string job = slurm.value("job_id", std::string());
  if (login.empty() || !is_job_id(job)) {
    return fail(ErrorKind::failed, "run {}: its record names no Slurm login node and job id",
                run.run_id);
  }
  FERRY_TRY(parse_host_spec(login));
  FERRY_TRY_ASSIGN(const UserConfig* config, ctx.user_config());
  SlurmTarget target;
  target.login = ferry::ssh_target_for(ssh, *config, login, ctx.global.verbose);
  if (auto options = slurm_options_from_json(slurm.value("options", nlohmann::json::object()))) {
    target.command_line = *options;
  }
  if (slurm.contains("time_limit_min") && slurm["time_limit_min"].is_number_integer()) {
    target.command_line.time_min = slurm["time_limit_min"].get<int>();
  }
  target.detached_job = job;
  if (const auto size = slurm.find("array_size");
      size != slurm.end() && size->is_number_integer()) {
    target.array_points = size->get<int>();
  }
  return target;
}

} // namespace

Expected<std::unique_ptr<HostSession>> detached_slurm_session(Context& ctx, const HostTargets& ssh,
                                                              const RunRecord& run)
{
  if (!has_slurm_key(run.target)) {
    return std::unique_ptr<HostSession>();
  }
  FERRY_TRY_ASSIGN(const SlurmTarget target, detached_target(ctx, ssh, run));
  auto sessions = make_slurm_sessions(target);
  std::unique_ptr<HostSession> session = std::move(sessions.front());
  FERRY_TRY(session->connect());
  return session;
}

std::optional<std::string> detached_slurm_ps(Context& ctx, const HostTargets& ssh,
                                             const RunRecord& run)
{
  if (!has_slurm_key(run.target)) {
    return std::nullopt;
  }
  const auto target = detached_target(ctx, ssh, run);
  if (!target) {
    return "unknown: " + target.error().message;
  }
  const auto state = detached_slurm_state(*target, run.detached.value("run_dir", std::string()));
  if (!state) {
    return "unreachable: " + state.error().message;
  }
  // As for an SSH host: a directory gone after the run's timeout, grace and --keep-for was
  // removed by the run base's sweep (docs/record.md, "The life of a run").
  return *state == "gone" && expired_by_now(run) ? "expired" : *state;
}

void use_archived_slurm_target(TargetOptions& target, const RunRecord& original)
{
  if (!has_slurm_key(original.target)) {
    return;
  }
  const auto& slurm = original.target["slurm"];
  const bool other_target = !target.hosts.empty() || !target.hosts_file.empty() || target.local;
  if (other_target) {
    return;
  }
  if (target.slurm.login.empty()) {
    target.slurm.login = slurm.value("login", "");
  }
  if (auto options = slurm_options_from_json(slurm.value("options", nlohmann::json::object()))) {
    target.slurm.archived = std::move(options).value();
  }
}

std::optional<std::string> slurm_check_text(const RunRecord& record)
{
  if (!has_slurm_key(record.target)) {
    return std::nullopt;
  }
  const auto& slurm = record.target["slurm"];
  const auto cluster = slurm.value("cluster", nlohmann::json::object());
  std::string partitions;
  for (const auto& partition : cluster.value("partitions", nlohmann::json::array())) {
    partitions += (partitions.empty() ? "" : " ") + partition.value("name", std::string("?")) +
                  (partition.value("default", false) ? "*" : "");
  }
  std::string gres;
  for (const auto& node : cluster.value("nodes", nlohmann::json::array())) {
    const std::string g = node.value("gres", "");
    if (!g.empty() && g != "(null)") {
      gres += (gres.empty() ? "" : ", ") + node.value("name", std::string("?")) + " " + g;
    }
  }
  const auto shared = slurm.find("run_dir_shared");
  const std::string base =
      shared == slurm.end() || !shared->is_boolean()
          ? "remote base: not known whether the nodes share it"
          : (shared->get<bool>() ? "remote base shared with node " + slurm.value("node", "?")
                                 : "remote base NOT visible on node " + slurm.value("nodes", "?"));
  std::string text = fmt::format(
      "{}: {} — Slurm {}, partitions {}, GPU gres {}; {}\n", record.host_label,
      record.status == RunStatus::ok ? fmt::format("ok in {:.2f} s", record.duration_s) : "FAILED",
      cluster.value("version", "?"), partitions.empty() ? "?" : partitions,
      gres.empty() ? "none" : gres, base);
  if (record.status != RunStatus::ok) {
    text += fmt::format("  {}\n", record.error.value_or("see stderr"));
  }
  // The cluster's names and the error come from the login node: no control sequences pass.
  return terminal_safe(text, Newlines::keep);
}

} // namespace ferry::cli
