// The fleet against a fake session that takes several runs at once and ends them in the
// reverse of their order: records and output must still come out whole and in plan order.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "ferry/fleet.hpp"
#include "ferry/run_record.hpp"
#include "ferry/runner.hpp"
#include "stub_session.hpp"

using namespace ferry;
using nlohmann::json;

namespace {

constexpr int k_runs = 4;
constexpr std::chrono::seconds k_bound{10};

class ReversingSession final : public testing::StubSession<HostSession> {
public:
  ReversingSession(bool concurrent, int& peak) : m_concurrent(concurrent), m_peak(peak) {}
  SessionTraits traits() const override { return {m_concurrent}; }
  Expected<StagedRun> stage(const RunBundle& bundle, const StopToken& stop) override
  {
    StagedRun run;
    run.run_dir = fmt::format("/base/ferry-{}", m_dirs++);
    run.stop = stop;
    const auto at = bundle.job_bytes.find("index=");
    if (at != std::string::npos) {
      const std::lock_guard lock(m_mutex);
      m_index[run.run_dir] = bundle.job_bytes[at + 6] - '0';
    }
    return run;
  }
  Expected<ExecOutcome> launch(StagedRun& run, const LaunchRequest& request) override
  {
    std::unique_lock lock(m_mutex);
    const int index = m_index.at(run.run_dir);
    ++m_running;
    m_peak = std::max(m_peak, m_running);
    // Concurrently: once all runs are under way, run i ends only after every later run has,
    // the reverse of the plan. The waits are bounded, so a fleet that does not run them at once
    // fails the checks below instead of hanging.
    if (m_concurrent) {
      m_changed.notify_all();
      m_changed.wait_for(lock, k_bound, [&] { return m_running == k_runs || m_ended > 0; });
      m_changed.wait_for(lock, k_bound, [&] { return m_ended == k_runs - 1 - index; });
    }
    lock.unlock();
    request.on_output(OutputStream::out, fmt::format("run {} line 1\n", index));
    request.on_output(OutputStream::out, fmt::format("run {} line 2\n", index));
    lock.lock();
    --m_running;
    ++m_ended;
    m_changed.notify_all();
    ExecOutcome outcome;
    outcome.exit_code = 0;
    outcome.out.saw_sentinel = true;
    outcome.err.saw_sentinel = true;
    outcome.out.launcher_report = "0 exit\nresult none\nclean removed\n";
    return outcome;
  }

private:
  bool m_concurrent;
  std::atomic<int> m_dirs{0};
  std::mutex m_mutex;
  std::condition_variable m_changed;
  std::map<std::string, int> m_index;
  int m_running = 0;
  int& m_peak;
  int m_ended = 0;
};

class Log final : public RunObserver {
public:
  void run_started(const RunRef& run) override
  {
    events.push_back(fmt::format("start {}", run.job));
  }
  void run_output(const RunRef&, OutputStream, std::string_view bytes) override
  {
    events.emplace_back(bytes);
  }
  void run_finished(RunRecord& record) override
  {
    events.push_back(fmt::format("end {} {}", record.job, to_string(record.status)));
  }
  std::vector<std::string> events;
};

} // namespace

TEST_CASE("runs of one host at once still report whole and in plan order", "[fleet]")
{
  std::vector<Job> jobs;
  for (int i = 0; i < k_runs; ++i) {
    auto job = parse_job(fmt::format("j{}", i), fmt::format("j{}.py", i), "j.py",
                         fmt::format("# /// ferry\n# interpreter = \"python3\"\n# result = "
                                     "\"optional\"\n# ///\n# index={}\n",
                                     i));
    REQUIRE(job);
    jobs.push_back(std::move(job).value());
  }
  std::vector<PlannedRun> runs;
  for (const auto& job : jobs) {
    runs.push_back({&job, json::object()});
  }
  std::vector<std::string> expected;
  for (int i = 0; i < k_runs; ++i) {
    expected.push_back(fmt::format("start j{}", i));
    expected.push_back(fmt::format("run {} line 1\n", i));
    expected.push_back(fmt::format("run {} line 2\n", i));
    expected.push_back(fmt::format("end j{} ok", i));
  }
  for (const bool concurrent : {true, false}) {
    INFO("concurrent: " << concurrent);
    int peak = 0;
    std::vector<std::unique_ptr<HostSession>> sessions;
    sessions.push_back(std::make_unique<ReversingSession>(concurrent, peak));
    Log log;
    run_fleet(sessions, runs, k_runs, RunOptions{}, log);
    CHECK(log.events == expected);
    // A session that takes runs at once gets them all at once (-j allows 4); one that does not,
    // one at a time.
    CHECK(peak == (concurrent ? k_runs : 1));
  }
}

namespace {

// A session that runs every job at once, fine; or, `dead`, one whose connection went while it
// sat idle: nothing can be staged on it.
class PlainSession final : public testing::StubSession<HostSession> {
public:
  explicit PlainSession(bool dead) : m_dead(dead) {}
  Expected<void> connect() override
  {
    ++connects;
    if (connect_error) {
      return Unexpected{*connect_error};
    }
    return {};
  }
  Expected<StagedRun> stage(const RunBundle&, const StopToken& stop) override
  {
    if (m_dead) {
      return fail(ErrorKind::failed, "h: the connection was closed by the server");
    }
    StagedRun run;
    run.run_dir = "/base/ferry-run";
    run.stop = stop;
    return run;
  }
  Expected<ExecOutcome> launch(StagedRun&, const LaunchRequest&) override
  {
    ExecOutcome outcome;
    outcome.exit_code = 0;
    outcome.out.saw_sentinel = true;
    outcome.err.saw_sentinel = true;
    outcome.out.launcher_report = "0 exit\nresult none\nclean removed\n";
    return outcome;
  }

