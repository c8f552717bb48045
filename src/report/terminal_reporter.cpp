// The terminal reporter: run blocks, the summary table, the progress line on a tty.
#include <algorithm>
#include <cstdlib>
#include <map>

#include <unistd.h>

#include <fmt/ranges.h>

#include "ferry/reporter.hpp"
#include "ferry/text.hpp"
#include "report/host_fold.hpp"
#include "report/result_fold.hpp"

namespace ferry {

namespace {

void put(std::FILE* stream, std::string_view bytes)
{
  std::fwrite(bytes.data(), 1, bytes.size(), stream);
}

// The last `lines` lines of `text`.
std::string_view tail_lines(std::string_view text, int lines)
{
  std::size_t pos = text.size();
  if (pos > 0 && text[pos - 1] == '\n') {
    --pos;
  }
  for (int i = 0; i < lines && pos > 0; ++i) {
    const auto newline = text.rfind('\n', pos - 1);
    if (newline == std::string_view::npos) {
      pos = 0;
      break;
    }
    pos = newline;
  }
  return text.substr(pos == 0 ? 0 : pos + 1);
}

// Colours only for a terminal, and not when the user set NO_COLOR (no-color.org).
bool wants_colour(std::FILE* stream)
{
  const char* no_colour = std::getenv("NO_COLOR");
  return isatty(fileno(stream)) != 0 && (no_colour == nullptr || *no_colour == '\0');
}

std::string status_text(RunStatus status, bool colour)
{
  const std::string_view text = to_string(status);
  if (!colour) {
    return std::string(text);
  }
  const char* code = status == RunStatus::ok            ? "32"
                     : status == RunStatus::interrupted ? "33"
                                                        : "31";
  return fmt::format("\033[{}m{}\033[0m", code, text);
}

// ferry's own line about a run: every part that came from a job, a host or a user is escaped.
std::string summary_line(const RunRecord& record, bool colour)
{
  std::string line = fmt::format("{} @ {}: {} in {:.2f} s", terminal_safe(record.job),
                                 terminal_safe(record.host_label),
                                 status_text(record.status, colour), record.duration_s);
  if (record.error) {
    line += " — " + terminal_safe(*record.error);
  }
  for (const auto& warning : record.warnings) {
    line += fmt::format("\n  warning: {}", terminal_safe(warning.value("message", "")));
  }
  return line + "\n";
}

// A run that was not ok: where, and why in a word (its host's failure, else its status).
struct NotOk {
  explicit NotOk(const RunRecord& record)
      : host(record.host_label),
        rank(record.failure != Unreached::none ? static_cast<int>(record.failure)
                                               : 16 + static_cast<int>(record.status)),
        why(record.failure == Unreached::timeout ? "connect timeout"
            : record.failure != Unreached::none  ? to_string(record.failure)
                                                 : to_string(record.status))
  {
  }
  std::string host;
  int rank; // hosts not reached first, by class, then runs by status
  std::string why;
};

// "3 failed: 2 unreachable (gpu[03,07]), 1 auth (gpu11)\n", or nothing when every run was ok.
std::string not_ok_line(const std::vector<NotOk>& runs)
{
  struct Class {
    std::string why;
    std::vector<std::string> hosts; // one per run
  };
  std::map<int, Class> by_rank;
  for (const auto& run : runs) {
    Class& group = by_rank[run.rank];
    group.why = run.why;
    group.hosts.push_back(run.host);
  }
  std::vector<std::string> parts;
  for (const auto& [rank, group] : by_rank) {
    parts.push_back(fmt::format("{} {} ({})", group.hosts.size(), group.why,
                                terminal_safe(fold_hosts(group.hosts))));
  }
  return runs.empty() ? std::string()
                      : fmt::format("{} failed: {}\n", runs.size(), fmt::join(parts, ", "));
}

std::string render_table(const Table& raw)
{
  Table table = raw; // cells escaped first, so the columns line up as shown
  for (auto& row : table.rows) {
    for (auto& cell : row) {
      cell = terminal_safe(cell);
    }
  }
  const std::size_t columns = table.header.size();
  std::vector<std::size_t> widths(columns);
  for (std::size_t c = 0; c < columns; ++c) {
    widths[c] =
        std::max(table.header[c].size(), c < table.min_widths.size() ? table.min_widths[c] : 0);
    for (const auto& row : table.rows) {
      widths[c] = std::max(widths[c], row[c].size());
    }
  }
  std::string text = table.blank_line_before ? "\n" : "";
  const auto add_row = [&](const std::vector<std::string>& row) {
    for (std::size_t c = 0; c + 1 < columns; ++c) {
      const bool right = c < table.right_aligned.size() && table.right_aligned[c];
      text += right ? fmt::format("{:>{}}  ", row[c], widths[c])
                    : fmt::format("{:<{}}  ", row[c], widths[c]);
    }
    text += row.back() + "\n";
  };
  add_row(table.header);
  for (const auto& row : table.rows) {
    add_row(row);
  }
  return text;
}

// A job's own output: as it is, or, on a terminal, with control sequences made visible.
std::string job_output(std::string_view bytes, bool escape)
{
  return escape ? terminal_safe(bytes, Newlines::keep) : std::string(bytes);
}

// Pieces of output become whole lines (and whole UTF-8 sequences) before they are shown.
class LineBuffer {
public:
  // The complete lines `bytes` adds, each with its newline.
  std::vector<std::string> add(std::string_view bytes)
  {
    m_partial.append(bytes);
    std::vector<std::string> lines;
    std::size_t start = 0;
    for (std::size_t nl = m_partial.find('\n'); nl != std::string::npos;
         nl = m_partial.find('\n', start)) {
      lines.push_back(m_partial.substr(start, nl + 1 - start));
      start = nl + 1;
    }
    m_partial.erase(0, start);
    return lines;
  }
  std::string rest() { return std::exchange(m_partial, {}); }

private:
  std::string m_partial;
};

class TerminalReporter final : public Reporter {
public:
  TerminalReporter(std::FILE* out, std::FILE* err, TerminalOptions options)
      : m_out(out), m_err(err), m_colour(wants_colour(out)), m_stream(options.stream),
        m_blocks(options.blocks), m_fold_option(options.fold), m_terminal(isatty(fileno(out)) != 0),
        m_escape_out(!options.raw_output && isatty(fileno(out)) != 0),
        m_escape_err(!options.raw_output && isatty(fileno(err)) != 0)
  {
  }

