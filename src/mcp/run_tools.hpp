#pragma once
// The tools for detached runs (a job tool called with `detach: true`): a run's state, its output
// so far, its result (collected as `ferry attach` collects it), and stopping it. A run is named
// as `ferry attach` names it: its id, a unique prefix of it, or `last`; only runs on this
// server's targets are reached.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/fleet.hpp"
#include "mcp/call.hpp"
#include "run/session_pool.hpp"

namespace ferry::mcp {

enum class RunTool { state, output, result, stop };

// The tool of that name; nullopt for any other name (a job's).
[[nodiscard]] std::optional<RunTool> run_tool(std::string_view name);
[[nodiscard]] inline bool is_run_tool(std::string_view name)
{
  return run_tool(name).has_value();
}
// "ferry_run_state, ferry_run_output, ferry_run_result and ferry_run_stop"
[[nodiscard]] std::string run_tool_names();

// The definitions tools/list returns for them.
[[nodiscard]] nlohmann::json run_tool_definitions();

// Most seconds ferry_run_result waits for a run to end.
inline constexpr int k_max_result_wait_s = 600;
// How much of a run's output ferry_run_output shows (the last of it).
inline constexpr std::size_t k_output_lines = 200;
inline constexpr std::size_t k_output_bytes = 16 * 1024;

struct RunToolSetup {
  const CallArchive* archive = nullptr;
  const std::vector<PoolTarget>* targets = nullptr; // the server's: only their runs are reached
  nlohmann::json client;                            // for the collected record
  StopToken stop;                                   // the call was cancelled
  std::optional<RunStatus>* collected = nullptr;    // set to the run's status once collected
};

// The detached run of exactly this id on one of the server's targets (a task another ferry mcp
// started, say); nullopt when there is none.
[[nodiscard]] std::optional<RunRecord> detached_run_of(const RunToolSetup& setup,
                                                       const std::string& run_id);

// The result ferry_run_result returned for the run of exactly this id once it was collected (by
// this server, another one or `ferry attach`), rebuilt from its final record in the archive;
// sets `setup.collected`. nullopt when the archive has no final record of it.
[[nodiscard]] std::optional<nlohmann::json> collected_run_result(const RunToolSetup& setup,
                                                                 const std::string& run_id);

// One call of a run tool: its arguments checked, its CallToolResult (a refusal or a failure is
// a result with isError set). `view` hears a collected run as a job call's reporter does.
[[nodiscard]] nlohmann::json call_run_tool(RunTool tool, const nlohmann::json& arguments,
                                           const RunToolSetup& setup, RunObserver& view);

} // namespace ferry::mcp
