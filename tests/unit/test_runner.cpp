// The runner against a fake session: what it stages, what it executes, and how each outcome
// becomes a run record. The real transports are tested for real in tests/integration.
#include <cstdio>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <signal.h>

#include "archive_test_support.hpp"

#include "ferry/json_diff.hpp"
#include "ferry/remote/launcher.hpp"
#include "ferry/remote/shell_neutral.hpp"
#include "ferry/remote/standby_boot.hpp"
#include "ferry/run_record.hpp"
#include "ferry/runner.hpp"
#include "ferry/util.hpp"
#include "run/detached_runs.hpp"
#include "transport/exec_request.hpp"
#include "transport/run_files.hpp"

using namespace ferry;
using nlohmann::json;

namespace {

// A target that stages a run as every target does (write_run_files), into a map.
class FakeSession final : public HostSession, RunDirWriter {
public:
  FakeSession()
  {
    // The launcher ran: its sentinel came on both streams.
    outcome.out.saw_sentinel = true;
    outcome.err.saw_sentinel = true;
  }
  std::map<std::string, std::string> files;
  std::vector<std::string> removed;
  std::set<std::string> listed; // directories list() finds (none else)
  std::vector<std::string> dirs;
  std::vector<std::string> executed;
  std::vector<bool> cache_refused; // each stage's RunBundle::job_cache_refused
  ExecOutcome outcome;
  std::function<void(FakeSession&, const std::string& run_dir)> during_exec;
  std::optional<Error> fail_put;
  std::string job_cache_remade; // what stage says it found changed in the job cache

  json target() const override
  {
    return {{"host", "h"}, {"user", "u"}, {"port", 22}, {"host_key_sha256", "SHA256:x"}};
  }
  std::string label() const override { return "gpu1"; }
  Expected<void> connect() override { return {}; }
  Expected<StagedRun> stage(const RunBundle& bundle, const StopToken& stop) override
  {
    const std::string dir = "/home/u/.cache/ferry/runs/ferry-1-abc";
    cache_refused.push_back(bundle.job_cache_refused);
    if (auto written = write_run_files(*this, bundle, dir); !written) {
      removed.push_back(dir);
      return Unexpected{written.error()};
    }
    StagedRun run = staged_run(bundle, dir, stop);
    run.job_cache_remade = job_cache_remade;
    return run;
  }
  Expected<ExecOutcome> launch(StagedRun& run, const LaunchRequest& request) override
  {
    auto command = shell_neutral_command(launcher_request(run, request).argv);
    REQUIRE(command);
    executed.push_back(*command);
    if (during_exec) {
      during_exec(*this, run.run_dir);
    }
    return outcome;
  }
  Expected<FetchedFile> fetch(const StagedRun& run, const std::string& rel, const ChunkSink& sink,
                              std::uint64_t offset) override
  {
    auto it = files.find(run.run_dir + "/" + rel);
    if (it == files.end()) {
      return FetchedFile{};
    }
    FERRY_TRY(sink(
        std::string_view(it->second).substr(std::min<std::size_t>(offset, it->second.size()))));
    return FetchedFile{FetchedFile::Kind::regular, {}, {}};
  }
  Expected<std::optional<std::vector<DirEntry>>> list(const StagedRun& run,
                                                      const std::string& rel) override
  {
    if (listed.count(run.run_dir + (rel.empty() ? "" : "/" + rel)) != 0) {
      return std::optional<std::vector<DirEntry>>(std::vector<DirEntry>{});
    }
    return std::optional<std::vector<DirEntry>>();
  }
  Expected<void> finish(StagedRun& run, Finish how) override
  {
    if (how == Finish::remove) {
      removed.push_back(run.run_dir);
    }
    return {};
  }

private:
  Expected<void> make_dir(const std::string& path) override
  {
    dirs.push_back(path);
    return {};
  }
  Expected<void> put_file(const std::string& path, std::string_view bytes) override
  {
    if (fail_put) {
      return Unexpected{*fail_put};
    }
    files[path] = std::string(bytes);
    return {};
  }
};

Job test_job(std::string interpreter = "python3")
{
  auto job = parse_job("probe", "probe.py", "probe.py",
                       "# /// ferry\n# interpreter = \"" + interpreter +
                           "\"\n# timeout = 7\n# ///\nprint(1)\n");
  REQUIRE(job);
  return std::move(job).value();
}

const std::string k_dir = "/home/u/.cache/ferry/runs/ferry-1-abc";

} // namespace

