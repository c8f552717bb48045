#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <vector>

#include <fcntl.h>
#include <pwd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ferry/fd.hpp"
#include "ferry/util.hpp"

namespace ferry {

std::string random_hex(std::size_t bytes)
{
  std::string raw(bytes, '\0');
  std::size_t got = 0;
  while (got < bytes) {
    const ssize_t n = getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      throw std::runtime_error(fmt::format("getrandom failed: {}", std::strerror(errno)));
    }
    got += static_cast<std::size_t>(n);
  }
  return lower_hex(raw);
}

std::string lower_hex(std::string_view bytes)
{
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (const unsigned char c : bytes) {
    hex += fmt::format("{:02x}", c);
  }
  return hex;
}

namespace {
std::tm to_utc(std::chrono::system_clock::time_point t)
{
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  return tm;
}
} // namespace

std::string utc_compact(std::chrono::system_clock::time_point t)
{
  const std::tm tm = to_utc(t);
  return fmt::format("{:04}{:02}{:02}T{:02}{:02}{:02}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

std::string utc_iso(std::chrono::system_clock::time_point t)
{
  const std::tm tm = to_utc(t);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()) % 1000;
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms.count());
}

Expected<std::string> read_file(const std::filesystem::path& path)
{
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return fail(ErrorKind::usage, "cannot read {}: {}", path.string(), std::strerror(errno));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    return fail(ErrorKind::usage, "error while reading {}", path.string());
  }
  return buffer.str();
}

namespace {

std::string mib_text(std::uint64_t bytes)
{
  return bytes % (1 << 20) == 0 ? fmt::format("{} MiB", bytes >> 20)
                                : fmt::format("{} bytes", bytes);
}

std::string too_big(std::string_view name, SmallFile file)
{
  return fmt::format("{} {} is larger than {}, the most ferry reads from it; is it the file you "
                     "meant?",
                     file.what, name, mib_text(file.limit));
}

} // namespace

Expected<std::string> read_small_fd(int fd, std::string_view name, SmallFile file)
{
  std::string bytes;
  std::vector<char> buffer(std::size_t{1} << 16);
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      return fail(ErrorKind::usage, "cannot read {} {}: {}", file.what, name, std::strerror(errno));
    }
    if (n == 0) {
      return bytes;
    }
    if (bytes.size() + static_cast<std::size_t>(n) > file.limit) {
      return fail(ErrorKind::usage, "{}", too_big(name, file));
    }
    bytes.append(buffer.data(), static_cast<std::size_t>(n));
  }
}

Expected<std::string> read_small_file(const std::filesystem::path& path, SmallFile file)
{
  // O_NONBLOCK: opening a FIFO does not wait for a writer; it is refused below unread.
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd) {
    return fail(ErrorKind::usage, "cannot read {} {}: {}", file.what, path.string(),
                std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return fail(ErrorKind::usage, "cannot read {} {}: {}", file.what, path.string(),
                std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "a device";
    return fail(ErrorKind::usage, "{} {} is {}, not a regular file; ferry reads only a file here",
                file.what, path.string(), kind);
  }
  if (static_cast<std::uint64_t>(st.st_size) > file.limit) {
    return fail(ErrorKind::usage, "{}", too_big(path.string(), file));
  }
  return read_small_fd(fd.get(), path.string(), file); // capped again: the file may grow
}

int write_all(int fd, std::string_view bytes)
{
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      return errno;
    }
    done += static_cast<std::size_t>(n);
  }
  return 0;
}

Expected<void> write_file_atomic(const std::filesystem::path& path, std::string_view bytes,
                                 unsigned mode)
{
  const std::string tmp = path.string() + ".tmp-" + random_hex(4);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    return fail(ErrorKind::failed, "cannot create {}: {}", tmp, std::strerror(errno));
  }
  if (const int err = write_all(fd, bytes); err != 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return fail(ErrorKind::failed, "cannot write {}: {}", tmp, std::strerror(err));
  }
  ::fchmod(fd, mode);
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return fail(ErrorKind::failed, "cannot write {}: {}", path.string(), std::strerror(err));
  }
  return {};
}

std::string home_dir()
{
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return home;
  }
  if (const passwd* pw = ::getpwuid(::getuid()); pw != nullptr && pw->pw_dir != nullptr) {
    return pw->pw_dir;
  }
  return "/";
}

std::string env_or(const char* name, std::string_view fallback)
{
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::string(value) : std::string(fallback);
}

double seconds_since(std::chrono::steady_clock::time_point start)
{
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

} // namespace ferry

namespace ferry {

std::optional<double> seconds_since_utc(std::string_view iso)
{
  const std::string text(iso);
  std::tm tm{};
  int millis = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ", &tm.tm_year, &tm.tm_mon,
                  &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &millis) != 7) {
    return std::nullopt;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  const auto then =
      std::chrono::system_clock::from_time_t(timegm(&tm)) + std::chrono::milliseconds(millis);
  return std::chrono::duration<double>(std::chrono::system_clock::now() - then).count();
}

std::optional<long long> parse_duration_s(std::string_view text, long long max_s)
{
  static constexpr std::pair<char, long long> units[] = {
      {'s', 1}, {'m', 60}, {'h', 3600}, {'d', 86400}, {'w', 7 * 86400}};
  long long unit = 1;
  if (!text.empty()) {
    for (const auto& [suffix, seconds] : units) {
      if (text.back() == suffix) {
        unit = seconds;
        text.remove_suffix(1);
        break;
      }
    }
  }
  long long count = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), count);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || count <= 0 ||
      count > max_s / unit) {
    return std::nullopt;
  }
  return count * unit;
}

} // namespace ferry
