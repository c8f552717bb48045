// The holder's preparers (src/transport/held/held_host.hpp): a host's start and idle work waits
// while other hosts' requests are under way (a fan-out), and goes as soon as they are done; the
// next run's channel after a run never waits.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>

#include "ferry/sessions.hpp"
#include "transport/held/held_host.hpp"

using namespace ferry;
using namespace std::chrono_literals;

namespace {

// Counts what the pool asks of it; nothing else of a session is used by the pool.
class CountingConnection final : public SshConnection {
public:
  std::atomic<int> ahead{0};
  std::atomic<int> interpreter{0};
  std::atomic<int> idle{0};

  [[nodiscard]] nlohmann::json target() const override { return {}; }
  [[nodiscard]] std::string label() const override { return "counting"; }
  Expected<void> connect() override { return {}; }
  Expected<StagedRun> stage(const RunBundle&, const StopToken&) override { return StagedRun{}; }
  Expected<ExecOutcome> launch(StagedRun&, const LaunchRequest&) override { return ExecOutcome{}; }
  Expected<FetchedFile> fetch(const StagedRun&, const std::string&, const ChunkSink&,
                              std::uint64_t) override
  {
    return FetchedFile{};
  }
  Expected<std::optional<std::vector<DirEntry>>> list(const StagedRun&, const std::string&) override
  {
    return std::optional<std::vector<DirEntry>>();
  }
  Expected<void> finish(StagedRun&, Finish) override { return {}; }
  [[nodiscard]] std::string options_identity() const override { return "counting"; }
  bool alive() override { return true; }
  Expected<void> recheck_host_key() override { return {}; }
  void prepare_ahead() override { ++ahead; }
  void prepare_interpreter() override { ++interpreter; }
  void prepare_idle() override { ++idle; }
};

struct Host {
  std::shared_ptr<held::HeldHost> held;
  CountingConnection* session = nullptr;
};

Host make_host(const std::string& name)
{
  Host host;
  host.held = std::make_shared<held::HeldHost>(name, name, "2026-12-05T00:00:00Z");
  auto session = std::make_unique<CountingConnection>();
  host.session = session.get();
  host.held->session = std::move(session);
  host.held->state = held::HeldHost::State::ready;
  return host;
}

// Waits up to 5 s for `done`.
template <typename F> bool eventually(F done)
{
  for (int i = 0; i < 500 && !done(); ++i) {
    std::this_thread::sleep_for(10ms);
  }
  return done();
}

// A request under way, as serve_host_client counts it: on its host and on the pool.
struct Request {
  Request(held::PreparePool& pool, held::HeldHost& host) : m_pool(pool), m_host(host)
  {
    ++m_host.requests;
    ++m_pool.requests();
  }
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request()
  {
    --m_host.requests;
    --m_pool.requests();
  }

private:
  held::PreparePool& m_pool;
  held::HeldHost& m_host;
};

} // namespace

TEST_CASE("holder: a host's start work waits while another host's request is under way", "[held]")
{
  held::PreparePool pool(3);
  Host busy = make_host("busy");
  Host first = make_host("first");
  {
    const Request fan_out(pool, *busy.held);
    pool.want(first.held, held::PreparePool::Wish::start);
    pool.want(first.held, held::PreparePool::Wish::idle);
    std::this_thread::sleep_for(300ms);
    CHECK(first.session->ahead == 0);
    CHECK(first.session->interpreter == 0);
    CHECK(first.session->idle == 0);
  }
  REQUIRE(eventually([&] { return first.session->ahead > 0 && first.session->idle > 0; }));
  pool.stop();
}

TEST_CASE("holder: a host's own request does not hold its start work back", "[held]")
{
  held::PreparePool pool(3);
  Host only = make_host("only");
  const Request run(pool, *only.held); // a single host's loop of runs
  pool.want(only.held, held::PreparePool::Wish::start);
  REQUIRE(eventually([&] { return only.session->interpreter > 0; }));
  CHECK(only.session->ahead > 0);
  pool.stop();
}

TEST_CASE("holder: the next run's channel after a run never waits for other hosts", "[held]")
{
  held::PreparePool pool(3);
  Host busy = make_host("busy");
  Host next = make_host("next");
  const Request fan_out(pool, *busy.held);
  pool.want(next.held, held::PreparePool::Wish::standby);
  REQUIRE(eventually([&] { return next.session->ahead > 0; }));
  CHECK(next.session->interpreter == 0);
  pool.stop();
}
