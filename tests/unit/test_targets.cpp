// Targets that cannot go wrong silently: an empty host is refused (exit 2), never taken for
// "no host" (which would run the job on this machine).
#include <cstdio>
#include <fstream>

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "cli/targets.hpp"

using namespace ferry;
using namespace ferry::cli;

namespace {

std::string refusal(const TargetOptions& target)
{
  auto hosts = target_hosts(target, UserConfig{});
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
  const auto hosts = target_hosts(fine, UserConfig{});
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
  const auto hosts = target_hosts(target, UserConfig{});
  REQUIRE(hosts);
  CHECK(*hosts == std::vector<std::string>{"gpu1", "gpu2", "gpu3"});
  std::ofstream(path) << "gpu1\ngpu2,,gpu3\n";
  CHECK_THAT(refusal(target), Catch::Contains(std::string(path) + " line 2 names an empty host"));
  std::ofstream(path) << "# nothing\n\n";
  CHECK_THAT(refusal(target), Catch::Contains("names no host"));
  std::remove(path);
}

TEST_CASE("hosts file: - is standard input, a missing file says why, no FIFO, device or huge file",
          "[targets]")
{
  // Issue 42 item 10 and issue 45 item 6.
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const std::string listed = "gpu1\n# a comment\ngpu2, gpu3\n";
  REQUIRE(::write(fds[1], listed.data(), listed.size()) == static_cast<ssize_t>(listed.size()));
  ::close(fds[1]);
  const int saved = ::dup(STDIN_FILENO);
  ::dup2(fds[0], STDIN_FILENO);
  ::close(fds[0]);
  TargetOptions target;
  target.hosts_file = "-";
  const auto hosts = target_hosts(target, UserConfig{});
  ::dup2(saved, STDIN_FILENO);
  ::close(saved);
  REQUIRE(hosts);
  CHECK(*hosts == std::vector<std::string>{"gpu1", "gpu2", "gpu3"});

  target.hosts_file = "/nonexistent/hosts.txt";
  CHECK(refusal(target) ==
        "cannot read --hosts-file /nonexistent/hosts.txt: No such file or directory");
  char pattern[] = "/tmp/ferry-hosts-dir-XXXXXX";
  const std::string dir = ::mkdtemp(pattern);
  target.hosts_file = dir + "/fifo";
  REQUIRE(::mkfifo(target.hosts_file.c_str(), 0600) == 0);
  ::alarm(10); // a blocked open ends (and fails) the test
  CHECK_THAT(refusal(target), Catch::Contains("/fifo is a FIFO, not a regular file"));
  target.hosts_file = "/dev/zero";
  CHECK_THAT(refusal(target), Catch::Contains("--hosts-file /dev/zero is a device"));
  ::alarm(0);
  target.hosts_file = dir + "/big";
  std::ofstream(target.hosts_file) << std::string((8 << 20) + 1, '#');
  CHECK_THAT(refusal(target), Catch::Contains("is larger than 8 MiB"));
  std::remove(target.hosts_file.c_str());
  std::remove((dir + "/fifo").c_str());
  ::rmdir(dir.c_str());
}
