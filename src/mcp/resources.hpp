#pragma once
// Archived runs as read-only MCP resources: resources/list shows the recent ones,
// resources/read gives one run's record (`ferry://runs/RUN_ID`) as JSON.
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

// The result of resources/read for `uri`. An unknown or malformed URI is ErrorKind::usage.
[[nodiscard]] Expected<nlohmann::json> read_run(Archive& archive, std::string_view uri);

// The result of resources/templates/list.
[[nodiscard]] nlohmann::json run_templates();

} // namespace ferry::mcp
