#include "mcp/call_reporter.hpp"

#include <algorithm>
#include <array>

#include "ferry/text.hpp"
#include "ferry/util.hpp"

namespace ferry::mcp {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::array<std::string_view, 8> k_level_names = {
    "debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"};

std::string_view stream_name(OutputStream stream)
{
  return stream == OutputStream::out ? "stdout" : "stderr";
}

} // namespace

std::optional<LogLevel> log_level_from(std::string_view name)
{
  for (std::size_t i = 0; i < k_level_names.size(); ++i) {
    if (k_level_names[i] == name) {
      return static_cast<LogLevel>(i);
    }
  }
  return std::nullopt;
}

CallReporter::CallReporter(Writer& writer, json progress_token,
                           const std::atomic<LogLevel>& min_level, std::string job,
                           std::size_t runs, OutputRate rate)
    : m_writer(writer), m_token(std::move(progress_token)), m_min_level(min_level),
      m_job(std::move(job)), m_runs(runs), m_rate(rate), m_last_progress(Clock::now()),
      m_tokens(rate.burst), m_refilled(Clock::now())
{
}

void CallReporter::run_started(const RunRef& run)
{
  std::lock_guard guard(m_lock);
  Host& host = m_hosts[std::string(run.host)];
  host.started = Clock::now();
  notify_progress(fmt::format("{}: {} started", run.host, m_job));
}

void CallReporter::run_output(const RunRef& run, OutputStream stream, std::string_view bytes)
{
  std::lock_guard guard(m_lock);
  if (m_closed) {
    return;
  }
  const std::string name(run.host);
  Host& host = m_hosts[name];
  std::string& partial = stream == OutputStream::out ? host.out.text : host.err.text;
  while (!bytes.empty()) {
    const auto newline = bytes.find('\n');
    partial.append(bytes.substr(0, std::min(newline, bytes.size())));
    if (newline == std::string_view::npos) {
      // Memory stays bounded: an endless line is shown cut, as any long line is.
      if (partial.size() > 4 * m_rate.line_bytes) {
        partial.resize(4 * m_rate.line_bytes);
      }
      return;
    }
    emit_line(name, stream, partial);
    partial.clear();
    bytes.remove_prefix(newline + 1);
  }
}

void CallReporter::run_finished(RunRecord& record)
{
  std::lock_guard guard(m_lock);
  ++m_done;
  if (m_closed) {
    return;
  }
  Host& host = m_hosts[record.host_label];
  for (const auto stream : {OutputStream::out, OutputStream::err}) {
    std::string& partial = stream == OutputStream::out ? host.out.text : host.err.text;
    if (!partial.empty()) {
      emit_line(record.host_label, stream, partial);
      partial.clear();
    }
  }
  report_skipped(record.host_label);
  if (m_done == m_runs) {
    // The response says that much. A progress notification right before it would reach a
    // client in the same read, and the TypeScript SDK handles notifications a tick after
    // responses: it would call the token unknown.
    return;
  }
  notify_progress(fmt::format("{}: {} {} ({} of {} runs done)", record.host_label, m_job,
                              to_string(record.status), m_done, m_runs));
}

void CallReporter::heartbeat()
{
  std::lock_guard guard(m_lock);
  if (m_closed || Clock::now() - m_last_progress < k_heartbeat) {
    return;
  }
  std::string running;
  for (const auto& [name, host] : m_hosts) {
    running += fmt::format("{}{} {:.0f} s, {} lines of output", running.empty() ? "" : "; ", name,
                           seconds_since(host.started), host.lines);
  }
  notify_progress(fmt::format("{} running: {}", m_job, running));
}

void CallReporter::close()
{
  std::lock_guard guard(m_lock);
  m_closed = true;
}

void CallReporter::notify_progress(const std::string& message)
{
  m_last_progress = Clock::now();
  if (m_closed || m_token.is_null()) {
    return;
  }
  ++m_progress;
  m_writer.send(
      notification("notifications/progress",
                   {{"progressToken", m_token}, {"progress", m_progress}, {"message", message}}));
}

bool CallReporter::logging_on() const
{
  return m_min_level.load() <= LogLevel::info;
}

bool CallReporter::take_token()
{
  const auto now = Clock::now();
  m_tokens = std::min(m_rate.burst,
                      m_tokens + m_rate.lines_per_second *
                                     std::chrono::duration<double>(now - m_refilled).count());
  m_refilled = now;
  if (m_tokens < 1) {
    return false;
  }
  m_tokens -= 1;
  return true;
}

void CallReporter::emit_line(const std::string& host_name, OutputStream stream,
                             std::string_view line)
{
  Host& host = m_hosts[host_name];
  ++host.lines;
  if (!line.empty() && line.back() == '\r') {
    line.remove_suffix(1);
  }
  if (!logging_on()) {
    return;
  }
  if (!take_token()) {
    ++host.skipped;
    return;
  }
  report_skipped(host_name);
  m_writer.send(notification("notifications/message",
                             {{"level", "info"},
                              {"logger", "ferry"},
                              {"data",
                               {{"target", host_name},
                                {"job", m_job},
                                {"stream", stream_name(stream)},
                                {"line", terminal_safe(shorten(line, m_rate.line_bytes))}}}}));
}

void CallReporter::report_skipped(const std::string& host_name)
{
  Host& host = m_hosts[host_name];
  if (host.skipped == 0 || !logging_on()) {
    return;
  }
  const std::size_t skipped = std::exchange(host.skipped, 0);
  m_writer.send(notification(
      "notifications/message",
      {{"level", "info"},
       {"logger", "ferry"},
       {"data",
        {{"target", host_name},
         {"job", m_job},
         {"skipped_lines", skipped},
         {"note", fmt::format("{} lines of output not shown (more than {:.0f} a second); the "
                              "tool result and the archived run have the output",
                              skipped, m_rate.lines_per_second)}}}}));
}

} // namespace ferry::mcp
