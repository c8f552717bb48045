#pragma once
// Result comparison for `replay`: numbers compared exactly, list order matters, every change
// named by its JSON Pointer.
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

} // namespace ferry
