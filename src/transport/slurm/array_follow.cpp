#include "transport/slurm/array_follow.hpp"

#include <fmt/format.h>

namespace ferry::slurm {

namespace {
constexpr auto k_watch_interval = std::chrono::milliseconds(100);
} // namespace

ArrayFollow::~ArrayFollow()
{
  if (m_thread.joinable()) {
    m_thread.join();
  }
}

void ArrayFollow::enroll(int task, Follow& follow)
{
  std::unique_lock lock(m_mutex);
  m_points.at(static_cast<std::size_t>(task)).follow = &follow;
  ++m_enrolled;
  start(lock);
}

void ArrayFollow::arm(Exec exec, ExecRequest script, std::string tag)
{
  std::unique_lock lock(m_mutex);
  m_exec = std::move(exec);
  // On the script's thread.
  script.on_output = [this](OutputStream stream, std::string_view bytes) {
    if (stream == OutputStream::out) {
      const std::lock_guard guard(m_mutex);
      m_frames->feed(bytes);
      if (m_frames->broken()) {
        for (Point& point : m_points) {
          point.follow->take_broken(*m_frames->broken());
          point.ended = true;
        }
        m_changed.notify_all();
      }
    }
  };
  m_script = std::move(script);
  m_frames.emplace(
      std::move(tag), [this](const auto& words) { on_line(words); },
      [this](OutputStream stream, std::string_view bytes) { on_bytes(stream, bytes); }, true);
  start(lock);
}

void ArrayFollow::abandon(std::string why)
{
  const std::lock_guard lock(m_mutex);
  if (!m_failure) {
    m_failure = std::move(why);
  }
  m_changed.notify_all();
}

// Every point is enrolled and the script armed: it runs.
void ArrayFollow::start(std::unique_lock<std::mutex>& /*held*/)
{
  if (m_started || !m_script || m_enrolled < m_points.size() || m_failure) {
    return;
  }
  m_started = true;
  m_thread = std::thread([this] {
    auto outcome = m_exec(*m_script);
    const std::lock_guard lock(m_mutex);
    m_done = std::move(outcome);
    m_changed.notify_all();
  });
}

// A frame about the whole array goes to every point, one about a task to its point.
void ArrayFollow::on_line(const std::vector<std::string_view>& words)
{
  const int task = m_frames->task();
  if (task < 0) {
    for (std::size_t k = 0; k < m_points.size(); ++k) {
      Point& point = m_points[k];
      if (words[0] == "job" && words.size() > 1) {
        const std::string id = fmt::format("{}_{}", words[1], k); // its task: "4242_3"
        point.follow->take_line({words[0], id});
      } else if (!point.ended) {
        point.follow->take_line(words);
      }
    }
    return;
  }
  if (static_cast<std::size_t>(task) >= m_points.size()) {
    return;
  }
  Point& point = m_points[static_cast<std::size_t>(task)];
  point.follow->take_line(words);
  point.follow->watch_time();
  if (words[0] == "end") {
    point.ended = true;
    m_changed.notify_all();
  }
}

void ArrayFollow::on_bytes(OutputStream stream, std::string_view bytes)
{
  const int task = m_frames->task();
  if (task >= 0 && static_cast<std::size_t>(task) < m_points.size()) {
    m_points[static_cast<std::size_t>(task)].follow->take_bytes(stream, bytes);
  }
}

Expected<ExecOutcome> ArrayFollow::wait(int task, const StopToken& stop,
                                        const std::function<void()>& cancel_task)
{
  std::unique_lock lock(m_mutex);
  const Point& point = m_points.at(static_cast<std::size_t>(task));
  const auto give_up = std::chrono::steady_clock::now() + k_start_limit;
  bool cancelled = false;
  while (!point.ended && !m_done) {
    if (m_failure) {
      return fail(ErrorKind::failed, "the job array was not submitted: {}", *m_failure);
    }
    if (!m_started && (stop.stop_requested() || std::chrono::steady_clock::now() > give_up)) {
      return fail(ErrorKind::failed, "the job array was not submitted: {}",
                  stop.stop_requested() ? "interrupted" : "its other points never got ready");
    }
    point.follow->watch_time();
    if (point.follow->stop_reason() == ExecEnd::deadline && !cancelled) {
      cancelled = true;
      lock.unlock();
      cancel_task();
      lock.lock();
      continue;
    }
    m_changed.wait_for(lock, k_watch_interval);
  }
  return seen_by(point);
}

// The script's outcome as one point sees it: a point whose task has ended is done, whatever the
// script goes on to do for the others.
Expected<ExecOutcome> ArrayFollow::seen_by(const Point& point) const
{
  if (point.ended) {
    ExecOutcome script;
    // The runner's stop or ferry's deadline ended it: Follow::outcome says which.
    script.end = point.follow->stop_reason() ? ExecEnd::interrupted : ExecEnd::exited;
    script.exit_code = 0;
    return script;
  }
  if (!*m_done) {
    return Unexpected<Error>{m_done->error()};
  }
  ExecOutcome script;
  const ExecOutcome& all = **m_done;
  script.end = all.end;
  script.exit_code = all.exit_code;
  script.err.bytes = all.err.bytes; // sbatch's complaint
  script.out.before_sentinel = all.out.before_sentinel;
  script.err.before_sentinel = all.err.before_sentinel;
  script.lost_reason = all.lost_reason;
  script.start_limit_s = all.start_limit_s;
  return script;
}

} // namespace ferry::slurm
