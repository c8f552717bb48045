// The holder's preparer threads (docs/persistence.md, "A host's first run through the holder"):
// a host's start work waits while other hosts' first runs are under way, and goes once they have
// ended; other work never waits for them.
#include <atomic>
#include <functional>
#include <future>
#include <thread>

#include <catch2/catch.hpp>

#include "stub_session.hpp"
#include "transport/held/held_host.hpp"

using namespace ferry;
using namespace std::chrono_literals;

namespace {

// Counts what the pool asks of it; connects nowhere.
class CountingSession final : public testing::StubSession<SshConnection> {
public:
  explicit CountingSession(std::atomic<int>& prepared) : m_prepared(prepared) {}
  std::string options_identity() const override { return "h"; }
  bool alive() override { return true; }
  Expected<void> recheck_host_key() override { return {}; }
  void prepare_ahead() override { ++m_prepared; }

private:
  std::atomic<int>& m_prepared;
};

std::shared_ptr<held::HeldHost> host_counting(std::atomic<int>& prepared)
{
  auto host = std::make_shared<held::HeldHost>("key", "h", "2026-12-06T00:00:00Z");
  host->session = std::make_unique<CountingSession>(prepared);
  return host;
}

// Its preparing step waits until the test lets it go; says when it is torn down.
class HeldUpSession final : public testing::StubSession<SshConnection> {
public:
  HeldUpSession(std::promise<void>& started, std::shared_future<void> go,
                std::function<void()> on_teardown)
      : m_started(started), m_go(std::move(go)), m_on_teardown(std::move(on_teardown))
  {
  }
  HeldUpSession(const HeldUpSession&) = delete;
  HeldUpSession& operator=(const HeldUpSession&) = delete;
  ~HeldUpSession() override { m_on_teardown(); }
  std::string options_identity() const override { return "h"; }
  bool alive() override { return true; }
  Expected<void> recheck_host_key() override { return {}; }
  void prepare_ahead() override
  {
    if (!m_told) {
      m_told = true;
      m_started.set_value();
    }
    m_go.wait();
  }

private:
  std::promise<void>& m_started;
  std::shared_future<void> m_go;
  std::function<void()> m_on_teardown;
  bool m_told = false;
};

// Whether `count` reaches `at_least` within 10 s.
bool reaches(const std::atomic<int>& count, int at_least)
{
  for (int i = 0; i < 1000 && count < at_least; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  return count >= at_least;
}

} // namespace

TEST_CASE("a host's start work waits for the first runs under way, then goes", "[prepare_pool]")
{
  held::PreparePool pool(3);
  std::atomic<int> prepared{0};
  auto host = host_counting(prepared);
  pool.first_run_began(); // another host's first run
  pool.first_run_began(); // and a third's
  pool.want(host, held::PreparePool::Wish::start);
  std::this_thread::sleep_for(300ms);
  CHECK(prepared == 0);
  pool.want(host, held::PreparePool::Wish::standby); // joins the held-back start work
  pool.first_run_ended();
  std::this_thread::sleep_for(300ms);
  CHECK(prepared == 0); // one is still under way
  pool.first_run_ended();
  CHECK(reaches(prepared, 1));
  pool.stop();
}

TEST_CASE("with no first run under way, or for a standby, preparing goes at once", "[prepare_pool]")
{
  held::PreparePool pool(3);
  std::atomic<int> started{0};
  auto host = host_counting(started);
  pool.want(host, held::PreparePool::Wish::start);
  CHECK(reaches(started, 1));

  std::atomic<int> readied{0};
  auto other = host_counting(readied);
  pool.first_run_began();
  pool.want(other, held::PreparePool::Wish::standby); // the next run's channel: not held back
  CHECK(reaches(readied, 1));
  pool.first_run_ended();
  pool.stop();
}

TEST_CASE("a held-back host that ends is let go at once", "[prepare_pool]")
{
  held::PreparePool pool(3);
  std::atomic<int> prepared{0};
  auto host = host_counting(prepared);
  const std::weak_ptr<held::HeldHost> watched = host;
  pool.first_run_began();
  pool.want(host, held::PreparePool::Wish::start);
  std::this_thread::sleep_for(300ms);
  host->ending = true;
  pool.retire(std::move(host)); // as the holder retires an ended host
  for (int i = 0; i < 1000 && !watched.expired(); ++i) {
    std::this_thread::sleep_for(10ms);
  }
  CHECK(watched.expired()); // its session torn down, not kept for the first run's end
  CHECK(prepared == 0);     // an ending host is not prepared
  pool.first_run_ended();
  pool.stop();
}

TEST_CASE("an ended host is gone only once the preparing step under way on it is done",
          "[prepare_pool]")
{
  held::PreparePool pool(3);
  std::promise<void> started;
  std::promise<void> go;
  std::atomic<bool> torn_down{false};
  auto host = std::make_shared<held::HeldHost>("key", "h", "2026-12-06T00:00:00Z");
  host->session =
      std::make_unique<HeldUpSession>(started, go.get_future().share(), [&] { torn_down = true; });
  pool.want(host, held::PreparePool::Wish::standby);
  REQUIRE(started.get_future().wait_for(10s) == std::future_status::ready);
  const auto gone = host->gone();
  host->end();
  pool.retire(std::move(host)); // as `ferry disconnect` ends it
  CHECK(gone.wait_for(300ms) ==
        std::future_status::timeout); // its step (an SFTP one, say) is still under way
  CHECK_FALSE(torn_down);
  go.set_value();
  CHECK(gone.wait_for(10s) == std::future_status::ready);
  CHECK(torn_down); // the session went before the host was told gone
  pool.stop();
}

TEST_CASE("a retired host is torn down before the preparing queued for other hosts",
          "[prepare_pool]")
{
  held::PreparePool pool(1);
  std::promise<void> started;
  std::promise<void> go;
  auto busy = std::make_shared<held::HeldHost>("busy", "h", "2026-12-06T00:00:00Z");
  busy->session = std::make_unique<HeldUpSession>(started, go.get_future().share(), [] {});
  pool.want(busy, held::PreparePool::Wish::standby); // the pool's one thread, held up
  REQUIRE(started.get_future().wait_for(10s) == std::future_status::ready);

  std::atomic<int> waiting_prepared{0};
  auto waiting = host_counting(waiting_prepared);
  pool.want(waiting, held::PreparePool::Wish::standby); // queued behind it

  std::promise<void> unused;
  std::shared_future<void> never_waited = std::promise<void>().get_future().share();
  std::atomic<int> prepared_at_teardown{-1};
  auto ended = std::make_shared<held::HeldHost>("ended", "h", "2026-12-06T00:00:00Z");
  ended->session = std::make_unique<HeldUpSession>(
      unused, never_waited, [&] { prepared_at_teardown = waiting_prepared.load(); });
  const auto gone = ended->gone();
  ended->end();
  pool.retire(std::move(ended));

  go.set_value();
  CHECK(gone.wait_for(10s) == std::future_status::ready);
  CHECK(prepared_at_teardown == 0); // the ended host went first
  CHECK(reaches(waiting_prepared, 1));
  pool.stop();
}
