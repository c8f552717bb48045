// The everyday command line: did-you-mean, the job path, parameter input and its limits, and
// the completion table (every option of ferry's has a completion kind).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include <fcntl.h>
#include <unistd.h>

#include "cli/cli.hpp"
#include "ferry/job.hpp"
#include "ferry/params.hpp"
#include "ferry/suggest.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"

using namespace ferry;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

class ScratchDir {
public:
  ScratchDir()
  {
    std::string pattern = (fs::temp_directory_path() / "ferry-cli-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("mkdtemp failed");
    }
    m_path = pattern;
  }
  ~ScratchDir()
  {
    std::error_code ec;
    fs::remove_all(m_path, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  [[nodiscard]] fs::path operator/(const std::string& name) const { return m_path / name; }
  [[nodiscard]] const fs::path& path() const { return m_path; }

  fs::path write(const std::string& name, const std::string& bytes) const
  {
    const fs::path file = m_path / name;
    fs::create_directories(file.parent_path());
    std::ofstream(file, std::ios::binary) << bytes;
    return file;
  }

private:
  fs::path m_path;
};

std::string job_text(const std::string& description, const std::string& params = "")
{
  return "# /// ferry\n# description = \"" + description + "\"\n# interpreter = \"python3\"\n" +
         params + "# ///\nprint(1)\n";
}

const char* k_list_job = R"(# /// ferry
# interpreter = "python3"
#
# [params.sizes]
# type = "list"
# items = "int"
#
# [params.ctx]
# type = "list"
# items = "string"
# choices = ["a", "b", "c"]
#
# [params.tp]
# type = "int"
# default = 1
#
# [params.note]
# type = "string"
#
# [params.blob]
# type = "json"
# ///
)";

Job list_job()
{
  auto job = parse_job("lists", "lists.py", "lists.py", k_list_job);
  REQUIRE(job);
  return std::move(job).value();
}

std::string refusal(const Expected<json>& result)
{
  REQUIRE_FALSE(result);
  CHECK(result.error().kind == ErrorKind::usage);
  return result.error().message;
}

} // namespace

TEST_CASE("edit distance counts insertions, deletions, substitutions and swaps", "[suggest]")
{
  CHECK(edit_distance("run", "run") == 0);
  CHECK(edit_distance("rnu", "run") == 1); // adjacent swap
  CHECK(edit_distance("rn", "run") == 1);
  CHECK(edit_distance("ruin", "run") == 1);
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("", "abc") == 3);
}

TEST_CASE("did-you-mean offers only a close name", "[suggest]")
{
  const std::vector<std::string> commands = {"run", "jobs", "new", "check", "log", "replay"};
  CHECK(closest_name("rnu", commands) == "run");
  CHECK(closest_name("chekc", commands) == "check");
  CHECK(closest_name("replya", commands) == "replay");
  CHECK(closest_name("kv", {"kv_calc", "gpu_probe"}) == "kv_calc"); // a prefix
  CHECK_FALSE(closest_name("deploy", commands));
  CHECK_FALSE(closest_name("x", {"kv_calc"}));
  CHECK(did_you_mean("tpp", {"tp", "model"}) == "; did you mean 'tp'?");
  CHECK(did_you_mean("zzzz", {"tp", "model"}).empty());
}

TEST_CASE("builtin:NAME always names the built-in job", "[jobpath]")
{
  ScratchDir dir;
  dir.write("jobs/gpu_probe.py", job_text("mine"));
  const JobPath path{{dir / "jobs"}, true, {}};
  auto mine = find_job("gpu_probe", path);
  REQUIRE(mine);
  CHECK(mine->source == (dir / "jobs/gpu_probe.py").string());
  auto builtin = find_job("builtin:gpu_probe", path);
  REQUIRE(builtin);
  CHECK(builtin->source == "built-in");
  CHECK(builtin->name == "gpu_probe");
  auto missing = find_job("builtin:gpu_prob", path);
  REQUIRE_FALSE(missing);
  CHECK_THAT(missing.error().message, Catch::Contains("did you mean 'gpu_probe'?"));
}

