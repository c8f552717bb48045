// libFuzzer target: parameter typing and validation (docs/parameters.md: -p KEY=VALUE, --params
// FILE.json).
//
// The first bytes declare a job (1-3 parameters: type, list item type, required, choices,
// default), kept only where parse_job_meta would accept them; the rest are `-p` assignments,
// a --params JSON text and a VALUE fed straight to parse_param_text (`-p KEY=@FILE` reads FILE
// through a reader that gives back FILE itself). Beyond "no crash, no
// sanitizer report, no exception": whatever is accepted has the declared type and passes the
// JSON-value check, and every refusal is a usage error that names the parameter.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>

#include "ferry/job.hpp"
#include "ferry/params.hpp"
#include "fuzz_common.hpp"

namespace {

using ferry::ParamSpec;
using ferry::ParamType;
using nlohmann::json;

constexpr ParamType k_types[] = {ParamType::integer, ParamType::floating, ParamType::boolean,
                                 ParamType::string,  ParamType::list,     ParamType::json};
constexpr ParamType k_item_types[] = {ParamType::integer, ParamType::floating, ParamType::string};
const char* const k_names[] = {"tp", "kv_dtype", "model-name"};

// Values a TOML block can hold are valid UTF-8, so a declaration never holds anything else.
bool serialisable(const json& value)
{
  try {
    (void)value.dump();
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

std::string dump_lossy(const json& value)
{
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

ParamSpec make_spec(FuzzedDataProvider& in, const char* name)
{
  ParamSpec spec;
  spec.name = name;
  spec.type = in.PickValueInArray(k_types);
  spec.items = in.PickValueInArray(k_item_types);
  spec.required = in.ConsumeBool();
  ParamSpec element = spec;
  if (spec.type == ParamType::list) {
    element.type = spec.items;
  }
  if (in.ConsumeBool()) {
    // choices: elements typed as parse_job_meta requires, each from a VALUE text.
    json choices = json::array();
    const int count = in.ConsumeIntegralInRange(0, 4);
    for (int i = 0; i < count; ++i) {
      auto choice = ferry::parse_param_text(element, in.ConsumeRandomLengthString(24));
      if (choice && serialisable(*choice)) {
        choices.push_back(std::move(*choice));
      }
    }
    spec.choices = std::move(choices);
  }
  if (in.ConsumeBool()) {
    const json value = json::parse(in.ConsumeRandomLengthString(64), nullptr, false);
    if (!value.is_discarded()) {
      auto typed = ferry::check_param_value(spec, value, "its default");
      if (typed) {
        spec.default_value = std::move(*typed);
      } else {
        FUZZ_CHECK(typed.error().kind == ferry::ErrorKind::usage);
      }
    }
  }
  spec.help = in.ConsumeRandomLengthString(16);
  return spec;
}

bool has_type(ParamType type, const json& value)
{
  switch (type) {
  case ParamType::integer:
    return value.is_number_integer();
  case ParamType::floating:
    return value.is_number_float();
  case ParamType::boolean:
    return value.is_boolean();
  case ParamType::string:
    return value.is_string();
  case ParamType::list:
    return value.is_array();
  case ParamType::json:
    return true;
  }
  return false;
}

void check_text(const ParamSpec& spec, const std::string& text)
{
  auto parsed = ferry::parse_param_text(spec, text);
  if (!parsed) {
    FUZZ_CHECK(parsed.error().kind == ferry::ErrorKind::usage);
    FUZZ_CHECK(parsed.error().message.find("'" + spec.name + "'") != std::string::npos);
    return;
  }
  const json& value = *parsed;
  FUZZ_CHECK(has_type(spec.type, value));
  if (spec.type == ParamType::string) {
    FUZZ_CHECK(value.get_ref<const std::string&>() == text); // verbatim
  }
  if (spec.type == ParamType::list) {
    // "a,b,c" has one element per comma and one more; "[...]" is a JSON array, which commas
    // inside its strings or nested values do not count (docs/parameters.md).
    const auto commas = static_cast<std::size_t>(std::count(text.begin(), text.end(), ','));
    const bool json_form = !text.empty() && text.front() == '[';
    FUZZ_CHECK(json_form || value.size() == (text.empty() ? 0 : commas + 1));
    FUZZ_CHECK(!json_form || value.size() <= commas + 1);
    for (const auto& element : value) {
      FUZZ_CHECK(has_type(spec.items, element));
    }
  }
  if (spec.type == ParamType::floating) {
    FUZZ_CHECK(std::isfinite(value.get<double>()));
  }
  // What -p accepts, the JSON-value check (--params) accepts too, unchanged.
  auto again = ferry::check_param_value(spec, value, "-p");
  FUZZ_CHECK(again);
  FUZZ_CHECK(dump_lossy(*again) == dump_lossy(value));
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
  FuzzedDataProvider in(data, size);
  ferry::Job job;
  job.name = "fuzz";
  job.source = "fuzz.py";
  job.file_name = "fuzz.py";
  job.meta.interpreter = "python3";
  const int count = in.ConsumeIntegralInRange(1, 3);
  for (int i = 0; i < count; ++i) {
    job.meta.params.push_back(make_spec(in, k_names[i]));
  }

  std::vector<std::string> assignments;
  const int n_assign = in.ConsumeIntegralInRange(0, 4);
  for (int i = 0; i < n_assign; ++i) {
    std::string assignment;
    if (in.ConsumeBool()) {
      assignment = std::string(k_names[in.ConsumeIntegralInRange(0, count - 1)]) + "=";
    }
    assignment += in.ConsumeRandomLengthString(128);
    assignments.push_back(std::move(assignment));
  }

  std::optional<json> file;
  switch (in.ConsumeIntegralInRange(0, 2)) {
  case 0:
    break;
  case 1: { // any JSON document
    json doc = json::parse(in.ConsumeRandomLengthString(256), nullptr, false);
    if (!doc.is_discarded()) {
      file = std::move(doc);
    }
    break;
  }
  case 2: { // an object whose keys are the job's parameters
    json doc = json::object();
    for (int i = 0; i < count; ++i) {
      if (in.ConsumeBool()) {
        json value = json::parse(in.ConsumeRandomLengthString(128), nullptr, false);
        if (!value.is_discarded()) {
          doc[k_names[i]] = std::move(value);
        }
      }
    }
    file = std::move(doc);
    break;
  }
  }

  const std::string rest = in.ConsumeRemainingBytesAsString();
  for (const auto& spec : job.meta.params) {
    check_text(spec, rest);
  }
  for (const auto& assignment : assignments) {
    const auto eq = assignment.find('=');
    if (eq != std::string::npos) {
      if (const auto* spec = job.param(assignment.substr(0, eq))) {
        check_text(*spec, assignment.substr(eq + 1));
      }
    }
  }

  // `-p KEY=@FILE` must not read the fuzzer's files (or its stdin): FILE stands for its own
  // contents, so the typing of file values is fuzzed too.
  const auto contents = [](const std::string& path,
                           std::string_view what) -> ferry::Expected<std::string> {
    FUZZ_CHECK(what.find(path) != std::string_view::npos);
    return path;
  };
  auto params = ferry::resolve_params(job, assignments, file, "--params", contents);
  if (!params) {
    FUZZ_CHECK(params.error().kind == ferry::ErrorKind::usage);
    return 0;
  }
  FUZZ_CHECK(params->is_object());
  FUZZ_CHECK(params->size() == job.meta.params.size());
  for (const auto& spec : job.meta.params) {
    FUZZ_CHECK(params->contains(spec.name));
    const json& value = (*params)[spec.name];
    if (value.is_null()) {
      // Not given and no default (a json parameter may also be given as null).
      FUZZ_CHECK(!spec.required || spec.type == ParamType::json);
      continue;
    }
    auto again = ferry::check_param_value(spec, value, "resolved");
    FUZZ_CHECK(again);
  }
  // What runner.cpp writes as params.json.
  (void)dump_lossy(*params);
  return 0;
}
