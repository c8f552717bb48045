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

// One target's runs: its session, whether it connected, and whether it stayed healthy.
struct HostRun {
  HostRun(std::size_t target, Lease borrowed, std::string label, std::size_t runs)
      : index(target), lease(std::move(borrowed)), order(std::move(label), runs)
  {
  }
  std::size_t index;
  Lease lease;
  HostOrder order;
  Expected<void> connected;
  double connect_s = 0;
  std::atomic<bool> healthy{true};
  bool together = false; // its runs go all at once (SessionTraits::runs_together)
};

// The run failed before anything was staged: on a session kept from an earlier batch, that is a
// connection that died meanwhile, and a new one may well work.
bool never_started(const RunRecord& record)
{
  return record.status == RunStatus::error && record.timings.exec == 0 &&
         record.timings.upload == 0;
}

// The shared state of one fleet run: which host is next, the counts, and the one lock that
// keeps observer calls from overlapping.
class Fleet {
public:
  Fleet(SessionSource& sessions, const std::vector<PlannedRun>& runs, const RunOptions& options,
        RunObserver& observer, int parallel)
      : m_sessions(sessions), m_runs(runs), m_options(options), m_observer(observer),
        m_parallel(static_cast<std::size_t>(std::max(1, parallel))), m_slots(m_parallel)
  {
    m_progress.total = sessions.targets() * runs.size();
  }

  // A worker: takes hosts until none is left.
  void work()
  {
    for (std::size_t i = m_next++; i < m_sessions.targets(); i = m_next++) {
      run_host(i);
    }
  }

private:
  void run_host(std::size_t i)
  {
    {
      std::lock_guard guard(m_lock);
      ++m_progress.running;
      m_observer.progress(m_progress);
    }
    Lease lease = m_sessions.borrow(i, false);
    std::string label = m_sessions.label(i, *lease.session);
    HostRun host(i, std::move(lease), std::move(label), m_runs.size());
    // A kept session's first run goes alone: should the session have died while idle, it is
    // tried again on a new one before the others start.
    const bool kept = host.lease.connected;
    connect(host);
    std::size_t first = 0;
    if (kept && !m_runs.empty()) {
      run_one(host, 0, true);
      first = 1;
    }
    run_lanes(host, first);
    const bool healthy = host.connected && host.healthy;
    m_sessions.give_back(i, std::move(host.lease), healthy); // a batch's own session ends here
  }

  void connect(HostRun& host)
  {
    if (host.lease.connected) {
      host.connected = {};
      return;
    }
    HostSession& session = *host.lease.session;
    const auto start = std::chrono::steady_clock::now();
    host.connected = m_options.stop.stop_requested()
                         ? Expected<void>(fail(ErrorKind::failed, "interrupted before connecting"))
                         : session.connect();
    const double seconds = seconds_since(start);
    host.connect_s += seconds;
    host.lease.connected = static_cast<bool>(host.connected);
    // Some targets know their name only once connected (a Slurm allocation's job id and node).
    host.order.host = m_sessions.label(host.index, session);
    log_step(m_options, session.label(), "session", host.connected ? "connect" : "connect (failed)",
             seconds);
  }

  // Runs `first`.. of the host: they share its session, on as many channels at once as -j
  // allows (the session learns the server's own limit from a refused channel).
  void run_lanes(HostRun& host, std::size_t first)
  {
    HostSession& session = *host.lease.session;
    const std::size_t left = m_runs.size() - std::min(first, m_runs.size());
    host.together = host.connected && session.traits().runs_together;
    const std::size_t lanes = host.together ? std::max<std::size_t>(left, 1)
                              : host.connected && session.traits().concurrent_runs
                                  ? std::min(m_parallel, left)
                                  : 1;
    if (host.connected && !m_sessions.keeps_sessions()) {
      session.plan(m_runs.size(), lanes);
    }
    std::atomic<std::size_t> next{first};
    const auto lane = [&] {
      for (std::size_t r = next++; r < m_runs.size(); r = next++) {
        run_one(host, r, false);
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

  RunRecord attempt(HostRun& host, std::size_t r)
  {
    const PlannedRun& run = m_runs[r];
    HostSession& session = *host.lease.session;
    RunRecord record = host.connected
                           ? run_job(session, *run.job, run.params, with_output(host.order, r))
                           : not_connected(session, run, host.connected.error());
    // Asked again after the run: a Slurm run's name has its job id and node only once submitted.
    record.host_label = m_sessions.label(host.index, session);
    return record;
  }

  // `retry_dead`: the session was kept from before; a run that never started goes again on a
  // new session.
  void run_one(HostRun& host, std::size_t r, bool retry_dead)
  {
    if (!host.together) {
      m_slots.acquire(); // -j bounds the runs under way across all hosts
    }
    announce(host.order, r);
    RunRecord record = attempt(host, r);
    if (retry_dead && host.connected && never_started(record) && !m_options.stop.stop_requested()) {
      m_sessions.give_back(host.index, std::move(host.lease), false);
      host.lease = m_sessions.borrow(host.index, true);
      connect(host);
      record = attempt(host, r);
    }
    if (!host.together) {
      m_slots.release();
    }
    if (r == 0) {
      record.timings.connect = host.connect_s;
      record.duration_s += host.connect_s;
    }
    if (record.status == RunStatus::error) {
      host.healthy = false;
    }
    finished(host.order, r, std::move(record));
  }

  RunRecord not_connected(const HostSession& session, const PlannedRun& run, const Error& error)
  {
    const bool interrupted = m_options.stop.stop_requested();
    RunRecord record =
        unstarted_run(*run.job, run.params, session,
                      interrupted ? RunStatus::interrupted : RunStatus::error, error.message);
    record.unreachable = !interrupted && error.kind == ErrorKind::unreachable;
    if (record.unreachable) {
      record.failure =
          error.unreached == Unreached::none ? Unreached::unreachable : error.unreached;
    }
    record.replay_of = m_options.replay_of;
    record.options = recorded_options(m_options, *run.job);
    return record;
  }

  // The options for one run, its output passed to the observer as it arrives (or held while
  // earlier runs of its host are under way).
  RunOptions with_output(HostOrder& order, std::size_t r)
  {
    RunOptions options = m_options;
    options.on_output = [this, &order, r, host = order.host,
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
    options.on_note = [this, host = order.host, name = m_runs[r].job->name](std::string_view text) {
      std::lock_guard guard(m_lock);
      m_observer.run_note(RunRef{host, name}, text);
    };
    return options;
  }

  void announce(HostOrder& order, std::size_t r)
  {
    std::lock_guard guard(m_lock);
    if (r == order.head) {
      m_observer.run_started(RunRef{order.host, m_runs[r].job->name});
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

  SessionSource& m_sessions;
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

void run_fleet(SessionSource& sessions, const std::vector<PlannedRun>& runs, int parallel,
               const RunOptions& options, RunObserver& observer, std::vector<std::string> swept)
{
  Fleet fleet(sessions, runs, options, observer, parallel);
  const std::size_t targets = sessions.targets();
  observer.batch_started(BatchInfo{targets * runs.size(), targets, std::move(swept)});
  const int workers = std::max(1, std::min<int>(parallel, static_cast<int>(targets)));
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

void run_fleet(std::vector<std::unique_ptr<HostSession>>& sessions,
               const std::vector<PlannedRun>& runs, int parallel, const RunOptions& options,
               RunObserver& observer, std::vector<std::string> swept)
{
  SessionList list(sessions);
  run_fleet(list, runs, parallel, options, observer, std::move(swept));
}

} // namespace ferry
