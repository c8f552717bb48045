#include "mcp/call.hpp"

#include <atomic>
#include <mutex>
#include <thread>

#include "ferry/text.hpp"

namespace ferry::mcp {

namespace {

// How many targets of one call run at once.
constexpr std::size_t k_parallel_targets = 8;

// The run failed before anything was staged: on a session that sat idle, that is a connection
// that died in the meantime, and a new one may well work.
bool never_started(const RunRecord& record)
{
  return record.status == RunStatus::error && record.timings.exec == 0 &&
         record.timings.upload == 0;
}

RunRecord not_connected(const CallSetup& setup, const Lease& lease)
{
  const bool stopped = setup.options.stop.stop_requested();
  RunRecord record =
      unstarted_run(*setup.job, setup.params, *lease.session,
                    stopped ? RunStatus::interrupted : RunStatus::error, lease.failed->message);
  record.unreachable = !stopped && lease.failed->kind == ErrorKind::unreachable;
  return record;
}

RunRecord run_on_target(HostPool& pool, const std::string& label, const CallSetup& setup,
                        const RunOptions& options)
{
  Lease lease = pool.borrow(label);
  RunRecord record = lease.failed ? not_connected(setup, lease)
                                  : run_job(*lease.session, *setup.job, setup.params, options);
  if (!lease.failed && lease.reused && never_started(record) && !options.stop.stop_requested()) {
    pool.reconnect(lease);
    record = lease.failed ? not_connected(setup, lease)
                          : run_job(*lease.session, *setup.job, setup.params, options);
  }
  record.timings.connect = lease.connect_s;
  record.duration_s += lease.connect_s;
  pool.give_back(label, std::move(lease), record.status != RunStatus::error);
  return record;
}

// Stores the run with the client that asked for it; false when the archive refused it.
bool archive_run(Archive* archive, RunRecord& record, const nlohmann::json& client)
{
  record.client = client;
  if (archive == nullptr) {
    return false;
  }
  auto stored = archive->record(record);
  if (!stored) {
    const std::string line =
        fmt::format("ferry mcp: error: {}\n", terminal_safe(stored.error().message));
    std::fwrite(line.data(), 1, line.size(), stderr);
    record.warnings.push_back(
        {{"code", "not-archived"},
         {"message", "the archive refused this run: " + stored.error().message}});
    return false;
  }
  return true;
}

} // namespace

CallOutcome run_call(HostPool& pool, Archive* archive, const CallSetup& setup,
                     RunObserver& observer)
{
  const std::size_t count = setup.targets.size();
  CallOutcome outcome{std::vector<RunRecord>(count), std::vector<bool>(count, false)};
  std::mutex lock; // observer calls never overlap
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next++; i < count; i = next++) {
      const std::string& label = setup.targets[i];
      {
        std::lock_guard guard(lock);
        observer.run_started(RunRef{label, setup.job->name});
      }
      RunOptions options = setup.options;
      options.on_output = [&, label](OutputStream stream, std::string_view bytes) {
        std::lock_guard guard(lock);
        observer.run_output(RunRef{label, setup.job->name}, stream, bytes);
      };
      RunRecord record = run_on_target(pool, label, setup, options);
      record.host_label = label;
      std::lock_guard guard(lock);
      outcome.archived[i] = archive_run(archive, record, setup.client);
      observer.run_finished(record);
      outcome.runs[i] = std::move(record);
    }
  };
  std::vector<std::thread> threads;
  for (std::size_t t = 1; t < std::min(count, k_parallel_targets); ++t) {
    threads.emplace_back(work);
  }
  work();
  for (auto& thread : threads) {
    thread.join();
  }
  return outcome;
}

} // namespace ferry::mcp
