#pragma once
// MCP tasks (spec 2025-11-25, "Tasks") backed by detached runs: a job tool called with `task`
// starts the job as `detach: true` does, and the task is that run (its id the run's id). The
// table keeps what this server knows of its tasks; the host is asked for the rest.
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "ferry/run_record.hpp"

namespace ferry::mcp {

// How often a client should poll tasks/get, in milliseconds.
inline constexpr int k_task_poll_ms = 1000;

struct TaskEntry {
  std::string created_at;
  std::string updated_at;
  std::string status = "working"; // working, completed, failed or cancelled
  std::string message;            // statusMessage ("" for none)
  nlohmann::json result;          // the CallToolResult once collected (null before)
};

// This server's tasks, by id; shared by the main thread and the calls' workers.
class TaskTable {
public:
  // `created_at` empty: now.
  void add(const std::string& id, std::string status, std::string message, nlohmann::json result,
           std::string created_at = {});
  [[nodiscard]] std::optional<TaskEntry> find(const std::string& id) const;
  // Sets a task's status (and its result, when not null); a task that ended stays as it ended.
  // `changed`: the status is not what it was.
  struct Updated {
    TaskEntry entry;
    bool changed = false;
  };
  Updated update(const std::string& id, std::string status, std::string message,
                 nlohmann::json result = nullptr);
  // tasks/list's result: every task, oldest first.
  [[nodiscard]] nlohmann::json list() const;

private:
  mutable std::mutex m_mutex;
  std::map<std::string, TaskEntry> m_tasks;
};

[[nodiscard]] bool task_ended(std::string_view status);
// A Task object (TaskSchema).
[[nodiscard]] nlohmann::json task_json(const std::string& id, const TaskEntry& entry);
// The task status for a detached run's state (ferry_run_state's `state`).
[[nodiscard]] std::string task_status_of_state(std::string_view state);
// The task status of a collected run: completed when it ran ok, cancelled when it was
// interrupted (stopped), else failed.
[[nodiscard]] std::string task_status_of(RunStatus status);
// The text of a CallToolResult.
[[nodiscard]] std::string text_of(const nlohmann::json& result);
// The run id of a one-run job call's result; nullopt when it has none.
[[nodiscard]] std::optional<std::string> only_run_id(const nlohmann::json& result);
// The result with the related-task _meta tasks/result carries.
[[nodiscard]] nlohmann::json with_related_task(nlohmann::json result, const std::string& id);

} // namespace ferry::mcp
