#pragma once
// The archive's schema, as the ordered list of steps that build it: step i takes a database at
// `PRAGMA user_version` i to i+1, so an archive from any older ferry is brought up to date by
// running the steps after its version, in order, in one transaction.
#include <cstdint>
#include <span>
#include <string_view>

namespace ferry::archive {

struct Migration {
  int to_version;
  std::string_view sql;
};

[[nodiscard]] std::span<const Migration> migrations();

// The version this ferry writes: the last migration's.
[[nodiscard]] int schema_version();

// `PRAGMA application_id` of a ferry archive ("FRRY"): tells it apart from other SQLite files.
inline constexpr std::int32_t application_id = 0x46525259;

} // namespace ferry::archive
