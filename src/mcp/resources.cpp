#include "mcp/resources.hpp"

#include <algorithm>

#include "ferry/text.hpp"
#include "mcp/render.hpp"

namespace ferry::mcp {

using nlohmann::json;

namespace {

constexpr std::string_view k_prefix = "ferry://runs/";

bool is_run_id(std::string_view id)
{
  return !id.empty() && id.size() <= 64 && std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-';
  });
}

std::string target_name(const RunRecord& run)
{
  return run.host_label.empty() ? "local" : run.host_label;
}

// The stream as the resource carries it: whole up to the cap, else its first part.
void put_stream(json& record, const char* key, const std::string& bytes)
{
  if (bytes.size() <= k_resource_stream_bytes) {
    record[key] = bytes;
    return;
  }
  std::size_t end = k_resource_stream_bytes;
  while (end > 0 && (static_cast<unsigned char>(bytes[end]) & 0xC0) == 0x80) {
    --end; // not inside a character
  }
  record[key] = bytes.substr(0, end);
  record[std::string(key) + "_bytes"] = bytes.size();
}

} // namespace

Expected<json> list_runs(Archive& archive)
{
  LogFilter filter;
  filter.limit = k_listed_runs;
  filter.with_output = false;
  FERRY_TRY_ASSIGN(const auto runs, archive.log(filter));
  json resources = json::array();
  for (const auto& run : runs) {
    resources.push_back(
        {{"uri", run_uri(run.run_id)},
         {"name", run.run_id},
         {"title", fmt::format("{} on {}: {}", run.job, target_name(run), to_string(run.status))},
         {"description",
          fmt::format("run of {} on {}, started {}, {} ({:.2f} s)", run.job, target_name(run),
                      run.started_at, to_string(run.status), run.duration_s)},
         {"mimeType", "application/json"}});
  }
  return json{{"resources", resources}};
}

Expected<json> read_run(Archive& archive, std::string_view uri)
{
  const bool ours = uri.substr(0, k_prefix.size()) == k_prefix;
  const std::string_view id = ours ? uri.substr(k_prefix.size()) : std::string_view();
  if (!ours || !is_run_id(id)) {
    return fail(ErrorKind::usage, "no such resource: {} (runs are ferry://runs/RUN_ID)",
                shorten(uri, 120));
  }
  auto run = archive.load(id);
  // load() also takes a prefix or "last"; a resource is named by its whole id only.
  if (!run || run->run_id != id) {
    return fail(ErrorKind::usage, "no archived run {}", id);
  }
  json record = to_json(*run, false);
  put_stream(record, "stdout", run->stdout_text);
  put_stream(record, "stderr", run->stderr_text);
  json content = {{"uri", std::string(uri)},
                  {"mimeType", "application/json"},
                  {"text", record.dump(2, ' ', false, json::error_handler_t::replace)}};
  return json{{"contents", json::array({content})}};
}

json run_templates()
{
  return {{"resourceTemplates",
           json::array({{{"uriTemplate", "ferry://runs/{run_id}"},
                         {"name", "run"},
                         {"title", "an archived ferry run"},
                         {"description", "the run record of RUN_ID as JSON (stdout and stderr "
                                         "up to 1 MiB each)"},
                         {"mimeType", "application/json"}}})}};
}

} // namespace ferry::mcp