  ReportFormat format() const override { return ReportFormat::terminal; }

  void batch_started(const BatchInfo& batch) override
  {
    m_many = batch.total > 1;
    m_fold = m_fold_option.value_or(batch.hosts > k_fold_hosts);
    // One host: its output as it comes, as ssh shows it. Several: host-prefixed lines as they
    // come when asked, and by default on a terminal with few enough hosts to follow; else whole
    // blocks.
    m_live =
        batch.hosts <= 1 || m_stream || (!m_blocks && m_terminal && batch.hosts <= k_stream_hosts);
    m_prefixed = m_live && batch.hosts > 1;
    // The progress line only while whole blocks are shown: between streamed lines it would be
    // cleared and redrawn for every line, and would hide which host is still talking.
    m_show_progress = m_many && !m_live && isatty(fileno(m_err)) != 0;
    m_swept = batch.swept;
  }

  void run_started(const RunRef& run) override
  {
    if (m_live && !m_prefixed && m_many) {
      clear_progress();
      put(m_out, header(run.job, run.host));
      std::fflush(m_out);
    }
  }

  void run_output(const RunRef& run, OutputStream stream, std::string_view bytes) override
  {
    if (!m_live) {
      return;
    }
    clear_progress();
    const bool out = stream == OutputStream::out;
    if (m_prefixed) {
      show_prefixed_lines(run.host, m_lines[key(run.host, run.job, stream)].add(bytes), out);
    } else {
      show_plain(bytes, out ? 0 : 1);
    }
    std::fflush(out ? m_out : m_err);
  }

  void record(const RunRecord& record, const nlohmann::json&) override
  {
    clear_progress();
    if (m_live) {
      finish_live(record);
    } else {
      show_block(record);
    }
    put(m_out, summary_line(record, m_colour));
    std::fflush(m_out);
    std::vector<std::string> row = {record.host_label, record.job};
    for (const auto& name : m_swept) {
      row.push_back(record.params.contains(name) ? to_json_line(record.params[name]) : "-");
    }
    row.insert(row.end(), {std::string(to_string(record.status)),
                           fmt::format("{:.2f} s", record.duration_s), result_digest(record)});
    m_rows.push_back(std::move(row));
    if (record.status != RunStatus::ok) {
      m_not_ok.emplace_back(record);
    }
    if (m_fold) {
      keep_outcome(record);
    }
  }

  void progress(const FleetProgress& p) override
  {
    if (!m_show_progress || p.done == p.total) {
      return;
    }
    clear_progress();
    put(m_err,
        fmt::format("{}/{} done, {} failed, {} running", p.done, p.total, p.failed, p.running));
    std::fflush(m_err);
    m_progress_shown = true;
  }

