#include "transport/slurm/verdict.hpp"

#include <algorithm>
#include <array>
#include <charconv>

#include <fmt/format.h>

namespace ferry::slurm {

namespace {

using Kind = ExecOutcome::Verdict::Kind;

std::optional<int> number(std::string_view text)
{
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

std::string where(const JobEnd& end, const NodeRun& run)
{
  if (!run.node.empty()) {
    return run.node;
  }
  return end.nodes.empty() ? std::string("its node") : end.nodes;
}

// States in which Slurm itself ended the job, whatever the launcher reported.
std::optional<ExecOutcome::Verdict> scheduler_ended(const JobEnd& end, const NodeRun& run)
{
  if (end.state == "TIMEOUT") {
    return ExecOutcome::Verdict{Kind::timeout,
                                fmt::format("Slurm stopped the job at its time limit (--time {} "
                                            "min; state TIMEOUT)",
                                            run.time_min)};
  }
  if (end.state == "OUT_OF_MEMORY") {
    return ExecOutcome::Verdict{Kind::failed,
                                "Slurm stopped the job: it ran out of memory (state "
                                "OUT_OF_MEMORY); ask for more with --slurm-arg=--mem=SIZE"};
  }
  if (end.state == "NODE_FAIL" || end.state == "BOOT_FAIL") {
    return ExecOutcome::Verdict{
        Kind::error,
        fmt::format("node {} failed while the job ran (state {})", where(end, run), end.state)};
  }
  if (end.state == "PREEMPTED" || end.state == "DEADLINE") {
    return ExecOutcome::Verdict{Kind::failed,
                                fmt::format("Slurm ended the job (state {})", end.state)};
  }
  if (end.state == "CANCELLED" && !run.stopped_by_ferry) {
    return ExecOutcome::Verdict{Kind::failed, "the Slurm job was cancelled outside ferry (state "
                                              "CANCELLED: scancel, or an administrator)"};
  }
  return std::nullopt;
}

} // namespace

bool is_final_state(std::string_view state)
{
  constexpr std::array<std::string_view, 9> final_states = {
      "COMPLETED", "FAILED",    "TIMEOUT",  "CANCELLED", "OUT_OF_MEMORY",
      "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "PREEMPTED"};
  return std::find(final_states.begin(), final_states.end(), state) != final_states.end();
}

std::optional<std::pair<int, int>> parse_exit_code(std::string_view text)
{
  const auto colon = text.find(':');
  if (colon == std::string_view::npos) {
    return std::nullopt;
  }
  const auto code = number(text.substr(0, colon));
  const auto signal = number(text.substr(colon + 1));
  if (!code || !signal) {
    return std::nullopt;
  }
  return std::pair{*code, *signal};
}

std::optional<ExecOutcome::Verdict> slurm_verdict(const JobEnd& end, const NodeRun& run)
{
  if (auto ended = scheduler_ended(end, run)) {
    return ended;
  }
  if (run.node.empty()) {
    if (end.exit_code == k_no_run_dir_exit) {
      return ExecOutcome::Verdict{
          Kind::error,
          fmt::format("node {} cannot see the run directory {}: the remote base must be on a "
                      "filesystem the login node shares with the compute nodes (a shared home "
                      "or scratch); choose one with --remote-base",
                      where(end, run), run.run_dir)};
    }
    if (run.stopped_by_ferry) {
      return std::nullopt; // cancelled before it started: the runner says interrupted
    }
    return ExecOutcome::Verdict{
        Kind::error,
        fmt::format("the Slurm job ended (state {}, exit code {}) before ferry's "
                    "launcher started on a node",
                    end.state,
                    end.exit_code ? fmt::format("{}:{}", *end.exit_code, end.signal.value_or(0))
                                  : std::string("unknown"))};
  }
  if (!run.launcher_report && !run.stopped_by_ferry) {
    return ExecOutcome::Verdict{
        Kind::failed,
        end.source == "none"
            ? fmt::format("ferry lost track of the Slurm job: the controller no longer lists it "
                          "and the cluster keeps no accounting (sacct), and the launcher on {} "
                          "did not report",
                          run.node)
            : fmt::format("ferry's launcher on {} ended without reporting (Slurm state {}, "
                          "exit code {})",
                          run.node, end.state,
                          end.exit_code ? std::to_string(*end.exit_code) : "unknown")};
  }
  return std::nullopt;
}

} // namespace ferry::slurm
