// libFuzzer target: the `/// ferry` block parser (docs/job-file.md) on hostile job files.
//
// Each input is tried twice: as a whole job file, and as the TOML text of a block (every line
// put behind "# " between "# /// ferry" and "# ///"), so mutations reach the TOML and parameter
// checks without having to keep the comment framing intact. Beyond "no crash, no sanitizer
// report, no exception", a job that loads must satisfy what the rest of ferry relies on.
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "ferry/job.hpp"
#include "ferry/params.hpp"
#include "ferry/remote/shell_neutral.hpp"
#include "fuzz_common.hpp"

namespace {

using ferry::ParamType;
using nlohmann::json;

constexpr std::string_view k_label = "fuzz/job.py";

bool valid_name(const std::string& name)
{
  if (name.empty()) {
    return false;
  }
  for (const char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) {
      return false;
    }
  }
  return true;
}

void check_loaded(const ferry::JobMeta& meta)
{
  FUZZ_CHECK(!meta.interpreter.empty());
  FUZZ_CHECK(ferry::is_shell_neutral_token(meta.interpreter));
  FUZZ_CHECK(meta.timeout_s >= 1 && meta.timeout_s <= 7 * 24 * 3600);
  std::set<std::string> names;
  bool defaults_suffice = true;
  for (const auto& spec : meta.params) {
    FUZZ_CHECK(valid_name(spec.name));
    FUZZ_CHECK(names.insert(spec.name).second);
    FUZZ_CHECK(spec.items == ParamType::integer || spec.items == ParamType::floating ||
               spec.items == ParamType::string);
    if (spec.choices) {
      FUZZ_CHECK(spec.choices->is_array());
      // TOML text is UTF-8, so these serialise strictly (a throw here is a crash).
      (void)spec.choices->dump();
    }
    if (spec.default_value) {
      (void)spec.default_value->dump();
      // The stored default is already typed and allowed: checking it again changes nothing.
      auto again = ferry::check_param_value(spec, *spec.default_value, "its default");
      FUZZ_CHECK(again);
      FUZZ_CHECK(again->dump() == spec.default_value->dump());
    } else if (spec.required) {
      defaults_suffice = false;
    }
  }
  // Resolving with no -p and no --params: fails exactly when a required parameter has no
  // default, and otherwise gives every declared parameter (a default or null).
  ferry::Job job{"job", "fuzz/job.py", "job.py", "", meta};
  auto params = ferry::resolve_params(job, {}, std::nullopt);
  FUZZ_CHECK(params.has_value() == defaults_suffice);
  if (params) {
    FUZZ_CHECK(params->is_object());
    FUZZ_CHECK(params->size() == meta.params.size());
    for (const auto& spec : meta.params) {
      FUZZ_CHECK(params->contains(spec.name));
      FUZZ_CHECK((*params)[spec.name].is_null() == !spec.default_value.has_value());
    }
    (void)params->dump();
  } else {
    FUZZ_CHECK(params.error().kind == ferry::ErrorKind::usage);
  }
}

void try_file(std::string_view bytes)
{
  auto meta = ferry::parse_job_meta(bytes, k_label);
  if (meta) {
    check_loaded(*meta);
  } else {
    FUZZ_CHECK(meta.error().kind == ferry::ErrorKind::usage);
    FUZZ_CHECK(std::string_view(meta.error().message).substr(0, k_label.size()) == k_label);
  }
  // parse_job is parse_job_meta plus the label it makes; it must agree.
  auto job = ferry::parse_job("job", "job.py", "built-in", std::string(bytes));
  FUZZ_CHECK(job.has_value() == meta.has_value());
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try_file(bytes);

  std::string wrapped = "#!/usr/bin/env python3\n# /// ferry\n";
  std::size_t start = 0;
  while (start < bytes.size()) {
    std::size_t end = bytes.find('\n', start);
    if (end == std::string_view::npos) {
      end = bytes.size();
    }
    wrapped += "# ";
    wrapped.append(bytes.substr(start, end - start));
    wrapped += '\n';
    start = end + 1;
  }
  wrapped += "# ///\nprint('hi')\n";
  try_file(wrapped);
  return 0;
}
