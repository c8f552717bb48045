#include "report/result_fold.hpp"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ferry/text.hpp"
#include "report/host_fold.hpp"

namespace ferry {

namespace {

void replace_all(std::string& text, std::string_view what, std::string_view with)
{
  if (what.empty()) {
    return;
  }
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + with.size())) {
    text.replace(at, what.size(), with);
  }
}

// Groups in the order they are shown: ok before the rest, larger before smaller, earlier first.
bool shown_before(const OutcomeGroup& a, std::size_t a_first, const OutcomeGroup& b,
                  std::size_t b_first)
{
  const bool a_ok = a.status == RunStatus::ok;
  const bool b_ok = b.status == RunStatus::ok;
  if (a_ok != b_ok) {
    return a_ok;
  }
  if (a.hosts.size() != b.hosts.size()) {
    return a.hosts.size() > b.hosts.size();
  }
  return a_first < b_first;
}

// A value in a change, short enough for one line.
std::string value_text(const nlohmann::json& value)
{
  return shorten(to_json_line(value), 40);
}

std::string change_text(const JsonChange& change)
{
  // A JSON Pointer without its leading "/" reads as a path; the whole document is "result".
  const std::string field = change.path.empty() ? "result" : change.path.substr(1);
  if (change.new_missing) {
    return fmt::format("{} absent (others: {})", field, value_text(change.old_value));
  }
  if (change.old_missing) {
    return fmt::format("{} {} (absent in others)", field, value_text(change.new_value));
  }
  return fmt::format("{} {} instead of {}", field, value_text(change.new_value),
                     value_text(change.old_value));
}

std::string hosts_text(const OutcomeGroup& group)
{
  const std::string names = terminal_safe(fold_hosts(group.hosts));
  return group.hosts.size() == 1 ? names : fmt::format("{} ({} hosts)", names, group.hosts.size());
}

} // namespace

std::string generic_error(std::string_view error, std::string_view label,
                          const nlohmann::json& target)
{
  std::string text(error);
  const std::string host = target.is_object() ? target.value("host", "") : "";
  if (!host.empty() && host != label) {
    if (target.contains("port") && target["port"].is_number_integer()) {
      replace_all(text, fmt::format("{}:{}", host, target["port"].get<long long>()), "{address}");
    }
    replace_all(text, host, "{address}");
  }
  replace_all(text, label, "{host}");
  return text;
}

std::vector<OutcomeGroup> group_outcomes(const std::vector<HostOutcome>& outcomes)
{
  std::vector<OutcomeGroup> groups;
  std::vector<std::size_t> first; // per group: the index of its first run
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    const auto& run = outcomes[i];
    const bool ok = run.status == RunStatus::ok;
    const std::string key =
        fmt::format("{}\n{}", to_string(run.status), ok ? run.result.dump() : run.generic);
    auto [at, added] = index.try_emplace(key, groups.size());
    if (added) {
      groups.push_back({{}, run.status, ok ? "" : run.generic, run.result, run.digest, false, {}});
      first.push_back(i);
    }
    groups[at->second].hosts.push_back(run.host);
    if (!ok && groups[at->second].hosts.size() == 1) {
      groups[at->second].error = run.error;
    } else if (!ok) {
      groups[at->second].error = run.generic;
    }
  }
  std::vector<std::size_t> order(groups.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    order[i] = i;
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return shown_before(groups[a], first[a], groups[b], first[b]);
  });
  std::vector<OutcomeGroup> sorted;
  sorted.reserve(groups.size());
  for (const std::size_t i : order) {
    sorted.push_back(std::move(groups[i]));
  }
  if (!sorted.empty() && sorted.front().status == RunStatus::ok) {
    sorted.front().reference = true;
    for (std::size_t i = 1; i < sorted.size() && sorted[i].status == RunStatus::ok; ++i) {
      sorted[i].changes = json_diff(sorted.front().result, sorted[i].result);
    }
  }
  return sorted;
}

std::string describe_changes(const std::vector<JsonChange>& changes, std::size_t shown)
{
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < changes.size() && i < shown; ++i) {
    parts.push_back(change_text(changes[i]));
  }
  if (changes.size() > shown) {
    parts.push_back(fmt::format("+{} more", changes.size() - shown));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

std::string render_groups(const std::vector<OutcomeGroup>& groups)
{
  std::string text;
  for (const auto& group : groups) {
    const std::string what = group.status != RunStatus::ok ? group.error
                             : group.reference || group.changes.empty()
                                 ? group.digest
                                 : describe_changes(group.changes);
    text += fmt::format("{}: {} — {}\n", hosts_text(group), to_string(group.status),
                        terminal_safe(what));
  }
  return text;
}

} // namespace ferry