TEST_CASE("the runner stages two files and executes only the launcher", "[runner]")
{
  FakeSession session;
  session.outcome.exit_code = 0;
  session.during_exec = [](FakeSession& s, const std::string& dir) {
    s.files[dir + "/result.json"] = R"({"x": 1})";
  };
  const json params = {{"text", "$(id) `id` 'q' \"d\""}};
  RunRecord record = run_job(session, test_job(), params, RunOptions{});
  CHECK(record.status == RunStatus::ok);
  CHECK(record.result == json{{"x", 1}});
  REQUIRE(session.executed.size() == 1);
  CHECK(session.executed[0] == "/bin/sh " + k_dir + "/launch.sh");
  CHECK(session.files.at(k_dir + "/probe.py") == test_job().bytes);
  // params.json rides at the end of the launcher, which copies it out on the host.
  CHECK(session.files.count(k_dir + "/params.json") == 0);
  const std::string& launcher = session.files.at(k_dir + "/launch.sh");
  const std::string params_text = params_file_bytes(params);
  REQUIRE(launcher.size() > params_text.size());
  CHECK(launcher.substr(launcher.size() - params_text.size()) == params_text);
  CHECK(json::parse(params_text) == params);
  CHECK_THAT(launcher, Catch::Contains("nap 7 ||"));
  CHECK_THAT(launcher, Catch::Contains(fmt::format("tail -c {} ", params_text.size())));
  CHECK(session.removed == std::vector<std::string>{k_dir});
  CHECK(record.target["host"] == "h");
  CHECK(record.host_label == "gpu1");
  CHECK(record.job_sha256.size() == 64);
  CHECK(record.script == test_job().bytes);
}

TEST_CASE("a result in the launcher's report needs no fetch and no cleanup", "[runner]")
{
  FakeSession session;
  session.outcome.exit_code = 0;
  // A file the fake would fetch, to show that the report's bytes win.
  session.files[k_dir + "/result.json"] = R"({"fetched": true})";
  SECTION("a framed result and a removed run directory")
  {
    session.outcome.out.launcher_report = "0 exit\nresult file 8\n{\"x\": 1}clean removed\n";
    const RunRecord record = run_job(session, test_job(), json::object(), RunOptions{});
    CHECK(record.status == RunStatus::ok);
    CHECK(record.result == json{{"x", 1}});
    CHECK(session.removed.empty());
  }
  SECTION("a result too large for the frame is fetched, and the directory cleaned")
  {
    session.outcome.out.launcher_report = "0 exit\nresult fetch\nclean kept\n";
    const RunRecord record = run_job(session, test_job(), json::object(), RunOptions{});
    CHECK(record.result == json{{"fetched", true}});
    CHECK(session.removed == std::vector<std::string>{k_dir});
  }
  SECTION("a FIFO the launcher named is a bad result, never fetched")
  {
    session.outcome.out.launcher_report = "0 exit\nresult special\nclean removed\n";
    const RunRecord record = run_job(session, test_job(), json::object(), RunOptions{});
    CHECK(record.status == RunStatus::bad_result);
    CHECK_THAT(*record.error, Catch::Contains("a FIFO, socket or device"));
    CHECK(session.removed.empty());
  }
  SECTION("a garbled frame falls back to the fetch and the cleanup")
  {
    session.outcome.out.launcher_report = "0 exit\nresult file 99\n{}clean removed\n";
    const RunRecord record = run_job(session, test_job(), json::object(), RunOptions{});
    CHECK(record.result == json{{"fetched", true}});
    CHECK(session.removed == std::vector<std::string>{k_dir});
  }
}

