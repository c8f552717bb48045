#pragma once
// What ferry tells its user. Every command writes through a Reporter: the terminal one draws run
// blocks, tables and a progress line (escape sequences only on a tty), the JSON Lines one writes
// one JSON object per line. Run events arrive while jobs run (RunObserver), so live output, an
// MCP server or a Slurm target plug in the same way.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ferry/expected.hpp"
#include "ferry/run_observer.hpp"

namespace ferry {

// A listing: the terminal shows the cells in aligned columns under the header, JSON Lines shows
// each row's object.
struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::vector<nlohmann::json> objects; // one per row
  std::vector<bool> right_aligned;     // per column; missing means left
  std::vector<std::size_t> min_widths; // per column; missing means the header's
  bool blank_line_before = false;      // terminal: set the table off from what came before
};

enum class ReportFormat { terminal, json_lines };

class Reporter : public RunObserver {
public:
  [[nodiscard]] virtual ReportFormat format() const = 0;

  // A run record as this format shows it: the terminal's block (job output, summary line,
  // warnings) or one JSON line with `extra` members added.
  virtual void record(const RunRecord& record, const nlohmann::json& extra) = 0;
  // RunObserver: a finished run is shown as record() shows it.
  void run_finished(RunRecord& run) override { record(run, nlohmann::json::object()); }
  // RunObserver: a target's note about a running job, as "HOST JOB: TEXT".
  void run_note(const RunRef& run, std::string_view text) override
  {
    note(fmt::format("{} {}: {}", run.host, run.job, text));
  }

  virtual void table(const Table& table) = 0;
  // One document: the terminal shows `text`, JSON Lines shows `json` as one line.
  virtual void document(std::string_view text, const nlohmann::json& json) = 0;
  // Exactly these bytes on stdout, in either format (`show --stdout`).
  virtual void bytes(std::string_view bytes) = 0;
  // "ferry: TEXT" on stderr: something the user should know that is not an error.
  virtual void note(std::string_view text) = 0;
  // "ferry: error: MESSAGE" on stderr.
  virtual void error(const Error& error) = 0;
};

struct TerminalOptions {
  // Job output goes to a terminal as it is (control sequences included); ferry's own lines are
  // escaped whatever this says.
  bool raw_output = false;
  // Every run's output as it arrives, each line prefixed with its host (with one host, output
  // is always shown as it arrives, unprefixed; with several, the default is to stream on a
  // terminal with at most k_stream_hosts hosts, else whole blocks).
  bool stream = false;
  // Whole blocks with several hosts even on a terminal (`--no-stream`).
  bool blocks = false;
  // The summary after several runs: hosts folded by the sameness of their results (true,
  // `--fold`) or one table row per run (false, `--no-fold`); unset: folded when the batch has
  // more than k_fold_hosts hosts.
  std::optional<bool> fold;
};

// A terminal streams the output of at most this many hosts by default.
inline constexpr std::size_t k_stream_hosts = 8;
// The summary after a batch folds hosts by the sameness of their results by default when the
// batch has more than this many hosts: up to 4 rows read at a glance.
inline constexpr std::size_t k_fold_hosts = 4;

// Everything from a job, a host or a user that ferry shows in its own lines is escaped
// (terminal_safe), and so is job output written to a terminal unless `raw_output`.
[[nodiscard]] std::unique_ptr<Reporter> make_terminal_reporter(std::FILE* out = stdout,
                                                               std::FILE* err = stderr,
                                                               TerminalOptions options = {});
// `stream`: each piece of output as it arrives, as {"event":"output",...} lines before the
// records.
[[nodiscard]] std::unique_ptr<Reporter>
make_json_reporter(std::FILE* out = stdout, std::FILE* err = stderr, bool stream = false);

// "{"gpus":[…]}" shortened to `width` characters for a table cell: the error of a failed run,
// else its result as one JSON line, else "-".
[[nodiscard]] std::string result_digest(const RunRecord& record, std::size_t width = 60);
// The same from the result as one JSON line, or its start (empty: no result).
[[nodiscard]] std::string result_digest(const RunRecord& record, std::string_view result_line,
                                        std::size_t width);

} // namespace ferry
