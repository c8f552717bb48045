#include "run/detached_runs.hpp"

#include <vector>

#include "ferry/text.hpp"
#include "ferry/util.hpp"

namespace ferry {

using nlohmann::json;

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

bool expired_by_now(const RunRecord& run)
{
  const long long most = run.options.value("timeout_s", 300LL) + run.options.value("grace_s", 2LL) +
                         run.detached.value("keep_for_s", 0LL);
  const auto started = seconds_since_utc(run.started_at);
  return started && *started > static_cast<double>(most);
}

std::string host_state(const DetachedSessionFor& session_for, const RunRecord& run)
{
  auto session = session_for(run);
  if (!session) {
    return "unreachable: " + session.error().message;
  }
  auto state =
      detached_state(**session, detached_staged(run), run.detached.value("launcher_pid", 0LL));
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

Expected<Attached> collect_detached(Archive& archive, HostSession& session, const Job& job,
                                    RunRecord running, const CollectRequest& request,
                                    RunObserver& observer)
{
  const std::string host = running.host_label;
  const std::string job_name = running.job;
  observer.batch_started({1, 1, {}});
  observer.run_started({host, job_name});
  RunOptions options = options_of(running, request.verbose);
  options.stop = request.interrupt;
  if (request.show_output) {
    options.on_output = [&observer, &host, &job_name](OutputStream stream, std::string_view bytes) {
      observer.run_output({host, job_name}, stream, bytes);
    };
  }
  options.on_note = [&observer, &host, &job_name](std::string_view text) {
    observer.run_note({host, job_name}, text); // a scheduler's: the job pending
  };
  const std::string run_id = running.run_id;
  FERRY_TRY_ASSIGN(Attached attached,
                   attach_run(session, job, std::move(running), options, request.stop));
  if (attached.end == Attached::End::detached) {
    return attached;
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
  if (auto forgotten = archive.forget_detached(run_id); !forgotten && request.on_error) {
    request.on_error(forgotten.error());
  }
  return attached;
}

} // namespace ferry
