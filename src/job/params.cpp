#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <set>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ferry/fd.hpp"
#include "ferry/params.hpp"
#include "ferry/suggest.hpp"
#include "ferry/text.hpp"

namespace ferry {
namespace {

using nlohmann::json;

// How much of a refused value an error message quotes.
constexpr std::size_t k_shown = 60;
constexpr std::size_t k_max_pattern_value = 256;

std::string describe(const ParamSpec& spec)
{
  if (spec.type == ParamType::list) {
    return fmt::format("a list of {} (comma-separated, or a JSON array)", to_string(spec.items));
  }
  switch (spec.type) {
  case ParamType::integer:
    return "an int";
  case ParamType::floating:
    return "a float";
  case ParamType::boolean:
    return "a bool (true/false/1/0/yes/no)";
  case ParamType::string:
    return "a string (UTF-8 text)";
  case ParamType::json:
    return "a JSON value";
  default:
    return "?";
  }
}

std::optional<json> parse_scalar(ParamType type, std::string_view text)
{
  switch (type) {
  case ParamType::integer: {
    std::int64_t value = 0;
    const auto* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, value);
    if (text.empty() || ec != std::errc() || ptr != end) {
      return std::nullopt;
    }
    return json(value);
  }
  case ParamType::floating: {
    const std::string copy(text);
    char* end = nullptr;
    const double value = std::strtod(copy.c_str(), &end);
    if (copy.empty() || end != copy.c_str() + copy.size() || !std::isfinite(value) ||
        std::isspace(static_cast<unsigned char>(copy.front()))) {
      return std::nullopt;
    }
    return json(value);
  }
  case ParamType::boolean: {
    std::string lower(text);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower == "true" || lower == "1" || lower == "yes")
      return json(true);
    if (lower == "false" || lower == "0" || lower == "no")
      return json(false);
    return std::nullopt;
  }
  case ParamType::string:
    if (!is_valid_utf8(text)) {
      return std::nullopt; // parameters travel as JSON, which carries UTF-8 text only
    }
    return json(std::string(text));
  default:
    return std::nullopt;
  }
}