TEST_CASE("a job cache entry a python standby made anew before the run is warned of, once",
          "[runner]")
{
  FakeSession session;
  session.during_exec = [](FakeSession& s, const std::string& dir) {
    s.outcome.err.before_sentinel =
        std::string("hello from .bashrc\n") + std::string(k_standby_entry_refused_prefix) +
        "/home/u/.cache/ferry/runs/ferry-job-ab.py " + std::string(k_standby_entry_mismatch) + "\n";
    s.outcome.exit_code = 0;
    s.files[dir + "/result.json"] = "{}";
  };
  const RunRecord record = run_job(session, test_job(), json::object(), RunOptions{});
  CHECK(record.status == RunStatus::ok);
  CHECK(session.executed.size() == 1); // the job ran from the entry made anew: no second run
  REQUIRE(record.warnings.size() == 2);
  CHECK(record.warnings[0]["code"] == "job-cache-refused");
  CHECK_THAT(record.warnings[0]["message"].get<std::string>(),
             Catch::Contains("gpu1: the job cache entry /home/u/.cache/ferry/runs/ferry-job-ab.py "
                             "no longer matches the job's sha256"));
  // The standby's line is not the login shell's noise; the rest is.
  CHECK(record.warnings[1]["code"] == "login-shell-output");
  CHECK_THAT(record.warnings[1]["message"].get<std::string>(),
             Catch::StartsWith("the login shell printed 19 bytes"));
}

TEST_CASE("a job cache entry the target made anew as it staged the run is warned of", "[runner]")
{
  FakeSession session;
  session.job_cache_remade = "/home/u/.cache/ferry/runs/ferry-job-ab.py\x1b[2J";
  session.during_exec = [](FakeSession& s, const std::string& dir) {
    s.outcome.exit_code = 0;
    s.files[dir + "/result.json"] = "{}";
  };
  const RunRecord record = run_job(session, test_job(), json::object(), RunOptions{});
  CHECK(record.status == RunStatus::ok);
  CHECK(session.executed.size() == 1);
  REQUIRE(record.warnings.size() == 1);
  CHECK(record.warnings[0]["code"] == "job-cache-refused");
  const auto message = record.warnings[0]["message"].get<std::string>();
  CHECK_THAT(message, Catch::StartsWith("gpu1: the job cache entry "
                                        "/home/u/.cache/ferry/runs/ferry-job-ab.py"));
  CHECK_THAT(message, Catch::Contains("was not as ferry leaves it, a regular file of yours of "
                                      "mode 0400 and of the job's size"));
  CHECK(message.find('\x1b') == std::string::npos); // what the host named reaches no terminal raw
}

TEST_CASE("a launcher that refuses the job's cache entry has the job sent again, once", "[runner]")
{
  FakeSession session;
  const std::string refusal =
      std::string(k_launcher_cache_refused_prefix) +
      "/home/u/.cache/ferry/runs/ferry-job-ab.py does not match its sha256\n";
  // The launcher refuses the first `refusals` runs, and runs the job after that.
  auto refuse = [&](int refusals) {
    session.during_exec = [refusal, refusals](FakeSession& s, const std::string& dir) {
      const bool refused = static_cast<int>(s.executed.size()) <= refusals;
      s.outcome.exit_code = refused ? k_launcher_cache_refused_exit : 0;
      s.outcome.err.bytes = refused ? refusal : "";
      s.files[dir + "/result.json"] = "{}";
    };
  };
  SECTION("the second run uploads the job and ends ok, with a warning naming host and entry")
  {
    refuse(1);
    const RunRecord record = run_job(session, test_job(), json::object(), RunOptions{});
    CHECK(record.status == RunStatus::ok);
    CHECK(session.executed.size() == 2);
    CHECK(session.cache_refused == std::vector<bool>{false, true});
    CHECK(session.removed.size() == 2);
    REQUIRE(record.warnings.size() == 1);
    CHECK(record.warnings[0]["code"] == "job-cache-refused");
    CHECK_THAT(record.warnings[0]["message"].get<std::string>(),
               Catch::Contains("gpu1: the job cache entry "
                               "/home/u/.cache/ferry/runs/ferry-job-ab.py no longer matches"));
    CHECK_THAT(session.files.at(k_dir + "/launch.sh"), Catch::Contains(record.job_sha256));
  }
  SECTION("a second refusal is the run's end: no third")
  {
    refuse(2);
    const RunRecord record = run_job(session, test_job(), json::object(), RunOptions{});
    CHECK(record.status == RunStatus::failed);
    CHECK(session.executed.size() == 2);
  }
}

