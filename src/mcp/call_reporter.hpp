#pragma once
// What a client sees of a tools/call while it runs: notifications/progress (when the request
// asked for it with a progressToken) at each run's start and end and every few seconds in
// between, and the job's output lines as notifications/message at level info, at a bounded
// rate (the lines over it are counted and reported as a count).
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "ferry/fleet.hpp"
#include "mcp/json_rpc.hpp"

namespace ferry::mcp {

// MCP log levels (RFC 5424 names), lowest first.
enum class LogLevel { debug, info, notice, warning, error, critical, alert, emergency };
[[nodiscard]] std::optional<LogLevel> log_level_from(std::string_view name);

struct OutputRate {
  double lines_per_second = 10;
  double burst = 20;
  std::size_t line_bytes = 1000; // longer lines are cut
};

inline constexpr std::chrono::seconds k_heartbeat{5};

class CallReporter final : public RunObserver {
public:
  // `progress_token`: null when the request asked for no progress. `min_level`: the level the
  // client set with logging/setLevel; output lines go out only while info passes it.
  CallReporter(Writer& writer, nlohmann::json progress_token,
               const std::atomic<LogLevel>& min_level, std::string job, std::size_t runs,
               OutputRate rate = {});

  void run_started(const RunRef& run) override;
  void run_output(const RunRef& run, OutputStream stream, std::string_view bytes) override;
  void run_finished(RunRecord& record) override;

  // A progress notification when nothing was said for k_heartbeat (a client that resets its
  // request timeout on progress keeps waiting for a long job).
  void heartbeat();
  // No notification after this (the call was cancelled or has answered).
  void close();

private:
  struct Partial {
    std::string text; // a line not yet ended
  };
  struct Host {
    Partial out;
    Partial err;
    std::size_t lines = 0;
    std::size_t skipped = 0;
    std::chrono::steady_clock::time_point started;
  };

  void notify_progress(const std::string& message);
  void emit_line(const std::string& host, OutputStream stream, std::string_view line);
  void report_skipped(const std::string& host);
  bool take_token();
  [[nodiscard]] bool logging_on() const;

  Writer& m_writer;
  nlohmann::json m_token;
  const std::atomic<LogLevel>& m_min_level;
  std::string m_job;
  std::size_t m_runs;
  std::size_t m_done = 0;
  OutputRate m_rate;
  std::mutex m_lock;
  bool m_closed = false;
  std::size_t m_progress = 0;
  std::chrono::steady_clock::time_point m_last_progress;
  double m_tokens;
  std::chrono::steady_clock::time_point m_refilled;
  std::map<std::string, Host> m_hosts;
};

} // namespace ferry::mcp
