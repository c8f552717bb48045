// The result of a run: result.json when present (it must be UTF-8 JSON within the caps), else
// stdout when it is exactly one JSON document, else null.
#include <fmt/format.h>

#include "ferry/runner.hpp"
#include "ferry/text.hpp"

namespace ferry {

using nlohmann::json;

namespace {

// Whether every string in `value` is valid UTF-8, as JSON must carry it.
bool dumps(const json& value)
{
  try {
    (void)value.dump();
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

ParsedResult parse_result_file(const std::string& bytes, std::size_t cap)
{
  if (bytes.size() > cap) {
    return {json(), fmt::format("result.json is larger than the {} MiB cap", cap >> 20)};
  }
  // nlohmann's parser recurses: the depth is checked first, without recursion.
  if (const std::size_t depth = json_nesting_depth(bytes); depth > k_max_json_depth) {
    return {json(), fmt::format("result.json nests {} levels deep (at most {} allowed)", depth,
                                k_max_json_depth)};
  }
  json value = json::parse(bytes, nullptr, false);
  if (value.is_discarded()) {
    return {json(), "result.json is not valid JSON (UTF-8 text)"};
  }
  if (!dumps(value)) {
    return {json(), "result.json holds strings that are not valid UTF-8"};
  }
  return {std::move(value), std::nullopt};
}

// stdout is the result only when it is exactly one JSON array or object.
json stdout_result(std::string_view stdout_text, std::size_t cap)
{
  if (stdout_text.size() > cap) {
    return json();
  }
  const auto first = stdout_text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos || (stdout_text[first] != '{' && stdout_text[first] != '[')) {
    return json();
  }
  if (json_nesting_depth(stdout_text) > k_max_json_depth) {
    return json(); // not parsed: nlohmann's parser recurses
  }
  json value = json::parse(stdout_text, nullptr, false);
  return !value.is_discarded() && dumps(value) ? value : json();
}

} // namespace

ParsedResult parse_result(const std::optional<std::string>& result_file,
                          std::string_view stdout_text, std::size_t cap)
{
  if (result_file) {
    return parse_result_file(*result_file, cap);
  }
  return {stdout_result(stdout_text, cap), std::nullopt};
}

} // namespace ferry
