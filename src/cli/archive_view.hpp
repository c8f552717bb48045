#pragma once
// Shared by `log`, `show` and `export`: opening the archive for reading, error exit codes, and
// archived bytes made safe to print on a terminal.
#include <string>
#include <string_view>

#include "cli/cli.hpp"

namespace ferry::cli {

// Prints the error and returns its exit code: 2 for usage (no such run, bad filter), else 1.
[[nodiscard]] int report_error(const Error& error);

// The archived run RUN names (an id, a unique prefix, or "last"), read-only.
[[nodiscard]] Expected<RunRecord> load_archived_run(const Context& ctx, std::string_view ref);

// What the user called the target, else its host, else "local".
[[nodiscard]] std::string target_label(const RunRecord& run);

// Bytes as terminal text: valid UTF-8 kept, invalid bytes and control characters other than
// tab shown as \xNN, so a job's binary output cannot drive the terminal.
[[nodiscard]] std::string printable(std::string_view bytes);

// At most `width` characters (code points), cut with "…".
[[nodiscard]] std::string shorten(std::string_view text, std::size_t width);

} // namespace ferry::cli
