#include "transport/exec_request.hpp"

namespace ferry {

namespace {
// The login shell's startup noise is kept for diagnosis only, up to this much.
constexpr std::size_t k_noise_cap = 64 * 1024;
// Up to this much of a stream's capture grows as it comes; past it, the cap is reserved.
constexpr std::size_t k_small_output = 1024 * 1024;
} // namespace

OutputCapture::OutputCapture(std::string sentinel, std::size_t cap, std::string end_marker,
                             std::function<void(std::string_view)> sink, std::size_t report_cap)
    : m_marker(sentinel.empty() ? std::string() : sentinel + "\n"),
      m_end(end_marker.empty() ? std::string() : end_marker + " "), m_cap(cap),
      m_sink(std::move(sink)), m_report_cap(report_cap)
{
  m_out.saw_sentinel = m_marker.empty();
}

void OutputCapture::feed(std::string_view data)
{
  if (!m_out.saw_sentinel) {
    // Only the tail that could still hold the start of the marker is worth keeping.
    m_pending.append(data);
    const std::size_t at = m_pending.find(m_marker);
    if (at == std::string::npos) {
      const std::size_t keep = m_marker.size() - 1;
      if (m_pending.size() > k_noise_cap + keep) {
        const std::size_t drop = m_pending.size() - keep;
        if (m_out.before_sentinel.size() < k_noise_cap) {
          m_out.before_sentinel.append(m_pending, 0,
                                       std::min(drop, k_noise_cap - m_out.before_sentinel.size()));
        }
        m_pending.erase(0, drop);
      }
      return;
    }
    m_out.saw_sentinel = true;
    if (m_out.before_sentinel.size() < k_noise_cap) {
      m_out.before_sentinel.append(m_pending, 0,
                                   std::min(at, k_noise_cap - m_out.before_sentinel.size()));
    }
    const std::string rest = m_pending.substr(at + m_marker.size());
    m_pending.clear();
    m_pending.shrink_to_fit();
    data = rest;
    feed(data); // rest is bounded by the pending cap
    return;
  }
  take(data);
}

void OutputCapture::take(std::string_view job_bytes)
{
  if (m_end.empty()) {
    keep(job_bytes);
    return;
  }
  m_held.append(job_bytes);
  if (const auto at = m_held.find(m_end); at != std::string::npos) {
    // The launcher's report: everything from the marker on is held for finish(), unless it grows
    // past what a report can be (then the job printed the marker: its bytes after all).
    keep(std::string_view(m_held).substr(0, at));
    m_held.erase(0, at);
    if (m_held.size() > m_report_cap) {
      keep(std::string_view(m_held).substr(0, m_end.size()));
      m_held.erase(0, m_end.size());
      take({});
    }
    return;
  }
  // Hold back only the longest tail that could still become the marker, so a job's line is
  // passed on as soon as it arrives.
  std::size_t hold = std::min(m_held.size(), m_end.size());
  while (hold > 0 && m_held.compare(m_held.size() - hold, hold, m_end, 0, hold) != 0) {
    --hold;
  }
  keep(std::string_view(m_held).substr(0, m_held.size() - hold));
  m_held.erase(0, m_held.size() - hold);
}

void OutputCapture::keep(std::string_view job_bytes)
{
  if (job_bytes.empty()) {
    return;
  }
  if (m_sink) {
    m_sink(job_bytes);
  }
  m_total += job_bytes.size();
  // The first half of the cap keeps the start of the stream, the second half (a ring) its end:
  // errors are usually last.
  const std::size_t head_cap = m_cap - m_cap / 2;
  if (m_out.bytes.size() < head_cap) {
    const std::size_t n = std::min(job_bytes.size(), head_cap - m_out.bytes.size());
    if (m_out.bytes.size() + n > k_small_output && m_out.bytes.capacity() < m_cap) {
      // A large output: the whole capture's room at once, instead of a string that doubles
      // up to the head's cap and is then moved into that room (each step a copy, and freed
      // blocks of megabytes that malloc may keep: the peak RSS varied by 8 MiB between runs).
      m_out.bytes.reserve(m_cap);
    }
    m_out.bytes.append(job_bytes.substr(0, n));
    job_bytes.remove_prefix(n);
  }
  const std::size_t tail_cap = m_cap / 2;
  if (job_bytes.empty() || tail_cap == 0) {
    return;
  }
  if (m_tail.size() != tail_cap) {
    // Room for the tail after the head now, while the ring is not allocated yet: joining them
    // at the end then copies nothing, and the peak stays at head + ring.
    m_out.bytes.reserve(head_cap + tail_cap);
    m_tail.assign(tail_cap, '\0');
  }
  if (job_bytes.size() >= tail_cap) {
    job_bytes = job_bytes.substr(job_bytes.size() - tail_cap);
  }
  for (std::size_t done = 0; done < job_bytes.size();) {
    const std::size_t n = std::min(job_bytes.size() - done, tail_cap - m_tail_pos);
    m_tail.replace(m_tail_pos, n, job_bytes.substr(done, n));
    m_tail_pos = (m_tail_pos + n) % tail_cap;
    m_tail_filled = std::min(tail_cap, m_tail_filled + n);
    done += n;
  }
}

std::optional<std::string_view> OutputCapture::report_so_far() const
{
  if (m_end.empty() || !m_out.saw_sentinel || m_held.compare(0, m_end.size(), m_end) != 0) {
    return std::nullopt;
  }
  return std::string_view(m_held).substr(m_end.size());
}

CapturedStream OutputCapture::finish() &&
{
  if (!m_out.saw_sentinel) {
    // The launcher never ran (or its marker was lost): keep what came, as it came.
    m_out.bytes = m_out.before_sentinel + m_pending;
    m_out.before_sentinel.clear();
  }
  if (!m_end.empty() && m_held.compare(0, m_end.size(), m_end) == 0) {
    m_out.launcher_report = m_held.substr(m_end.size());
  } else {
    keep(m_held); // not the launcher's last line after all: the job's
  }
  m_held.clear();
  // The ring, oldest byte first, after the head.
  const std::size_t oldest = m_tail_filled < m_tail.size() ? 0 : m_tail_pos;
  m_out.bytes.append(m_tail, oldest, m_tail_filled - oldest);
  m_out.bytes.append(m_tail, 0, oldest);
  m_tail.clear();
  m_tail.shrink_to_fit();
  if (m_total > m_out.bytes.size() && m_out.saw_sentinel) {
    m_out.dropped = m_total - m_out.bytes.size();
    m_out.truncated = true;
  }
  return std::move(m_out);
}

OutputCapture capture_for(const ExecRequest& request, OutputStream stream, bool stderr_ends)
{
  std::function<void(std::string_view)> sink;
  if (request.on_output) {
    sink = [on_output = request.on_output, stream](std::string_view bytes) {
      on_output(stream, bytes);
    };
  }
  return OutputCapture(request.sentinel, request.output_cap,
                       stream == OutputStream::out || stderr_ends ? request.end_marker
                                                                  : std::string(),
                       std::move(sink), request.report_cap);
}

ExecRequest launcher_request(const StagedRun& run, const LaunchRequest& request)
{
  ExecRequest exec;
  exec.argv = {"/bin/sh", run.run_dir + "/" + k_launcher_file};
  exec.argv.insert(exec.argv.end(), run.launcher_args.begin(), run.launcher_args.end());
  exec.sentinel = run.launcher.sentinel;
  exec.end_marker = run.launcher.end_marker;
  exec.output_cap = request.output_cap;
  exec.report_cap = request.report_cap;
  exec.deadline = request.deadline;
  exec.grace = request.grace;
  exec.stop = request.stop;
  exec.on_output = request.on_output;
  exec.on_note = request.on_note;
  exec.python_ahead = runs_on_python_ahead(run.launcher);
  return exec;
}

} // namespace ferry
