#pragma once
// Jobs as MCP tools: one tool per job, its input schema generated from the job's `/// ferry`
// block plus a `target` argument, and the arguments of a call checked exactly as `--params`
// checks a JSON object (same messages).
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/expected.hpp"
#include "ferry/job.hpp"

namespace ferry::mcp {

// The argument every tool has besides the job's parameters, and its value for every target.
inline constexpr std::string_view k_target_argument = "target";
inline constexpr std::string_view k_all_targets = "all";
// The argument that starts the job detached and returns its run id at once (`run --detach`).
inline constexpr std::string_view k_detach_argument = "detach";
// How long a finished detached run waits on its host for collection (`--keep-for`'s default).
inline constexpr long long k_detach_keep_for_s = 7LL * 24 * 3600;

// Why a job cannot be offered as a tool (a name MCP clients refuse or one of ferry's own tools
// has, a parameter that takes the name of the `target` or `detach` argument); nullopt when it
// can.
[[nodiscard]] std::optional<std::string> tool_refusal(const Job& job);

[[nodiscard]] nlohmann::json input_schema(const Job& job, const std::vector<std::string>& targets);

// The tool's outputSchema when the job declares `result_schema`: every run of the call, with
// the job's result (in the declared shape) where the run produced one.
[[nodiscard]] std::optional<nlohmann::json> output_schema(const Job& job);

// The tool definition tools/list returns.
[[nodiscard]] nlohmann::json tool_definition(const Job& job,
                                             const std::vector<std::string>& targets);

struct CallPlan {
  std::vector<std::string> targets; // where to run, in the server's order
  nlohmann::json params;            // typed, defaults applied
  bool detach = false;              // `detach: true`
};

// The arguments of a tools/call: `target`, `detach` and the job's parameters, checked like
// `--params`.
// A refusal is ErrorKind::usage with the message the command line gives.
[[nodiscard]] Expected<CallPlan> plan_call(const Job& job, const nlohmann::json& arguments,
                                           const std::vector<std::string>& targets);

} // namespace ferry::mcp