TEST_CASE("a file named like a built-in is listed with the built-in it hides", "[jobpath]")
{
  ScratchDir dir;
  dir.write("jobs/gpu_probe.py", job_text("mine"));
  const auto jobs = list_jobs(JobPath{{dir / "jobs"}, true, {}});
  std::map<std::string, JobListing> by_name;
  for (const auto& job : jobs) {
    CHECK(by_name.emplace(job.name, job).second); // each name once
  }
  REQUIRE(by_name.count("gpu_probe") == 1);
  REQUIRE(by_name.count("builtin:gpu_probe") == 1);
  CHECK(by_name["gpu_probe"].shadows == "builtin:gpu_probe");
  CHECK(by_name["builtin:gpu_probe"].source == "built-in");
  CHECK(by_name["builtin:gpu_probe"].shadowed_by == (dir / "jobs/gpu_probe.py").string());
  CHECK(by_name.count("builtin:kv_calc") == 0); // not hidden, so not listed twice
}

TEST_CASE("only files with a /// ferry block are jobs", "[jobpath]")
{
  ScratchDir dir;
  dir.write("first/helper.py", "import json\n");
  dir.write("first/probe.py", "print('no block')\n");
  dir.write("second/probe.sh", job_text("the real probe"));
  const JobPath path{{dir / "first", dir / "second"}, false, {}};
  const JobScan scan = scan_jobs(path);
  REQUIRE(scan.jobs.size() == 1);
  CHECK(scan.jobs[0].name == "probe");
  CHECK(scan.jobs[0].source == (dir / "second/probe.sh").string());
  REQUIRE(scan.notes.size() == 2);
  CHECK_THAT(scan.notes[0], Catch::Contains("helper.py: not a job (no `/// ferry` block)"));
  auto probe = find_job("probe", path);
  REQUIRE(probe);
  CHECK(probe->source == (dir / "second/probe.sh").string());
  auto helper = find_job("helper", path);
  REQUIRE_FALSE(helper);
  CHECK_THAT(helper.error().message, Catch::Contains("helper.py is not a job"));
}

TEST_CASE("a job that does not parse is listed once with its first error line", "[jobpath]")
{
  ScratchDir dir;
  dir.write("jobs/broken.py", "# /// ferry\n# interpreter = \"python3\"\n# colour = 1\n# ///\n");
  dir.write("jobs/noclose.py", "# /// ferry\n# interpreter = \"python3\"\n");
  const auto jobs = list_jobs(JobPath{{dir / "jobs"}, false, {}});
  REQUIRE(jobs.size() == 2);
  for (const auto& job : jobs) {
    CHECK_FALSE(job.valid);
    CHECK(job.description.starts_with("(not a valid job: "));
    CHECK(job.description.find('\n') == std::string::npos);
  }
}

TEST_CASE("a mistyped job name gets a suggestion", "[jobpath]")
{
  auto job = find_job("kv_calk", JobPath{{}, true, {}});
  REQUIRE_FALSE(job);
  CHECK_THAT(job.error().message, Catch::Contains("did you mean 'kv_calc'?"));
}

TEST_CASE("a mistyped parameter name gets a suggestion", "[params]")
{
  const Job job = list_job();
  CHECK_THAT(refusal(resolve_params(job, {"sizez=1"}, std::nullopt)),
             Catch::Contains("has no parameter 'sizez'; did you mean 'sizes'?"));
  CHECK_THAT(refusal(resolve_params(job, {}, json{{"tpp", 2}})),
             Catch::Contains("has no parameter 'tpp'; did you mean 'tp'?"));
}

TEST_CASE("repeating -p for a list parameter appends", "[params]")
{
  const Job job = list_job();
  auto params =
      resolve_params(job, {"sizes=1", "sizes=2,3", "ctx=a", "ctx=c", "tp=2"}, json{{"sizes", {9}}});
  REQUIRE(params);
  CHECK((*params)["sizes"] == json({1, 2, 3})); // -p replaces the file's value, then appends
  CHECK((*params)["ctx"] == json({"a", "c"}));
  CHECK((*params)["tp"] == 2);
  CHECK_THAT(refusal(resolve_params(job, {"ctx=a", "ctx=d"}, std::nullopt)),
             Catch::Contains("not one of the choices"));
}

