#pragma once
// A sweep's job array followed on one channel of the login node: one script submits the array and
// reports on every task of it (its frames name the task), and this passes each task's frames on
// to its point's Follow. Each point still waits on its own thread and makes its own record; the
// channels the sweep takes on the login node do not grow with its points (docs/slurm.md).
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ferry/expected.hpp"
#include "transport/exec_request.hpp"
#include "transport/slurm/follow.hpp"
#include "transport/slurm/frames.hpp"

namespace ferry::slurm {

class ArrayFollow {
public:
  using Exec = std::function<Expected<ExecOutcome>(const ExecRequest&)>;

  explicit ArrayFollow(int points) : m_points(static_cast<std::size_t>(points)) {}
  ArrayFollow(const ArrayFollow&) = delete;
  ArrayFollow& operator=(const ArrayFollow&) = delete;
  ~ArrayFollow(); // waits for the script (it ends once every task has)

  // Point `task` is ready: its task's frames go to `follow` (alive until wait() returns).
  void enroll(int task, Follow& follow);
  // The first point's part: the script (its frames tagged `tag`) is ready. It starts, on a thread
  // of its own, once every point has enrolled.
  void arm(Exec exec, ExecRequest script, std::string tag);
  // The script cannot run: every point fails with `why`.
  void abandon(std::string why);
  // Waits until point `task`'s task has ended or the script has; past its deadline, calls
  // `cancel_task` (once) to cancel that task alone. Returns the script's outcome as this point
  // sees it.
  [[nodiscard]] Expected<ExecOutcome> wait(int task, const StopToken& stop,
                                           const std::function<void()>& cancel_task);

  // How long an enrolled point waits for the script to start.
  static constexpr std::chrono::seconds k_start_limit{180};

private:
  struct Point {
    Follow* follow = nullptr;
    bool ended = false;
  };
  void start(std::unique_lock<std::mutex>& lock);
  void on_line(const std::vector<std::string_view>& words);
  void on_bytes(OutputStream stream, std::string_view bytes);
  [[nodiscard]] Expected<ExecOutcome> seen_by(const Point& point) const;

  std::mutex m_mutex;
  std::condition_variable m_changed;
  std::vector<Point> m_points;
  std::size_t m_enrolled = 0;
  Exec m_exec;
  std::optional<ExecRequest> m_script;
  std::optional<FrameReader> m_frames;
  std::optional<std::string> m_failure;
  bool m_started = false;
  std::optional<Expected<ExecOutcome>> m_done; // how the script ended
  std::thread m_thread;
};

} // namespace ferry::slurm
