#include "report/host_fold.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ferry {

namespace {

// A name's last run of digits: "r2-n01-ib" -> {"r2-n", "01", "-ib"}.
struct SplitName {
  std::string prefix;
  std::string digits;
  std::string suffix;
};

// Longer digit runs are not numbers here (no overflow): such names are listed as they are.
constexpr std::size_t k_max_digits = 18;

bool is_digit(char c)
{
  return c >= '0' && c <= '9';
}

std::optional<SplitName> split_name(const std::string& name)
{
  if (name.find_first_of("[],") != std::string::npos) {
    return std::nullopt;
  }
  const auto last = std::find_if(name.rbegin(), name.rend(), is_digit);
  if (last == name.rend()) {
    return std::nullopt;
  }
  const auto end = static_cast<std::size_t>(name.rend() - last);
  std::size_t begin = end;
  while (begin > 0 && is_digit(name[begin - 1])) {
    --begin;
  }
  if (end - begin > k_max_digits) {
    return std::nullopt;
  }
  return SplitName{name.substr(0, begin), name.substr(begin, end - begin), name.substr(end)};
}

struct NodeNumber {
  std::uint64_t value = 0;
  std::string digits;
  bool operator<(const NodeNumber& other) const
  {
    return std::pair(value, digits.size()) < std::pair(other.value, other.digits.size());
  }
  bool operator==(const NodeNumber& other) const { return digits == other.digits; }
};

// The width a range starting at `digits` pads its numbers to (0: not padded).
std::size_t padding_of(const std::string& digits)
{
  return digits.size() > 1 && digits[0] == '0' ? digits.size() : 0;
}

std::string padded(std::uint64_t value, std::size_t width)
{
  return fmt::format("{:0{}}", value, width);
}

// One bracket's ranges of numbers, each padded to its first number's width.
struct NodeRange {
  std::string first;
  NodeNumber last;
  std::size_t width = 0;
};

// "01-03,07,10": a number extends a range that ends just before it and whose padding writes it
// as it was written, else it starts one ("0,00,1" -> "0-1,00").
std::string fold_numbers(std::vector<NodeNumber> numbers)
{
  std::sort(numbers.begin(), numbers.end());
  numbers.erase(std::unique(numbers.begin(), numbers.end()), numbers.end());
  std::vector<NodeRange> ranges;
  for (auto& number : numbers) {
    const auto range = std::find_if(ranges.begin(), ranges.end(), [&](const NodeRange& r) {
      return r.last.value + 1 == number.value && padded(number.value, r.width) == number.digits;
    });
    if (range != ranges.end()) {
      range->last = std::move(number);
    } else {
      const std::size_t width = padding_of(number.digits);
      ranges.push_back({number.digits, std::move(number), width});
    }
  }
  std::vector<std::string> texts;
  texts.reserve(ranges.size());
  for (const auto& range : ranges) {
    texts.push_back(range.first == range.last.digits
                        ? range.first
                        : fmt::format("{}-{}", range.first, range.last.digits));
  }
  return fmt::format("{}", fmt::join(texts, ","));
}

} // namespace

std::string fold_hosts(const std::vector<std::string>& names)
{
  // Keyed by prefix and suffix; parts sort by (prefix, suffix), a plain name as its own prefix.
  std::map<std::pair<std::string, std::string>, std::vector<NodeNumber>> groups;
  std::vector<std::pair<std::pair<std::string, std::string>, std::string>> parts;
  for (const auto& name : names) {
    if (auto split = split_name(name)) {
      groups[{split->prefix, split->suffix}].push_back(
          NodeNumber{std::stoull(split->digits), split->digits});
    } else {
      parts.push_back({{name, ""}, name});
    }
  }
  for (auto& [key, numbers] : groups) {
    const std::string folded = fold_numbers(std::move(numbers));
    const bool one = folded.find_first_of(",-") == std::string::npos;
    parts.push_back({key, one ? key.first + folded + key.second
                              : fmt::format("{}[{}]{}", key.first, folded, key.second)});
  }
  std::sort(parts.begin(), parts.end());
  parts.erase(std::unique(parts.begin(), parts.end()), parts.end());
  std::vector<std::string> out;
  out.reserve(parts.size());
  for (auto& part : parts) {
    out.push_back(std::move(part.second));
  }
  return fmt::format("{}", fmt::join(out, ","));
}

} // namespace ferry
