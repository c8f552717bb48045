#pragma once
// What a tools/call returns: a text rendering of every run (status, exit code, run id, bounded
// excerpts of the result and the output), links to the archived runs, and, for a job that
// declares a result schema (or for a call with `detach: true`: each run's id and `running`), the
// runs as structuredContent.
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/job.hpp"
#include "ferry/run_record.hpp"

namespace ferry::mcp {

// How much of a run one tool result shows; the archived run (a resource) has all of it.
inline constexpr std::size_t k_excerpt_lines = 40;
inline constexpr std::size_t k_excerpt_bytes = 4096;
inline constexpr std::size_t k_result_text_bytes = 32 * 1024;

// "ferry://runs/RUN_ID"
[[nodiscard]] std::string run_uri(std::string_view run_id);
// "ferry://runs/RUN_ID/outputs/PATH", PATH percent-encoded (but its slashes).
[[nodiscard]] std::string output_uri(std::string_view run_id, std::string_view path);
// Where a run's fetched files are on this machine: `out_dir` with {run_id} (and {host}) replaced.
[[nodiscard]] std::string local_output_dir(std::string_view out_dir, const RunRecord& run);

// The last lines of `text`, at most `lines` of them and `bytes` bytes (cut at a character).
[[nodiscard]] std::string tail_excerpt(std::string_view text, std::size_t lines, std::size_t bytes);

// The CallToolResult for these runs; `archived[i]` says whether runs[i] is in the archive.
// Fetched files are listed with where they are (`out_dir`, as RunOptions has it) and linked as
// resources.
[[nodiscard]] nlohmann::json call_result(const Job& job, const std::vector<RunRecord>& runs,
                                         const std::vector<bool>& archived,
                                         std::string_view out_dir);

// A tool result that reports a refusal (bad arguments) or a failure before any run.
[[nodiscard]] nlohmann::json error_result(std::string_view message);

} // namespace ferry::mcp
