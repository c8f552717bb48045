#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "ferry/job.hpp"
#include "ferry/params.hpp"
#include "ferry/reporter.hpp"
#include "ferry/run_record.hpp"

using namespace ferry;
using nlohmann::json;

namespace {

const char* k_good = R"(#!/usr/bin/env python3
# /// ferry
# description = "KV-cache capacity"
# interpreter = "python3"
# timeout = 120
#
# [params.tp]
# type = "int"
# default = 1
# help = "tensor-parallel size"
#
# [params.kv_dtype]
# type = "list"
# items = "string"
# default = ["bf16", "fp8_e4m3"]
# choices = ["auto", "bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "nvfp4"]
#
# [params.ratio]
# type = "float"
# default = 0.9
#
# [params.verbose]
# type = "bool"
# default = false
#
# [params.name]
# type = "string"
# required = true
#
# [params.config]
# type = "json"
#
# [params.sizes]
# type = "list"
# items = "int"
# ///
print("hi")
)";

Job good_job()
{
  auto job = parse_job("kv", "kv.py", "kv.py", k_good);
  REQUIRE(job);
  return std::move(job).value();
}

std::string error_of(std::string_view text)
{
  auto meta = parse_job_meta(text, "job.py");
  REQUIRE_FALSE(meta);
  return meta.error().message;
}

} // namespace

TEST_CASE("a good metadata block parses with every field", "[meta]")
{
  const Job job = good_job();
  CHECK(job.meta.description == "KV-cache capacity");
  CHECK(job.meta.interpreter == "python3");
  CHECK(job.meta.timeout_s == 120);
  REQUIRE(job.meta.params.size() == 7);
  CHECK(job.meta.params[0].name == "tp"); // declaration order, not alphabetical
  CHECK(job.meta.params[1].name == "kv_dtype");
  CHECK(job.meta.params[1].type == ParamType::list);
  CHECK(job.meta.params[1].items == ParamType::string);
  CHECK(*job.meta.params[1].default_value == json({"bf16", "fp8_e4m3"}));
  CHECK(job.meta.params[1].choices->size() == 7);
  CHECK(job.param("name")->required);
  CHECK(job.param("tp")->help == "tensor-parallel size");
  CHECK(job.param("sizes")->items == ParamType::integer);
}

TEST_CASE("the timeout defaults to 300 s and CRLF line ends are accepted", "[meta]")
{
  auto meta = parse_job_meta("# /// ferry\r\n# interpreter = \"sh\"\r\n# ///\r\necho\r\n", "x.sh");
  REQUIRE(meta);
  CHECK(meta->timeout_s == 300);
  CHECK(meta->interpreter == "sh");
}

TEST_CASE("gpus asks for 1 to 64 GPUs picked on the host", "[meta]")
{
  auto meta = parse_job_meta("# /// ferry\n# interpreter = \"sh\"\n# gpus = 2\n# ///\n", "x.sh");
  REQUIRE(meta);
  CHECK(meta->gpus == 2);
  CHECK(parse_job_meta("# /// ferry\n# interpreter = \"sh\"\n# ///\n", "x.sh")->gpus == 0);
  for (const char* bad : {"0", "65", "\"2\"", "1.5"}) {
    INFO(bad);
    CHECK_THAT(
        error_of(fmt::format("# /// ferry\n# interpreter = \"sh\"\n# gpus = {}\n# ///\n", bad)),
        Catch::Contains("job.py:3: gpus must be a whole number of GPUs between 1 and 64"));
  }
}

