// A fleet's connects (src/transport/ssh/handshake.hpp): a bounded number of handshakes at once,
// a server's early drop tried again, and what is not worth another try given up at once.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "transport/ssh/handshake.hpp"

using namespace ferry;

namespace {

ssh::ConnectPlan plan(std::vector<std::string>* told = nullptr, int retries = 0)
{
  ssh::ConnectPlan p{"h", retries, StopToken::make(), {}};
  if (told) {
    p.tell = [told](std::string line) { told->push_back(std::move(line)); };
  }
  return p;
}

// An attempt that fails with each of `errors` in turn, then succeeds; counts its calls.
std::function<Expected<void>()> failing(std::vector<Error> errors, int& calls)
{
  return [errors = std::move(errors), &calls]() -> Expected<void> {
    const auto i = static_cast<std::size_t>(calls++);
    if (i < errors.size()) {
      return Unexpected{errors[i]};
    }
    return {};
  };
}

const auto always = [] { return true; };

} // namespace

TEST_CASE("handshakes at once are bounded across the process", "[handshake]")
{
  // Every attempt holds its slot until one host has said that it waits (or 30 s, so that a
  // broken bound fails instead of hanging): the host past the bound must wait, whatever the
  // threads' timing on a busy machine.
  std::mutex mutex;
  std::condition_variable said;
  std::vector<std::string> told;
  int in_flight = 0;
  int peak = 0;
  const auto attempt = [&]() -> Expected<void> {
    std::unique_lock lock(mutex);
    peak = std::max(peak, ++in_flight);
    said.wait_for(lock, std::chrono::seconds(30), [&] { return !told.empty(); });
    --in_flight;
    return {};
  };
  std::vector<std::thread> hosts;
  for (int i = 0; i < 3 * ssh::k_handshakes_at_once; ++i) {
    hosts.emplace_back([&] {
      auto p = plan();
      p.tell = [&](std::string line) {
        {
          const std::lock_guard lock(mutex);
          told.push_back(std::move(line));
        }
        said.notify_all();
      };
      CHECK(ssh::connect_paced(p, attempt, always));
    });
  }
  for (auto& host : hosts) {
    host.join();
  }
  CHECK(peak <= ssh::k_handshakes_at_once);
  REQUIRE_FALSE(told.empty());
  CHECK(told.front() ==
        fmt::format("pacing: waits, {} handshakes in flight", ssh::k_handshakes_at_once));
}

TEST_CASE("a server that dropped the connection early is tried again, and -v says so",
          "[handshake]")
{
  std::vector<std::string> told;
  int calls = 0;
  const Error dropped{ErrorKind::unreachable,
                      "h: at 127.0.0.1:22, the server dropped the connection before its banner "
                      "(sshd MaxStartups?): Socket error: disconnected",
                      Unreached::refused};
  CHECK(ssh::connect_paced(plan(&told), failing({dropped}, calls), always));
  CHECK(calls == 2);
  REQUIRE(told.size() == 1);
  CHECK_THAT(told[0], Catch::Matches("the server dropped the connection before its banner \\(sshd "
                                     "MaxStartups\\?\\); again in 0\\.[1-5] s"));
}

TEST_CASE("only transient failures are tried again, as --retries says", "[handshake]")
{
  const Error auth{ErrorKind::unreachable, "h: authentication failed", Unreached::auth};
  const Error refused{ErrorKind::unreachable, "h: cannot connect: Connection refused",
                      Unreached::unreachable};
  int calls = 0;
  auto result = ssh::connect_paced(plan(nullptr, 3), failing({auth}, calls), always);
  REQUIRE_FALSE(result);
  CHECK(result.error().unreached == Unreached::auth);
  CHECK(calls == 1);
  calls = 0;
  CHECK(ssh::connect_paced(plan(nullptr, 1), failing({refused}, calls), always));
  CHECK(calls == 2);
  calls = 0;
  CHECK_FALSE(ssh::connect_paced(plan(nullptr, 0), failing({refused}, calls), always));
  CHECK(calls == 1);
  // A proxy that said why it failed: no second try, even of a drop.
  calls = 0;
  const Error dropped{ErrorKind::unreachable, "h: dropped", Unreached::refused};
  CHECK_FALSE(
      ssh::connect_paced(plan(nullptr, 3), failing({dropped}, calls), [] { return false; }));
  CHECK(calls == 1);
}
