#pragma once
// A fleet's runs folded by sameness for the terminal's summary: hosts whose result is the same
// JSON form one group, the largest group of `ok` runs is shown once, every other group by the
// fields where its result differs from that one, and runs that are not `ok` are grouped by
// status and error message. `--json` records are never folded; this is only what a person reads.
#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/json_diff.hpp"
#include "ferry/run_record.hpp"

namespace ferry {

// What the summary keeps of one run.
struct HostOutcome {
  std::string host;
  RunStatus status = RunStatus::ok;
  std::string error;     // a run that is not ok: its error
  std::string generic;   // ... with this host's names made generic (generic_error)
  nlohmann::json result; // an ok run: its result (null: none)
  std::string digest;    // the result as one short line (result_digest)
};

struct OutcomeGroup {
  std::vector<std::string> hosts; // in the order their runs ended
  RunStatus status = RunStatus::ok;
  std::string error; // generic, or the host's own error when the group has one host
  nlohmann::json result;
  std::string digest;
  bool reference = false;          // the largest group of ok runs, the one others are told against
  std::vector<JsonChange> changes; // an ok group's result against the reference's
};

// `error` with the names of this host made generic, so the same failure on two hosts reads the
// same: TARGET's "host:port" and "host" become "{address}", LABEL (the name the user gave)
// becomes "{host}".
[[nodiscard]] std::string generic_error(std::string_view error, std::string_view label,
                                        const nlohmann::json& target);

// OUTCOMES grouped: the reference group first, then the other ok groups, then the rest, each
// part largest first (ties: the group whose first run ended first).
[[nodiscard]] std::vector<OutcomeGroup> group_outcomes(const std::vector<HostOutcome>& outcomes);

// CHANGES as a person reads them: `driver "535.154" instead of "550.54"; gpus/1 absent (others:
// {…}); +2 more fields`, at most `shown` of them. Not yet escaped for a terminal.
[[nodiscard]] std::string describe_changes(const std::vector<JsonChange>& changes,
                                           std::size_t shown = 3);

// The summary's lines, each ending "\n", every part from a host or job escaped for a terminal:
//   gpu[01-16,18-41,43-256] (240 hosts): ok — {"driver":"550.54",…}
//   gpu[17,42] (2 hosts): ok — driver "535.154" instead of "550.54"
//   gpu03: error — gpu03: cannot connect to …
[[nodiscard]] std::string render_groups(const std::vector<OutcomeGroup>& groups);

} // namespace ferry