  void batch_finished() override
  {
    clear_progress();
    if (m_rows.size() > 1) {
      put(m_out, m_fold ? folded_summary() : render_table(summary_table()));
      put(m_out, not_ok_line(m_not_ok));
    }
    std::fflush(m_out);
  }

  void table(const Table& table) override
  {
    put(m_out, render_table(table));
    std::fflush(m_out);
  }

  void document(std::string_view text, const nlohmann::json&) override
  {
    clear_progress();
    put(m_out, terminal_safe(text, Newlines::keep));
    std::fflush(m_out);
  }

  void bytes(std::string_view bytes) override
  {
    put(m_out, bytes);
    std::fflush(m_out);
  }

  void note(std::string_view text) override
  {
    clear_progress();
    std::fflush(m_out);
    put(m_err, fmt::format("ferry: {}\n", terminal_safe(text, Newlines::keep)));
  }

  void error(const Error& error) override
  {
    clear_progress();
    std::fflush(m_out);
    put(m_err, fmt::format("ferry: error: {}\n", terminal_safe(error.message, Newlines::keep)));
  }

private:
  static std::string header(std::string_view job, std::string_view host)
  {
    return fmt::format("== {} @ {} ==\n", terminal_safe(job), terminal_safe(host));
  }
  static std::string key(std::string_view host, std::string_view job, OutputStream stream)
  {
    return fmt::format("{}\n{}\n{}", host, job, stream == OutputStream::out ? 1 : 2);
  }
  static std::string prefixed(std::string_view host, std::string_view line, bool escape)
  {
    return fmt::format("{}: {}", terminal_safe(host), job_output(line, escape));
  }

  void show_prefixed_lines(std::string_view host, const std::vector<std::string>& lines, bool out)
  {
    for (const auto& line : lines) {
      put(out ? m_out : m_err, prefixed(host, line, out ? m_escape_out : m_escape_err));
    }
  }

  // Bytes of stream `i` (0 stdout, 1 stderr) as they came, less an incomplete UTF-8 sequence at
  // their end, which waits for the rest.
  void show_plain(std::string_view bytes, int i)
  {
    const bool escape = i == 0 ? m_escape_out : m_escape_err;
    std::string& pending = m_pending[i];
    pending.append(bytes);
    const std::size_t hold = escape ? utf8_incomplete_tail(pending) : 0;
    put(i == 0 ? m_out : m_err,
        job_output(std::string_view(pending).substr(0, pending.size() - hold), escape));
    pending.erase(0, pending.size() - hold);
    if (pending.empty() && !bytes.empty()) {
      m_ends_with_newline[i] = bytes.back() == '\n';
    }
  }

  // The end of a run whose output was shown as it came: what is still buffered, and a newline
  // so the summary line starts a line of its own.
  void finish_live(const RunRecord& record)
  {
    if (m_prefixed) {
      for (const auto stream : {OutputStream::out, OutputStream::err}) {
        const std::string rest = m_lines[key(record.host_label, record.job, stream)].rest();
        if (!rest.empty()) {
          show_prefixed_lines(record.host_label, {rest + "\n"}, stream == OutputStream::out);
        }
      }
    } else {
      finish_plain(0);
      finish_plain(1);
    }
    std::fflush(m_err);
    if (record.stdout_truncated) {
      put(m_out, "[stdout truncated in the record: its first and last part are kept]\n");
    }
  }

  void finish_plain(int i)
  {
    std::FILE* to = i == 0 ? m_out : m_err;
    if (!m_pending[i].empty()) {
      put(to, job_output(std::exchange(m_pending[i], {}), i == 0 ? m_escape_out : m_escape_err));
      m_ends_with_newline[i] = false;
    }
    if (!m_ends_with_newline[i]) {
      put(to, "\n");
    }
    m_ends_with_newline[i] = true;
  }

  // A run shown when it has ended: its stdout, the end of its stderr, then the summary line.
  void show_block(const RunRecord& record)
  {
    if (m_many) {
      put(m_out, header(record.job, record.host_label));
    }
    put(m_out, job_output(record.stdout_text, m_escape_out));
    if (!record.stdout_text.empty() && record.stdout_text.back() != '\n') {
      put(m_out, "\n");
    }
    if (record.stdout_truncated) {
      put(m_out, "[stdout truncated]\n");
    }
    if (!record.stderr_text.empty()) {
      std::fflush(m_out);
      put(m_err, job_output(tail_lines(record.stderr_text, 20), m_escape_err));
      if (record.stderr_text.back() != '\n') {
        put(m_err, "\n");
      }
    }
  }

