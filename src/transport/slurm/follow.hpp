#pragma once
// One exec of the submit script on the login node, seen from ferry: its frames become the job's
// own output (fed to the usual capture, sentinel and end line included), notes for the user
// ("job 4242 pending: Resources") and the job's final state. ferry's deadline for the job counts
// from the moment Slurm runs it, never from the submission.
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "transport/exec_request.hpp"
#include "transport/slurm/frames.hpp"
#include "transport/slurm/verdict.hpp"

namespace ferry::slurm {

class Follow {
public:
  using Clock = std::chrono::steady_clock;

  // `request` is the runner's (the launcher's sentinel, end line, caps, deadline, stop);
  // `on_job` hears the job id as soon as sbatch has said it.
  Follow(const ExecRequest& request, std::string tag, std::function<void(std::string)> on_job);

  // The request for the submit script itself: its own sentinel, no deadline of its own (ferry
  // stops it through `stop` instead, once the job has run too long), output passed here.
  [[nodiscard]] ExecRequest script_request(std::vector<std::string> argv, std::string sentinel);

  // The runner's outcome, from the script's.
  [[nodiscard]] ExecOutcome outcome(ExecOutcome script, NodeRun run);

  // Fed by a job array's follower (ArrayFollow) instead of a script of its own: its frames about
  // this point's task, the task named no more.
  void take_line(const std::vector<std::string_view>& words);
  void take_bytes(OutputStream stream, std::string_view bytes);
  // The follower's report stopped making sense.
  void take_broken(std::string why) { m_broken_elsewhere = std::move(why); }
  // The run's stop request or ferry's deadline: stops the script (once).
  void watch_time();
  [[nodiscard]] const std::optional<ExecEnd>& stop_reason() const { return m_stop_reason; }

  [[nodiscard]] const std::string& job_id() const { return m_job_id; }
  [[nodiscard]] const std::string& node() const { return m_node; }
  [[nodiscard]] const std::optional<JobEnd>& end() const { return m_end; }
  [[nodiscard]] bool stopped_by_ferry() const { return m_stop_reason.has_value(); }

private:
  void on_state(std::string_view state, std::string_view reason);
  void on_end(const std::vector<std::string_view>& words);
  void note(const std::string& text) const;

  const ExecRequest& m_request;
  std::function<void(std::string)> m_on_job;
  OutputCapture m_out;
  OutputCapture m_err;
  FrameReader m_frames;
  StopToken m_script_stop = StopToken::make();
  std::optional<ExecEnd> m_stop_reason; // why ferry stopped the script
  std::string m_job_id;
  std::string m_state;
  std::string m_reason;
  std::string m_node;
  std::optional<JobEnd> m_end;
  std::optional<Clock::time_point> m_running_since;
  std::optional<std::string> m_broken_elsewhere;
};

// A script that follows jobs for `request`'s run: its own sentinel, no deadline of its own, at
// least `grace` between TERM and KILL (it cancels the jobs meanwhile); neither stop nor output
// handler yet.
[[nodiscard]] ExecRequest follower_request(const ExecRequest& request,
                                           std::vector<std::string> argv, std::string sentinel,
                                           std::chrono::seconds grace);

} // namespace ferry::slurm
