// Regression tests for what fuzzing found (tests/fuzz; each reproducer is also kept in
// tests/fuzz/corpus/, which the ctest `fuzz` replays).
#include <optional>

#include <catch2/catch.hpp>

#include "ferry/job.hpp"
#include "ferry/params.hpp"

using namespace ferry;
using nlohmann::json;

namespace {

ParamSpec string_with_choices(ParamType type)
{
  ParamSpec spec;
  spec.name = "model";
  spec.type = type;
  spec.items = ParamType::string;
  spec.choices = json::array({"bf16", "fp8_e4m3"});
  return spec;
}

} // namespace

// corpus/params/regress-invalid-utf8-outside-choices: `-p model=$'\xff'` on a parameter with
// choices threw nlohmann's type_error 316 out of the error message's dump() (ferry exited 1
// with "[json.exception.type_error.316] invalid UTF-8 byte") instead of refusing with exit 2.
TEST_CASE("parameter text that is not UTF-8 is refused not thrown", "[params][fuzz]")
{
  for (const auto type : {ParamType::string, ParamType::list}) {
    for (const bool with_choices : {true, false}) {
      ParamSpec spec = string_with_choices(type);
      if (!with_choices) {
        spec.choices.reset();
      }
      for (const char* text : {"\xff", "bf16,\xe9", "\xe2\x82"}) {
        std::optional<Expected<json>> parsed;
        REQUIRE_NOTHROW(parsed.emplace(parse_param_text(spec, text)));
        REQUIRE_FALSE(*parsed);
        CHECK((*parsed).error().kind == ErrorKind::usage);
        CHECK_THAT((*parsed).error().message, Catch::Contains("'model'"));
      }
    }
  }
}

TEST_CASE("check_param_value names a wrongly typed value that is not valid UTF-8", "[params][fuzz]")
{
  ParamSpec spec;
  spec.name = "tp";
  spec.type = ParamType::integer;
  std::optional<Expected<json>> checked;
  REQUIRE_NOTHROW(checked.emplace(check_param_value(spec, json("\xff"), "--params")));
  REQUIRE_FALSE(*checked);
  CHECK_THAT((*checked).error().message, Catch::Contains("'tp' expects an int"));
}

// corpus/job_meta/regress-toml-table-header-slash: a table header whose key starts with a
// character no key may start with. toml++ 3.3.0 asserts on it in a debug build
// (marzer/tomlplusplus#301); the library ferry links reports a parse error.
TEST_CASE("a table header that starts with no key is a TOML error", "[meta][fuzz]")
{
  for (const char* header : {"[[/// ferry", "[/x]", "[[[1]]]", "[[="}) {
    const std::string file =
        std::string("# /// ferry\n# interpreter = \"sh\"\n# ") + header + "\n# ///\n";
    auto meta = parse_job_meta(file, "job.sh");
    REQUIRE_FALSE(meta);
    CHECK_THAT(meta.error().message,
               Catch::StartsWith("job.sh:3:") && Catch::Contains(": invalid TOML"));
  }
}

// corpus/job_meta/regress-toml-unreachable-*: toml++ 3.3.0 reaches __builtin_unreachable()
// when it asks whether many non-ASCII characters are whitespace (marzer/tomlplusplus#295,
// fixed upstream by #305, not in Debian 12). The library ferry links rejects such a file with
// a parse error; this checks it keeps doing so.
TEST_CASE("non-ASCII characters where TOML expects a key or a value end are a TOML error",
          "[meta][fuzz]")
{
  const char* const cases[][2] = {
      {"# /// ferry\n# \xcc\xaa\n# ///\n", "job.sh:2:3: invalid TOML"},
      {"# /// ferry\n# interpreter = \"sh\"\n# timeout = 1\xc9\xab\n# ///\n",
       "job.sh:3:14: invalid TOML"},
      {"# /// ferry\n# interpreter = \"sh\"\n# [params.a]\n# type = \"int\"\n# default = "
       "1\xc2\xa7\n# ///\n",
       "job.sh:5:14: invalid TOML"},
  };
  for (const auto& [file, message] : cases) {
    auto meta = parse_job_meta(file, "job.sh");
    REQUIRE_FALSE(meta);
    CHECK_THAT(meta.error().message, Catch::Contains(message));
  }
  // Non-ASCII text inside strings is fine.
  auto meta = parse_job_meta("# /// ferry\n# interpreter = \"sh\"\n# description = \"\"\"\\\n# "
                             "\xc2\xa7 \xcc\xaa\"\"\"\n# ///\n",
                             "job.sh");
  REQUIRE(meta);
  CHECK(meta->description == "\xc2\xa7 \xcc\xaa");
}

// corpus/job_meta/regress-timeout-float-overflow: `timeout = 922337203685477580761.0` made
// toml++'s node::value<int64_t>() convert a double outside int64_t's range (undefined
// behaviour, UBSan float-cast-overflow). Refused either way; the fuzz build checks the UB.
TEST_CASE("a timeout that is a huge float is refused", "[meta][fuzz]")
{
  for (const char* timeout : {"922337203685477580761.0", "1e300", "-1e300", "inf", "nan", "0.5"}) {
    const std::string file =
        std::string("# /// ferry\n# interpreter = \"sh\"\n# timeout = ") + timeout + "\n# ///\n";
    auto meta = parse_job_meta(file, "job.sh");
    REQUIRE_FALSE(meta);
    CHECK_THAT(meta.error().message, Catch::Contains("job.sh:3: timeout must be"));
  }
}