TEST_CASE("broken metadata blocks are refused with file and line", "[meta]")
{
  SECTION("no block shows the block to add")
  {
    const auto message = error_of("print(1)\n");
    CHECK_THAT(message, Catch::Contains("no `/// ferry` metadata block"));
    CHECK_THAT(message, Catch::Contains("# /// ferry"));
    CHECK_THAT(message, Catch::Contains("# interpreter = \"python3\""));
  }
  SECTION("unterminated block")
  {
    CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n"),
               Catch::Contains("no closing `# ///`"));
    CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\necho\n# ///\n"),
               Catch::Contains("job.py:3:"));
  }
  SECTION("invalid TOML names the file's line and column")
  {
    // Issue 42 item 10: the column too, counted in the file's line ("# " included).
    CHECK_THAT(error_of("#!/bin/sh\n# /// ferry\n# interpreter = \"sh\"\n# timeout = = 3\n# ///\n"),
               Catch::StartsWith("job.py:4:13: invalid TOML"));
    CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n#timeout = = 3\n# ///\n"),
               Catch::StartsWith("job.py:3:12: invalid TOML"));
  }
  SECTION("interpreter with shell characters")
  {
    CHECK_THAT(error_of("# /// ferry\n# interpreter = \"python3 -u\"\n# ///\n"),
               Catch::Contains("job.py:2: interpreter must be"));
    CHECK_THAT(error_of("# /// ferry\n# interpreter = \"$(id)\"\n# ///\n"),
               Catch::Contains("interpreter"));
  }
  SECTION("missing interpreter")
  {
    CHECK_THAT(error_of("# /// ferry\n# timeout = 3\n# ///\n"), Catch::Contains("interpreter"));
  }
  SECTION("bad timeout")
  {
    CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n# timeout = -1\n# ///\n"),
               Catch::Contains("job.py:3: timeout"));
    CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n# timeout = \"10\"\n# ///\n"),
               Catch::Contains("timeout"));
  }
  SECTION("unknown keys are typos, not silence")
  {
    CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n# timout = 3\n# ///\n"),
               Catch::Contains("unknown key 'timout'"));
    CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n# [params.a]\n# type = \"int\"\n# "
                        "defualt = 1\n# ///\n"),
               Catch::Contains("job.py:5: params.a has an unknown key 'defualt'"));
  }
  SECTION("bad parameter types")
  {
    CHECK_THAT(
        error_of(
            "# /// ferry\n# interpreter = \"sh\"\n# [params.a]\n# type = \"integer\"\n# ///\n"),
        Catch::Contains("params.a.type must be one of"));
    CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n# [params.a]\n# type = \"list\"\n# "
                        "items = \"json\"\n# ///\n"),
               Catch::Contains("params.a.items"));
  }
  SECTION("a default of the wrong type or outside choices")
  {
    CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n# [params.a]\n# type = \"int\"\n# "
                        "default = \"x\"\n# ///\n"),
               Catch::Contains("parameter 'a' expects an int"));
    CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n# [params.a]\n# type = \"string\"\n# "
                        "default = \"c\"\n# choices = [\"a\", \"b\"]\n# ///\n"),
               Catch::Contains("not one of the choices"));
  }
  SECTION("inf and nan have no JSON form")
  {
    CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n# [params.a]\n# type = \"float\"\n# "
                        "default = inf\n# ///\n"),
               Catch::Contains("job.py:5: params.a.default holds inf or nan"));
    CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n# [params.a]\n# type = \"float\"\n# "
                        "choices = [1.0, nan]\n# ///\n"),
               Catch::Contains("params.a.choices holds inf or nan"));
    CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n# [params.a]\n# type = \"json\"\n# "
                        "default = {x = [-inf]}\n# ///\n"),
               Catch::Contains("params.a.default holds inf or nan"));
  }
}

TEST_CASE("parameter text from -p is typed by the declaration", "[params]")
{
  const Job job = good_job();
  auto params = resolve_params(job,
                               {"tp=8", "kv_dtype=bf16,fp8_e4m3,nvfp4", "ratio=0.5", "verbose=yes",
                                "name=a=b, c", "config={\"x\": [1, 2]}", "sizes=1,2,3"},
                               std::nullopt);
  REQUIRE(params);
  CHECK((*params)["tp"] == 8);
  CHECK((*params)["tp"].is_number_integer());
  CHECK((*params)["kv_dtype"] == json({"bf16", "fp8_e4m3", "nvfp4"}));
  CHECK((*params)["ratio"] == 0.5);
  CHECK((*params)["verbose"] == true);
  CHECK((*params)["name"] == "a=b, c");
  CHECK((*params)["config"] == json::parse(R"({"x": [1, 2]})"));
  CHECK((*params)["sizes"] == json({1, 2, 3}));
}

