// `ferry mcp`: the jobs on the job path as MCP tools over stdio, on targets fixed here.
#include <algorithm>

#include <unistd.h>

#include "cli/execute.hpp"
#include "cli/targets.hpp"
#include "ferry/text.hpp"
#include "mcp/server.hpp"
#include "mcp/tools.hpp"

namespace ferry::cli {

namespace {

struct McpCommand {
  TargetOptions target;
  std::vector<std::string> jobs_dirs;
};

void note(std::string_view text)
{
  const std::string line = fmt::format("ferry mcp: {}\n", terminal_safe(text));
  std::fwrite(line.data(), 1, line.size(), stderr);
}

// One session factory per target: each host given, and this machine with --local (or when no
// host is given). Unlike `run`, --local and hosts may be combined: a client picks per call.
Expected<std::vector<mcp::TargetEntry>> server_targets(Context& ctx, const TargetOptions& options)
{
  TargetOptions hosts_only = options;
  hosts_only.local = false;
  FERRY_TRY_ASSIGN(auto hosts, target_hosts(hosts_only));
  std::vector<mcp::TargetEntry> targets;
  for (const auto& host : hosts) {
    if (host == mcp::k_all_targets || (host == "local" && options.local)) {
      return fail(ErrorKind::usage,
                  "--host {}: ferry mcp uses that name for {}; give the host another name (an "
                  "alias in the ssh config)",
                  host, host == "local" ? "--local" : "every target");
    }
    const bool seen = std::any_of(targets.begin(), targets.end(),
                                  [&](const mcp::TargetEntry& t) { return t.label == host; });
    if (seen) {
      continue;
    }
    TargetOptions one = hosts_only;
    one.hosts = {host};
    one.hosts_file.clear();
    targets.push_back(
        {host, [&ctx, one] { return std::move(make_sessions(ctx, one).value().front()); }});
  }
  if (options.local || targets.empty()) {
    targets.push_back({"local", [&ctx] {
                         return std::move(make_sessions(ctx, TargetOptions{}).value().front());
                       }});
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

Expected<ExitCode> serve(Context& ctx, McpCommand& cmd)
{
  ctx.global.jobs_dirs.insert(ctx.global.jobs_dirs.end(), cmd.jobs_dirs.begin(),
                              cmd.jobs_dirs.end());
  FERRY_TRY_ASSIGN(auto targets, server_targets(ctx, cmd.target));
  // Every call is archived: without an archive there is no server.
  FERRY_TRY_ASSIGN(auto archive, Archive::open(ctx.archive_path()));
  mcp::ServerConfig config;
  config.jobs = tool_jobs(ctx.job_path());
  config.targets = std::move(targets);
  config.archive = &archive;
  config.run_options.verbose = ctx.global.verbose;
  std::string labels;
  for (const auto& target : config.targets) {
    labels += (labels.empty() ? "" : ", ") + target.label;
  }
  note(fmt::format("{} tools on {}; archive {}", config.jobs.size(), labels,
                   archive.path().string()));
  install_interrupt_handlers();
  return mcp::serve(std::move(config), STDIN_FILENO, STDOUT_FILENO);
}

} // namespace

void add_mcp_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<McpCommand>();
  auto* sub = app.add_subcommand(
      "mcp", "Serve the jobs as tools to an AI agent (MCP over stdio); no shell, no free-form "
             "commands");
  add_target_options(*sub, cmd->target);
  sub->add_option("--jobs", cmd->jobs_dirs, "look for jobs here first (repeatable)");
  sub->footer(R"(Examples:
  ferry mcp --local
  ferry mcp --host gpu1 --host gpu2 --jobs ~/ferry-jobs
An MCP client starts it and talks JSON-RPC on its stdin and stdout; diagnostics go to stderr.)");
  on_chosen(*sub, ctx, [cmd, &ctx] { return serve(ctx, *cmd); });
}

} // namespace ferry::cli
