// Targets that cannot go wrong silently: an empty host is refused (exit 2), never taken for
// "no host" (which would run the job on this machine).
#include <cstdio>
#include <fstream>

#include <catch2/catch.hpp>

#include "cli/targets.hpp"

using namespace ferry;
using namespace ferry::cli;

namespace {

std::string refusal(const TargetOptions& target)
{
  auto hosts = target_hosts(target);
  REQUIRE_FALSE(hosts);
  CHECK(hosts.error().kind == ErrorKind::usage);
  return hosts.error().message;
}

} // namespace

TEST_CASE("an empty or blank host is refused, whatever its form", "[targets]")
{
  for (const std::string host : {"", " ", "\t", "a,,b", "a,", ",a", "a, ,b"}) {
    TargetOptions target;
    target.hosts = {"gpu1", host};
    INFO("--host '" << host << "'");
    CHECK_THAT(refusal(target), Catch::Contains("--host names an empty host"));
  }
  TargetOptions fine;
  fine.hosts = {" gpu1 , gpu2", "gpu1"};
  const auto hosts = target_hosts(fine);
  REQUIRE(hosts);
  CHECK(*hosts == std::vector<std::string>{"gpu1", "gpu2", "gpu1"}); // repeats go at make_sessions
}

TEST_CASE("a hosts file: blank and comment lines are fine, an empty entry is not", "[targets]")
{
  char path[] = "/tmp/ferry-hosts-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  TargetOptions target;
  target.hosts_file = path;
  std::ofstream(path) << "# fleet\n\ngpu1\n  gpu2, gpu3  # two\n   \n";
  const auto hosts = target_hosts(target);
  REQUIRE(hosts);
  CHECK(*hosts == std::vector<std::string>{"gpu1", "gpu2", "gpu3"});
  std::ofstream(path) << "gpu1\ngpu2,,gpu3\n";
  CHECK_THAT(refusal(target), Catch::Contains(std::string(path) + " line 2 names an empty host"));
  std::ofstream(path) << "# nothing\n\n";
  CHECK_THAT(refusal(target), Catch::Contains("names no host"));
  std::remove(path);
}