TEST_CASE("outcomes become statuses", "[runner]")
{
  FakeSession session;
  SECTION("timeout: exit 124 with the launcher's report")
  {
    session.outcome.exit_code = k_launcher_timeout_exit;
    session.outcome.out.launcher_report = "124 timeout\n";
    const auto record = run_job(session, test_job(), json::object(), RunOptions{});
    CHECK(record.status == RunStatus::timeout);
    CHECK(record.exit_code == 124);
    CHECK_THAT(*record.error, Catch::Contains("7 s timeout"));
  }
  SECTION("a job's own exit 124 is not a timeout")
  {
    session.outcome.exit_code = 124;
    session.outcome.out.launcher_report = "124 exit\n";
    CHECK(run_job(session, test_job(), json::object(), RunOptions{}).status == RunStatus::failed);
  }
  SECTION("missing interpreter is named")
  {
    session.outcome.exit_code = k_launcher_no_interpreter_exit;
    session.outcome.err.bytes =
        std::string(k_launcher_no_interpreter_prefix) + "python9 not found\n";
    const auto record = run_job(session, test_job("python9"), json::object(), RunOptions{});
    CHECK(record.status == RunStatus::failed);
    CHECK_THAT(*record.error, Catch::Contains("interpreter 'python9' not found"));
  }
  SECTION("non-zero exit shows the last stderr line")
  {
    session.outcome.exit_code = 3;
    session.outcome.err.bytes = "Traceback\nValueError: bad\n";
    const auto record = run_job(session, test_job(), json::object(), RunOptions{});
    CHECK(record.status == RunStatus::failed);
    CHECK_THAT(*record.error, Catch::Contains("status 3: ValueError: bad"));
  }
  SECTION("connection lost keeps the run dir for the launcher's deadline and says so")
  {
    session.outcome.end = ExecEnd::lost;
    session.outcome.lost_reason = "EOF";
    const auto record = run_job(session, test_job(), json::object(), RunOptions{});
    CHECK(record.status == RunStatus::error);
    CHECK_THAT(*record.error, Catch::Contains("connection lost"));
  }
  SECTION("interrupted")
  {
    session.outcome.end = ExecEnd::interrupted;
    CHECK(run_job(session, test_job(), json::object(), RunOptions{}).status ==
          RunStatus::interrupted);
    CHECK(session.removed.size() == 1);
  }
  SECTION("upload failure is an error and the run dir is removed")
  {
    session.fail_put = Error{ErrorKind::failed, "gpu1: cannot write: no space left on the device"};
    const auto record = run_job(session, test_job(), json::object(), RunOptions{});
    CHECK(record.status == RunStatus::error);
    CHECK_THAT(*record.error, Catch::Contains("no space"));
    CHECK(session.executed.empty());
    CHECK(session.removed.size() == 1);
  }
  SECTION("keep_remote keeps it and says where")
  {
    session.outcome.exit_code = 0;
    RunOptions options;
    options.keep_remote = true;
    const auto record = run_job(session, test_job(), json::object(), options);
    CHECK(session.removed.empty());
    CHECK_THAT(record.warnings.dump(), Catch::Contains(k_dir));
  }
}

TEST_CASE("results: file stdout-only JSON or null", "[runner]")
{
  CHECK(parse_result(std::nullopt, "hello\n", 100).value.is_null());
  CHECK(parse_result(std::nullopt, " {\"a\": 1}\n", 100).value == json{{"a", 1}});
  CHECK(parse_result(std::nullopt, "{} {}", 100).value.is_null());
  CHECK(parse_result(std::string("[1,2]"), "{\"ignored\": 1}", 100).value == json{1, 2});
  CHECK_THAT(*parse_result(std::string("{bad"), "", 100).bad,
             Catch::StartsWith("result.json is not valid JSON"));
  CHECK_THAT(*parse_result(std::string(200, ' '), "", 100).bad, Catch::Contains("larger than"));
  CHECK_THAT(*parse_result(std::string(100000, '[') + std::string(100000, ']'), "", 1 << 20).bad,
             Catch::Contains("nests"));
  CHECK_THAT(*parse_result(std::string("\"\xff\""), "", 100).bad,
             Catch::Contains("not valid JSON"));
}

