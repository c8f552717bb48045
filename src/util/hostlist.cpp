#include "ferry/hostlist.hpp"

#include <charconv>
#include <cstdint>

#include "ferry/text.hpp"

namespace ferry {

namespace {

// One part of an entry: literal text, or the values of a bracket group, in order.
using Choices = std::vector<std::string>;

Unexpected<Error> bad_range(std::string_view entry, std::string_view why)
{
  return fail(ErrorKind::usage, "bad host range '{}': {}", terminal_safe(entry), why);
}

Expected<std::uint64_t> range_number(std::string_view entry, std::string_view text)
{
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || text.size() > 9 || ec != std::errc{} || end != text.data() + text.size()) {
    return bad_range(entry, fmt::format("'{}' is not a number of at most 9 digits (write "
                                        "gpu[1-4,7] or gpu[01-16])",
                                        terminal_safe(text)));
  }
  return value;
}

// "a", "a-b" or "a-b/step", appended to `values`; a start with a leading zero sets the width.
Expected<void> add_range(Choices& values, std::string_view entry, std::string_view item,
                         std::size_t cap)
{
  std::string_view bounds = item;
  std::uint64_t step = 1;
  if (const auto slash = item.find('/'); slash != std::string_view::npos) {
    FERRY_TRY_ASSIGN(step, range_number(entry, item.substr(slash + 1)));
    if (step == 0) {
      return bad_range(entry, fmt::format("'{}' steps by 0", terminal_safe(item)));
    }
    bounds = item.substr(0, slash);
  }
  const auto dash = bounds.find('-');
  const std::string_view first = bounds.substr(0, dash);
  FERRY_TRY_ASSIGN(const auto low, range_number(entry, first));
  std::uint64_t high = low;
  if (dash != std::string_view::npos) {
    FERRY_TRY_ASSIGN(high, range_number(entry, bounds.substr(dash + 1)));
  }
  if (high < low) {
    return bad_range(entry, fmt::format("'{}' runs backwards; write the lower bound first",
                                        terminal_safe(item)));
  }
  if ((high - low) / step + 1 > cap - std::min(cap, values.size())) {
    return bad_range(entry, fmt::format("it names more than {} hosts", cap));
  }
  const std::size_t width = first.size() > 1 && first.front() == '0' ? first.size() : 0;
  for (std::uint64_t value = low; value <= high; value += step) {
    values.push_back(fmt::format("{:0{}}", value, width));
  }
  return {};
}

Expected<Choices> range_values(std::string_view entry, std::string_view inside, std::size_t cap)
{
  Choices values;
  std::size_t start = 0;
  while (start <= inside.size()) {
    const auto comma = std::min(inside.find(',', start), inside.size());
    FERRY_TRY(add_range(values, entry, trim(inside.substr(start, comma - start)), cap));
    start = comma + 1;
  }
  return values;
}

// An IPv6 literal sits where the host starts: at the front, or right after "user@".
bool is_address_literal(std::string_view entry, std::size_t open, std::string_view inside)
{
  return (open == 0 || entry[open - 1] == '@') && inside.find(':') != std::string_view::npos;
}

Expected<std::vector<Choices>> parse_entry(std::string_view entry, std::size_t cap)
{
  std::vector<Choices> parts;
  std::size_t literal_start = 0;
  for (std::size_t at = 0; at < entry.size(); ++at) {
    if (entry[at] == ']') {
      return bad_range(entry, "a ']' closes no '['");
    }
    if (entry[at] != '[') {
      continue;
    }
    const auto close = entry.find(']', at);
    if (close == std::string_view::npos || entry.find('[', at + 1) < close) {
      return bad_range(entry, "a '[' is not closed by ']'");
    }
    const std::string_view inside = entry.substr(at + 1, close - at - 1);
    if (is_address_literal(entry, at, inside)) {
      at = close;
      continue;
    }
    parts.push_back({std::string(entry.substr(literal_start, at - literal_start))});
    FERRY_TRY_ASSIGN(auto values, range_values(entry, inside, cap));
    parts.push_back(std::move(values));
    literal_start = close + 1;
    at = close;
  }
  parts.push_back({std::string(entry.substr(literal_start))});
  return parts;
}

} // namespace

std::vector<std::string> split_hostlist(std::string_view list)
{
  std::vector<std::string> entries;
  std::size_t start = 0;
  bool inside = false;
  for (std::size_t at = 0; at <= list.size(); ++at) {
    if (at == list.size() || (list[at] == ',' && !inside)) {
      entries.emplace_back(trim(list.substr(start, at - start)));
      start = at + 1;
    } else if (list[at] == '[' || list[at] == ']') {
      inside = list[at] == '[';
    }
  }
  return entries;
}

Expected<std::vector<std::string>> expand_hostlist(std::string_view entry, std::size_t cap)
{
  FERRY_TRY_ASSIGN(const auto parts, parse_entry(entry, cap));
  std::size_t total = 1;
  for (const auto& choices : parts) {
    if (choices.size() > cap / total) {
      return bad_range(entry, fmt::format("it names more than {} hosts", cap));
    }
    total *= choices.size();
  }
  std::vector<std::string> hosts{""};
  for (const auto& choices : parts) {
    std::vector<std::string> longer;
    longer.reserve(hosts.size() * choices.size());
    for (const auto& head : hosts) {
      for (const auto& tail : choices) {
        longer.push_back(head + tail);
      }
    }
    hosts = std::move(longer);
  }
  return hosts;
}

} // namespace ferry
