#pragma once
// `ferry run --retry-failed [last|ID]`: the runs of one invocation that did not end ok, again,
// on their hosts, with their archived job bytes, parameters and files (docs/cli.md).
#include <optional>
#include <string>
#include <vector>

#include "cli/cli.hpp"
#include "cli/targets.hpp"
#include "ferry/bundle.hpp"
#include "ferry/run_record.hpp"
#include "run/environment.hpp"

namespace ferry::cli {

struct RetryRequest {
  std::string invocation;       // "last", an id or a prefix
  std::optional<int> timeout_s; // else each run's archived one
  int parallel = 8;
  bool archive = true;
  bool keep_remote = false;
  EnvironmentOptions environment; // --env, --interpreter, as for `run`
  // How to reach the hosts (--ssh-config, --connect-timeout, --persist, ...); never which.
  TargetOptions connection;
};

[[nodiscard]] Expected<ExitCode> retry_failed(Context& ctx, const RetryRequest& request);

// An archived run's timeout (unless TIMEOUT_S), output and result caps and grace, from its
// record's "options" (shared with `replay`).
[[nodiscard]] RunOptions archived_options(const nlohmann::json& recorded,
                                          std::optional<int> timeout_s);

// The files that travelled with an archived run, with their archived (and verified) bytes
// (shared with `replay`).
[[nodiscard]] Expected<std::vector<BundleFile>> archived_files(const RunRecord& original);

} // namespace ferry::cli