TEST_CASE("the job file travels under its own name unless that is unsafe", "[runner]")
{
  CHECK(staged_job_file_name(test_job()) == "probe.py");
  Job odd = test_job();
  odd.file_name = "my job.py";
  CHECK(staged_job_file_name(odd) == "job");
  odd.file_name = "params.json";
  CHECK(staged_job_file_name(odd) == "job");
}

TEST_CASE("json_diff names changes by JSON Pointer and numbers exact order matters", "[diff]")
{
  const json a =
      json::parse(R"({"kv": {"bf16": {"max_tokens": 1216348}}, "l": [1, 2], "x/y": 1, "f": 0.5})");
  CHECK(json_diff(a, a).empty());
  const json b = json::parse(
      R"({"kv": {"bf16": {"max_tokens": 1216000}}, "l": [2, 1], "x/y": 1.0, "f": 0.5000001, "n": null})");
  const auto changes = json_diff(a, b);
  std::vector<std::string> paths;
  for (const auto& c : changes) {
    paths.push_back(c.path);
  }
  CHECK(paths == std::vector<std::string>{"/f", "/kv/bf16/max_tokens", "/l/0", "/l/1", "/n"});
  CHECK(changes[1].old_value == 1216348);
  CHECK(changes[1].new_value == 1216000);
  CHECK(changes[4].old_missing);
  CHECK(json_diff(json{{"a~b", 1}}, json{{"a~b", 2}})[0].path == "/a~0b");
}

