#pragma once
// Typing and validation of job parameters (docs/parameters.md), done before any host is
// contacted: every refusal is ErrorKind::usage and names the parameter and expected type.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/expected.hpp"
#include "ferry/job.hpp"

namespace ferry {

// VALUE from `-p KEY=VALUE`, typed by the declaration.
[[nodiscard]] Expected<nlohmann::json> parse_param_text(const ParamSpec& spec,
                                                        std::string_view text);

// A JSON value that must already have the declared type (`--params`, defaults).
[[nodiscard]] Expected<nlohmann::json>
check_param_value(const ParamSpec& spec, const nlohmann::json& value, std::string_view origin);

// The full, typed, defaults-applied parameter object for `job`. `assignments` are the raw
// `-p KEY=VALUE` strings; `file` the object from `--params` (its values win less).
[[nodiscard]] Expected<nlohmann::json> resolve_params(const Job& job,
                                                      const std::vector<std::string>& assignments,
                                                      const std::optional<nlohmann::json>& file,
                                                      std::string_view file_label = "--params");

} // namespace ferry
