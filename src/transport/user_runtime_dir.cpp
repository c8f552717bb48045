#include "transport/user_runtime_dir.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ferry {

namespace fs = std::filesystem;

namespace {

fs::path default_dir()
{
  // XDG_RUNTIME_DIR is per user, 0700 and on tmpfs: the place for sockets, when there is one.
  if (const char* runtime = std::getenv("XDG_RUNTIME_DIR"); runtime && runtime[0] == '/') {
    struct stat st {};
    if (::stat(runtime, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::getuid()) {
      return fs::path(runtime) / "ferry";
    }
  }
  if (const char* cache = std::getenv("XDG_CACHE_HOME"); cache && cache[0] == '/') {
    return fs::path(cache) / "ferry" / "holders";
  }
  const char* home = std::getenv("HOME");
  return fs::path(home && home[0] == '/' ? home : "/tmp") / ".cache" / "ferry" / "holders";
}

Expected<void> make_private_dirs(const fs::path& dir)
{
  if (::mkdir(dir.c_str(), 0700) == 0 || errno == EEXIST) {
    return {};
  }
  if (errno == ENOENT && dir.has_parent_path() && dir.parent_path() != dir) {
    FERRY_TRY(make_private_dirs(dir.parent_path()));
    if (::mkdir(dir.c_str(), 0700) == 0 || errno == EEXIST) {
      return {};
    }
  }
  return fail(ErrorKind::failed, "cannot make {}: {}", dir.string(), std::strerror(errno));
}

} // namespace

Expected<fs::path> user_runtime_dir(bool create)
{
  const fs::path dir = default_dir();
  if (create) {
    FERRY_TRY(make_private_dirs(dir));
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    return fail(ErrorKind::failed, "{}: {}", dir.string(), std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) {
    return fail(ErrorKind::failed, "{} is not a directory (a link?); remove it", dir.string());
  }
  if (st.st_uid != ::getuid()) {
    return fail(ErrorKind::failed, "{} belongs to uid {}, not to you (uid {}); remove it",
                dir.string(), st.st_uid, ::getuid());
  }
  if ((st.st_mode & 077) != 0) {
    return fail(ErrorKind::failed, "{} is open to others (mode {:04o}); run chmod 700 on it",
                dir.string(), st.st_mode & 07777);
  }
  return dir;
}

} // namespace ferry
