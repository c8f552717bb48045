// Detached runs (docs/cli.md, "ferry attach", "ferry stop", "ferry ps"): `run --detach` starts
// them, these commands find them in the archive, follow or stop them on their host, and collect
// them as runs that were never detached.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <map>

#include "cli/cli.hpp"
#include "cli/detached.hpp"
#include "cli/execute.hpp"
#include "ferry/runner.hpp"
#include "ferry/sessions.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"
#include "run/archiving.hpp"

namespace ferry::cli {

using nlohmann::json;

namespace {

struct DetachedCommand {
  std::string run;
  HostTargets ssh;
  bool json = false;
};

// The detached run REF names: its id, a unique prefix of it (or of its random part), or `last`.
Expected<RunRecord> find_detached(Archive& archive, const std::string& ref)
{
  FERRY_TRY_ASSIGN(auto runs, archive.detached_runs());
  if (runs.empty()) {
    return fail(ErrorKind::usage,
                "no detached run '{}': none waits for collection (`ferry run JOB --detach` "
                "starts one; `ferry log` lists the collected ones)",
                terminal_safe(ref));
  }
  if (ref == "last") {
    return std::move(runs.front());
  }
  std::vector<RunRecord*> matches;
  for (auto& run : runs) {
    const std::string_view id = run.run_id;
    const auto dash = id.rfind('-');
    if (id == ref) {
      return std::move(run);
    }
    if (id.starts_with(ref) ||
        (dash != std::string_view::npos && id.substr(dash + 1).starts_with(ref))) {
      matches.push_back(&run);
    }
  }
  if (matches.size() == 1) {
    return std::move(*matches.front());
  }
  std::string listed;
  for (const auto& run : runs) {
    listed += fmt::format("\n  {} {} {}", run.run_id, run.job, run.host_label);
  }
  return fail(ErrorKind::usage, "{} detached run '{}'; `ferry ps` lists them:{}",
              matches.empty() ? "no" : "more than one", terminal_safe(ref), listed);
}

// A new session to the run's target: this machine, or its SSH host as the record names it, with
// the SSH options given now (a direct connection, not a held one).
Expected<std::unique_ptr<HostSession>> session_for(Context& ctx, const HostTargets& ssh,
                                                   const RunRecord& run)
{
  if (run.target.value("local", false)) {
    return make_local_session(LocalTarget{});
  }
  FERRY_TRY_ASSIGN(const UserConfig* config, ctx.user_config());
  HostTargets target = ssh;
  target.persist_s = 0;
  auto session =
      make_ssh_session(ferry::ssh_target_for(target, *config, run.host_label, ctx.global.verbose));
  FERRY_TRY(session->connect());
  return session;
}

// The options the run was made with, as its record kept them.
RunOptions options_of(const RunRecord& run, bool verbose)
{
  RunOptions options;
  const json& recorded = run.options;
  const json& detached = run.detached;
  options.verbose = verbose;
  options.timeout_s = recorded.value("timeout_s", 300);
  options.grace_s = recorded.value("grace_s", 2);
  options.output_cap = recorded.value("output_cap", std::size_t{16} << 20);
  options.result_cap = recorded.value("result_cap", std::size_t{64} << 20);
  options.fetch = detached.value("fetch", std::vector<std::string>{});
  options.out_dir = detached.value("out_dir", std::string("ferry-out/{run_id}/{host}"));
  options.archive_outputs_max = detached.value("archive_outputs_max", std::uint64_t{16} << 20);
  options.invocation = run.invocation;
  return options;
}

Expected<Job> job_of(const RunRecord& run)
{
  const std::string name = run.detached.value("script_name", run.job);
  return parse_job(run.job, name.empty() ? run.job : name, "archive", run.script);
}

// Follows the run to its end and collects it (or stops it first); the final record goes into
// the archive in place of the detached one.
Expected<ExitCode> collect(Context& ctx, const DetachedCommand& cmd, bool stop)
{
  install_interrupt_handlers();
  ctx.use_json(cmd.json);
  FERRY_TRY_ASSIGN(auto archive, Archive::open(ctx.archive_path()));
  FERRY_TRY_ASSIGN(RunRecord running, find_detached(archive, cmd.run));
  FERRY_TRY_ASSIGN(const Job job, job_of(running));
  FERRY_TRY_ASSIGN(auto session, session_for(ctx, cmd.ssh, running));
  Reporter& view = ctx.reporter();
  ArchivingSettings settings;
  settings.archive = &archive;
  settings.on_error = [&view](const Error& error) { view.error(error); };
  settings.on_note = [&view](std::string_view text) { view.note(text); };
  ArchivingObserver observer(std::move(settings), view);
  const std::string host = running.host_label;
  const std::string job_name = running.job;
  observer.batch_started({1, 1, {}});
  observer.run_started({host, job_name});
  RunOptions options = options_of(running, ctx.global.verbose);
  if (!stop) {
    options.on_output = [&observer, &host, &job_name](OutputStream stream, std::string_view bytes) {
      observer.run_output({host, job_name}, stream, bytes);
    };
  }
  const std::string run_id = running.run_id;
  FERRY_TRY_ASSIGN(Attached attached, attach_run(*session, job, std::move(running), options, stop));
  if (attached.end == Attached::End::detached) {
    view.note(
        fmt::format("detached from run {}; it goes on (`ferry attach {}` again)", run_id, run_id));
    return ExitCode::interrupted;
  }
  if (attached.end == Attached::End::gone) {
    return fail(ErrorKind::failed,
                "run {} is gone from {}: its run directory {} is not there (collected by another "
                "ferry, or removed by the host's sweep after --keep-for {} s); `ferry ps` says "
                "which",
                run_id, terminal_safe(host),
                terminal_safe(attached.record.detached.value("run_dir", std::string())),
                attached.record.detached.value("keep_for_s", 0LL));
  }
  observer.run_finished(attached.record);
  observer.batch_finished();
  if (auto forgotten = archive.forget_detached(run_id); !forgotten) {
    view.error(forgotten.error());
  }
  std::fflush(stdout);
  // `stop` did what it was asked: the run is recorded `interrupted`, and that is no failure.
  return stop && attached.record.status == RunStatus::interrupted ? ExitCode::ok
                                                                  : observer.exit_code();
}

// What `ps` says of one run, looked at on its host.
std::string host_state(Context& ctx, const HostTargets& ssh, const RunRecord& run)
{
  auto session = session_for(ctx, ssh, run);
  if (!session) {
    return "unreachable: " + session.error().message;
  }
  StagedRun staged;
  staged.run_dir = run.detached.value("run_dir", std::string());
  auto state = detached_state(**session, staged, run.detached.value("launcher_pid", 0LL));
  if (!state) {
    return "unknown: " + state.error().message;
  }
  switch (*state) {
  case DetachedState::gone:
    return expired_by_now(run) ? "expired" : "gone";
  case DetachedState::lost:
    return "lost: its launcher died without an exit status (killed, or the host restarted); "
           "`ferry attach` records it failed";
  case DetachedState::finished:
    return "finished";
  case DetachedState::running:
    break;
  }
  return "running";
}

Expected<ExitCode> list_detached(Context& ctx, const DetachedCommand& cmd)
{
  ctx.use_json(cmd.json);
  FERRY_TRY_ASSIGN(auto archive, Archive::open(ctx.archive_path()));
  FERRY_TRY_ASSIGN(const auto runs, archive.detached_runs());
  FERRY_TRY(ctx.user_config()); // read once, before the threads below use it
  // Every run looked at at once: a host that does not answer holds up only its own lines.
  std::vector<std::future<std::string>> states;
  states.reserve(runs.size());
  for (const auto& run : runs) {
    states.push_back(std::async(std::launch::async,
                                [&ctx, &cmd, &run] { return host_state(ctx, cmd.ssh, run); }));
  }
  Table table;
  table.header = {"RUN", "JOB", "HOST", "STARTED", "STATE"};
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const std::string state = terminal_safe(states[i].get());
    table.rows.push_back({runs[i].run_id, runs[i].job, terminal_safe(runs[i].host_label),
                          runs[i].started_at, state});
    table.objects.push_back({{"run_id", runs[i].run_id},
                             {"job", runs[i].job},
                             {"host", runs[i].host_label},
                             {"started_at", runs[i].started_at},
                             {"state", state.substr(0, state.find(':'))},
                             {"detail", state}});
  }
  if (runs.empty() && !cmd.json) {
    ctx.reporter().note("no detached runs wait for collection");
  } else {
    ctx.reporter().table(table);
  }
  return ExitCode::ok;
}

} // namespace

