#pragma once
// Small helpers that know nothing of ferry: hashing, randomness, time, files.
#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
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
// Seconds from a time utc_iso wrote ("YYYY-MM-DDTHH:MM:SS.mmmZ") to now; nullopt for other text.
[[nodiscard]] std::optional<double> seconds_since_utc(std::string_view iso);
// A duration as `--keep-for` takes it: seconds, or a number with s, m, h, d or w ("90s", "7d");
// nullopt for anything else, 0, or more than `max_s`.
[[nodiscard]] std::optional<long long> parse_duration_s(std::string_view text, long long max_s);

[[nodiscard]] Expected<std::string> read_file(const std::filesystem::path& path);

// What ferry reads whole from a file the user names: its size cap, and the words for messages
// ("the config file", "--hosts-file").
struct SmallFile {
  std::string_view what;
  std::uint64_t limit;
};

// The bytes of the regular file PATH. A FIFO, device, socket or directory is refused before
// anything is read (the open does not wait for a FIFO's writer), and so is a file over the
// limit, each with a message naming the file and what to do; ErrorKind::usage. A missing file:
// the error's message says so, as strerror does.
[[nodiscard]] Expected<std::string> read_small_file(const std::filesystem::path& path,
                                                    SmallFile file);
// The same from an already open descriptor (stdin, for `--hosts-file -`), which may be a pipe:
// read up to the limit; NAME names it in messages.
[[nodiscard]] Expected<std::string> read_small_fd(int fd, std::string_view name, SmallFile file);
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
