// What `replay` leaves out of its comparison: --ignore pointers and a job's `volatile` list;
// and the options a record keeps for it.
#include <catch2/catch.hpp>

#include "ferry/job.hpp"
#include "ferry/json_diff.hpp"
#include "ferry/run_record.hpp"
#include "ferry/runner.hpp"

using namespace ferry;
using nlohmann::json;

namespace {

std::vector<std::string> paths(const std::vector<JsonChange>& changes)
{
  std::vector<std::string> out;
  for (const auto& change : changes) {
    out.push_back(change.path);
  }
  return out;
}

using Paths = std::vector<std::string>;

} // namespace

TEST_CASE("diff ignore: a pointer drops itself and what is below it, nothing else", "[diff]")
{
  const json a = json::parse(R"({"cwd": "/a", "cwdx": 1, "gpus": [{"t": 40, "n": "A"}],
                                 "a/b": 1, "host": {"name": "x", "up": 5}})");
  const json b = json::parse(R"({"cwd": "/b", "cwdx": 2, "gpus": [{"t": 41, "n": "B"}],
                                 "a/b": 2, "host": {"name": "y", "up": 6}})");
  const auto all = json_diff(a, b);
  CHECK(paths(without_ignored(all, {})) == paths(all));
  CHECK(paths(without_ignored(all, {"/cwd"})) ==
        Paths{"/a~1b", "/cwdx", "/gpus/0/n", "/gpus/0/t", "/host/name", "/host/up"});
  CHECK(paths(without_ignored(all, {"/gpus/0/t", "/host", "/a~1b"})) ==
        Paths{"/cwd", "/cwdx", "/gpus/0/n"});
  CHECK(without_ignored(all, {""}).empty());
  // A pointer that names nothing changes nothing.
  CHECK(without_ignored(all, {"/nothing"}).size() == all.size());
}

TEST_CASE("diff ignore: JSON Pointer syntax", "[diff]")
{
  for (const char* good : {"", "/", "/cwd", "/a~0b", "/a~1b/0", "/gpus/0/temp"}) {
    CHECK(is_json_pointer(good));
  }
  for (const char* bad : {"cwd", "#/cwd", "/a~2", "/a~", "~1"}) {
    CHECK_FALSE(is_json_pointer(bad));
  }
}

TEST_CASE("job metadata: volatile lists JSON Pointers", "[meta]")
{
  const std::string head = "# /// ferry\n# interpreter = \"sh\"\n";
  auto meta = parse_job_meta(head + "# volatile = [\"/cwd\", \"/hostname\"]\n# ///\n", "j.sh");
  REQUIRE(meta);
  CHECK(meta->volatile_pointers == std::vector<std::string>{"/cwd", "/hostname"});
  CHECK(parse_job_meta(head + "# ///\n", "j.sh")->volatile_pointers.empty());
  for (const char* bad : {"\"/cwd\"", "[\"cwd\"]", "[1]", "[\"/a~2\"]"}) {
    auto refused = parse_job_meta(head + "# volatile = " + bad + "\n# ///\n", "j.sh");
    REQUIRE_FALSE(refused);
    CHECK(refused.error().kind == ErrorKind::usage);
    CHECK(refused.error().message.find("j.sh:3: volatile") != std::string::npos);
  }
}

TEST_CASE("recorded options: what replay needs, defaults applied", "[replay]")
{
  Job job;
  job.name = "probe";
  job.source = "built-in";
  job.meta.interpreter = "python3";
  job.meta.timeout_s = 120;
  RunOptions options;
  auto recorded = recorded_options(options, job);
  CHECK(recorded["timeout_s"] == 120);
  CHECK(recorded["interpreter"] == "python3");
  CHECK(recorded["output_cap"] == 16u << 20);
  CHECK(recorded["remote_base"].is_null());
  CHECK(recorded["job_source"] == "built-in");
  options.timeout_s = 2;
  options.output_cap = 1u << 20;
  options.remote_base = "/scratch/ferry";
  job.source = "archived script of run X";
  recorded = recorded_options(options, job);
  CHECK(recorded["timeout_s"] == 2);
  CHECK(recorded["output_cap"] == 1u << 20);
  CHECK(recorded["remote_base"] == "/scratch/ferry");
  CHECK(recorded["job_source"].is_null());
  // And the record carries them through JSON.
  RunRecord run;
  run.run_id = "r";
  run.job = "probe";
  run.status = RunStatus::ok;
  run.options = recorded;
  auto back = run_record_from_json(to_json(run));
  REQUIRE(back);
  CHECK(back->options == recorded);
  run.options = json::object();
  CHECK_FALSE(to_json(run).contains("options"));
}