bool has_type(ParamType type, const json& value)
{
  switch (type) {
  case ParamType::integer:
    return value.is_number_integer();
  case ParamType::floating:
    return value.is_number();
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

// `pattern`: each string (list element) matches it whole. Long values are refused before the
// match: std::regex recurses per character.
Expected<void> check_pattern(const ParamSpec& spec, const json& value)
{
  if (!spec.pattern) {
    return {};
  }
  const std::regex pattern(*spec.pattern, std::regex::ECMAScript);
  const auto matches = [&](const json& v) {
    const auto& text = v.get_ref<const std::string&>();
    return text.size() <= k_max_pattern_value && std::regex_match(text, pattern);
  };
  const json single = json::array({value});
  for (const auto& element : spec.type == ParamType::list ? value : single) {
    if (element.is_string() && !matches(element)) {
      return fail(ErrorKind::usage,
                  "parameter '{}': {} does not match the pattern {} the job "
                  "declares (at most {} characters)",
                  spec.name,
                  shorten(element.dump(-1, ' ', false, json::error_handler_t::replace), k_shown),
                  *spec.pattern, k_max_pattern_value);
    }
  }
  return {};
}

Expected<void> check_choices(const ParamSpec& spec, const json& value)
{
  if (!spec.choices) {
    return {};
  }
  auto allowed = [&](const json& v) {
    return std::any_of(spec.choices->begin(), spec.choices->end(),
                       [&](const json& c) { return c == v; });
  };
  const bool ok = spec.type == ParamType::list ? std::all_of(value.begin(), value.end(), allowed)
                                               : allowed(value);
  if (!ok && spec.program) {
    const json& bad = spec.type == ParamType::list
                          ? *std::find_if_not(value.begin(), value.end(), allowed)
                          : value;
    return fail(ErrorKind::usage,
                "parameter '{}' names programs to run on the host, and {} is not one the job "
                "allows; allowed: {}",
                spec.name,
                shorten(bad.dump(-1, ' ', false, json::error_handler_t::replace), k_shown),
                spec.choices->dump(-1, ' ', false, json::error_handler_t::replace));
  }
  if (!ok) {
    return fail(ErrorKind::usage, "parameter '{}': {} is not one of the choices {}", spec.name,
                shorten(value.dump(-1, ' ', false, json::error_handler_t::replace), k_shown),
                spec.choices->dump(-1, ' ', false, json::error_handler_t::replace));
  }
  return {};
}

std::string too_large(std::string_view what)
{
  return fmt::format("{} is larger than {} MiB, the most ferry takes as parameters (the same cap "
                     "as a result); put large inputs in a file on the host and pass its path",
                     what, k_max_params_bytes >> 20);
}

} // namespace

Expected<void> check_params_json_limits(std::string_view text, std::string_view what)
{
  if (text.size() > k_max_params_bytes) {
    return fail(ErrorKind::usage, "{}", too_large(what));
  }
  if (json_nesting_depth(text) > k_max_json_depth) {
    return fail(ErrorKind::usage,
                "{} nests JSON deeper than {} levels, the most ferry takes (as for a result); "
                "give it a flatter shape",
                what, k_max_json_depth);
  }
  return {};
}

Expected<std::string> read_params_input(const std::string& path, std::string_view what)
{
  Fd owned;
  if (path != "-") {
    owned.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!owned) {
      return fail(ErrorKind::usage, "{}: cannot read {}: {}", what, path, std::strerror(errno));
    }
  }
  const int fd = owned ? owned.get() : STDIN_FILENO;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    return fail(ErrorKind::usage, "{}: cannot read {}: {}", what, path,
                S_ISDIR(st.st_mode) ? "it is a directory" : std::strerror(errno));
  }
  // Judged by the size before a byte is read; a pipe has none and is read up to the cap.
  if (S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_size) > k_max_params_bytes) {
    return fail(ErrorKind::usage, "{}", too_large(what));
  }
  std::string bytes;
  bytes.reserve(S_ISREG(st.st_mode) ? static_cast<std::size_t>(st.st_size) : 0);
  std::vector<char> buffer(std::size_t{1} << 16);
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      return fail(ErrorKind::usage, "{}: error while reading {}: {}", what, path,
                  std::strerror(errno));
    }
    if (n == 0) {
      return bytes;
    }
    if (bytes.size() + static_cast<std::size_t>(n) > k_max_params_bytes) {
      return fail(ErrorKind::usage, "{}", too_large(what));
    }
    bytes.append(buffer.data(), static_cast<std::size_t>(n));
  }
}

Expected<json> check_param_value(const ParamSpec& spec, const json& value, std::string_view origin)
{
  if (!has_type(spec.type, value)) {
    return fail(ErrorKind::usage, "parameter '{}' expects {}, but {} gives {} ({})", spec.name,
                describe(spec), origin, value.type_name(),
                shorten(value.dump(-1, ' ', false, json::error_handler_t::replace), k_shown));
  }
  json typed = value;
  if (spec.type == ParamType::floating) {
    typed = value.get<double>();
  }
  if (spec.type == ParamType::list) {
    for (auto& element : typed) {
      if (!has_type(spec.items, element)) {
        return fail(ErrorKind::usage, "parameter '{}' expects {}, but {} gives an element {} ({})",
                    spec.name, describe(spec), origin, element.type_name(),
                    shorten(element.dump(-1, ' ', false, json::error_handler_t::replace), k_shown));
      }
      if (spec.items == ParamType::floating) {
        element = element.get<double>();
      }
    }
  }
  FERRY_TRY(check_choices(spec, typed));
  FERRY_TRY(check_pattern(spec, typed));
  return typed;
}

