#pragma once
// Typing and validation of job parameters (docs/parameters.md), done before any host is
// contacted: every refusal is ErrorKind::usage and names the parameter and expected type.
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/expected.hpp"
#include "ferry/job.hpp"

namespace ferry {

// The most bytes a `--params` document, or a value read by `-p KEY=@FILE`, may have: the same cap
// as a result. JSON given as parameters may nest at most k_max_json_depth deep, like a result.
inline constexpr std::size_t k_max_params_bytes = std::size_t{64} << 20;

// Refuses (ErrorKind::usage) JSON text larger than k_max_params_bytes or nested deeper than
// k_max_json_depth before anything parses it: the parser, and everything after it that walks the
// value, recurse once per level. `what` names the input in the message.
[[nodiscard]] Expected<void> check_params_json_limits(std::string_view text, std::string_view what);

// The bytes of `path` (`-`: standard input) for `--params` or `-p KEY=@FILE`. Larger than
// k_max_params_bytes is refused, judged by the file's size before anything is read when it has
// one (a pipe is read up to the cap). `what` names the input in messages.
[[nodiscard]] Expected<std::string> read_params_input(const std::string& path,
                                                      std::string_view what);

// How `-p KEY=@FILE` reads FILE: read_params_input, unless a caller (a test, a fuzzer) that must
// not touch the file system passes its own.
using ParamFileReader =
    std::function<Expected<std::string>(const std::string& path, std::string_view what)>;

// VALUE from `-p KEY=VALUE`, typed by the declaration.
[[nodiscard]] Expected<nlohmann::json> parse_param_text(const ParamSpec& spec,
                                                        std::string_view text);

// A JSON value that must already have the declared type (`--params`, defaults).
[[nodiscard]] Expected<nlohmann::json>
check_param_value(const ParamSpec& spec, const nlohmann::json& value, std::string_view origin);

// The full, typed, defaults-applied parameter object for `job`. `assignments` are the raw
// `-p KEY=VALUE` strings (VALUE `@FILE` reads the file, `@@…` stands for `@…`; repeating KEY
// appends for a list, else the last wins); `file` the object from `--params` (its values win
// less).
[[nodiscard]] Expected<nlohmann::json>
resolve_params(const Job& job, const std::vector<std::string>& assignments,
               const std::optional<nlohmann::json>& file, std::string_view file_label = "--params",
               const ParamFileReader& read_file = read_params_input);

} // namespace ferry
