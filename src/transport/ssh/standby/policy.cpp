#include "transport/ssh/standby/policy.hpp"

#include <algorithm>

namespace ferry::ssh::standby {

bool last_on_its_channel(RunsPlan& plan)
{
  if (plan.expected == 0) {
    return false; // unknown (a holder's): standbys stay
  }
  plan.started = std::min(plan.started + 1, plan.expected);
  return plan.expected - plan.started < std::max<std::size_t>(plan.at_once, 1);
}

bool fans_out_python(bool python_job, const RunsPlan& plan)
{
  return python_job && plan.expected != 1;
}

bool defers_staging(const Facts& facts)
{
  return facts.python_ready && facts.channel_limit > 2 && facts.deferred < k_max_deferred &&
         facts.names_run_dirs;
}

bool opens_ahead(const Facts& facts)
{
  return facts.connected && !facts.has_standby && facts.channel_limit - facts.execs >= 2;
}

Keep keep_after_run(bool may_keep, const Facts& facts)
{
  if (!may_keep) {
    return Keep::none; // its channel closes: the standby reads the end of its stdin and ends
  }
  if (!facts.has_standby) {
    return Keep::standby;
  }
  return facts.spares < k_max_spares ? Keep::spare : Keep::none;
}

Close to_close(const Facts& facts)
{
  if (facts.spares > 0) {
    return Close::spare;
  }
  return facts.has_standby ? Close::standby : Close::none;
}

bool script_look_due(bool command_known, Clock::time_point now, Clock::time_point last_look)
{
  return !command_known || now - last_look >= k_script_look_every;
}

Wait runs_first(bool runs_busy, Clock::time_point last_activity, Clock::time_point started,
                Clock::time_point now)
{
  const auto give_up = started + k_runs_first_at_most;
  if (now >= give_up) {
    return {};
  }
  if (runs_busy) {
    return {true, give_up};
  }
  const auto quiet = last_activity + k_runs_quiet;
  if (now >= quiet) {
    return {};
  }
  return {false, std::min(quiet, give_up)};
}

} // namespace ferry::ssh::standby
