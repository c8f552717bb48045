#include "ferry/fleet.hpp"

#include <atomic>
#include <mutex>
#include <thread>

#include "ferry/util.hpp"

namespace ferry {

namespace {

// The shared state of one fleet run: which host is next, the counts, and the one lock that
// keeps observer calls from overlapping.
class Fleet {
public:
  Fleet(std::vector<std::unique_ptr<HostSession>>& sessions, const std::vector<PlannedRun>& runs,
        const RunOptions& options, RunObserver& observer)
      : m_sessions(sessions), m_runs(runs), m_options(options), m_observer(observer)
  {
    m_progress.total = sessions.size() * runs.size();
  }

  // A worker: takes hosts until none is left.
  void work()
  {
    for (std::size_t i = m_next++; i < m_sessions.size(); i = m_next++) {
      run_host(*m_sessions[i]);
      m_sessions[i].reset(); // disconnect as soon as this host is done
    }
  }

private:
  void run_host(HostSession& session)
  {
    {
      std::lock_guard guard(m_lock);
      ++m_progress.running;
      m_observer.progress(m_progress);
    }
    const auto start = std::chrono::steady_clock::now();
    auto connected = m_options.stop.stop_requested()
                         ? Expected<void>(fail(ErrorKind::failed, "interrupted before connecting"))
                         : session.connect();
    const double connect_s = seconds_since(start);
    log_step(m_options, session.label(), "session", connected ? "connect" : "connect (failed)",
             connect_s);
    for (std::size_t r = 0; r < m_runs.size(); ++r) {
      announce(session, *m_runs[r].job);
      RunRecord record = connected ? run_job(session, *m_runs[r].job, m_runs[r].params,
                                             with_output(session, *m_runs[r].job))
                                   : not_connected(session, m_runs[r], connected.error());
      if (r == 0) {
        record.timings.connect = connect_s;
        record.duration_s += connect_s;
      }
      report(record, r + 1 == m_runs.size());
    }
  }

  RunRecord not_connected(const HostSession& session, const PlannedRun& run, const Error& error)
  {
    const bool interrupted = m_options.stop.stop_requested();
    RunRecord record =
        unstarted_run(*run.job, run.params, session,
                      interrupted ? RunStatus::interrupted : RunStatus::error, error.message);
    record.unreachable = !interrupted && error.kind == ErrorKind::unreachable;
    record.replay_of = m_options.replay_of;
    record.options = recorded_options(m_options, *run.job);
    return record;
  }

  // The options for one run, its output passed to the observer as it arrives.
  RunOptions with_output(const HostSession& session, const Job& job)
  {
    RunOptions options = m_options;
    options.on_output = [this, host = session.label(), name = job.name](OutputStream stream,
                                                                        std::string_view bytes) {
      std::lock_guard guard(m_lock);
      m_observer.run_output(RunRef{host, name}, stream, bytes);
    };
    options.on_note = [this, host = session.label(), name = job.name](std::string_view text) {
      std::lock_guard guard(m_lock);
      m_observer.run_note(RunRef{host, name}, text);
    };
    return options;
  }

  void announce(const HostSession& session, const Job& job)
  {
    const std::string label = session.label();
    std::lock_guard guard(m_lock);
    m_observer.run_started(RunRef{label, job.name});
  }

  void report(RunRecord& record, bool last_of_host)
  {
    std::lock_guard guard(m_lock);
    ++m_progress.done;
    if (record.status != RunStatus::ok) {
      ++m_progress.failed;
    }
    if (last_of_host) {
      --m_progress.running;
    }
    m_observer.run_finished(record);
    m_observer.progress(m_progress);
  }

  std::vector<std::unique_ptr<HostSession>>& m_sessions;
  const std::vector<PlannedRun>& m_runs;
  const RunOptions& m_options;
  RunObserver& m_observer;
  std::mutex m_lock;
  FleetProgress m_progress;
  std::atomic<std::size_t> m_next{0};
};

} // namespace

void run_fleet(std::vector<std::unique_ptr<HostSession>>& sessions,
               const std::vector<PlannedRun>& runs, int parallel, const RunOptions& options,
               RunObserver& observer, std::vector<std::string> swept)
{
  Fleet fleet(sessions, runs, options, observer);
  observer.batch_started(
      BatchInfo{sessions.size() * runs.size(), sessions.size(), std::move(swept)});
  const int workers = std::max(1, std::min<int>(parallel, static_cast<int>(sessions.size())));
  if (workers == 1) {
    fleet.work();
  } else {
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(workers));
    for (int t = 0; t < workers; ++t) {
      threads.emplace_back([&fleet] { fleet.work(); });
    }
    for (auto& thread : threads) {
      thread.join();
    }
  }
  observer.batch_finished();
}

} // namespace ferry