TEST_CASE("defaults are applied and an undeclared optional parameter is null", "[params]")
{
  auto params = resolve_params(good_job(), {"name=x"}, std::nullopt);
  REQUIRE(params);
  CHECK((*params)["tp"] == 1);
  CHECK((*params)["ratio"] == 0.9);
  CHECK((*params)["config"].is_null());
  CHECK((*params)["sizes"].is_null());
  CHECK(params->size() == 7);
}

TEST_CASE("bool spellings", "[params]")
{
  const Job job = good_job();
  for (const auto* yes : {"true", "1", "yes", "TRUE", "Yes"}) {
    CHECK((*resolve_params(job, {"name=x", std::string("verbose=") + yes},
                           std::nullopt))["verbose"] == true);
  }
  for (const auto* no : {"false", "0", "no", "False"}) {
    CHECK((*resolve_params(job, {"name=x", std::string("verbose=") + no},
                           std::nullopt))["verbose"] == false);
  }
}

TEST_CASE("string values are taken verbatim", "[params]")
{
  const std::string hostile =
      "( ) \" ' \\ $HOME ${PATH} `id` $(id) *.py [a-z]* {a,b} ~root !! ; | & < > # \n\t\r 日本語";
  auto params = resolve_params(good_job(), {"name=" + hostile}, std::nullopt);
  REQUIRE(params);
  CHECK((*params)["name"] == hostile);
}

TEST_CASE("every refusal names the parameter and the expected type", "[params]")
{
  const Job job = good_job();
  auto refused = [&](std::vector<std::string> args, std::optional<json> file = std::nullopt) {
    auto params = resolve_params(job, args, file);
    REQUIRE_FALSE(params);
    CHECK(params.error().kind == ErrorKind::usage);
    return params.error().message;
  };
  CHECK_THAT(refused({"name=x", "tp=eight"}), Catch::Contains("'tp' expects an int, got 'eight'"));
  CHECK_THAT(refused({"name=x", "tp=1.5"}), Catch::Contains("'tp' expects an int"));
  CHECK_THAT(refused({"name=x", "tp="}), Catch::Contains("'tp' expects an int"));
  CHECK_THAT(refused({"name=x", "ratio=abc"}), Catch::Contains("'ratio' expects a float"));
  CHECK_THAT(refused({"name=x", "ratio=nan"}), Catch::Contains("'ratio' expects a float"));
  CHECK_THAT(refused({"name=x", "verbose=maybe"}), Catch::Contains("'verbose' expects a bool"));
  CHECK_THAT(refused({"name=x", "sizes=1,x"}), Catch::Contains("'sizes' expects a list of int"));
  CHECK_THAT(refused({"name=x", "kv_dtype=bf16,int3"}), Catch::Contains("not one of the choices"));
  CHECK_THAT(refused({"name=x", "config={bad"}), Catch::Contains("'config' expects a JSON value"));
  CHECK_THAT(refused({"name=x", "nope=1"}), Catch::Contains("has no parameter 'nope'"));
  CHECK_THAT(refused({"name=x", "tp"}), Catch::Contains("expected KEY=VALUE"));
  CHECK_THAT(refused({}), Catch::Contains("needs parameter 'name'"));
  CHECK_THAT(refused({"name=x"}, json{{"tp", "8"}}),
             Catch::Contains("'tp' expects an int, but --params gives string"));
  CHECK_THAT(refused({"name=x"}, json{{"kv_dtype", {"bf16", 3}}}),
             Catch::Contains("'kv_dtype' expects a list of string"));
  CHECK_THAT(refused({"name=x"}, json{{"unknown", 1}}),
             Catch::Contains("has no parameter 'unknown'"));
  CHECK_THAT(refused({"name=x"}, json::array({1})), Catch::Contains("must hold a JSON object"));
}

