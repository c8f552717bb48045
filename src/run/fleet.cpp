#include "ferry/fleet.hpp"

#include <atomic>
#include <mutex>
#include <optional>
#include <semaphore>
#include <thread>
#include <utility>
#include <vector>

#include "ferry/util.hpp"

namespace ferry {

namespace {

// The events of one host's runs, passed on in plan order although the runs may run at once on
// channels of the host's session: the earliest unfinished run's events go through as they come;
// a later run's are held (its output up to twice the output cap) until every run before it has
// finished. So output blocks stay whole and in the order of the plan.
struct HostOrder {
  struct Held {
    bool started = false;
    std::vector<std::pair<OutputStream, std::string>> output;
    std::size_t output_bytes = 0;
    std::optional<RunRecord> record;
  };
  HostOrder(std::string host_label, std::size_t runs) : host(std::move(host_label)), held(runs) {}
  std::string host;
  std::vector<Held> held;
  std::size_t head = 0; // the run whose events pass through
};

// The shared state of one fleet run: which host is next, the counts, and the one lock that
// keeps observer calls from overlapping.
class Fleet {
public:
  Fleet(std::vector<std::unique_ptr<HostSession>>& sessions, const std::vector<PlannedRun>& runs,
        const RunOptions& options, RunObserver& observer, int parallel)
      : m_sessions(sessions), m_runs(runs), m_options(options), m_observer(observer),
        m_parallel(static_cast<std::size_t>(std::max(1, parallel))), m_slots(m_parallel)
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
    // A host's runs share its session, on as many channels at once as -j allows (the session
    // learns the server's own limit from a refused channel).
    const std::size_t lanes =
        connected && session.traits().concurrent_runs ? std::min(m_parallel, m_runs.size()) : 1;
    if (connected) {
      session.plan(m_runs.size(), lanes);
    }
    HostOrder order(session.label(), m_runs.size());
    std::atomic<std::size_t> next{0};
    const auto lane = [&] {
      for (std::size_t r = next++; r < m_runs.size(); r = next++) {
        run_one(session, order, r, connected, connect_s);
      }
    };
    std::vector<std::thread> others;
    for (std::size_t l = 1; l < lanes; ++l) {
      others.emplace_back(lane);
    }
    lane();
    for (auto& thread : others) {
      thread.join();
    }
  }

  void run_one(HostSession& session, HostOrder& order, std::size_t r,
               const Expected<void>& connected, double connect_s)
  {
    const PlannedRun& run = m_runs[r];
    m_slots.acquire(); // -j bounds the runs under way across all hosts
    announce(session, order, r);
    RunRecord record = connected
                           ? run_job(session, *run.job, run.params, with_output(session, order, r))
                           : not_connected(session, run, connected.error());
    m_slots.release();
    if (r == 0) {
      record.timings.connect = connect_s;
      record.duration_s += connect_s;
    }
    finished(order, r, std::move(record));
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

  // The options for one run, its output passed to the observer as it arrives (or held while
  // earlier runs of its host are under way).
  RunOptions with_output(const HostSession& session, HostOrder& order, std::size_t r)
  {
    RunOptions options = m_options;
    options.on_output = [this, &order, r, host = session.label(),
                         name = m_runs[r].job->name](OutputStream stream, std::string_view bytes) {
      std::lock_guard guard(m_lock);
      if (r == order.head) {
        m_observer.run_output(RunRef{host, name}, stream, bytes);
        return;
      }
      HostOrder::Held& held = order.held[r];
      if (held.output_bytes + bytes.size() <= 2 * m_options.output_cap) {
        held.output_bytes += bytes.size();
        held.output.emplace_back(stream, std::string(bytes));
      }
    };
    options.on_note = [this, host = session.label(),
                       name = m_runs[r].job->name](std::string_view text) {
      std::lock_guard guard(m_lock);
      m_observer.run_note(RunRef{host, name}, text);
    };
    return options;
  }

  void announce(const HostSession& session, HostOrder& order, std::size_t r)
  {
    const std::string label = session.label();
    std::lock_guard guard(m_lock);
    if (r == order.head) {
      m_observer.run_started(RunRef{label, m_runs[r].job->name});
    } else {
      order.held[r].started = true;
    }
  }

  // Run r ended: its record, and those of the runs after it that ended meanwhile, are passed on
  // in plan order; the next unfinished run's held events go through and it becomes the head.
  void finished(HostOrder& order, std::size_t r, RunRecord record)
  {
    std::lock_guard guard(m_lock);
    order.held[r].record = std::move(record);
    while (order.head < order.held.size() && order.held[order.head].record) {
      report(*order.held[order.head].record, order.head + 1 == order.held.size());
      order.held[order.head] = HostOrder::Held{};
      if (++order.head < order.held.size()) {
        pass_on_held(order);
      }
    }
  }

  // The new head's events so far, in the order they came.
  void pass_on_held(HostOrder& order)
  {
    HostOrder::Held& held = order.held[order.head];
    const RunRef ref{order.host, m_runs[order.head].job->name};
    if (held.started) {
      m_observer.run_started(ref);
    }
    for (const auto& [stream, bytes] : held.output) {
      m_observer.run_output(ref, stream, bytes);
    }
    held.output.clear();
    held.output_bytes = 0;
  }

  void report(RunRecord& record, bool last_of_host)
  {
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
  std::size_t m_parallel;
  std::counting_semaphore<> m_slots;
  std::mutex m_lock;
  FleetProgress m_progress;
  std::atomic<std::size_t> m_next{0};
};

} // namespace

void run_fleet(std::vector<std::unique_ptr<HostSession>>& sessions,
               const std::vector<PlannedRun>& runs, int parallel, const RunOptions& options,
               RunObserver& observer, std::vector<std::string> swept)
{
  Fleet fleet(sessions, runs, options, observer, parallel);
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
