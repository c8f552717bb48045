#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <pwd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

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
