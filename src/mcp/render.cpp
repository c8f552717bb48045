#include "mcp/render.hpp"

#include <algorithm>
#include <cctype>

#include "ferry/bundle.hpp"

#include "ferry/text.hpp"

namespace ferry::mcp {

using nlohmann::json;

namespace {

// JSON in the text a client shows: every character outside ASCII escaped, so no control or
// bidirectional character the job sent reaches a screen.
std::string dump(const json& value)
{
  return value.dump(-1, ' ', true, json::error_handler_t::replace);
}

// Text a job or host wrote, as the result's text shows it: control and bidirectional
// characters escaped (tab and newline kept).
std::string shown(std::string_view text)
{
  return terminal_safe(text, Newlines::keep);
}

// The first byte at or after `from` that starts a character (not a UTF-8 continuation byte).
std::size_t character_start(std::string_view text, std::size_t from)
{
  while (from < text.size() && (static_cast<unsigned char>(text[from]) & 0xC0) == 0x80) {
    ++from;
  }
  return from;
}

std::string status_line(const RunRecord& run)
{
  std::string line = fmt::format("{}: {}", shown(run.host_label), to_string(run.status));
  line += run.exit_code ? fmt::format(" (exit {}, {:.2f} s)", *run.exit_code, run.duration_s)
                        : fmt::format(" ({:.2f} s)", run.duration_s);
  return line + ", run " + run.run_id;
}

void add_stream(std::string& text, std::string_view name, std::string_view bytes, bool truncated)
{
  if (bytes.empty()) {
    return;
  }
  const std::string excerpt = tail_excerpt(bytes, k_excerpt_lines, k_excerpt_bytes);
  const bool whole = excerpt.size() == bytes.size() && !truncated;
  text += fmt::format("{}{}:\n{}", name, whole ? "" : " (last lines)", shown(excerpt));
  if (!excerpt.empty() && excerpt.back() != '\n') {
    text += '\n';
  }
}

// The files fetched back: where they are on this machine, and which a resource gives.
void add_outputs(std::string& text, const RunRecord& run, bool archived, std::string_view out_dir)
{
  if (run.outputs.empty()) {
    return;
  }
  text += fmt::format("fetched files, saved under {}:\n", shown(local_output_dir(out_dir, run)));
  for (const auto& item : run.outputs) {
    const bool kept = archived && item.value("archived", false);
    text += fmt::format("  {} ({} bytes){}\n", shown(item.value("path", "")),
                        item.value("size", std::uint64_t{0}),
                        kept ? "" : "; not in the archive (over its cap): read it on this machine");
  }
}

// A run started with `detach: true`: where it runs and how to follow it.
std::string render_detached(const RunRecord& run, bool archived)
{
  std::string text =
      fmt::format("{}: running (detached), run {}\n", shown(run.host_label), run.run_id);
  text += fmt::format("follow it with ferry_run_state, ferry_run_output and ferry_run_result "
                      "(argument run: \"{}\"); ferry_run_stop stops it\n",
                      run.run_id);
  if (!archived) {
    text += "(the archive did not take this run: the run tools cannot find it)\n";
  }
  return text;
}

std::string render_run(const RunRecord& run, bool archived, std::string_view out_dir)
{
  if (!run.detached.is_null()) {
    return render_detached(run, archived);
  }
  std::string text = status_line(run) + "\n";
  if (run.error) {
    text += "error: " + shown(*run.error) + "\n";
  }
  if (!run.result.is_null()) {
    const std::string result = dump(run.result);
    if (result.size() <= k_result_text_bytes) {
      text += "result: " + result + "\n";
    } else {
      text += fmt::format("result: {} bytes of JSON, too long to show here{}\n", result.size(),
                          archived ? "; read " + run_uri(run.run_id) : "");
    }
  }
  // A result read from stdout is shown once, as the result.
  const bool stdout_is_result = run.result_bytes.empty() && !run.result.is_null();
  if (!stdout_is_result) {
    add_stream(text, "stdout", run.stdout_text, run.stdout_truncated);
  }
  add_stream(text, "stderr", run.stderr_text, run.stderr_truncated);
  add_outputs(text, run, archived, out_dir);
  for (const auto& warning : run.warnings) {
    text += fmt::format("warning ({}): {}\n", shown(warning.value("code", "")),
                        shown(warning.value("message", "")));
  }
  if (!archived) {
    text += "(this run is not in the archive)\n";
  }
  return text;
}

std::string summary(const Job& job, const std::vector<RunRecord>& runs)
{
  const auto ok = std::count_if(runs.begin(), runs.end(),
                                [](const RunRecord& r) { return r.status == RunStatus::ok; });
  const auto detached = std::count_if(runs.begin(), runs.end(),
                                      [](const RunRecord& r) { return !r.detached.is_null(); });
  if (detached > 0) {
    return fmt::format("{} on {} target{}: {} started detached, {} not started\n\n", job.name,
                       runs.size(), runs.size() == 1 ? "" : "s", detached,
                       runs.size() - static_cast<std::size_t>(detached));
  }
  return fmt::format("{} on {} target{}: {} ok, {} not ok\n\n", job.name, runs.size(),
                     runs.size() == 1 ? "" : "s", ok, runs.size() - static_cast<std::size_t>(ok));
}

json structured_run(const RunRecord& run)
{
  // A detached run's record says `running` (docs/record.md), and so does this.
  json entry = {{"target", run.host_label},
                {"status", run.detached.is_null() ? json(to_string(run.status)) : json("running")},
                {"exit_code", run.exit_code ? json(*run.exit_code) : json(nullptr)},
                {"run_id", run.run_id},
                {"error", run.error ? json(*run.error) : json(nullptr)},
                {"duration_s", run.duration_s}};
  // Only an ok run's result is promised to follow the job's schema.
  if (run.status == RunStatus::ok && !run.result.is_null()) {
    entry["result"] = run.result;
  }
  return entry;
}

} // namespace

std::string run_uri(std::string_view run_id)
{
  return "ferry://runs/" + std::string(run_id);
}

std::string output_uri(std::string_view run_id, std::string_view path)
{
  std::string uri = run_uri(run_id) + "/outputs/";
  for (const char c : path) {
    const auto byte = static_cast<unsigned char>(c);
    if (std::isalnum(byte) != 0 || std::string_view("-._~/").find(c) != std::string_view::npos) {
      uri += c;
    } else {
      uri += fmt::format("%{:02X}", byte);
    }
  }
  return uri;
}

std::string local_output_dir(std::string_view out_dir, const RunRecord& run)
{
  return output_dir_for(out_dir, run.run_id, run.host_label);
}

std::string tail_excerpt(std::string_view text, std::size_t lines, std::size_t bytes)
{
  std::size_t start = text.size();
  // A final newline ends the last line; it does not start another.
  std::size_t pos = !text.empty() && text.back() == '\n' ? text.size() - 1 : text.size();
  for (std::size_t n = 0; n < lines; ++n) {
    const auto newline = pos == 0 ? std::string_view::npos : text.rfind('\n', pos - 1);
    if (newline == std::string_view::npos) {
      start = 0;
      break;
    }
    start = newline + 1;
    pos = newline;
  }
  if (text.size() - start > bytes) {
    start = character_start(text, text.size() - bytes);
  }
  return std::string(text.substr(start));
}

namespace {

// A resource_link for each fetched file the archive keeps: resources/read gives its bytes.
void add_output_links(json& content, const RunRecord& run, std::string_view out_dir)
{
  const std::string dir = local_output_dir(out_dir, run);
  for (const auto& item : run.outputs) {
    if (!item.value("archived", false)) {
      continue;
    }
    const std::string path = item.value("path", "");
    content.push_back(
        {{"type", "resource_link"},
         {"uri", output_uri(run.run_id, path)},
         {"name", path},
         {"description", fmt::format("a file fetched from {} by run {}; on this machine at {}/{}",
                                     run.host_label, run.run_id, dir, path)},
         {"size", item.value("size", std::uint64_t{0})}});
  }
}

} // namespace

json call_result(const Job& job, const std::vector<RunRecord>& runs,
                 const std::vector<bool>& archived, std::string_view out_dir)
{
  std::string text = runs.size() > 1 ? summary(job, runs) : "";
  json content = json::array();
  json structured_runs = json::array();
  bool failed = false;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const bool stored = i < archived.size() && archived[i];
    text += (i == 0 ? "" : "\n") + render_run(runs[i], stored, out_dir);
    structured_runs.push_back(structured_run(runs[i]));
    failed |= runs[i].status != RunStatus::ok;
  }
  content.push_back({{"type", "text"}, {"text", text}});
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (i < archived.size() && archived[i] && runs[i].detached.is_null()) {
      content.push_back(
          {{"type", "resource_link"},
           {"uri", run_uri(runs[i].run_id)},
           {"name", runs[i].run_id},
           {"description", fmt::format("archived run of {} on {}", job.name, runs[i].host_label)},
           {"mimeType", "application/json"}});
      add_output_links(content, runs[i], out_dir);
    }
  }
  json result = {{"content", content}, {"isError", failed}};
  // The run ids of a detached call are for a program to take, whatever the job declares.
  const bool detached = std::any_of(runs.begin(), runs.end(),
                                    [](const RunRecord& r) { return !r.detached.is_null(); });
  if (job.meta.result_schema || detached) {
    result["structuredContent"] = {{"runs", structured_runs}};
  }
  return result;
}

json error_result(std::string_view message)
{
  return {{"content", json::array({{{"type", "text"}, {"text", message}}})}, {"isError", true}};
}

} // namespace ferry::mcp
