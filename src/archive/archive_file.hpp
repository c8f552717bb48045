#pragma once
// The archive file on disk before SQLite sees it: private directories, a 0600 file, and the
// checks that keep ferry from ever writing over something that is not its archive.
#include <filesystem>

#include "ferry/expected.hpp"

namespace ferry::archive {

// For writing: creates missing parent directories 0700 and the file 0600 (modes set
// explicitly, the umask is not trusted), strips group/other bits from an existing archive and
// its -wal/-shm, and refuses a read-only file or directory or a file that is not an SQLite
// database — without changing it.
[[nodiscard]] Expected<void> prepare_for_writing(const std::filesystem::path& path);

// For reading: false when there is no archive yet; an error when PATH is not a regular file or
// not an SQLite database.
[[nodiscard]] Expected<bool> check_for_reading(const std::filesystem::path& path);

} // namespace ferry::archive
