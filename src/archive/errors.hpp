#pragma once
// SQLite failures as ferry errors: what failed, which archive, and what to do about it.
#include <filesystem>
#include <string_view>
#include <type_traits>

#include "archive/sqlite.hpp"
#include "ferry/expected.hpp"

namespace ferry::archive {

// `doing` completes "cannot ...": "record run X", "read archive", ... For a corrupt database
// runs `PRAGMA quick_check` on `db` (when it is open) to say what is damaged; that check is
// only paid for once something already went wrong.
[[nodiscard]] Unexpected<Error> archive_error(const std::filesystem::path& path,
                                              std::string_view doing, const SqliteError& error,
                                              Database* db = nullptr);

// An SQLite result as a ferry result: the value, or its error explained by archive_error.
template <typename T>
[[nodiscard]] Expected<T> explained(SqliteResult<T> result, const std::filesystem::path& path,
                                    std::string_view doing, Database* db = nullptr)
{
  if (!result) {
    return archive_error(path, doing, result.error(), db);
  }
  if constexpr (std::is_void_v<T>) {
    return {};
  } else {
    return std::move(result).value();
  }
}

} // namespace ferry::archive
