#include "mcp/resources.hpp"

#include <algorithm>
#include <cstdint>

#include "ferry/bundle.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"
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

constexpr std::string_view k_outputs = "/outputs/";

int hex_digit(char c)
{
  if (c >= '0' && c <= '9') {
    return c - '0';
  }
  if (c >= 'a' && c <= 'f') {
    return c - 'a' + 10;
  }
  if (c >= 'A' && c <= 'F') {
    return c - 'A' + 10;
  }
  return -1;
}

std::string percent_decoded(std::string_view text)
{
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const int high = i + 2 < text.size() && text[i] == '%' ? hex_digit(text[i + 1]) : -1;
    const int low = high >= 0 ? hex_digit(text[i + 2]) : -1;
    if (low >= 0) {
      out += static_cast<char>(high * 16 + low);
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

std::string base64(std::string_view bytes)
{
  static constexpr char alphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const std::size_t n = std::min<std::size_t>(3, bytes.size() - i);
    std::uint32_t chunk = 0;
    for (std::size_t k = 0; k < 3; ++k) {
      chunk = (chunk << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0U);
    }
    for (std::size_t k = 0; k < 4; ++k) {
      out += k <= n ? alphabet[(chunk >> (18 - 6 * k)) & 0x3f] : '=';
    }
  }
  return out;
}

// A file RUN fetched: the archive's bytes, checked against their sha256.
Expected<json> read_output(const RunRecord& run, std::string_view uri, std::string_view encoded,
                           std::string_view out_dir)
{
  const std::string path = percent_decoded(encoded);
  const auto item = std::find_if(run.outputs.begin(), run.outputs.end(),
                                 [&](const json& o) { return o.value("path", "") == path; });
  if (item == run.outputs.end()) {
    return fail(ErrorKind::usage, "run {} fetched no file {}", run.run_id, shorten(path, 120));
  }
  const std::string sha256 = item->value("sha256", "");
  const auto blob = run.blobs.find(sha256);
  const std::string local = output_dir_for(out_dir, run.run_id, run.host_label) + "/" + path;
  if (!item->value("archived", false) || blob == run.blobs.end()) {
    return fail(ErrorKind::usage,
                "the archive keeps only the sha256 of {} (run {}): it was over the archive's "
                "cap; the file is at {} on the machine ferry mcp runs on",
                shorten(path, 120), run.run_id, local);
  }
  if (sha256_hex(blob->second) != sha256 || blob->second.size() > k_resource_output_bytes) {
    return fail(ErrorKind::failed, "{} of run {} cannot be given: {}; the file fetched is at {}",
                shorten(path, 120), run.run_id,
                blob->second.size() > k_resource_output_bytes
                    ? fmt::format("it is larger than {} MiB", k_resource_output_bytes >> 20)
                    : "its archived bytes no longer match their sha256",
                local);
  }
  json content = {{"uri", std::string(uri)}};
  if (is_valid_utf8(blob->second) && blob->second.find('\0') == std::string::npos) {
    content["mimeType"] = "text/plain";
    content["text"] = blob->second;
  } else {
    content["mimeType"] = "application/octet-stream";
    content["blob"] = base64(blob->second);
  }
  return json{{"contents", json::array({content})}};
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

Expected<json> read_run(Archive& archive, std::string_view uri, std::string_view out_dir)
{
  const bool ours = uri.substr(0, k_prefix.size()) == k_prefix;
  const std::string_view rest = ours ? uri.substr(k_prefix.size()) : std::string_view();
  const auto slash = rest.find('/');
  const std::string_view id = rest.substr(0, slash);
  if (!ours || !is_run_id(id) ||
      (slash != std::string_view::npos && rest.substr(slash, k_outputs.size()) != k_outputs)) {
    return fail(ErrorKind::usage,
                "no such resource: {} (runs are ferry://runs/RUN_ID, the files they fetched "
                "ferry://runs/RUN_ID/outputs/PATH)",
                shorten(uri, 120));
  }
  auto run = archive.load(id);
  // load() also takes a prefix or "last"; a resource is named by its whole id only.
  if (!run || run->run_id != id) {
    return fail(ErrorKind::usage, "no archived run {}", id);
  }
  if (slash != std::string_view::npos) {
    return read_output(*run, uri, rest.substr(slash + k_outputs.size()), out_dir);
  }
  json record = to_json(*run, false);
  put_stream(record, "stdout", run->stdout_text);
  put_stream(record, "stderr", run->stderr_text);
  json content = {{"uri", std::string(uri)},
                  {"mimeType", "application/json"},
                  {"text", record.dump(2, ' ', true, json::error_handler_t::replace)}};
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
                         {"mimeType", "application/json"}},
                        {{"uriTemplate", "ferry://runs/{run_id}/outputs/{+path}"},
                         {"name", "output"},
                         {"title", "a file an archived run fetched back"},
                         {"description", "the bytes the archive keeps of a file the run fetched "
                                         "(its `outputs`): text, or base64 for other bytes"}}})}};
}

} // namespace ferry::mcp
