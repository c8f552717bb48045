#include <atomic>
#include <mutex>
#include <thread>

#include "ferry/fleet.hpp"
#include "ferry/util.hpp"

namespace ferry {

void run_fleet(std::vector<std::unique_ptr<HostSession>>& sessions,
               const std::vector<PlannedRun>& runs, int parallel, const RunOptions& options,
               const FleetCallbacks& callbacks)
{
  std::mutex lock;
  FleetProgress progress;
  progress.total = sessions.size() * runs.size();
  std::atomic<std::size_t> next{0};

  auto report = [&](RunRecord& record, bool last_of_host) {
    std::lock_guard guard(lock);
    ++progress.done;
    if (record.status != RunStatus::ok) {
      ++progress.failed;
    }
    if (last_of_host) {
      --progress.running;
    }
    if (callbacks.on_done) {
      callbacks.on_done(record);
    }
    if (callbacks.on_progress) {
      callbacks.on_progress(progress);
    }
  };

  auto work = [&] {
    for (std::size_t i = next++; i < sessions.size(); i = next++) {
      HostSession& session = *sessions[i];
      {
        std::lock_guard guard(lock);
        ++progress.running;
        if (callbacks.on_progress) {
          callbacks.on_progress(progress);
        }
      }
      const auto start = std::chrono::steady_clock::now();
      auto connected = interrupt_requested()
                         ? Expected<void>(fail(ErrorKind::failed, "interrupted before connecting"))
                         : session.connect();
      const double connect_s = seconds_since(start);
      log_step(options, session.label(), "session", connected ? "connect" : "connect (failed)", connect_s);
      for (std::size_t r = 0; r < runs.size(); ++r) {
        const bool last = r + 1 == runs.size();
        RunRecord record;
        if (!connected) {
          const bool interrupted = interrupt_requested();
          record = unstarted_run(*runs[r].job, runs[r].params, session,
                                 interrupted ? RunStatus::interrupted : RunStatus::error,
                                 connected.error().message);
          record.unreachable = !interrupted && connected.error().kind == ErrorKind::unreachable;
          record.replay_of = options.replay_of;
        } else {
          record = run_job(session, *runs[r].job, runs[r].params, options);
        }
        if (r == 0) {
          record.timings.connect = connect_s;
          record.duration_s += connect_s;
        }
        report(record, last);
      }
      sessions[i].reset(); // disconnect as soon as this host is done
    }
  };

  const int workers = std::max(1, std::min<int>(parallel, static_cast<int>(sessions.size())));
  if (workers == 1) {
    work();
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(workers));
  for (int t = 0; t < workers; ++t) {
    threads.emplace_back(work);
  }
  for (auto& thread : threads) {
    thread.join();
  }
}

} // namespace ferry