TEST_CASE("a -p value wins over --params and --params values keep their JSON types", "[params]")
{
  auto params = resolve_params(good_job(), {"tp=4"}, json{{"tp", 2}, {"name", "n"}, {"ratio", 1}});
  REQUIRE(params);
  CHECK((*params)["tp"] == 4);
  CHECK((*params)["name"] == "n");
  CHECK((*params)["ratio"].is_number_float()); // an int given for a float becomes a float
}

namespace {

Job job_with_params(const std::string& params)
{
  std::string text = "# /// ferry\n# interpreter = \"sh\"\n";
  for (std::size_t start = 0; start < params.size();) {
    const auto end = params.find('\n', start);
    text += "# " + params.substr(start, end - start) + "\n";
    start = end == std::string::npos ? params.size() : end + 1;
  }
  auto job = parse_job("j", "j.sh", "j.sh", text + "# ///\n");
  REQUIRE(job);
  return std::move(job).value();
}

} // namespace

TEST_CASE("a parameter that names programs takes only its allow-list", "[params]")
{
  const Job job = job_with_params("[params.tools]\ntype = \"list\"\nprogram = true\n"
                                  "choices = [\"python3\", \"perl\"]\ndefault = []");
  REQUIRE(job.meta.params.front().program);
  CHECK(resolve_params(job, {"tools=perl,python3"}, std::nullopt));
  for (const std::string bad : {"/tmp/evil", "../x", "evilprog", "-c", "python3 -c x", "./perl"}) {
    INFO(bad);
    auto params = resolve_params(job, {"tools=perl," + bad}, std::nullopt);
    REQUIRE_FALSE(params);
    CHECK(params.error().message ==
          fmt::format("parameter 'tools' names programs to run on the host, and {} is not one "
                      "the job allows; allowed: [\"python3\",\"perl\"]",
                      json(bad).dump()));
    CHECK_FALSE(resolve_params(job, {}, json{{"tools", {bad}}}, "arguments"));
  }
  // The declaration: an allow-list of plain names, on strings.
  CHECK_THAT(
      error_of("# /// ferry\n# interpreter = \"sh\"\n# [params.p]\n# program = true\n# ///\n"),
      Catch::Contains("job.py:3: params.p: a parameter that names programs (program = "
                      "true) needs choices"));
  CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n# [params.p]\n# program = true\n"
                      "# choices = [\"sh\", \"/bin/sh\"]\n# ///\n"),
             Catch::Contains("params.p.choices: \"/bin/sh\" is not a plain program name"));
  for (const std::string choice : {"..", ".hidden", "-x", "a b", "a/b", ""}) {
    INFO(choice);
    CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n# [params.p]\n# program = true\n"
                        "# choices = [" +
                        json(choice).dump() + "]\n# ///\n"),
               Catch::Contains("is not a plain program name"));
  }
  CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n# [params.p]\n# type = \"json\"\n"
                      "# program = true\n# choices = [\"sh\"]\n# ///\n"),
             Catch::Contains("must be a string or a list of strings"));
  CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n# [params.p]\n# program = 1\n# ///\n"),
             Catch::Contains("params.p.program must be true or false"));
}

TEST_CASE("every built-in job's program parameters carry an allow-list of plain names", "[params]")
{
  std::size_t program_params = 0;
  for (const auto& listing : list_jobs(JobPath{{}, true, {}})) {
    auto job = find_job(listing.name, JobPath{{}, true, {}});
    REQUIRE(job);
    for (const auto& spec : job->meta.params) {
      INFO(listing.name << " " << spec.name);
      if (spec.program) {
        ++program_params;
        REQUIRE(spec.choices);
        CHECK_FALSE(spec.choices->empty());
      }
    }
  }
  // host_facts runs each of its `interpreters` as PROGRAM --version.
  auto facts = find_job("builtin:host_facts", {});
  REQUIRE(facts);
  REQUIRE(facts->param("interpreters") != nullptr);
  CHECK(facts->param("interpreters")->program);
  CHECK(program_params >= 1);
}