  Table summary_table() const
  {
    Table summary;
    summary.header = {"HOST", "JOB"};
    for (const auto& name : m_swept) {
      summary.header.push_back(name);
    }
    summary.header.insert(summary.header.end(), {"STATUS", "TIME", "RESULT"});
    const std::size_t time_column = summary.header.size() - 2;
    summary.rows = m_rows;
    summary.right_aligned.assign(summary.header.size(), false);
    summary.right_aligned[time_column] = true;
    summary.min_widths.assign(summary.header.size(), 0);
    summary.min_widths[time_column] = 9;
    summary.blank_line_before = true;
    return summary;
  }

  // What the folded summary needs of a run, under what ran (the job and its swept values).
  void keep_outcome(const RunRecord& record)
  {
    std::string what = record.job;
    for (const auto& name : m_swept) {
      if (record.params.contains(name)) {
        what += fmt::format(" {}={}", name, to_json_line(record.params[name]));
      }
    }
    auto found = std::find_if(m_outcomes.begin(), m_outcomes.end(),
                              [&](const auto& part) { return part.first == what; });
    if (found == m_outcomes.end()) {
      found = m_outcomes.insert(m_outcomes.end(), {what, {}});
    }
    const std::string error = record.error.value_or("-");
    found->second.push_back({record.host_label, record.status, error,
                             generic_error(error, record.host_label, record.target),
                             record.status == RunStatus::ok ? record.result : nlohmann::json(),
                             result_digest(record, 100)});
  }

  // "JOB on N hosts:" and its groups, for each job (and swept values) in the order their first
  // run ended.
  std::string folded_summary() const
  {
    std::string text;
    for (const auto& [what, outcomes] : m_outcomes) {
      text += fmt::format("\n{} on {} host{}:\n{}", terminal_safe(what), outcomes.size(),
                          outcomes.size() == 1 ? "" : "s",
                          indented(render_groups(group_outcomes(outcomes))));
    }
    return text;
  }

  // LINES (each ending "\n") with two spaces before each.
  static std::string indented(std::string_view lines)
  {
    std::string text;
    for (const auto line : split_lines(lines)) {
      text += fmt::format("  {}\n", line);
    }
    return text;
  }

  void clear_progress()
  {
    if (m_progress_shown) {
      put(m_err, "\r\033[K");
      m_progress_shown = false;
    }
  }

  std::FILE* m_out;
  std::FILE* m_err;
  bool m_colour;
  bool m_stream;
  bool m_blocks; // --no-stream
  std::optional<bool> m_fold_option;
  bool m_fold = false; // the summary folds hosts by the sameness of their results
  bool m_terminal;     // stdout is a terminal
  bool m_escape_out;   // job output shown on a terminal is escaped (unless --raw-output)
  bool m_escape_err;
  bool m_many = false;
  bool m_live = false;     // output is shown as it arrives
  bool m_prefixed = false; // ... line by line, each prefixed with its host
  bool m_show_progress = false;
  bool m_progress_shown = false;
  std::vector<std::string> m_swept;
  std::map<std::string, LineBuffer> m_lines;
  std::string m_pending[2];                   // an incomplete UTF-8 sequence held back
  bool m_ends_with_newline[2] = {true, true}; // the last byte shown on stdout, stderr
  std::vector<std::vector<std::string>> m_rows;
  std::vector<NotOk> m_not_ok;
  // Per job (and swept values), in the order their first run ended: each run's outcome.
  std::vector<std::pair<std::string, std::vector<HostOutcome>>> m_outcomes;
};

} // namespace

std::unique_ptr<Reporter> make_terminal_reporter(std::FILE* out, std::FILE* err,
                                                 TerminalOptions options)
{
  return std::make_unique<TerminalReporter>(out, err, options);
}

std::string result_digest(const RunRecord& record, std::size_t width)
{
  return result_digest(record, record.result.is_null() ? "" : to_json_line(record.result), width);
}

std::string result_digest(const RunRecord& record, std::string_view result_line, std::size_t width)
{
  const bool summarized = record.summary.is_array() && !record.summary.empty();
  std::string text = record.status != RunStatus::ok && record.error ? *record.error
                     : summarized                                   ? summary_text(record.summary)
                     : !result_line.empty()                         ? std::string(result_line)
                                                                    : "-";
  std::replace_if(
      text.begin(), text.end(), [](char c) { return c == '\n' || c == '\r' || c == '\t'; }, ' ');
  return shorten(text, width);
}

} // namespace ferry
