#include <charconv>
#include <ctime>

#include "ferry/archive.hpp"
#include "ferry/util.hpp"

namespace ferry {

namespace {

std::optional<int> digits(std::string_view text, std::size_t pos, std::size_t count)
{
  if (pos + count > text.size()) {
    return std::nullopt;
  }
  int value = 0;
  for (std::size_t i = pos; i < pos + count; ++i) {
    if (text[i] < '0' || text[i] > '9') {
      return std::nullopt;
    }
    value = value * 10 + (text[i] - '0');
  }
  return value;
}

// "7d" and friends: a positive count and one unit letter.
std::optional<std::chrono::seconds> parse_age(std::string_view text)
{
  if (text.size() < 2) {
    return std::nullopt;
  }
  long long count = 0;
  const auto* end = text.data() + text.size() - 1;
  const auto [ptr, ec] = std::from_chars(text.data(), end, count);
  if (ec != std::errc() || ptr != end || count < 0 || count > 100LL * 366 * 24 * 3600) {
    return std::nullopt;
  }
  switch (text.back()) {
  case 's':
    return std::chrono::seconds(count);
  case 'm':
    return std::chrono::minutes(count);
  case 'h':
    return std::chrono::hours(count);
  case 'd':
    return std::chrono::hours(24 * count);
  case 'w':
    return std::chrono::hours(24 * 7 * count);
  default:
    return std::nullopt;
  }
}

struct TimeOfDay {
  int hour = 0;
  int minute = 0;
  int second = 0;
  int millis = 0;
};

// What follows the date in TEXT: nothing, or (T| )HH:MM[:SS[.fff]].
std::optional<TimeOfDay> parse_time(std::string_view text)
{
  TimeOfDay time;
  if (text.size() == 10) {
    return time;
  }
  const auto h = digits(text, 11, 2);
  const auto m = digits(text, 14, 2);
  if (text.size() < 16 || (text[10] != 'T' && text[10] != 't' && text[10] != ' ') || !h || !m ||
      text[13] != ':' || *h > 23 || *m > 59) {
    return std::nullopt;
  }
  time.hour = *h;
  time.minute = *m;
  if (text.size() == 16) {
    return time;
  }
  const auto s = digits(text, 17, 2);
  if (text[16] != ':' || !s || *s > 60) {
    return std::nullopt;
  }
  time.second = *s;
  if (text.size() > 19) {
    // A fraction: '.' and 1 to 9 digits; milliseconds kept.
    if (text[19] != '.' || text.size() == 20 || text.size() > 29 ||
        !digits(text, 20, text.size() - 20)) {
      return std::nullopt;
    }
    const std::string ms = std::string(text.substr(20, 3)) + std::string(3, '0');
    time.millis = *digits(ms, 0, 3);
  }
  return time;
}

// YYYY-MM-DD[(T| )HH:MM[:SS[.fff]]][Z]
std::optional<std::string> parse_iso(std::string_view text)
{
  if (!text.empty() && (text.back() == 'Z' || text.back() == 'z')) {
    text.remove_suffix(1);
  }
  const auto year = digits(text, 0, 4);
  const auto month = digits(text, 5, 2);
  const auto day = digits(text, 8, 2);
  if (!year || !month || !day || text[4] != '-' || text[7] != '-' || *month < 1 || *month > 12 ||
      *day < 1 || *day > 31) {
    return std::nullopt;
  }
  const auto time = parse_time(text);
  if (!time) {
    return std::nullopt;
  }
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", *year, *month, *day, time->hour,
                     time->minute, time->second, time->millis);
}

} // namespace

Expected<std::string> normalize_since(std::string_view text,
                                      std::chrono::system_clock::time_point now)
{
  if (const auto age = parse_age(text)) {
    const auto then = std::chrono::time_point_cast<std::chrono::milliseconds>(now - *age);
    return utc_iso(then);
  }
  if (auto iso = parse_iso(text)) {
    return std::move(*iso);
  }
  return fail(ErrorKind::usage,
              "--since '{}': expected a UTC date or time such as 2026-11-29 or 2026-11-29T14:12, "
              "or an age such as 90m, 12h, 7d or 2w",
              text);
}

} // namespace ferry
