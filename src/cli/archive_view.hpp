#pragma once
// Shared by `log`, `show` and `export`: reading the archive and naming a run's target.
#include <string>
#include <string_view>

#include "cli/cli.hpp"

namespace ferry::cli {

// The archived run RUN names (an id, a unique prefix, or "last"), read-only.
[[nodiscard]] Expected<RunRecord> load_archived_run(const Context& ctx, std::string_view ref);

// What the user called the target, else its host, else "local".
[[nodiscard]] std::string target_label(const RunRecord& run);

} // namespace ferry::cli
