#include "transport/slurm/follow.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "ferry/remote/launcher.hpp"
#include "ferry/text.hpp"

namespace ferry::slurm {

namespace {
// ferry keeps only a little of what the submit script itself says (sbatch's complaints); the
// job's output is kept by the launcher's captures.
constexpr std::size_t k_script_cap = 64 * 1024;
// No deadline of its own: a job may wait in the queue for as long as the cluster is busy.
constexpr auto k_no_deadline = std::chrono::hours(24 * 365);
constexpr auto k_cancel_grace = std::chrono::seconds(10);
} // namespace

Follow::Follow(const ExecRequest& request, std::string tag, std::function<void(std::string)> on_job)
    : m_request(request), m_on_job(std::move(on_job)),
      m_out(capture_for(request, OutputStream::out)),
      m_err(capture_for(request, OutputStream::err)),
      m_frames(
          std::move(tag), [this](const auto& words) { take_line(words); },
          [this](OutputStream stream, std::string_view bytes) { take_bytes(stream, bytes); })
{
}

ExecRequest follower_request(const ExecRequest& request, std::vector<std::string> argv,
                             std::string sentinel, std::chrono::seconds grace)
{
  ExecRequest script;
  script.argv = std::move(argv);
  script.sentinel = std::move(sentinel);
  script.output_cap = k_script_cap;
  script.deadline = k_no_deadline;
  // After TERM the script cancels the job and waits for it to leave the queue (a few seconds):
  // KILL must not cut that short, or the job could outlive the run.
  script.grace = std::max<std::chrono::steady_clock::duration>(request.grace, grace);
  script.start_limit = request.start_limit;
  return script;
}

ExecRequest Follow::script_request(std::vector<std::string> argv, std::string sentinel)
{
  ExecRequest script =
      follower_request(m_request, std::move(argv), std::move(sentinel), k_cancel_grace);
  script.stop = m_script_stop;
  script.on_output = [this](OutputStream stream, std::string_view bytes) {
    if (stream == OutputStream::out) {
      m_frames.feed(bytes);
    }
    watch_time();
  };
  return script;
}

void Follow::take_bytes(OutputStream stream, std::string_view bytes)
{
  (stream == OutputStream::out ? m_out : m_err).feed(bytes);
}

void Follow::note(const std::string& text) const
{
  if (m_request.on_note) {
    m_request.on_note(terminal_safe(text)); // squeue's words come from the login node
  }
}

// Called whenever the script says something (at least once a second while the job is known):
// the run's own stop request and ferry's deadline stop the script, which cancels the job.
void Follow::watch_time()
{
  if (m_stop_reason) {
    return;
  }
  if (m_request.stop.stop_requested()) {
    m_stop_reason = ExecEnd::interrupted;
  } else if (m_running_since && Clock::now() - *m_running_since > m_request.deadline) {
    m_stop_reason = ExecEnd::deadline;
    note(fmt::format("job {} ran past ferry's deadline; cancelling it", m_job_id));
  }
  if (m_stop_reason) {
    m_script_stop.request_stop();
  }
}

void Follow::take_line(const std::vector<std::string_view>& words)
{
  const std::string_view kind = words[0];
  const std::string_view first = words.size() > 1 ? words[1] : std::string_view();
  if (kind == "job") {
    m_job_id = std::string(first);
    note(fmt::format("submitted as Slurm job {}", m_job_id));
    if (m_on_job) {
      m_on_job(m_job_id);
    }
  } else if (kind == "state") {
    on_state(first, words.size() > 2 ? words[2] : std::string_view("-"));
  } else if (kind == "node") {
    m_node = first == "-" ? std::string() : std::string(first);
  } else if (kind == "end") {
    on_end(words);
  } else if (kind == "note") {
    std::string text;
    for (std::size_t i = 1; i < words.size(); ++i) {
      text += (i > 1 ? " " : "") + std::string(words[i]);
    }
    note(fmt::format("job {}: {}", m_job_id, text));
  }
}

void Follow::on_state(std::string_view state, std::string_view reason)
{
  if (state == "RUNNING" && !m_running_since) {
    m_running_since = Clock::now();
  }
  // A state is shown once, a pending job's reason each time it changes ("None": none yet).
  const bool pending_again = state == "PENDING" && state == m_state;
  if ((state == m_state && !pending_again) || (pending_again && reason == m_reason)) {
    return;
  }
  m_state = std::string(state);
  m_reason = std::string(reason);
  if (state == "PENDING") {
    note(reason == "None" || reason == "-" ? fmt::format("job {} pending", m_job_id)
                                           : fmt::format("job {} pending: {}", m_job_id, reason));
  } else if (state == "RUNNING") {
    note(fmt::format("job {} running", m_job_id));
  } else if (!is_final_state(state)) {
    note(fmt::format("job {} {}", m_job_id, state));
  }
}

void Follow::on_end(const std::vector<std::string_view>& words)
{
  JobEnd end;
  end.state = words.size() > 1 ? std::string(words[1]) : "UNKNOWN";
  if (const auto code = parse_exit_code(words.size() > 2 ? words[2] : "")) {
    end.exit_code = code->first;
    end.signal = code->second;
  }
  const std::string_view nodes = words.size() > 3 ? words[3] : "-";
  end.nodes = nodes == "-" || nodes == "(null)" || nodes == "None_assigned" ? "" : nodes;
  end.source = words.size() > 4 ? std::string(words[4]) : "none";
  m_end = std::move(end);
}

ExecOutcome Follow::outcome(ExecOutcome script, NodeRun run)
{
  ExecOutcome outcome;
  outcome.out = std::move(m_out).finish();
  outcome.err = std::move(m_err).finish();
  // What the login shell printed before the submit script started is the run's noise.
  outcome.out.before_sentinel = script.out.before_sentinel + outcome.out.before_sentinel;
  outcome.err.before_sentinel = script.err.before_sentinel + outcome.err.before_sentinel;
  outcome.end = script.end;
  outcome.lost_reason = script.lost_reason;
  outcome.start_limit_s = script.start_limit_s;
  if (script.end == ExecEnd::interrupted && m_stop_reason) {
    outcome.end = *m_stop_reason;
  }
  if (const auto report = outcome.out.launcher_report
                              ? parse_launcher_report(*outcome.out.launcher_report)
                              : std::nullopt) {
    outcome.exit_code = report->code;
  }
  if (const auto& broken = m_frames.broken() ? m_frames.broken() : m_broken_elsewhere) {
    outcome.verdict =
        ExecOutcome::Verdict{ExecOutcome::Verdict::Kind::error,
                             fmt::format("the submit script's report made no sense ({})", *broken)};
    return outcome;
  }
  run.node = m_node;
  run.launcher_report = outcome.out.launcher_report.has_value();
  run.stopped_by_ferry = m_stop_reason.has_value();
  if (m_end && outcome.end == ExecEnd::exited) {
    outcome.verdict = slurm_verdict(*m_end, run);
  }
  return outcome;
}

} // namespace ferry::slurm