namespace {

Expected<json> parse_json_text(const ParamSpec& spec, std::string_view text)
{
  FERRY_TRY(check_params_json_limits(text, fmt::format("parameter '{}'", spec.name)));
  json value = json::parse(text.begin(), text.end(), nullptr, false);
  if (value.is_discarded()) {
    return fail(ErrorKind::usage,
                "parameter '{}' expects a JSON value, but '{}' is not valid JSON (quote strings: "
                "-p {}='\"text\"')",
                spec.name, shorten(text, k_shown), spec.name);
  }
  return value;
}

// "[1, 2]": a JSON array, its elements checked against the list's `items`.
Expected<json> parse_json_list_text(const ParamSpec& spec, std::string_view text)
{
  const std::string what = fmt::format("-p {}", spec.name);
  FERRY_TRY(check_params_json_limits(text, what));
  const json value = json::parse(text.begin(), text.end(), nullptr, false);
  if (value.is_discarded() || !value.is_array()) {
    return fail(ErrorKind::usage,
                "parameter '{}' expects {}, but '{}' starts with [ and is not a JSON array (quote "
                "strings: -p {}='[\"a\", \"b\"]', or give a,b)",
                spec.name, describe(spec), shorten(text, k_shown), spec.name);
  }
  return check_param_value(spec, value, what);
}

// "a,b,c": every element typed by the list's `items`; "[...]" is a JSON array.
Expected<json> parse_list_text(const ParamSpec& spec, std::string_view text)
{
  json value = json::array();
  if (text.empty()) {
    return value;
  }
  if (text.front() == '[') {
    return parse_json_list_text(spec, text);
  }
  for (std::size_t start = 0;;) {
    const std::size_t comma = text.find(',', start);
    const std::string_view item = text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    auto element = parse_scalar(spec.items, item);
    if (!element) {
      return fail(ErrorKind::usage, "parameter '{}' expects {}, but element '{}' is not {}",
                  spec.name, describe(spec), shorten(item, k_shown),
                  spec.items == ParamType::string ? "UTF-8 text" : to_string(spec.items));
    }
    value.push_back(std::move(*element));
    if (comma == std::string_view::npos) {
      return value;
    }
    start = comma + 1;
  }
}

Expected<json> parse_scalar_text(const ParamSpec& spec, std::string_view text)
{
  auto scalar = parse_scalar(spec.type, text);
  if (!scalar) {
    return fail(ErrorKind::usage, "parameter '{}' expects {}, got '{}'", spec.name, describe(spec),
                shorten(text, k_shown));
  }
  return std::move(*scalar);
}

std::string known_names(const Job& job)
{
  std::string names;
  for (const auto& spec : job.meta.params) {
    names += (names.empty() ? "" : ", ") + spec.name;
  }
  return names.empty() ? std::string("it takes none") : "known: " + names;
}

std::string no_such_param(const Job& job, std::string_view key)
{
  std::vector<std::string> names;
  for (const auto& spec : job.meta.params) {
    names.push_back(spec.name);
  }
  return fmt::format("job {} has no parameter '{}'{} ({})", job.name, key, did_you_mean(key, names),
                     known_names(job));
}

// The values `--params` gives, each checked against its declaration.
Expected<void> add_file_values(const Job& job, const json& file, std::string_view file_label,
                               json& given)
{
  if (!file.is_object()) {
    return fail(ErrorKind::usage, "{} must hold a JSON object of parameters, not {}", file_label,
                file.type_name());
  }
  for (const auto& [key, value] : file.items()) {
    const ParamSpec* spec = job.param(key);
    if (spec == nullptr) {
      return fail(ErrorKind::usage, "{}: {}", file_label, no_such_param(job, key));
    }
    FERRY_TRY_ASSIGN(given[key], check_param_value(*spec, value, file_label));
  }
  return {};
}

// A parameter's value read from a file (`-p KEY=@FILE`): a string takes the bytes as they are,
// a list or json value is parsed as JSON, the other types are parsed from the trimmed text.
Expected<json> parse_param_file(const ParamSpec& spec, const std::string& bytes,
                                std::string_view what)
{
  if (spec.type == ParamType::string) {
    return parse_param_text(spec, bytes);
  }
  if (spec.type != ParamType::list && spec.type != ParamType::json) {
    return parse_param_text(spec, trim(bytes));
  }
  FERRY_TRY(check_params_json_limits(bytes, what));
  const json value = json::parse(bytes, nullptr, false);
  if (value.is_discarded()) {
    return fail(ErrorKind::usage, "{}: not valid JSON; a {} parameter read from a file takes {}",
                what, to_string(spec.type),
                spec.type == ParamType::list ? "a JSON array like [1, 2]" : "any JSON value");
  }
  return check_param_value(spec, value, what);
}

// VALUE of `-p KEY=VALUE`: text, or the contents of FILE for `@FILE` (`@@…` is the text `@…`).
Expected<json> assignment_value(const ParamSpec& spec, std::string_view text,
                                const ParamFileReader& read_file)
{
  if (!text.starts_with('@') || text.starts_with("@@")) {
    return parse_param_text(spec, text.starts_with('@') ? text.substr(1) : text);
  }
  const std::string file(text.substr(1));
  if (file.empty()) {
    return fail(ErrorKind::usage,
                "-p {}=@: name the file to read after the @ (a value that starts with @ is "
                "written @@…)",
                spec.name);
  }
  const std::string what = fmt::format("-p {}=@{}", spec.name, file);
  FERRY_TRY_ASSIGN(const auto bytes, read_file(file, what));
  return parse_param_file(spec, bytes, what);
}

// The values `-p KEY=VALUE` gives, typed by their declarations; they win over the file's. A list
// parameter given again gets the new elements appended.
Expected<void> add_assignments(const Job& job, const std::vector<std::string>& assignments,
                               const ParamFileReader& read_file, json& given)
{
  std::set<std::string> assigned;
  for (const auto& assignment : assignments) {
    const auto eq = assignment.find('=');
    if (eq == std::string::npos || eq == 0) {
      return fail(ErrorKind::usage, "-p '{}': expected KEY=VALUE", shorten(assignment, k_shown));
    }
    const std::string key = assignment.substr(0, eq);
    const ParamSpec* spec = job.param(key);
    if (spec == nullptr) {
      return fail(ErrorKind::usage, "-p {}: {}", key, no_such_param(job, key));
    }
    FERRY_TRY_ASSIGN(
        json value,
        assignment_value(*spec, std::string_view(assignment).substr(eq + 1), read_file));
    const bool again = !assigned.insert(key).second;
    if (again && spec->type != ParamType::list) {
      const std::string before =
          shorten(given[key].dump(-1, ' ', false, json::error_handler_t::replace), k_shown);
      const std::string after =
          shorten(value.dump(-1, ' ', false, json::error_handler_t::replace), k_shown);
      return fail(ErrorKind::usage,
                  "-p {} is given twice ({}, then {}), but '{}' takes one value ({}); give it "
                  "once, or --sweep {}=... for one run per value",
                  key, before, after, key, describe(*spec), key);
    }
    if (again && spec->type == ParamType::list) {
      given[key].insert(given[key].end(), value.begin(), value.end());
    } else {
      given[key] = std::move(value);
    }
  }
  return {};
}

} // namespace

