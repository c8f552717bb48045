#include "transport/stop_schedule.hpp"

namespace ferry {

namespace {
// The launcher sends KILL `grace` after TERM; ferry waits a little longer before it does so
// itself, and gives up on a job that survives even that.
constexpr std::chrono::seconds k_kill_slack{3};
constexpr std::chrono::seconds k_give_up_slack{8};
} // namespace

StopSchedule::StopSchedule(Clock::time_point start, const ExecRequest& request)
    : m_start(start), m_deadline(request.deadline), m_grace(request.grace), m_stop(request.stop)
{
}

StopSchedule::Step StopSchedule::next(Clock::time_point now)
{
  if (!m_termed_at) {
    const bool stop = m_stop.stop_requested();
    if (!stop && now - m_start <= m_deadline) {
      return Step::none;
    }
    m_reason = stop ? ExecEnd::interrupted : ExecEnd::deadline;
    m_termed_at = now;
    return Step::term;
  }
  if (!m_killed && now - *m_termed_at > m_grace + k_kill_slack) {
    m_killed = true;
    return Step::kill;
  }
  if (m_killed && !m_gave_up && now - *m_termed_at > m_grace + k_give_up_slack) {
    m_gave_up = true;
    return Step::give_up;
  }
  return Step::none;
}

} // namespace ferry