bool expired_by_now(const RunRecord& run)
{
  const long long most = run.options.value("timeout_s", 300LL) + run.options.value("grace_s", 2LL) +
                         run.detached.value("keep_for_s", 0LL);
  const auto started = seconds_since_utc(run.started_at);
  return started && *started > static_cast<double>(most);
}

void add_detached_commands(CLI::App& app, Context& ctx)
{
  for (const bool stop : {false, true}) {
    auto cmd = std::make_shared<DetachedCommand>();
    auto* sub = app.add_subcommand(
        stop ? "stop" : "attach",
        stop ? "Stop a detached run (TERM, KILL after the grace) and record it interrupted"
             : "Show a detached run's output so far and then live, and collect it when it ends");
    sub->add_option("RUN", cmd->run, "a detached run's id, a unique prefix of it, or last")
        ->required();
    sub->add_flag("--json", cmd->json, "print the final run record as one JSON line");
    add_ssh_options(*sub, cmd->ssh);
    on_chosen(*sub, ctx, [cmd, stop, &ctx] { return collect(ctx, *cmd, stop); });
  }
  auto cmd = std::make_shared<DetachedCommand>();
  auto* sub = app.add_subcommand(
      "ps", "List the detached runs not yet collected, with their state read from their hosts");
  sub->add_flag("--json", cmd->json, "print one JSON document");
  add_ssh_options(*sub, cmd->ssh);
  on_chosen(*sub, ctx, [cmd, &ctx] { return list_detached(ctx, *cmd); });
}

} // namespace ferry::cli
