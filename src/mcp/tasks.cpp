#include "mcp/tasks.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "ferry/util.hpp"
#include "mcp/tools.hpp"

namespace ferry::mcp {

using nlohmann::json;

namespace {

std::string now()
{
  return utc_iso(std::chrono::system_clock::now());
}

} // namespace

void TaskTable::add(const std::string& id, std::string status, std::string message, json result,
                    std::string created_at)
{
  const std::lock_guard lock(m_mutex);
  TaskEntry entry;
  entry.created_at = created_at.empty() ? now() : std::move(created_at);
  entry.updated_at = now();
  entry.status = std::move(status);
  entry.message = std::move(message);
  entry.result = std::move(result);
  m_tasks[id] = std::move(entry);
}

std::optional<TaskEntry> TaskTable::find(const std::string& id) const
{
  const std::lock_guard lock(m_mutex);
  const auto found = m_tasks.find(id);
  return found == m_tasks.end() ? std::nullopt : std::optional<TaskEntry>(found->second);
}

TaskTable::Updated TaskTable::update(const std::string& id, std::string status, std::string message,
                                     json result)
{
  const std::lock_guard lock(m_mutex);
  TaskEntry& entry = m_tasks[id];
  if (task_ended(entry.status)) {
    return {entry, false};
  }
  const bool changed = entry.status != status;
  if (changed || entry.message != message) {
    entry.updated_at = now();
  }
  entry.status = std::move(status);
  entry.message = std::move(message);
  if (!result.is_null()) {
    entry.result = std::move(result);
  }
  return {entry, changed};
}

json TaskTable::list() const
{
  const std::lock_guard lock(m_mutex);
  std::vector<std::pair<std::string, TaskEntry>> tasks(m_tasks.begin(), m_tasks.end());
  std::stable_sort(tasks.begin(), tasks.end(), [](const auto& a, const auto& b) {
    return a.second.created_at < b.second.created_at;
  });
  json listed = json::array();
  for (const auto& [id, entry] : tasks) {
    listed.push_back(task_json(id, entry));
  }
  return {{"tasks", listed}};
}

bool task_ended(std::string_view status)
{
  return status == "completed" || status == "failed" || status == "cancelled";
}

json task_json(const std::string& id, const TaskEntry& entry)
{
  // ttl: how long the run's host keeps a finished run for collection.
  json task = {{"taskId", id},
               {"status", entry.status},
               {"ttl", k_detach_keep_for_s * 1000},
               {"createdAt", entry.created_at},
               {"lastUpdatedAt", entry.updated_at},
               {"pollInterval", k_task_poll_ms}};
  if (!entry.message.empty()) {
    task["statusMessage"] = entry.message;
  }
  return task;
}

std::string task_status_of_state(std::string_view state)
{
  if (state == "finished") {
    return "completed"; // its result waits: tasks/result collects it
  }
  if (state == "gone" || state == "expired") {
    return "failed";
  }
  return "working"; // running, or its host could not be asked
}

std::string task_status_of(RunStatus status)
{
  return status == RunStatus::ok            ? "completed"
         : status == RunStatus::interrupted ? "cancelled"
                                            : "failed";
}

std::string text_of(const json& result)
{
  std::string text;
  for (const auto& item : result.value("content", json::array())) {
    if (item.is_object() && item.value("type", "") == "text") {
      text += item.value("text", "");
    }
  }
  return text;
}

std::optional<std::string> only_run_id(const json& result)
{
  const auto structured = result.find("structuredContent");
  if (structured == result.end() || !structured->is_object()) {
    return std::nullopt;
  }
  const auto runs = structured->find("runs");
  if (runs == structured->end() || !runs->is_array() || runs->size() != 1 ||
      !(*runs)[0].contains("run_id") || !(*runs)[0]["run_id"].is_string()) {
    return std::nullopt;
  }
  return (*runs)[0]["run_id"].get<std::string>();
}

json with_related_task(json result, const std::string& id)
{
  result["_meta"]["io.modelcontextprotocol/related-task"] = {{"taskId", id}};
  return result;
}

} // namespace ferry::mcp
