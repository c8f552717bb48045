// `ferry run --retry-failed`: the runs of an invocation that did not end ok, again, as they were
// made (archived job bytes, parameters, files, options), grouped so that runs of one job with
// the same parameters go to all their hosts in one fan-out.
#include "cli/retry.hpp"

#include <map>

#include "cli/execute.hpp"
#include "cli/slurm_cli.hpp"
#include "cli/targets.hpp"
#include "ferry/archive.hpp"
#include "ferry/job.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"
#include "report/host_fold.hpp"

namespace ferry::cli {

namespace {

using nlohmann::json;

// Runs that go out together: one job's bytes, one set of parameters, one kind of target.
struct RetryGroup {
  std::vector<RunRecord> runs; // loaded with their script and files
};

// What keeps two failed runs apart: their job's bytes, their parameters, their run base, and a
// Slurm run's own submission (each goes again as it was submitted).
std::string group_key(const RunRecord& run)
{
  const bool slurm = run.target.is_object() && run.target.contains("slurm");
  return fmt::format("{}\n{}\n{}\n{}", run.job_sha256, run.params.dump(),
                     run.options.value("remote_base", json()).dump(), slurm ? run.run_id : "");
}

Expected<std::vector<RetryGroup>> failed_runs(Archive& archive, const std::string& invocation)
{
  LogFilter filter;
  filter.invocation = invocation;
  filter.limit = 0;
  filter.with_output = false;
  FERRY_TRY_ASSIGN(const auto runs, archive.log(filter));
  std::map<std::string, RetryGroup> groups;
  std::vector<std::string> order;
  // Oldest first: the order the invocation ran them in.
  for (auto it = runs.rbegin(); it != runs.rend(); ++it) {
    if (it->status == RunStatus::ok) {
      continue;
    }
    LoadOptions load;
    load.verify_blobs = true; // archived bytes run only as archived
    FERRY_TRY_ASSIGN(auto run, archive.load(it->run_id, load));
    const std::string key = group_key(run);
    if (!groups.contains(key)) {
      order.push_back(key);
    }
    groups[key].runs.push_back(std::move(run));
  }
  std::vector<RetryGroup> ordered;
  for (const auto& key : order) {
    ordered.push_back(std::move(groups[key]));
  }
  return ordered;
}

TargetOptions group_target(const RetryGroup& group, const TargetOptions& connection)
{
  const RunRecord& first = group.runs.front();
  TargetOptions target = connection;
  use_archived_slurm_target(target, first);
  if (target.slurm.login.empty()) {
    for (const auto& run : group.runs) {
      target.local = target.local || run.target.value("local", false);
      if (!run.target.value("local", false)) {
        target.hosts.push_back(run.host_label.empty() ? run.target.value("host", "")
                                                      : run.host_label);
      }
    }
  }
  const json& base = first.options.value("remote_base", json());
  if (target.remote_base.empty() && base.is_string()) {
    target.remote_base = base.get<std::string>();
  }
  return target;
}

// The archived run's options, each unless the command line gives it anew.
Expected<RunOptions> group_options(Context& ctx, const RetryRequest& request,
                                   const RunRecord& first, const std::string& invocation)
{
  RunOptions options = archived_options(first.options, request.timeout_s);
  FERRY_TRY_ASSIGN(const UserConfig* config, ctx.user_config());
  FERRY_TRY(set_run_environment(options, request.environment, *config));
  options.verbose = ctx.global.verbose;
  options.keep_remote = request.keep_remote;
  options.invocation = invocation;
  return options;
}

Expected<ExitCode> retry_group(Context& ctx, const RetryRequest& request, const RetryGroup& group,
                               const std::string& invocation)
{
  const RunRecord& first = group.runs.front();
  if (first.script.empty()) {
    return fail(ErrorKind::failed, "run {} has no archived script bytes to run again",
                first.run_id);
  }
  FERRY_TRY_ASSIGN(auto job,
                   parse_job(first.job, first.script_name.empty() ? first.job : first.script_name,
                             "archived script of run " + first.run_id, first.script));
  FERRY_TRY_ASSIGN(job.files, archived_files(first));
  const TargetOptions target = group_target(group, request.connection);
  FERRY_TRY_ASSIGN(auto sessions, make_sessions(ctx, target, std::span<const Job>(&job, 1)));
  FERRY_TRY_ASSIGN(auto options, group_options(ctx, request, first, invocation));
  options.remote_base = target.remote_base;
  options.gpus_by_scheduler = !target.slurm.login.empty();
  const std::vector<PlannedRun> runs = {{&job, first.params}};
  const BatchOptions batch{
      request.archive, batch_parallel(target, request.parallel, sessions.size()), {}};
  return execute_runs(ctx, sessions, runs, options, batch, ctx.reporter());
}

} // namespace

Expected<ExitCode> retry_failed(Context& ctx, const RetryRequest& request)
{
  FERRY_TRY_ASSIGN(auto archive, Archive::open(ctx.archive_path()));
  FERRY_TRY_ASSIGN(const auto invocation, archive.resolve_invocation(request.invocation));
  FERRY_TRY_ASSIGN(const auto groups, failed_runs(archive, invocation));
  if (groups.empty()) {
    ctx.reporter().note(
        fmt::format("every run of invocation {} ended ok: nothing to retry", invocation));
    return ExitCode::ok;
  }
  std::size_t count = 0;
  std::vector<std::string> hosts;
  for (const auto& group : groups) {
    for (const auto& run : group.runs) {
      ++count;
      hosts.push_back(run.host_label);
    }
  }
  const std::string retry = new_run_id();
  ctx.reporter().note(fmt::format("retrying {} run{} of invocation {} that did not end ok ({}); "
                                  "this invocation is {}",
                                  count, count == 1 ? "" : "s", invocation,
                                  terminal_safe(fold_hosts(hosts)), retry));
  ExitCode worst = ExitCode::ok;
  for (const auto& group : groups) {
    FERRY_TRY_ASSIGN(const ExitCode code, retry_group(ctx, request, group, retry));
    worst = std::max(worst, code);
  }
  return worst;
}

} // namespace ferry::cli
