#pragma once
// The `[archive]` table of ferry's config file: read on its own, so that other tables of the
// same file can be read elsewhere without this depending on them.
#include <cstdint>
#include <filesystem>
#include <optional>

#include "ferry/expected.hpp"

namespace ferry::cli {

// $XDG_CONFIG_HOME/ferry/config.toml, else ~/.config/ferry/config.toml.
[[nodiscard]] std::filesystem::path config_file_path();

// `[archive] max_size = "2GiB"` (or a number of bytes) from FILE: nullopt when the file, the
// table or the key is absent. A file that does not parse, or a bad value: ErrorKind::usage
// naming the file and the line.
[[nodiscard]] Expected<std::optional<std::uint64_t>>
configured_archive_max_size(const std::filesystem::path& file = config_file_path());

} // namespace ferry::cli
