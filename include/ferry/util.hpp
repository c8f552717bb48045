#pragma once
// Small helpers that know nothing of ferry: hashing, randomness, time, files.
#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "ferry/expected.hpp"

namespace ferry {

[[nodiscard]] std::string sha256_hex(std::string_view bytes);

// SHA-256 fed piece by piece, for files streamed to disk (no copy of them is held).
class Sha256 {
public:
  Sha256();
  void update(std::string_view bytes);
  [[nodiscard]] std::string hex() &&; // lowercase hex

private:
  std::array<std::uint32_t, 8> m_h;
  std::array<unsigned char, 64> m_block{};
  std::size_t m_buffered = 0;
  std::uint64_t m_total = 0;
};

// `bytes` as lowercase hex, two digits a byte.
[[nodiscard]] std::string lower_hex(std::string_view bytes);

// `bytes` random bytes from the operating system (getrandom), as lowercase hex.
[[nodiscard]] std::string random_hex(std::size_t bytes);

// "20261129T141215Z" (compact) and "2026-11-29T14:12:15.123Z" (ISO 8601).
[[nodiscard]] std::string utc_compact(std::chrono::system_clock::time_point t);
[[nodiscard]] std::string utc_iso(std::chrono::system_clock::time_point t);

[[nodiscard]] Expected<std::string> read_file(const std::filesystem::path& path);
// Writes all of `bytes` to `fd` (retrying short writes and EINTR); 0 or the errno.
[[nodiscard]] int write_all(int fd, std::string_view bytes);

// Writes through a temporary name and renames it into place.
[[nodiscard]] Expected<void> write_file_atomic(const std::filesystem::path& path,
                                               std::string_view bytes, unsigned mode = 0644);

[[nodiscard]] std::string home_dir();
// $NAME when set and non-empty, else `fallback`.
[[nodiscard]] std::string env_or(const char* name, std::string_view fallback);

[[nodiscard]] double seconds_since(std::chrono::steady_clock::time_point start);

} // namespace ferry
