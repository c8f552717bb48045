// The terminal reporter on a real pseudo-terminal: a fleet of a few hosts streams host-prefixed
// lines by default (issue 42.4); piped, with many hosts or with --no-stream, whole blocks.
#include <cstdio>
#include <string>

#include <fcntl.h>
#include <pty.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "ferry/reporter.hpp"

using namespace ferry;

namespace {

// What a reporter writing to `out` shows for two output lines of host h1 while its run is
// under way (before it ends): the bytes that reached the other end by then.
struct Screen {
  int reader = -1;
  std::FILE* out = nullptr;

  explicit Screen(bool terminal)
  {
    int writer = -1;
    if (terminal) {
      REQUIRE(openpty(&reader, &writer, nullptr, nullptr, nullptr) == 0);
    } else {
      int fds[2];
      REQUIRE(pipe(fds) == 0);
      reader = fds[0];
      writer = fds[1];
    }
    REQUIRE(fcntl(reader, F_SETFL, O_NONBLOCK) == 0);
    out = fdopen(writer, "w");
    REQUIRE(out != nullptr);
  }
  ~Screen()
  {
    std::fclose(out);
    close(reader);
  }
  std::string shown() const
  {
    std::string text;
    char buffer[4096];
    for (ssize_t n; (n = ::read(reader, buffer, sizeof buffer)) > 0;) {
      text.append(buffer, static_cast<std::size_t>(n));
    }
    return text;
  }
};

std::string while_running(bool terminal, std::size_t hosts, TerminalOptions options = {})
{
  Screen screen(terminal);
  std::FILE* err = std::tmpfile();
  auto reporter = make_terminal_reporter(screen.out, err, options);
  reporter->batch_started(BatchInfo{hosts, hosts, {}});
  reporter->run_started(RunRef{"h1", "probe"});
  reporter->run_output(RunRef{"h1", "probe"}, OutputStream::out, "loading\nready\n");
  std::fflush(screen.out);
  std::fclose(err);
  return screen.shown();
}

} // namespace

TEST_CASE("a terminal streams a few hosts' lines as they come, each with its host", "[report]")
{
  // A pty turns "\n" into "\r\n" on the way.
  CHECK(while_running(true, 2) == "h1: loading\r\nh1: ready\r\n");
  CHECK(while_running(true, k_stream_hosts) == "h1: loading\r\nh1: ready\r\n");
  // Too many hosts to follow, --no-stream, or not a terminal: the block comes when the run ends.
  CHECK(while_running(true, k_stream_hosts + 1).empty());
  CHECK(while_running(true, 2, TerminalOptions{false, false, true, {}}).empty());
  CHECK(while_running(false, 2).empty());
  // --stream asks for it anywhere; one host is always shown as it comes, unprefixed.
  CHECK(while_running(false, 2, TerminalOptions{false, true, false, {}}) ==
        "h1: loading\nh1: ready\n");
  CHECK(while_running(false, 1) == "loading\nready\n");
}

namespace {

// What stderr shows when a batch of `hosts` hosts reports progress, stderr being a terminal or
// a pipe; stdout is a file (so output streams only when asked).
std::string progress_shown(bool terminal, std::size_t hosts, TerminalOptions options = {})
{
  Screen screen(terminal);
  std::FILE* out = std::tmpfile();
  auto reporter = make_terminal_reporter(out, screen.out, options);
  reporter->batch_started(BatchInfo{hosts, hosts, {}});
  reporter->progress(FleetProgress{hosts, 1, 0, 2});
  std::fflush(screen.out);
  std::fclose(out);
  return screen.shown();
}

RunRecord probe_finished(std::string host, nlohmann::json result)
{
  RunRecord record;
  record.job = "probe";
  record.host_label = std::move(host);
  record.status = RunStatus::ok;
  record.result = std::move(result);
  return record;
}

// What the reporter wrote to `out`, both files closed.
std::string read_and_close(std::FILE* out, std::FILE* err)
{
  std::rewind(out);
  std::string text;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, out)) > 0;) {
    text.append(buffer, n);
  }
  std::fclose(out);
  std::fclose(err);
  return text;
}

// The summary after `hosts` runs, one of them with another result.
std::string summary_after(std::size_t hosts, TerminalOptions options = {})
{
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  auto reporter = make_terminal_reporter(out, err, options);
  reporter->batch_started(BatchInfo{hosts, hosts, {}});
  for (std::size_t i = 1; i <= hosts; ++i) {
    auto record = probe_finished(fmt::format("gpu{}", i), {{"driver", i == 2 ? "535" : "550"}});
    reporter->run_finished(record);
  }
  reporter->batch_finished();
  std::string text = read_and_close(out, err);
  return text.substr(text.rfind("\n\n") + 2);
}

} // namespace

TEST_CASE("the progress line is drawn on a terminal stderr while blocks are shown", "[report]")
{
  CHECK(progress_shown(true, 16) == "1/16 done, 0 failed, 2 running");
  // Not piped, not while output streams, not for one host.
  CHECK(progress_shown(false, 16).empty());
  CHECK(progress_shown(true, 2, TerminalOptions{false, true, false, {}}).empty());
  CHECK(progress_shown(true, 1).empty());
}

TEST_CASE("the summary folds hosts by result above the threshold", "[report][fold]")
{
  const std::string folded = "probe on 5 hosts:\n"
                             "  gpu[1,3-5] (4 hosts): ok — {\"driver\":\"550\"}\n"
                             "  gpu2: ok — driver \"535\" instead of \"550\"\n";
  CHECK(summary_after(k_fold_hosts + 1) == folded);
  CHECK(summary_after(k_fold_hosts).rfind("HOST", 0) == 0);
  CHECK(summary_after(k_fold_hosts + 1, TerminalOptions{false, false, false, false})
            .rfind("HOST", 0) == 0);
  CHECK(summary_after(k_fold_hosts, TerminalOptions{false, false, false, true})
            .rfind("probe on 4 hosts:\n", 0) == 0);
}

TEST_CASE("the summary ends with the runs that were not ok, by class, their hosts folded",
          "[report][fold]")
{
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  auto reporter = make_terminal_reporter(out, err, TerminalOptions{});
  reporter->batch_started(BatchInfo{6, 6, {}});
  const auto finish = [&](std::string host, RunStatus status, Unreached failure) {
    RunRecord record = probe_finished(std::move(host), nullptr);
    record.status = status;
    record.failure = failure;
    record.unreachable = failure != Unreached::none;
    reporter->run_finished(record);
  };
  finish("gpu11", RunStatus::error, Unreached::auth);
  finish("gpu7", RunStatus::error, Unreached::unreachable);
  finish("gpu5", RunStatus::failed, Unreached::none);
  finish("gpu1", RunStatus::ok, Unreached::none);
  finish("gpu3", RunStatus::error, Unreached::unreachable);
  finish("gpu6", RunStatus::error, Unreached::timeout);
  reporter->batch_finished();
  std::string text = read_and_close(out, err);
  // Hosts not reached first (by class: a connect timeout is not the job's), then the runs that
  // failed otherwise, by status.
  CHECK(text.substr(text.rfind('\n', text.size() - 2) + 1) ==
        "5 failed: 2 unreachable (gpu[3,7]), 1 connect timeout (gpu6), 1 auth (gpu11), 1 failed "
        "(gpu5)\n");
}