Expected<json> parse_param_text(const ParamSpec& spec, std::string_view text)
{
  FERRY_TRY_ASSIGN(json value, spec.type == ParamType::json   ? parse_json_text(spec, text)
                               : spec.type == ParamType::list ? parse_list_text(spec, text)
                                                              : parse_scalar_text(spec, text));
  FERRY_TRY(check_choices(spec, value));
  FERRY_TRY(check_pattern(spec, value));
  return value;
}

Expected<json> resolve_params(const Job& job, const std::vector<std::string>& assignments,
                              const std::optional<json>& file, std::string_view file_label,
                              const ParamFileReader& read_file)
{
  json given = json::object();
  if (file) {
    FERRY_TRY(add_file_values(job, *file, file_label, given));
  }
  FERRY_TRY(add_assignments(job, assignments, read_file, given));
  json params = json::object();
  for (const auto& spec : job.meta.params) {
    if (given.contains(spec.name)) {
      params[spec.name] = given[spec.name];
    } else if (spec.default_value) {
      params[spec.name] = *spec.default_value;
    } else if (spec.required) {
      return fail(ErrorKind::usage, "job {} needs parameter '{}' ({}{}); pass -p {}=VALUE",
                  job.name, spec.name, describe(spec), spec.help.empty() ? "" : ": " + spec.help,
                  spec.name);
    } else {
      params[spec.name] = nullptr;
    }
  }
  return params;
}

} // namespace ferry