TEST_CASE("repeating -p for a parameter that is not a list is refused", "[params]")
{
  // Issue 42 item 10: `-p tp=2 -p tp=4` silently kept 4.
  const Job job = list_job();
  CHECK_THAT(refusal(resolve_params(job, {"tp=2", "sizes=1", "tp=4"}, std::nullopt)),
             Catch::Contains("-p tp is given twice (2, then 4), but 'tp' takes one value (an "
                             "int); give it once, or --sweep tp=... for one run per value"));
}

TEST_CASE("a list parameter takes a JSON array from -p", "[params]")
{
  // Issue 42 item 10: `-p 'sizes=[1,2]'` was refused ('[1' is not an int).
  const Job job = list_job();
  auto params = resolve_params(job, {"sizes=[1, 2]", "sizes=3", R"(ctx=["a", "c"])"}, std::nullopt);
  REQUIRE(params);
  CHECK((*params)["sizes"] == json({1, 2, 3}));
  CHECK((*params)["ctx"] == json({"a", "c"}));
  CHECK_THAT(refusal(resolve_params(job, {"sizes=[1, \"x\"]"}, std::nullopt)),
             Catch::Contains("'sizes' expects a list of int"));
  CHECK_THAT(refusal(resolve_params(job, {"sizes=[1,2"}, std::nullopt)),
             Catch::Contains("starts with [ and is not a JSON array"));
  CHECK_THAT(refusal(resolve_params(job, {"ctx=[\"d\"]"}, std::nullopt)),
             Catch::Contains("not one of the choices"));
}

TEST_CASE("a value -p KEY=@FILE gives is the file's contents, typed by the declaration", "[params]")
{
  ScratchDir dir;
  const std::string note = "line one\nline two\n\xE2\x9C\x93 \"quoted\"\n";
  const auto note_file = dir.write("note.txt", note).string();
  const auto tp_file = dir.write("tp.txt", "8\n").string();
  const auto sizes_file = dir.write("sizes.json", "[4, 5]\n").string();
  const auto blob_file = dir.write("blob.json", R"({"a": [1, {"b": null}]})").string();
  const Job job = list_job();
  auto params = resolve_params(job,
                               {"note=@" + note_file, "tp=@" + tp_file, "sizes=@" + sizes_file,
                                "sizes=6", "blob=@" + blob_file},
                               std::nullopt);
  REQUIRE(params);
  CHECK((*params)["note"] == note); // exactly the bytes
  CHECK((*params)["tp"] == 8);      // surrounding blanks trimmed for a number
  CHECK((*params)["sizes"] == json({4, 5, 6}));
  CHECK((*params)["blob"] == json::parse(R"({"a": [1, {"b": null}]})"));

  auto literal = resolve_params(job, {"note=@@home"}, std::nullopt);
  REQUIRE(literal);
  CHECK((*literal)["note"] == "@home");

  const auto bad_list = dir.write("bad.json", "4,5").string();
  CHECK_THAT(refusal(resolve_params(job, {"sizes=@" + bad_list}, std::nullopt)),
             Catch::Contains("not valid JSON; a list parameter read from a file takes a JSON "
                             "array"));
  CHECK_THAT(refusal(resolve_params(job, {"note=@" + (dir / "nope").string()}, std::nullopt)),
             Catch::Contains("cannot read"));
  CHECK_THAT(refusal(resolve_params(job, {"note=@" + dir.path().string()}, std::nullopt)),
             Catch::Contains("it is a directory"));
  CHECK_THAT(refusal(resolve_params(job, {"note=@"}, std::nullopt)),
             Catch::Contains("name the file to read after the @"));
}

