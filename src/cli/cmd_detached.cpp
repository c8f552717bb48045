// Detached runs (docs/cli.md, "ferry attach", "ferry stop", "ferry ps"): `run --detach` starts
// them, these commands find them in the archive, follow or stop them on their host, and collect
// them as runs that were never detached (the work itself: src/run/detached_runs.hpp).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <map>

#include "cli/cli.hpp"
#include "cli/detached.hpp"
#include "cli/execute.hpp"
#include "cli/slurm_cli.hpp"
#include "ferry/held.hpp"
#include "ferry/runner.hpp"
#include "ferry/sessions.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"
#include "run/archiving.hpp"
#include "run/detached_runs.hpp"

namespace ferry::cli {

using nlohmann::json;

namespace {

struct DetachedCommand {
  std::string run;
  HostTargets ssh;
  bool json = false;
};

// A new session to the run's target: this machine, or its SSH host as the record names it, with
// the SSH options given now: the session the connection holder keeps for those options when it
// keeps one (a host held by `ferry connect`: no second factor asked again), else a direct
// connection (none is held for attach alone; --persist 0 always connects directly).
Expected<std::unique_ptr<HostSession>> session_for(Context& ctx, const HostTargets& ssh,
                                                   const RunRecord& run)
{
  if (run.target.value("local", false)) {
    return make_local_session(LocalTarget{});
  }
  FERRY_TRY_ASSIGN(auto slurm, detached_slurm_session(ctx, ssh, run));
  if (slurm) {
    return slurm; // its login node, following its job
  }
  FERRY_TRY_ASSIGN(const UserConfig* config, ctx.user_config());
  const SshTarget target = ferry::ssh_target_for(ssh, *config, run.host_label, ctx.global.verbose);
  FERRY_TRY_ASSIGN(auto direct, make_checked_ssh_session(target));
  FERRY_TRY_ASSIGN(const int persist_s, persist_for(ssh, *config, run.host_label));
  std::unique_ptr<HostSession> session =
      persist_s > 0 ? make_held_or_direct_session(std::move(direct), target) : std::move(direct);
  FERRY_TRY(session->connect());
  return session;
}

// Follows the run to its end and collects it (or stops it first); the final record goes into
// the archive in place of the detached one.
Expected<ExitCode> collect_run(Context& ctx, const DetachedCommand& cmd, bool stop)
{
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
  // The final record another collector archived: shown, tallied, not archived again.
  ArchivingObserver shown_only(ArchivingSettings{}, view);
  CollectRequest request;
  request.stop = stop;
  request.show_output = !stop;
  request.verbose = ctx.global.verbose;
  request.on_error = [&view](const Error& error) { view.error(error); };
  request.view = &shown_only;
  const std::string run_id = running.run_id;
  FERRY_TRY_ASSIGN(const Collected collected,
                   collect_detached(archive, *session, job, std::move(running), request, observer));
  const Attached& attached = collected.attached;
  if (attached.end == Attached::End::detached) {
    view.note(
        fmt::format("detached from run {}; it goes on (`ferry attach {}` again)", run_id, run_id));
    return ExitCode::interrupted;
  }
  std::fflush(stdout);
  // `stop` did what it was asked: the run is recorded `interrupted`, and that is no failure.
  if (stop && attached.record.status == RunStatus::interrupted) {
    return ExitCode::ok;
  }
  return collected.by_another ? shown_only.exit_code() : observer.exit_code();
}

// Ctrl-C (or SIGTERM) before the run is followed, while connecting, leaves it as after: it goes on.
// Any other failure (a lost connection) loses nothing either: the error says so.
Expected<ExitCode> collect(Context& ctx, const DetachedCommand& cmd, bool stop)
{
  install_interrupt_handlers();
  auto collected = collect_run(ctx, cmd, stop);
  if (!collected && interrupt_requested()) {
    ctx.reporter().note(fmt::format("interrupted ({}); run {} goes on (`ferry {} {}` again)",
                                    collected.error().message, terminal_safe(cmd.run),
                                    stop ? "stop" : "attach", terminal_safe(cmd.run)));
    return ExitCode::interrupted;
  }
  if (!collected && collected.error().kind != ErrorKind::usage) {
    Error error = collected.error();
    error.message +=
        fmt::format("; run {} was not collected and stays in `ferry ps` (`ferry {} {}` "
                    "again)",
                    terminal_safe(cmd.run), stop ? "stop" : "attach", terminal_safe(cmd.run));
    return Unexpected{std::move(error)};
  }
  return collected;
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
    states.push_back(std::async(std::launch::async, [&ctx, &cmd, &run] {
      if (auto slurm = detached_slurm_ps(ctx, cmd.ssh, run)) {
        return *slurm; // its job as the scheduler tells it
      }
      return host_state([&](const RunRecord& r) { return session_for(ctx, cmd.ssh, r); }, run);
    }));
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
