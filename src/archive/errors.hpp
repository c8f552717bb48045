#pragma once
// SQLite failures as ferry errors: what failed, which archive, and what to do about it.
#include <filesystem>
#include <string_view>

#include "archive/sqlite.hpp"
#include "ferry/expected.hpp"

namespace ferry::archive {

// `doing` completes "cannot ...": "record run X", "read archive", ... For a corrupt database
// runs `PRAGMA quick_check` on `db` (when it is open) to say what is damaged; that check is
// only paid for once something already went wrong.
[[nodiscard]] Unexpected<Error> archive_error(const std::filesystem::path& path, std::string_view doing,
                                       const SqliteError& error, Database* db = nullptr);

} // namespace ferry::archive
