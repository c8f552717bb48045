#include "transport/stop_schedule.hpp"

namespace ferry {

namespace {
// The launcher sends KILL `grace` after TERM; ferry waits a little longer before it does so
// itself, and gives up on a job that survives even that. When the user is waiting (an
// interrupt), both come sooner: ferry must end within a few seconds.
constexpr std::chrono::seconds k_kill_slack{3};
constexpr std::chrono::seconds k_give_up_slack{8};
constexpr std::chrono::seconds k_kill_slack_interrupted{1};
constexpr std::chrono::seconds k_give_up_slack_interrupted{3};
} // namespace

StopSchedule::StopSchedule(Clock::time_point start, const ExecRequest& request)
    : m_start(start), m_deadline(request.deadline), m_grace(request.grace),
      m_start_limit(request.start_limit), m_stop(request.stop)
{
}

StopSchedule::Step StopSchedule::next(Clock::time_point now, bool started)
{
  if (!m_termed_at) {
    const bool stop = m_stop.stop_requested();
    const bool never_started = !started && now - m_start > m_start_limit;
    if (!stop && !never_started && now - m_start <= m_deadline) {
      return Step::none;
    }
    m_reason = stop ? ExecEnd::interrupted : never_started ? ExecEnd::no_start : ExecEnd::deadline;
    m_termed_at = now;
    return Step::term;
  }
  const bool interrupted = m_reason != ExecEnd::deadline; // the job never ran, or a user waits
  const auto kill_after = m_grace + (interrupted ? k_kill_slack_interrupted : k_kill_slack);
  const auto give_up_after =
      m_grace + (interrupted ? k_give_up_slack_interrupted : k_give_up_slack);
  if (!m_killed && now - *m_termed_at > kill_after) {
    m_killed = true;
    return Step::kill;
  }
  if (m_killed && !m_gave_up && now - *m_termed_at > give_up_after) {
    m_gave_up = true;
    return Step::give_up;
  }
  return Step::none;
}

} // namespace ferry
