// `ferry mcp`: the jobs on the job path as MCP tools over stdio, on targets fixed here.
#include <algorithm>

#include <unistd.h>

#include "cli/archive_config.hpp"
#include "cli/execute.hpp"
#include "ferry/text.hpp"
#include "mcp/server.hpp"
#include "mcp/tools.hpp"

namespace ferry::cli {

namespace {

struct McpCommand {
  TargetOptions target;
  EnvironmentOptions environment;
  std::vector<std::string> jobs_dirs;
  std::string out_dir; // empty: beside the archive
  std::uint64_t archive_outputs_max_mib = 16;
  std::size_t output_cap_mib = 16;
};

// How long a session stays connected after a call for the next one, unless --persist says.
constexpr int k_default_idle_s = 300;

void note(std::string_view text)
{
  const std::string line = fmt::format("ferry mcp: {}\n", terminal_safe(text));
  std::fwrite(line.data(), 1, line.size(), stderr);
}

// The targets a call picks from: each host given, resolved as `ferry run` resolves it, and this
// machine with --local (or when no host is given). Unlike `run`, --local and hosts may be
// combined: a client picks per call. The server keeps sessions of its own (through a host's
// held session when the user's holder keeps one, docs/mcp.md).
Expected<std::vector<PoolTarget>> server_targets(const TargetOptions& options,
                                                 const UserConfig& config, bool verbose)
{
  if (!options.slurm.login.empty() || options.slurm.options_given()) {
    return fail(ErrorKind::usage, "ferry mcp serves SSH hosts and this machine; it does not "
                                  "take --slurm or its options");
  }
  HostTargets hosts_only = options;
  hosts_only.local = false;
  FERRY_TRY_ASSIGN(const auto named, named_hosts(hosts_only, config));
  std::vector<PoolTarget> targets;
  for (const auto& host : each_host_once(named, note)) {
    if (host == mcp::k_all_targets || (host == "local" && options.local)) {
      return fail(ErrorKind::usage,
                  "--host {}: ferry mcp uses that name for {}; give the host another name (an "
                  "alias in the ssh config)",
                  host, host == "local" ? "--local" : "every target");
    }
    FERRY_TRY_ASSIGN(auto make, direct_sessions(hosts_only, config, host, verbose));
    targets.push_back({host, std::move(make)});
  }
  if (options.local || targets.empty()) {
    targets.push_back({"local", [] { return make_local_session(LocalTarget{}); }});
  }
  return targets;
}

// Every job on the path that can be a tool; the others are named on stderr.
std::vector<Job> tool_jobs(const JobPath& path)
{
  std::vector<Job> jobs;
  for (const auto& listing : list_jobs(path)) {
    auto job = find_job(listing.name, path);
    if (!job) {
      note(fmt::format("job {} left out: {}", listing.name, job.error().message));
      continue;
    }
    if (const auto refusal = mcp::tool_refusal(*job)) {
      note(fmt::format("job {} left out: {}", listing.name, *refusal));
      continue;
    }
    // The job's own `files` travel with every call, read once here.
    if (auto files = resolve_job_files(*job, {}, k_default_max_upload); !files) {
      note(fmt::format("job {} left out: {}", listing.name, files.error().message));
      continue;
    }
    jobs.push_back(std::move(job).value());
  }
  return jobs;
}

// Where a call's fetched files go: DIR/RUN_ID, DIR absolute, never the client's working
// directory unless --out names it.
std::string output_pattern(const Context& ctx, const McpCommand& cmd)
{
  const auto dir = cmd.out_dir.empty() ? ctx.archive_path().parent_path() / "outputs"
                                       : std::filesystem::path(cmd.out_dir);
  return (std::filesystem::absolute(dir) / "{run_id}").string();
}

// What every call runs with: the environment and interpreters as `ferry run` resolves them.
Expected<RunOptions> run_options(Context& ctx, const McpCommand& cmd, const UserConfig& config)
{
  RunOptions options;
  FERRY_TRY(set_run_environment(options, cmd.environment, config));
  options.verbose = ctx.global.verbose;
  options.remote_base = cmd.target.remote_base;
  options.out_dir = output_pattern(ctx, cmd);
  options.archive_outputs_max = cmd.archive_outputs_max_mib << 20;
  options.output_cap = cmd.output_cap_mib << 20;
  return options;
}

Expected<mcp::CallArchive> call_archive(Archive& archive)
{
  FERRY_TRY_ASSIGN(auto max_size, configured_archive_max_size());
  return mcp::CallArchive{&archive, max_size, config_file_path().string()};
}

Expected<ExitCode> serve(Context& ctx, McpCommand& cmd)
{
  ctx.global.jobs_dirs.insert(ctx.global.jobs_dirs.end(), cmd.jobs_dirs.begin(),
                              cmd.jobs_dirs.end());
  FERRY_TRY_ASSIGN(const UserConfig* config, ctx.user_config());
  mcp::ServerConfig server;
  FERRY_TRY_ASSIGN(server.targets, server_targets(cmd.target, *config, ctx.global.verbose));
  FERRY_TRY_ASSIGN(server.run_options, run_options(ctx, cmd, *config));
  // Every call is archived: without an archive there is no server.
  FERRY_TRY_ASSIGN(auto archive, Archive::open(ctx.archive_path()));
  FERRY_TRY_ASSIGN(server.archive, call_archive(archive));
  // The tools are the same wherever the client starts the server: ./jobs is left out.
  server.jobs = tool_jobs(JobPath::from_environment(ctx.global.jobs_dirs, false));
  server.idle_limit = std::chrono::seconds(cmd.target.persist_s.value_or(k_default_idle_s));
  std::string labels;
  for (const auto& target : server.targets) {
    labels += (labels.empty() ? "" : ", ") + target.label;
  }
  note(fmt::format("{} tools on {}; archive {}", server.jobs.size(), labels,
                   archive.path().string()));
  install_interrupt_handlers();
  return mcp::serve(std::move(server), STDIN_FILENO, STDOUT_FILENO);
}

} // namespace

void add_mcp_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<McpCommand>();
  auto* sub = app.add_subcommand(
      "mcp", "Serve the jobs as tools to an AI agent (MCP over stdio); no shell, no free-form "
             "commands");
  add_target_options(*sub, cmd->target);
  sub->get_option("--persist")
      ->description(fmt::format("seconds a target's session stays connected after a call for the "
                                "next one (0: none; default {})",
                                k_default_idle_s));
  add_environment_options(*sub, cmd->environment);
  sub->add_option("--jobs", cmd->jobs_dirs, "look for jobs here first (repeatable)");
  sub->add_option("--out", cmd->out_dir,
                  "where fetched files go, in a directory per run (default: outputs/ beside the "
                  "archive)");
  sub->add_option("--archive-outputs-max", cmd->archive_outputs_max_mib,
                  "MiB of fetched files the archive keeps per run (larger ones: their hash only)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--output-cap", cmd->output_cap_mib, "MiB kept of each of stdout and stderr")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  sub->footer(R"(Examples:
  ferry mcp --local
  ferry mcp --host gpu1 --host gpu2 --jobs ~/ferry-jobs
An MCP client starts it and talks JSON-RPC on its stdin and stdout; diagnostics go to stderr.)");
  on_chosen(*sub, ctx, [cmd, &ctx] { return serve(ctx, *cmd); });
}

} // namespace ferry::cli
