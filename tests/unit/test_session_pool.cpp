// A long-lived process's sessions (`ferry mcp`): kept connected after a batch and lent to the
// next, dropped when unhealthy, never kept past the idle limit.
#include <thread>

#include <catch2/catch.hpp>

#include "run/session_pool.hpp"
#include "stub_session.hpp"

using namespace ferry;

namespace {

class PoolSession final : public testing::StubSession<HostSession> {
public:
  explicit PoolSession(int serial) : m_serial(serial) {}
  std::string label() const override { return "h-" + std::to_string(m_serial); }

private:
  int m_serial;
};

std::vector<PoolTarget> counting_targets(int& made)
{
  return {{"gpu1", [&made] { return std::make_unique<PoolSession>(++made); }}};
}

// A lease as the fleet gives it back: connected (or not).
Lease connected(Lease lease, bool is_connected = true)
{
  lease.connected = is_connected;
  return lease;
}

} // namespace

TEST_CASE("a healthy connected session is lent again, a fresh, failed or unconnected one is not",
          "[session_pool]")
{
  int made = 0;
  SessionPool pool(counting_targets(made), std::chrono::minutes(5));
  CHECK(pool.labels() == std::vector<std::string>{"gpu1"});
  Lease first = pool.borrow("gpu1", false);
  CHECK_FALSE(first.connected);
  CHECK(first.session->label() == "h-1");
  pool.give_back("gpu1", connected(std::move(first)), true);
  Lease again = pool.borrow("gpu1", false);
  CHECK(again.connected); // kept: the fleet does not connect it again
  CHECK(again.session->label() == "h-1");
  CHECK(pool.borrow("gpu1", true).session->label() == "h-2"); // fresh: a new one
  pool.give_back("gpu1", connected(std::move(again)), false); // a run failed with an error
  CHECK(pool.borrow("gpu1", false).session->label() == "h-3");
  pool.give_back("gpu1", connected(pool.borrow("gpu1", false), false), true); // never connected
  CHECK(pool.borrow("gpu1", false).session->label() == "h-5");
  PooledSessions source(pool, {"gpu1"});
  CHECK(source.targets() == 1);
  CHECK(source.keeps_sessions());
  CHECK(source.label(0, PoolSession(9)) == "gpu1"); // runs go by the target's name
}

TEST_CASE("idle sessions go after the idle limit, and none is kept with a limit of 0",
          "[session_pool]")
{
  int made = 0;
  SessionPool pool(counting_targets(made), std::chrono::milliseconds(20));
  pool.give_back("gpu1", connected(pool.borrow("gpu1", false)), true);
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  pool.expire_idle();
  CHECK(pool.borrow("gpu1", false).session->label() == "h-2");

  SessionPool none(counting_targets(made), std::chrono::seconds(0));
  none.give_back("gpu1", connected(none.borrow("gpu1", false)), true);
  CHECK_FALSE(none.borrow("gpu1", false).connected);
}