  int connects = 0;
  std::optional<Error> connect_error;

private:
  bool m_dead;
};

// A source that keeps its sessions, as a server's pool does: it lends `kept` first (connected
// by an earlier batch), a new session when asked for a fresh one, and notes what comes back.
class KeptSource final : public SessionSource {
public:
  explicit KeptSource(bool kept_is_dead) : m_kept_is_dead(kept_is_dead) {}
  std::size_t targets() const override { return 1; }
  Lease borrow(std::size_t, bool fresh) override
  {
    borrows.push_back(fresh ? "fresh" : "kept");
    if (fresh) {
      return {std::make_unique<PlainSession>(false), false};
    }
    return {std::make_unique<PlainSession>(m_kept_is_dead), true};
  }
  void give_back(std::size_t, Lease lease, bool healthy) override
  {
    const auto& session = dynamic_cast<const PlainSession&>(*lease.session);
    given_back.push_back(
        fmt::format("{} connects={}", healthy ? "healthy" : "dropped", session.connects));
  }
  std::string label(std::size_t, const HostSession&) const override { return "target-a"; }
  bool keeps_sessions() const override { return true; }

  std::vector<std::string> borrows;
  std::vector<std::string> given_back;

private:
  bool m_kept_is_dead;
};

std::vector<Job> plain_jobs(int count)
{
  std::vector<Job> jobs;
  for (int i = 0; i < count; ++i) {
    auto job = parse_job(fmt::format("p{}", i), fmt::format("p{}.sh", i), "p.sh",
                         "# /// ferry\n# interpreter = \"sh\"\n# result = \"optional\"\n# ///\n");
    REQUIRE(job);
    jobs.push_back(std::move(job).value());
  }
  return jobs;
}

} // namespace

TEST_CASE("a kept session that died while idle is replaced for its first run", "[fleet]")
{
  const auto jobs = plain_jobs(3);
  std::vector<PlannedRun> runs;
  for (const auto& job : jobs) {
    runs.push_back({&job, json::object()});
  }
  for (const bool dead : {true, false}) {
    INFO("the kept session is dead: " << dead);
    KeptSource source(dead);
    Log log;
    run_fleet(source, runs, 4, RunOptions{}, log);
    CHECK(log.events == std::vector<std::string>{"start p0", "end p0 ok", "start p1", "end p1 ok",
                                                 "start p2", "end p2 ok"});
    if (dead) {
      // The dead one goes back dropped; the new one is connected once and kept after the runs.
      CHECK(source.borrows == std::vector<std::string>{"kept", "fresh"});
      CHECK(source.given_back ==
            std::vector<std::string>{"dropped connects=0", "healthy connects=1"});
    } else {
      CHECK(source.borrows == std::vector<std::string>{"kept"});
      CHECK(source.given_back == std::vector<std::string>{"healthy connects=0"});
    }
  }
}

TEST_CASE("a batch's own session is not tried again, and runs go by the source's label", "[fleet]")
{
  const auto jobs = plain_jobs(1);
  const std::vector<PlannedRun> runs = {{&jobs[0], json::object()}};
  std::vector<std::unique_ptr<HostSession>> sessions;
  sessions.push_back(std::make_unique<PlainSession>(true));
  std::vector<std::string> labels;
  struct Labels final : RunObserver {
    std::vector<std::string>& seen;
    explicit Labels(std::vector<std::string>& s) : seen(s) {}
    void run_finished(RunRecord& record) override
    {
      seen.push_back(record.host_label + " " + std::string(to_string(record.status)));
    }
  } observer(labels);
  run_fleet(sessions, runs, 1, RunOptions{}, observer);
  CHECK(labels == std::vector<std::string>{"h error"});
  KeptSource source(true);
  run_fleet(source, runs, 1, RunOptions{}, observer);
  CHECK(labels == std::vector<std::string>{"h error", "target-a ok"});
}

TEST_CASE("a host not reached gets its class in the record and in its JSON", "[fleet]")
{
  const auto jobs = plain_jobs(1);
  const std::vector<PlannedRun> runs = {{&jobs[0], json::object()}};
  std::vector<std::unique_ptr<HostSession>> sessions;
  for (const auto& error : {Error{ErrorKind::unreachable, "h: auth", Unreached::auth},
                            Error{ErrorKind::unreachable, "h: unclassified"},
                            Error{ErrorKind::failed, "h: not a reach failure"}}) {
    auto session = std::make_unique<PlainSession>(false);
    session->connect_error = error;
    sessions.push_back(std::move(session));
  }
  sessions.push_back(std::make_unique<PlainSession>(false));
  std::vector<RunRecord> records;
  struct Keep final : RunObserver {
    std::vector<RunRecord>& kept;
    explicit Keep(std::vector<RunRecord>& k) : kept(k) {}
    void run_finished(RunRecord& record) override { kept.push_back(record); }
  } observer(records);
  run_fleet(sessions, runs, 1, RunOptions{}, observer);
  REQUIRE(records.size() == 4);
  std::vector<std::string> failures;
  for (const auto& record : records) {
    const json j = to_json(record);
    failures.push_back(j.value("failure", "-"));
    auto back = run_record_from_json(j);
    REQUIRE(back);
    CHECK(back.value().failure == record.failure);
  }
  // A connect error without a class is "unreachable"; a run not stopped by its host has none.
  CHECK(failures == std::vector<std::string>{"auth", "unreachable", "-", "-"});
  CHECK(records[0].unreachable);
  CHECK_FALSE(records[2].unreachable);
}
