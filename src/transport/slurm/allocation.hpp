#pragma once
// The node slots of one Slurm target (`--nodes N`) share one allocation per run: each slot stages
// its own run directory on the login node, slot 0 submits one job for all of them once every slot
// is ready, and each slot then follows its own node. This is where they meet.
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ferry/expected.hpp"
#include "ferry/transport.hpp"

namespace ferry::slurm {

class SharedAllocation {
public:
  explicit SharedAllocation(int slots) : m_slots(slots), m_left(static_cast<std::size_t>(slots)) {}

  [[nodiscard]] int slots() const { return m_slots; }

  // Slot `slot` is ready for its `round`-th run with `run_dir`: waits until every slot is, and
  // returns all run directories in slot order, or why the round cannot go on.
  [[nodiscard]] Expected<std::vector<std::string>> join(int round, int slot, std::string run_dir,
                                                        const StopToken& stop);
  // The id of the round's job, once slot 0 has submitted it.
  [[nodiscard]] Expected<std::string> job_of(int round, const StopToken& stop);
  void submitted(int round, std::string job_id);
  // The round goes no further (a slot could not stage its run, the submission failed).
  void abandon(int round, std::string why);
  // The slot takes part in no further round (it could not connect, or it is done).
  void leave(int slot, std::string why);

  // How long a slot waits for the others to be ready, and for the submission.
  static constexpr std::chrono::seconds k_join_limit{180};
  static constexpr std::chrono::seconds k_submit_limit{900};

private:
  struct Round {
    std::vector<std::optional<std::string>> dirs;
    int ready = 0;
    std::optional<std::string> job_id;
    std::optional<std::string> failure;
  };
  Round& round_of(int round);
  std::optional<std::string> absent_slot(const Round& round) const;
  template <typename Done>
  Expected<void> wait(std::unique_lock<std::mutex>& lock, const StopToken& stop,
                      std::chrono::seconds limit, Done done, std::string_view what);

  const int m_slots;
  std::mutex m_mutex;
  std::condition_variable m_changed;
  std::map<int, Round> m_rounds;
  std::vector<std::optional<std::string>> m_left; // why a slot left
};

} // namespace ferry::slurm
