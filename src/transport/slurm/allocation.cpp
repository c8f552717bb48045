#include "transport/slurm/allocation.hpp"

namespace ferry::slurm {

SharedAllocation::Round& SharedAllocation::round_of(int round)
{
  auto& entry = m_rounds[round];
  if (entry.dirs.empty()) {
    entry.dirs.resize(static_cast<std::size_t>(m_slots));
  }
  return entry;
}

// A slot that left before it joined this round: the round cannot be complete.
std::optional<std::string> SharedAllocation::absent_slot(const Round& round) const
{
  for (std::size_t slot = 0; slot < m_left.size(); ++slot) {
    if (m_left[slot] && !round.dirs[slot]) {
      return fmt::format("node slot {} of {} dropped out: {}", slot + 1, m_slots, *m_left[slot]);
    }
  }
  return std::nullopt;
}

template <typename Done>
Expected<void> SharedAllocation::wait(std::unique_lock<std::mutex>& lock, const StopToken& stop,
                                      std::chrono::seconds limit, Done done, std::string_view what)
{
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (stop.stop_requested()) {
      return fail(ErrorKind::failed, "interrupted while waiting for {}", what);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return fail(ErrorKind::failed, "waited {} s for {} in vain", limit.count(), what);
    }
    m_changed.wait_for(lock, std::chrono::milliseconds(100));
  }
  return {};
}

Expected<std::vector<std::string>> SharedAllocation::join(int round, int slot, std::string run_dir,
                                                          const StopToken& stop)
{
  std::unique_lock lock(m_mutex);
  Round& entry = round_of(round);
  entry.dirs[static_cast<std::size_t>(slot)] = std::move(run_dir);
  ++entry.ready;
  m_changed.notify_all();
  FERRY_TRY(wait(
      lock, stop, k_join_limit,
      [&] {
        if (!entry.failure) {
          entry.failure = absent_slot(entry);
        }
        return entry.failure || entry.ready == m_slots;
      },
      "the other nodes' runs to be staged"));
  if (entry.failure) {
    return fail(ErrorKind::failed, "the allocation was not submitted: {}", *entry.failure);
  }
  std::vector<std::string> dirs;
  for (const auto& dir : entry.dirs) {
    dirs.push_back(*dir);
  }
  return dirs;
}

Expected<std::string> SharedAllocation::job_of(int round, const StopToken& stop)
{
  std::unique_lock lock(m_mutex);
  Round& entry = round_of(round);
  FERRY_TRY(wait(
      lock, stop, k_submit_limit, [&] { return entry.job_id || entry.failure; },
      "the job's submission"));
  if (!entry.job_id) {
    return fail(ErrorKind::failed, "the allocation was not submitted: {}", *entry.failure);
  }
  return *entry.job_id;
}

void SharedAllocation::submitted(int round, std::string job_id)
{
  std::lock_guard lock(m_mutex);
  round_of(round).job_id = std::move(job_id);
  m_changed.notify_all();
}

void SharedAllocation::abandon(int round, std::string why)
{
  std::lock_guard lock(m_mutex);
  Round& entry = round_of(round);
  if (!entry.failure && !entry.job_id) {
    entry.failure = std::move(why);
  }
  m_changed.notify_all();
}

void SharedAllocation::leave(int slot, std::string why)
{
  std::lock_guard lock(m_mutex);
  auto& left = m_left[static_cast<std::size_t>(slot)];
  if (!left) {
    left = std::move(why);
  }
  m_changed.notify_all();
}

} // namespace ferry::slurm