TEST_CASE("a parameter with a pattern takes only strings that match it whole", "[params]")
{
  const Job job =
      job_with_params("[params.unit]\ntype = \"string\"\npattern = \"[A-Za-z0-9@._-]+\"\n"
                      "default = \"ssh\"");
  CHECK(resolve_params(job, {"unit=nginx.service"}, std::nullopt));
  for (const std::string& bad :
       {std::string("a b"), std::string("../x/"), std::string(), std::string(300, 'a')}) {
    INFO(bad);
    auto params = resolve_params(job, {"unit=" + bad}, std::nullopt);
    REQUIRE_FALSE(params);
    CHECK_THAT(params.error().message,
               Catch::Contains("parameter 'unit': ") &&
                   Catch::Contains("does not match the pattern [A-Za-z0-9@._-]+"));
  }
  CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n# [params.p]\n# pattern = \"(\"\n# "
                      "///\n"),
             Catch::Contains("params.p.pattern is not a regular expression"));
  CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n# [params.p]\n# type = \"int\"\n"
                      "# pattern = \"a\"\n# ///\n"),
             Catch::Contains("params.p.pattern applies to a string or a list of strings"));
  CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n# [params.p]\n# pattern = \"[a-z]+\"\n"
                      "# default = \"A\"\n# ///\n"),
             Catch::Contains("does not match the pattern"));
}

TEST_CASE("summary: JSON Pointers to the headline figures, * for every member", "[meta][summary]")
{
  // Issue 42 item 10: a sweep's table and `ferry log` showed {"assumptions": … of every run.
  const auto meta = parse_job_meta("# /// ferry\n# interpreter = \"python3\"\n# summary = "
                                   "[\"/kv/*/max_tokens\", \"/pick/tp\", \"/a~1b\"]\n# ///\n",
                                   "job.py");
  REQUIRE(meta);
  CHECK(meta->summary == std::vector<std::string>{"/kv/*/max_tokens", "/pick/tp", "/a~1b"});
  CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n# summary = [\"tp\"]\n# ///\n"),
             Catch::Contains("job.py:3: summary: 'tp' is not a JSON Pointer"));
  CHECK_THAT(error_of("# /// ferry\n# interpreter = \"sh\"\n# summary = \"/tp\"\n# ///\n"),
             Catch::Contains("summary must be a list of JSON Pointers"));

  const json result = json::parse(R"({"assumptions": ["a long text"], "tp": 8, "a/b": "x",
      "kv": {"bf16": {"max_tokens": 641164}, "fp8_e4m3": {"max_tokens": 1282328}}})");
  const json summary = result_summary(result, meta->summary);
  CHECK(summary == json::parse(R"([{"name": "bf16/max_tokens", "value": 641164},
                                   {"name": "fp8_e4m3/max_tokens", "value": 1282328},
                                   {"name": "a/b", "value": "x"}])"));
  CHECK(summary_text(summary) == "bf16/max_tokens=641164 fp8_e4m3/max_tokens=1282328 a/b=x");
  CHECK(result_summary(json::parse("[5, 6]"), {"/1", "/7", "/*"}) ==
        json::parse(R"([{"name": "1", "value": 6}, {"name": "0", "value": 5},
                        {"name": "1", "value": 6}])"));

  CHECK(result_summary(json::parse("[5]"), {"/99999999999999999999999", "/-1", "/01x"}).empty());
  CHECK(summary_text(json::parse(R"([1, {"name": 2}, {"name": "a", "value": 1}])")) == "a=1");

  RunRecord run;
  run.status = RunStatus::ok;
  run.result = result;
  CHECK(result_digest(run).starts_with("{\"a/b\":\"x\",\"assumptions\""));
  run.summary = summary;
  CHECK(result_digest(run) == "bf16/max_tokens=641164 fp8_e4m3/max_tokens=1282328 a/b=x");
  run.status = RunStatus::failed;
  run.error = "it failed";
  CHECK(result_digest(run) == "it failed");
}
