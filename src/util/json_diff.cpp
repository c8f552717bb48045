#include <algorithm>

#include "ferry/json_diff.hpp"

namespace ferry {

namespace {

using nlohmann::json;

std::string escape_token(const std::string& key)
{
  std::string out;
  for (const char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

bool same_scalar(const json& a, const json& b)
{
  if (a.is_number() && b.is_number()) {
    // An int and a float are the same number only if they are equal exactly.
    if (a.is_number_float() || b.is_number_float()) {
      return a.get<double>() == b.get<double>();
    }
    if (a.is_number_unsigned() && b.is_number_unsigned()) {
      return a.get<std::uint64_t>() == b.get<std::uint64_t>();
    }
    if (a.is_number_unsigned() || b.is_number_unsigned()) {
      const json& u = a.is_number_unsigned() ? a : b;
      const json& s = a.is_number_unsigned() ? b : a;
      return s.get<std::int64_t>() >= 0 &&
             static_cast<std::uint64_t>(s.get<std::int64_t>()) == u.get<std::uint64_t>();
    }
    return a.get<std::int64_t>() == b.get<std::int64_t>();
  }
  return a == b;
}

void diff(const json& a, const json& b, const std::string& path, std::vector<JsonChange>& out)
{
  if (a.is_object() && b.is_object()) {
    for (const auto& [key, value] : a.items()) {
      const std::string child = path + "/" + escape_token(key);
      if (!b.contains(key)) {
        out.push_back({child, value, json(), false, true});
      } else {
        diff(value, b[key], child, out);
      }
    }
    for (const auto& [key, value] : b.items()) {
      if (!a.contains(key)) {
        out.push_back({path + "/" + escape_token(key), json(), value, true, false});
      }
    }
    return;
  }
  if (a.is_array() && b.is_array()) {
    const std::size_t common = std::min(a.size(), b.size());
    for (std::size_t i = 0; i < common; ++i) {
      diff(a[i], b[i], path + "/" + std::to_string(i), out);
    }
    for (std::size_t i = common; i < a.size(); ++i) {
      out.push_back({path + "/" + std::to_string(i), a[i], json(), false, true});
    }
    for (std::size_t i = common; i < b.size(); ++i) {
      out.push_back({path + "/" + std::to_string(i), json(), b[i], true, false});
    }
    return;
  }
  if (a.type() != b.type() && !(a.is_number() && b.is_number())) {
    out.push_back({path, a, b});
    return;
  }
  if (!same_scalar(a, b)) {
    out.push_back({path, a, b});
  }
}

} // namespace

std::vector<JsonChange> json_diff(const json& old_value, const json& new_value)
{
  std::vector<JsonChange> changes;
  diff(old_value, new_value, "", changes);
  return changes;
}

bool is_json_pointer(std::string_view text)
{
  if (text.empty()) {
    return true;
  }
  if (text.front() != '/') {
    return false;
  }
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '~' && (i + 1 == text.size() || (text[i + 1] != '0' && text[i + 1] != '1'))) {
      return false;
    }
  }
  return true;
}

std::vector<JsonChange> without_ignored(std::vector<JsonChange> changes,
                                        const std::vector<std::string>& ignored)
{
  const auto is_ignored = [&ignored](const JsonChange& change) {
    return std::any_of(ignored.begin(), ignored.end(), [&change](const std::string& pointer) {
      return change.path == pointer ||
             (change.path.size() > pointer.size() && change.path.starts_with(pointer) &&
              change.path[pointer.size()] == '/');
    });
  };
  std::erase_if(changes, is_ignored);
  return changes;
}

} // namespace ferry
