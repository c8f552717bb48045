// The holder's preparer threads (docs/persistence.md, "A host's first run through the holder"):
// a host's start work waits while other hosts' first runs are under way, and goes once they have
// ended; other work never waits for them.
#include <atomic>
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
