#include <cctype>
#include <charconv>
#include <cmath>

#include "ferry/archive.hpp"

namespace ferry {

namespace {

std::string lower(std::string_view text)
{
  std::string out(text);
  for (char& c : out) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

// The multiplier a unit stands for; 0 for an unknown unit.
double unit_bytes(std::string_view unit)
{
  constexpr std::pair<std::string_view, double> units[] = {
      {"", 1},         {"b", 1},      {"k", 0x1p10},   {"kib", 0x1p10}, {"m", 0x1p20},
      {"mib", 0x1p20}, {"g", 0x1p30}, {"gib", 0x1p30}, {"t", 0x1p40},   {"tib", 0x1p40},
      {"kb", 1e3},     {"mb", 1e6},   {"gb", 1e9},     {"tb", 1e12},
  };
  for (const auto& [name, bytes] : units) {
    if (name == unit) {
      return bytes;
    }
  }
  return 0;
}

} // namespace

Expected<std::uint64_t> parse_size(std::string_view text, std::string_view what)
{
  const std::string spelled = lower(text);
  double number = -1;
  const auto [end, ec] = std::from_chars(spelled.data(), spelled.data() + spelled.size(), number);
  std::string_view unit(end, static_cast<std::size_t>(spelled.data() + spelled.size() - end));
  while (!unit.empty() && unit.front() == ' ') {
    unit.remove_prefix(1);
  }
  const double bytes = ec == std::errc() ? number * unit_bytes(unit) : 0;
  if (ec != std::errc() || !std::isfinite(number) || number < 0 || unit_bytes(unit) == 0 ||
      bytes >= 0x1p63) {
    return fail(ErrorKind::usage,
                "{} '{}': expected a size such as 2GiB, 500MiB, 1.5GB or 1048576 (bytes)", what,
                text);
  }
  return static_cast<std::uint64_t>(bytes);
}

std::string size_text(std::uint64_t bytes)
{
  constexpr std::string_view units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  auto value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(units)) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", value, units[unit]);
}

} // namespace ferry
