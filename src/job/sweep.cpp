#include "ferry/sweep.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "ferry/params.hpp"
#include "ferry/text.hpp"

namespace ferry {

namespace {

Expected<std::vector<std::string>> json_values(std::string_view key, std::string_view text)
{
  FERRY_TRY(check_params_json_limits(text, fmt::format("--sweep {}", key)));
  const auto list = nlohmann::json::parse(text, nullptr, false);
  if (list.is_discarded() || !list.is_array()) {
    return fail(ErrorKind::usage,
                "--sweep {}: '{}' is not a JSON list; give e.g. --sweep '{}=[\"a,b\",\"c\"]'", key,
                terminal_safe(shorten(text, 80)), key);
  }
  std::vector<std::string> values;
  for (const auto& item : list) {
    values.push_back(item.is_string() ? item.get<std::string>() : item.dump());
  }
  return values;
}

Expected<std::vector<std::string>> comma_values(std::string_view key, std::string_view text)
{
  std::vector<std::string> values;
  std::size_t start = 0;
  while (start <= text.size()) {
    const auto comma = std::min(text.find(',', start), text.size());
    values.emplace_back(text.substr(start, comma - start));
    if (values.back().empty()) {
      return fail(ErrorKind::usage,
                  "--sweep {}: an empty value in '{}'; an empty string can be given as a JSON "
                  "list (--sweep '{}=[\"\"]')",
                  key, terminal_safe(text), key);
    }
    start = comma + 1;
  }
  return values;
}

} // namespace

Expected<Sweep> parse_sweep(std::string_view option)
{
  const auto equals = option.find('=');
  Sweep sweep;
  sweep.key = std::string(option.substr(0, equals));
  if (equals == std::string_view::npos || sweep.key.empty()) {
    return fail(ErrorKind::usage, "--sweep '{}': give KEY=V1,V2,... (or KEY=[JSON list])",
                terminal_safe(option));
  }
  const std::string_view text = option.substr(equals + 1);
  if (text.empty()) {
    return fail(ErrorKind::usage, "--sweep {}: no values; give KEY=V1,V2,...",
                terminal_safe(sweep.key));
  }
  const bool json = text.front() == '[';
  FERRY_TRY_ASSIGN(sweep.values, json ? json_values(terminal_safe(sweep.key), text)
                                      : comma_values(terminal_safe(sweep.key), text));
  if (sweep.values.empty()) {
    return fail(ErrorKind::usage, "--sweep {}: the list is empty; give at least one value",
                terminal_safe(sweep.key));
  }
  return sweep;
}

Expected<std::vector<Sweep>> parse_sweeps(const std::vector<std::string>& options,
                                          const std::vector<std::string>& assignments)
{
  std::vector<Sweep> sweeps;
  std::size_t runs = 1;
  for (const auto& option : options) {
    FERRY_TRY_ASSIGN(auto sweep, parse_sweep(option));
    const std::string key = terminal_safe(sweep.key);
    if (std::any_of(sweeps.begin(), sweeps.end(),
                    [&](const Sweep& s) { return s.key == sweep.key; })) {
      return fail(ErrorKind::usage, "--sweep {} is given twice; put all its values in one", key);
    }
    if (std::any_of(assignments.begin(), assignments.end(),
                    [&](const std::string& a) { return a.substr(0, a.find('=')) == sweep.key; })) {
      return fail(ErrorKind::usage,
                  "{} is given both with -p and with --sweep; keep one (a swept value is "
                  "the run's value)",
                  key);
    }
    runs *= sweep.values.size();
    if (runs > k_max_sweep_runs) {
      return fail(ErrorKind::usage,
                  "--sweep: more than {} combinations per job and host; sweep fewer values",
                  k_max_sweep_runs);
    }
    sweeps.push_back(std::move(sweep));
  }
  return sweeps;
}

std::vector<std::vector<std::string>> sweep_combinations(const std::vector<Sweep>& sweeps)
{
  std::vector<std::vector<std::string>> combinations{{}};
  for (const auto& sweep : sweeps) {
    std::vector<std::vector<std::string>> next;
    for (const auto& partial : combinations) {
      for (const auto& value : sweep.values) {
        next.push_back(partial);
        next.back().push_back(sweep.key + "=" + value);
      }
    }
    combinations = std::move(next);
  }
  return combinations;
}

} // namespace ferry
