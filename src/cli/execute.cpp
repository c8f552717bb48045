#include <csignal>
#include <cstdio>
#include <mutex>
#include <optional>

#include <unistd.h>

#include "cli/execute.hpp"
#include "ferry/archive.hpp"
#include "ferry/transport.hpp"

namespace ferry::cli {

namespace {

extern "C" void on_interrupt_signal(int signal)
{
  if (interrupt_requested() && signal == SIGINT) {
    _exit(to_int(ExitCode::interrupted)); // a second Ctrl-C: stop waiting for cleanup
  }
  request_interrupt();
}

void write_all(std::FILE* stream, std::string_view bytes)
{
  std::fwrite(bytes.data(), 1, bytes.size(), stream);
}

std::string tail_lines(std::string_view text, int lines)
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
  return std::string(text.substr(pos == 0 ? 0 : pos + 1));
}

} // namespace

void install_interrupt_handlers()
{
  struct sigaction action {};
  action.sa_handler = on_interrupt_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
}

std::string result_digest(const RunRecord& record, std::size_t width)
{
  return result_digest(record, record.result.is_null() ? "" : to_json_line(record.result), width);
}

std::string result_digest(const RunRecord& record, std::string_view result_line, std::size_t width)
{
  std::string text;
  if (record.status != RunStatus::ok && record.error) {
    text = *record.error;
  } else if (!result_line.empty()) {
    text = result_line;
  } else {
    text = "-";
  }
  for (auto& c : text) {
    if (c == '\n' || c == '\r' || c == '\t') {
      c = ' ';
    }
  }
  if (text.size() > width) {
    std::size_t cut = width - 1;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) {
      --cut; // do not split a UTF-8 sequence
    }
    text = text.substr(0, cut) + "…";
  }
  return text;
}

int execute_runs(Context& ctx, std::vector<std::unique_ptr<HostSession>>& sessions,
                 const std::vector<PlannedRun>& runs, const RunOptions& run_options,
                 const ReportOptions& report, const std::function<void(const RunRecord&)>& on_record)
{
  std::optional<Archive> archive;
  if (report.archive) {
    auto opened = Archive::open(ctx.archive_path());
    if (opened) {
      archive.emplace(std::move(opened).value());
    } else {
      print_error(fmt::format("{} — runs go on, but they are not archived", opened.error().message));
    }
  }
  const bool many = sessions.size() * runs.size() > 1;
  const bool show_progress = !report.json && many && isatty(STDERR_FILENO) != 0;
  bool progress_shown = false;
  auto clear_progress = [&] {
    if (progress_shown) {
      std::fputs("\r\033[K", stderr);
      progress_shown = false;
    }
  };

  struct Row {
    std::string host, job, status, duration, digest;
  };
  std::vector<Row> rows;
  bool any_failed = false;
  bool any_unreachable = false;
  bool any_interrupted = false;

  FleetCallbacks callbacks;
  callbacks.on_done = [&](RunRecord& record) {
    if (archive) {
      if (auto stored = archive->record(record); !stored) {
        clear_progress();
        print_error(fmt::format("{} — this run's result is still shown below", stored.error().message));
      } else if (stored->spooled_to) {
        clear_progress();
        fmt::print(stderr,
                   "ferry: {}; run {} was saved to {} instead, and goes into the archive "
                   "the next time ferry opens it to record a run\n",
                   stored->why, record.run_id, stored->spooled_to->string());
      }
    }
    any_failed |= record.status != RunStatus::ok;
    any_unreachable |= record.unreachable;
    any_interrupted |= record.status == RunStatus::interrupted;
    clear_progress();
    const std::string where = record.host_label;
    const std::string summary =
      fmt::format("{} @ {}: {} in {:.2f} s", record.job, where, to_string(record.status), record.duration_s);
    if (report.json) {
      write_json_line(stdout, record);
    } else if (!report.quiet_stdout) {
      if (many) {
        write_all(stdout, fmt::format("== {} @ {} ==\n", record.job, where));
      }
      write_all(stdout, record.stdout_text);
      if (!record.stdout_text.empty() && record.stdout_text.back() != '\n') {
        write_all(stdout, "\n");
      }
      if (record.stdout_truncated) {
        write_all(stdout, "[stdout truncated]\n");
      }
      if (record.status != RunStatus::ok && !record.stderr_text.empty()) {
        std::fflush(stdout);
        write_all(stderr, tail_lines(record.stderr_text, 20));
        if (record.stderr_text.back() != '\n') {
          write_all(stderr, "\n");
        }
      }
      std::string line = summary;
      if (record.error) {
        line += " — " + *record.error;
      }
      for (const auto& warning : record.warnings) {
        line += fmt::format("\n  warning: {}", warning.value("message", ""));
      }
      write_all(stdout, line + "\n");
    }
    std::fflush(stdout);
    rows.push_back({where, record.job, std::string(to_string(record.status)),
                    fmt::format("{:.2f} s", record.duration_s), result_digest(record)});
    if (on_record) {
      on_record(record);
    }
  };
  callbacks.on_progress = [&](const FleetProgress& p) {
    if (!show_progress || p.done == p.total) {
      return;
    }
    clear_progress();
    std::fputs(fmt::format("{}/{} done, {} failed, {} running", p.done, p.total, p.failed, p.running)
                 .c_str(),
               stderr);
    std::fflush(stderr);
    progress_shown = true;
  };

  run_fleet(sessions, runs, report.parallel, run_options, callbacks);
  clear_progress();

  if (!report.json && !report.quiet_stdout && rows.size() > 1) {
    std::size_t host_w = 4, job_w = 3, status_w = 6;
    for (const auto& row : rows) {
      host_w = std::max(host_w, row.host.size());
      job_w = std::max(job_w, row.job.size());
      status_w = std::max(status_w, row.status.size());
    }
    std::string table = fmt::format("\n{:<{}}  {:<{}}  {:<{}}  {:>9}  {}\n", "HOST", host_w, "JOB",
                                    job_w, "STATUS", status_w, "TIME", "RESULT");
    for (const auto& row : rows) {
      table += fmt::format("{:<{}}  {:<{}}  {:<{}}  {:>9}  {}\n", row.host, host_w, row.job, job_w,
                           row.status, status_w, row.duration, row.digest);
    }
    write_all(stdout, table);
  }
  std::fflush(stdout);
  if (any_interrupted || interrupt_requested()) {
    return to_int(ExitCode::interrupted);
  }
  if (any_unreachable) {
    return to_int(ExitCode::unreachable);
  }
  return to_int(any_failed ? ExitCode::run_failed : ExitCode::ok);
}

} // namespace ferry::cli
