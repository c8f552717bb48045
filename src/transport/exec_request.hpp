#pragma once
// What the transports share below the seam (include/ferry/transport.hpp): a command to run on a
// target and how its two output streams are taken in. The runner never sees these.
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/transport.hpp"

namespace ferry {

// Feeds raw stream bytes; sets aside what precedes the launcher's sentinel line and the report
// the launcher prints after its `end_marker` (at most `report_cap` bytes; more means the job
// printed the marker itself), keeps at most `cap` bytes of the rest (its first and last half)
// and passes all of it to `sink` as it comes. Memory stays bounded however much arrives.
class OutputCapture {
public:
  static constexpr std::size_t k_default_report_cap = 64 * 1024;
  OutputCapture(std::string sentinel, std::size_t cap, std::string end_marker = {},
                std::function<void(std::string_view)> sink = {},
                std::size_t report_cap = k_default_report_cap);
  void feed(std::string_view data);
  // The launcher's sentinel has arrived (or none was expected).
  [[nodiscard]] bool started() const { return m_out.saw_sentinel; }
  // What came after the end marker so far (the launcher's report, as finish() will tell it);
  // nullopt before the marker.
  [[nodiscard]] std::optional<std::string_view> report_so_far() const;
  [[nodiscard]] CapturedStream finish() &&;

private:
  void take(std::string_view job_bytes);
  void keep(std::string_view job_bytes);

  std::string m_marker; // sentinel + "\n"
  std::string m_end;    // end_marker + " ": the start of the launcher's report, not the job's
  std::size_t m_cap;
  std::function<void(std::string_view)> m_sink;
  std::size_t m_report_cap;
  CapturedStream m_out;
  std::string m_pending;     // bytes before the sentinel, not yet known to be noise
  std::string m_held;        // the last bytes, held back while they could be the end marker
  std::uint64_t m_total = 0; // the job's bytes so far
  std::string m_tail;        // a ring of the last cap/2 bytes past the first cap/2
  std::size_t m_tail_pos = 0;
  std::size_t m_tail_filled = 0;
};

struct ExecRequest {
  std::vector<std::string> argv; // shell-neutral tokens
  std::string sentinel;
  std::string end_marker; // starts the launcher's report, the end of stdout
  std::size_t output_cap = 16u << 20;
  // The launcher's report may be this long (it may carry result.json's bytes).
  std::size_t report_cap = OutputCapture::k_default_report_cap;
  // ferry's own backstop: past it, the job is signalled (the launcher's deadline comes first).
  std::chrono::steady_clock::duration deadline = std::chrono::seconds(300);
  std::chrono::steady_clock::duration grace = std::chrono::seconds(2);
  // The launcher's first line must arrive within this (the login shell runs first).
  std::chrono::steady_clock::duration start_limit = std::chrono::seconds(20);
  // The launcher's job is a python3 job that becomes the interpreter started ahead of it
  // (docs/persistence.md): a run with no channel kept ahead free may open one of its own.
  bool python_ahead = false;
  // No run follows on this session (a direct connection's last planned run): a channel kept
  // ahead that runs it ends after it rather than staying for a next one.
  bool last = false;
  StopToken stop;       // stopped: the job is stopped as on an interrupt
  OutputSink on_output; // optional: the job's output as it arrives
  NoteSink on_note;     // optional: the target's notes about the run
};

// The capture of one stream of `request`'s job, passing what arrives to its on_output. Only
// stdout carries the launcher's report; `stderr_ends` gives stderr the end marker too (a process
// kept ahead ends a run's stderr with `END_MARKER stay` when it stays for the next run).
[[nodiscard]] OutputCapture capture_for(const ExecRequest& request, OutputStream stream,
                                        bool stderr_ends = false);

// The request that runs a staged run's launcher (`/bin/sh RUN_DIR/launch.sh`, the only command a
// shell sees) as `request` asks.
[[nodiscard]] ExecRequest launcher_request(const StagedRun& run, const LaunchRequest& request);

} // namespace ferry
