#pragma once
// Result comparison for `replay`: numbers compared exactly, list order matters, every change
// named by its JSON Pointer.
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ferry {

struct JsonChange {
  std::string path;         // JSON Pointer ("" is the whole document)
  nlohmann::json old_value; // null-with-missing is told apart by `old_missing`
  nlohmann::json new_value;
  bool old_missing = false;
  bool new_missing = false;
};

[[nodiscard]] std::vector<JsonChange> json_diff(const nlohmann::json& old_value,
                                                const nlohmann::json& new_value);

// Whether TEXT is a JSON Pointer (RFC 6901): "" or "/"-separated tokens, '~' only as ~0 or ~1.
[[nodiscard]] bool is_json_pointer(std::string_view text);

// CHANGES without those at or below any of IGNORED (JSON Pointers): "/cwd" drops "/cwd" and
// "/cwd/x", not "/cwdx"; "" drops everything.
[[nodiscard]] std::vector<JsonChange> without_ignored(std::vector<JsonChange> changes,
                                                      const std::vector<std::string>& ignored);

} // namespace ferry
