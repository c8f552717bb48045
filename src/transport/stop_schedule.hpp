#pragma once
// How both exec loops (SSH and local) stop a job: TERM once ferry is interrupted or its backstop
// deadline passes, KILL when the job outlives the launcher's own grace period, then give up.
#include <chrono>
#include <optional>

#include "transport/exec_request.hpp"

namespace ferry {

class StopSchedule {
public:
  using Clock = std::chrono::steady_clock;
  enum class Step { none, term, kill, give_up };

  StopSchedule(Clock::time_point start, const ExecRequest& request);

  // What the loop must do now; each step is returned once, in order. `started`: the launcher's
  // sentinel has arrived (a login shell that never starts it is stopped after the start limit).
  [[nodiscard]] Step next(Clock::time_point now, bool started = true);
  // Why the job is being stopped; nullopt while it is not.
  [[nodiscard]] std::optional<ExecEnd> reason() const { return m_reason; }

private:
  Clock::time_point m_start;
  Clock::duration m_deadline;
  Clock::duration m_grace;
  Clock::duration m_start_limit;
  StopToken m_stop;
  std::optional<Clock::time_point> m_termed_at;
  std::optional<ExecEnd> m_reason;
  bool m_killed = false;
  bool m_gave_up = false;
};

} // namespace ferry
