#pragma once
// Archived runs as read-only MCP resources: resources/list shows the recent ones,
// resources/read gives one run's record (`ferry://runs/RUN_ID`) as JSON, or a file it fetched
// (`ferry://runs/RUN_ID/outputs/PATH`).
#include <string_view>

#include <nlohmann/json.hpp>

#include "ferry/archive.hpp"
#include "ferry/expected.hpp"

namespace ferry::mcp {

inline constexpr int k_listed_runs = 50;
// Of each output stream a resource carries at most this much (the archive keeps all of it).
inline constexpr std::size_t k_resource_stream_bytes = 1u << 20;

// The result of resources/list.
[[nodiscard]] Expected<nlohmann::json> list_runs(Archive& archive);

// Of a fetched file a resource gives at most this much (the file on this machine has all of it).
inline constexpr std::size_t k_resource_output_bytes = 8u << 20;

// The result of resources/read for `uri`: a run (`ferry://runs/RUN_ID`) or a file it fetched
// (`ferry://runs/RUN_ID/outputs/PATH`, from the archive; `out_dir` says where it is on this
// machine, for a file the archive kept by hash only). An unknown or malformed URI is
// ErrorKind::usage.
[[nodiscard]] Expected<nlohmann::json> read_run(Archive& archive, std::string_view uri,
                                                std::string_view out_dir);

// The result of resources/templates/list.
[[nodiscard]] nlohmann::json run_templates();

} // namespace ferry::mcp
