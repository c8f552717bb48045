#include <toml++/toml.h>

#include "cli/archive_config.hpp"
#include "ferry/archive.hpp"
#include "ferry/user_config.hpp"
#include "ferry/util.hpp"

namespace ferry::cli {

namespace fs = std::filesystem;

fs::path config_file_path()
{
  // The XDG spec says to ignore a relative $XDG_CONFIG_HOME.
  if (const fs::path config = env_or("XDG_CONFIG_HOME", ""); config.is_absolute()) {
    return config / "ferry" / "config.toml";
  }
  return fs::path(home_dir()) / ".config" / "ferry" / "config.toml";
}

Expected<std::optional<std::uint64_t>> configured_archive_max_size(const fs::path& file)
{
  std::error_code ec;
  if (!fs::exists(file, ec)) {
    return std::optional<std::uint64_t>();
  }
  FERRY_TRY_ASSIGN(const auto config_text, read_small_file(file, k_config_file));
  toml::table config;
  try {
    config = toml::parse(config_text, file.string());
  } catch (const toml::parse_error& e) {
    return fail(ErrorKind::usage, "{}:{}:{}: invalid TOML: {}", file.string(),
                e.source().begin.line, e.source().begin.column, e.description());
  }
  const toml::node* value = config.at_path("archive.max_size").node();
  if (value == nullptr) {
    return std::optional<std::uint64_t>();
  }
  const std::string what =
      fmt::format("{}:{}: archive.max_size", file.string(), value->source().begin.line);
  if (const auto bytes = value->value_exact<std::int64_t>(); bytes && *bytes > 0) {
    return std::optional<std::uint64_t>(static_cast<std::uint64_t>(*bytes));
  }
  const auto text = value->value_exact<std::string>();
  if (!text) {
    return fail(ErrorKind::usage, "{} must be a size such as \"2GiB\" or a number of bytes", what);
  }
  FERRY_TRY_ASSIGN(const auto size, parse_size(*text, what));
  return std::optional<std::uint64_t>(size);
}

} // namespace ferry::cli