TEST_CASE("streamed JSON strings replace broken UTF-8 exactly as the archive's JSON does",
          "[record]")
{
  // `run --json` streams stdout/stderr with its own escaper; `show --json` goes through
  // nlohmann::json's replace handler. The same bytes must read back as the same text.
  const auto streamed = [](const std::string& bytes) {
    char* buffer = nullptr;
    std::size_t size = 0;
    std::FILE* out = open_memstream(&buffer, &size);
    REQUIRE(out != nullptr);
    ferry::write_json_string(out, bytes);
    std::fclose(out);
    std::string text(buffer, size);
    std::free(buffer);
    return nlohmann::json::parse(text).get<std::string>();
  };
  const auto archived = [](const std::string& bytes) {
    return nlohmann::json::parse(
               nlohmann::json(bytes).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
        .get<std::string>();
  };
  for (const std::string& bytes :
       {std::string("ok \xc3\xa9"),
        std::string("\xe2\x82"
                    "A"),
        std::string("\xe0\x80\x80"), std::string("\xed\xa0\x80"), std::string("\xf4\x90\x80\x80"),
        std::string("\xff\xfe"), std::string("tail \xf0\x9f\x98"), std::string("\xc0\xaf"),
        std::string("\x80\x80 x")}) {
    CHECK(streamed(bytes) == archived(bytes));
  }
  std::mt19937 random(20261129);
  std::uniform_int_distribution<int> pick(0, 11);
  const unsigned char interesting[] = {0x41, 0x80, 0xBF, 0xC2, 0xDF, 0xE0,
                                       0xED, 0xEF, 0xF0, 0xF4, 0xA0, 0x90};
  for (int round = 0; round < 2000; ++round) {
    std::string bytes;
    for (int n = 0; n < 12; ++n) {
      bytes.push_back(static_cast<char>(interesting[pick(random)]));
    }
    INFO("round " << round);
    REQUIRE(streamed(bytes) == archived(bytes));
  }
}

TEST_CASE("the runner stages the job's files under their paths, each directory made once",
          "[runner][bundle]")
{
  FakeSession session;
  session.outcome.exit_code = 0;
  Job job = test_job();
  job.meta.result_required = false;
  job.files = {{"a/b/c.txt", 0600, sha256_hex("c"), "c"},
               {"a/d.txt", 0600, sha256_hex("d"), "d"},
               {"top.py", 0600, sha256_hex("t"), "t"}};
  RunRecord record = run_job(session, job, json::object(), RunOptions{});
  CHECK(record.status == RunStatus::ok);
  CHECK(session.dirs == std::vector<std::string>{k_dir + "/a", k_dir + "/a/b"});
  CHECK(session.files.at(k_dir + "/a/b/c.txt") == "c");
  CHECK(session.files.at(k_dir + "/a/d.txt") == "d");
  CHECK(session.files.at(k_dir + "/top.py") == "t");
  REQUIRE(record.files.size() == 3);
  CHECK(record.files[0] ==
        json{{"path", "a/b/c.txt"}, {"mode", "0600"}, {"size", 1}, {"sha256", sha256_hex("c")}});
  CHECK(record.blobs.at(sha256_hex("d")) == "d");
}

namespace {

const std::string k_detached_dir = "/home/u/.cache/ferry/runs/ferry-9-det";

RunRecord detached_record()
{
  RunRecord record;
  record.run_id = "20260101-000000-abcd";
  record.job = "probe";
  record.detached = {{"run_dir", k_detached_dir}, {"sentinel", "S"}, {"end_marker", "E"}};
  return record;
}

DetachedState state_of(HostSession& session, const StagedRun& run, long long pid)
{
  auto state = detached_state(session, run, pid);
  REQUIRE(state);
  return *state;
}

StagedRun detached_run()
{
  StagedRun run;
  run.run_dir = k_detached_dir;
  run.launcher.sentinel = "S";
  run.launcher.end_marker = "E";
  return run;
}

} // namespace

TEST_CASE("ferry stop runs a launcher it staged itself, never the run's own launch.sh",
          "[runner][detach]")
{
  FakeSession session;
  session.outcome.exit_code = 0;
  auto attached = attach_run(session, test_job(), detached_record(), RunOptions{}, true);
  REQUIRE(attached);
  CHECK(attached->end == Attached::End::gone); // the fake has no run directory to follow
  REQUIRE(session.executed.size() == 1);
  CHECK(session.executed[0] == "/bin/sh " + k_dir + "/launch.sh stop " + k_detached_dir);
  CHECK(session.files.count(k_dir + "/launch.sh") == 1);
  CHECK(session.removed == std::vector<std::string>{k_dir}); // the stop launcher's directory
}

TEST_CASE("a detached launcher is lost only when /proc says it is gone", "[runner][detach]")
{
  FakeSession session;
  const StagedRun run = detached_run();
  session.listed.insert(k_detached_dir);
  session.files[k_detached_dir + "/.ferry-launcher"] = "4242 +60\n";
  // No /proc to read: never lost.
  CHECK(state_of(session, run, 0) == DetachedState::running);
  session.files["/proc/self/cmdline"] = std::string("ferry\0", 6);
  CHECK(state_of(session, run, 0) == DetachedState::lost);
  // The pid names the launcher: it runs.
  session.files["/proc/4242/cmdline"] =
      std::string("/bin/sh\0", 8) + k_detached_dir + std::string("/launch.sh\0detached\0", 20);
  CHECK(state_of(session, run, 0) == DetachedState::running);
  // The pid was reused by another process.
  session.files["/proc/4242/cmdline"] = std::string("sleep\0"
                                                    "30\0",
                                                    9);
  CHECK(state_of(session, run, 0) == DetachedState::lost);
  // A command line that reads empty: the pid between the two halves of an exec (the said pid
  // before `exec setsid /bin/sh launch.sh detached` has run) runs; a zombie or a kernel thread
  // does not; with no stat to read, no process.
  session.files["/proc/4242/cmdline"] = "";
  CHECK(state_of(session, run, 0) == DetachedState::lost);
  session.files["/proc/4242/stat"] = "4242 (setsid) R 4241 4241 4241 0 -1 4194560 96 0 0 0\n";
  CHECK(state_of(session, run, 0) == DetachedState::running);
  session.files["/proc/4242/stat"] = "4242 (a) b) Z 1 4241 4241 0 -1 4228164 96 0 0 0\n";
  CHECK(state_of(session, run, 0) == DetachedState::lost);
  session.files["/proc/4242/stat"] = "4242 (kworker/0:1) I 2 0 0 0 -1 69238880 0 0 0 0\n";
  CHECK(state_of(session, run, 0) == DetachedState::lost);
  session.files.erase("/proc/4242/stat");
  // Before the state file: the pid the channel said.
  session.files.erase(k_detached_dir + "/.ferry-launcher");
  CHECK(state_of(session, run, 0) == DetachedState::running);
  CHECK(state_of(session, run, 4242) == DetachedState::lost);
  session.files[k_detached_dir + "/.ferry-done"] = "0 exit 0 0\n";
  CHECK(state_of(session, run, 4242) == DetachedState::finished);
  session.listed.clear();
  session.files.clear();
  CHECK(state_of(session, run, 4242) == DetachedState::gone);
}

TEST_CASE("a lost detached run is collected failed with its output so far", "[runner][detach]")
{
  FakeSession session;
  session.listed.insert(k_detached_dir);
  session.files[k_detached_dir + "/.ferry-launcher"] = "4242 +60\n";
  session.files[k_detached_dir + "/.ferry-stdout"] = "S\nso far\n";
  session.files["/proc/self/cmdline"] = std::string("ferry\0", 6);
  // Were the launcher never taken for gone, attach would follow for ever: it is stopped (it
  // detaches) after 5 s.
  RunOptions options;
  options.stop = StopToken::make();
  auto stopper = std::async(std::launch::async, [stop = options.stop] {
    for (int i = 0; i < 100 && !stop.stop_requested(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    stop.request_stop();
  });
  auto attached = attach_run(session, test_job(), detached_record(), options, false);
  options.stop.request_stop();
  stopper.wait();
  REQUIRE(attached);
  REQUIRE(attached->end == Attached::End::collected);
  CHECK(attached->record.status == RunStatus::failed);
  CHECK_THAT(attached->record.error.value_or(""), Catch::Contains("died without an exit status"));
  CHECK(attached->record.stdout_text == "so far\n");
  CHECK(attached->record.detached.is_null());
  CHECK(session.removed == std::vector<std::string>{k_detached_dir});
}

TEST_CASE("bytes the host dropped from a capped output file make the stream truncated",
          "[runner][detach]")
{
  FakeSession session;
  session.listed.insert(k_detached_dir);
  session.files[k_detached_dir + "/.ferry-stdout"] = "S\nhead tail\nE 0 exit\nresult none\n";
  session.files[k_detached_dir + "/.ferry-stderr"] = "S\nerr\n";
  session.files[k_detached_dir + "/.ferry-done"] = "0 exit 1000 0\n";
  FollowRequest request;
  auto followed = follow_detached(session, detached_run(), request);
  REQUIRE(followed);
  REQUIRE(followed->end == FollowEnd::done);
  CHECK(followed->outcome.exit_code == 0);
  CHECK(followed->outcome.out.bytes == "head tail\n");
  CHECK(followed->outcome.out.truncated);
  CHECK(followed->outcome.out.dropped == 1000);
  CHECK_FALSE(followed->outcome.err.truncated);
  // An older launcher's done file has no counts.
  session.files[k_detached_dir + "/.ferry-done"] = "0 exit\n";
  followed = follow_detached(session, detached_run(), request);
  REQUIRE(followed);
  CHECK_FALSE(followed->outcome.out.truncated);
}

namespace {

// What a front end shows of a collection: notes and final records, never archived.
class SeenRuns final : public RunObserver {
public:
  void run_note(const RunRef& /*run*/, std::string_view text) override
  {
    const std::lock_guard lock(m_mutex);
    m_notes.emplace_back(text);
  }
  void run_finished(RunRecord& record) override
  {
    const std::lock_guard lock(m_mutex);
    m_finished.push_back(record);
  }
  [[nodiscard]] std::vector<std::string> notes() const
  {
    const std::lock_guard lock(m_mutex);
    return m_notes;
  }
  [[nodiscard]] std::vector<RunRecord> finished() const
  {
    const std::lock_guard lock(m_mutex);
    return m_finished;
  }

private:
  mutable std::mutex m_mutex;
  std::vector<std::string> m_notes;
  std::vector<RunRecord> m_finished;
};

// A detached run waiting for collection in a new archive at `path`.
RunRecord waiting_run(const std::filesystem::path& path)
{
  RunRecord running = archive_test::make_run("20260102T030405Z-0000c011");
  running.detached = detached_record().detached;
  Archive archive = archive_test::open_archive(path);
  REQUIRE(archive.record_detached(running));
  return running;
}

// A run waiting for collection, whose collection lock a first collector holds.
struct HeldCollection {
  archive_test::TempDir tmp;
  std::filesystem::path path = tmp / "archive.db";
  RunRecord running = waiting_run(path);
  Expected<std::optional<CollectionLock>> held = lock_collection(path, running.run_id, false, {});
};

} // namespace

TEST_CASE("a second collector of a run waits for the first and answers with its final record",
          "[runner][detach]")
{
  HeldCollection first;
  const auto& path = first.path;
  const RunRecord& running = first.running;
  auto& held = first.held;
  REQUIRE(held);
  REQUIRE(held->has_value()); // the first collector, following the run
  FakeSession session;
  SeenRuns observer; // stands for the archiving observer: it must hear no final record
  SeenRuns view;
  auto second = std::async(std::launch::async, [&] {
    Archive archive = archive_test::open_archive(path);
    CollectRequest request;
    request.view = &view;
    return collect_detached(archive, session, test_job(), running, request, observer);
  });
  const auto waiting = [&observer] { return !observer.notes().empty(); };
  for (int i = 0; i < 100 && !waiting(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(observer.notes().size() == 1);
  CHECK_THAT(observer.notes()[0], Catch::Contains("another ferry on this machine is collecting"));
  // The first one collects: the final record archived, the detached entry forgotten, let go.
  RunRecord final_record = running;
  final_record.detached = nullptr;
  final_record.stdout_text = "collected by the first\n";
  {
    Archive archive = archive_test::open_archive(path);
    REQUIRE(archive.record(final_record));
    REQUIRE(archive.forget_detached(running.run_id));
  }
  held->reset();
  auto collected = second.get();
  REQUIRE(collected);
  CHECK(collected->by_another);
  CHECK(collected->attached.end == Attached::End::collected);
  CHECK(collected->attached.record.stdout_text == "collected by the first\n");
  CHECK(observer.finished().empty());
  REQUIRE(view.finished().size() == 1);
  CHECK(view.finished()[0].run_id == running.run_id);
  CHECK(session.executed.empty()); // nothing on the host was touched
  CHECK(session.removed.empty());
  CHECK_FALSE(std::filesystem::exists(collecting_dir(path) / (running.run_id + ".lock")));
}

TEST_CASE("ferry stop does not wait for another collector of the run: it says who holds it",
          "[runner][detach]")
{
  HeldCollection first;
  const auto& path = first.path;
  const RunRecord& running = first.running;
  auto& held = first.held;
  REQUIRE(held);
  REQUIRE(held->has_value());
  FakeSession session;
  SeenRuns observer;
  Archive archive = archive_test::open_archive(path);
  CollectRequest request;
  request.stop = true;
  auto stopped = collect_detached(archive, session, test_job(), running, request, observer);
  REQUIRE_FALSE(stopped);
  CHECK_THAT(stopped.error().message, Catch::Contains("being collected by another ferry"));
  CHECK(session.executed.empty());
  CHECK(archive.detached_runs()->size() == 1);
}

TEST_CASE("a killed collector never holds up the next one", "[runner][detach]")
{
  archive_test::TempDir tmp;
  const auto path = tmp / "archive.db";
  const std::string id = "20260102T030405Z-0000c012";
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto lock = lock_collection(path, id, false, {});
    const char said = lock && lock->has_value() ? 'y' : 'n';
    (void)!::write(ready[1], &said, 1);
    ::pause();
    ::_exit(0);
  }
  char said = 0;
  REQUIRE(::read(ready[0], &said, 1) == 1);
  ::close(ready[0]);
  ::close(ready[1]);
  REQUIRE(said == 'y');
  auto busy = lock_collection(path, id, false, {});
  REQUIRE(busy);
  CHECK_FALSE(busy->has_value());
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  auto free = lock_collection(path, id, false, {});
  REQUIRE(free);
  CHECK(free->has_value());
}
