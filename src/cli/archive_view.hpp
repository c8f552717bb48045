#pragma once
// Shared by `log`, `show` and `export`: reading the archive and naming a run's target.
#include <string>
#include <string_view>
#include <vector>

#include "cli/cli.hpp"

namespace ferry::cli {

// The archived run RUN names (an id, a unique prefix of it or of its random part, "last",
// "last~N"), read-only.
[[nodiscard]] Expected<RunRecord> load_archived_run(const Context& ctx, std::string_view ref,
                                                    const RunNarrowing& narrow = {});

// `--job NAME` and HOST_FLAG HOST (`--host`, or `--from-host` where `--host` picks a target):
// which runs `last` and `last~N` count. NARROW must outlive the command.
void add_narrowing_options(CLI::App& command, RunNarrowing& narrow,
                           const std::string& host_flag = "--host");

inline constexpr const char* run_ref_help =
    "a run id, a unique prefix of one or of its random part, 'last', or 'last~N' (N runs before "
    "the last)";

// The run's archived bytes that no longer match the sha256 they are filed under (the archive
// was changed outside ferry, which `replay` refuses): one phrase each, empty when all match.
[[nodiscard]] std::vector<std::string> mismatched_bytes(const RunRecord& run);

// "run RUN: the archived script … — the archive was changed outside ferry; …", for a note.
[[nodiscard]] std::string mismatch_note(const RunRecord& run,
                                        const std::vector<std::string>& mismatched);

// What the user called the target, else its host, else "local".
[[nodiscard]] std::string target_label(const RunRecord& run);

} // namespace ferry::cli