TEST_CASE("parameter JSON deeper than 512 levels is refused before it is parsed", "[params]")
{
  const Job job = list_job();
  const std::string ok_depth = std::string(512, '[') + std::string(512, ']');
  auto fine = resolve_params(job, {"blob=" + ok_depth}, std::nullopt);
  REQUIRE(fine);
  // 60,000 levels used to overflow the stack in the code that walks a parsed value.
  const std::string deep = std::string(60000, '[') + std::string(60000, ']');
  CHECK_THAT(refusal(resolve_params(job, {"blob=" + deep}, std::nullopt)),
             Catch::Contains("parameter 'blob' nests JSON deeper than 512 levels"));
  ScratchDir dir;
  const auto file = dir.write("deep.json", deep).string();
  CHECK_THAT(refusal(resolve_params(job, {"blob=@" + file}, std::nullopt)),
             Catch::Contains("nests JSON deeper than 512 levels"));
  auto checked = check_params_json_limits("{\"blob\": " + deep + "}", "--params deep.json");
  REQUIRE_FALSE(checked);
  CHECK_THAT(checked.error().message,
             Catch::Contains("--params deep.json nests JSON deeper than 512 levels"));
}

TEST_CASE("parameter input larger than 64 MiB is refused by its size before it is read", "[params]")
{
  ScratchDir dir;
  const auto file = (dir / "huge.json").string();
  {
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(k_max_params_bytes) + 1) == 0); // sparse
    ::close(fd);
  }
  auto read = read_params_input(file, "--params huge.json");
  REQUIRE_FALSE(read);
  CHECK_THAT(read.error().message,
             Catch::Contains("--params huge.json is larger than 64 MiB, the most ferry takes"));
  const auto exact = dir.write("exact.txt", std::string(1000, 'x')).string();
  auto small = read_params_input(exact, "x");
  REQUIRE(small);
  CHECK(small->size() == 1000);
  CHECK_FALSE(check_params_json_limits(std::string(k_max_params_bytes + 1, ' '), "x"));
}

TEST_CASE("every option and argument of every command has a completion kind", "[completion]")
{
  CLI::App app;
  cli::Context ctx;
  cli::add_commands(app, ctx);
  std::vector<std::string> unknown;
  auto check = [&](const CLI::App& owner, const std::string& where) {
    for (const auto* option : owner.get_options()) {
      if ((option->get_positional() || cli::takes_value(*option)) &&
          cli::completion_kind(*option).kind == cli::ValueKind::unknown) {
        unknown.push_back(where + " " + option->get_name());
      }
    }
  };
  check(app, "ferry");
  const auto commands = cli::visible_commands(app);
  CHECK(commands.size() >= 10);
  for (const auto* command : commands) {
    check(*command, command->get_name());
  }
  CHECK(unknown == std::vector<std::string>{});
}

TEST_CASE("the --keep-for option takes seconds or a number with a unit, within its bounds",
          "[detach]")
{
  constexpr long long year = 365LL * 24 * 3600;
  CHECK(ferry::parse_duration_s("1s", year) == 1);
  CHECK(ferry::parse_duration_s("45", year) == 45);
  CHECK(ferry::parse_duration_s("90m", year) == 5400);
  CHECK(ferry::parse_duration_s("12h", year) == 43200);
  CHECK(ferry::parse_duration_s("7d", year) == 604800);
  CHECK(ferry::parse_duration_s("2w", year) == 1209600);
  CHECK(ferry::parse_duration_s("365d", year) == year);
  for (const char* bad : {"", "0", "0s", "-1", "d", "7x", "1.5h", "7 d", " 7d", "366d", "53w",
                          "99999999999999999999", "9223372036854775807w"}) {
    INFO(bad);
    CHECK_FALSE(ferry::parse_duration_s(bad, year));
  }
}

TEST_CASE("the seconds since a record's started_at", "[detach]")
{
  const auto now = std::chrono::system_clock::now();
  const auto since = ferry::seconds_since_utc(ferry::utc_iso(now - std::chrono::seconds(90)));
  REQUIRE(since);
  CHECK(*since > 89);
  CHECK(*since < 100);
  CHECK_FALSE(ferry::seconds_since_utc("yesterday"));
}
