#include <array>
#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "archive/archive_file.hpp"

namespace ferry::archive {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view sqlite_magic{"SQLite format 3\0", 16};

std::string mode_text(mode_t mode)
{
  return fmt::format("{:04o}", mode & 07777);
}

fs::path directory_of(const fs::path& path)
{
  const fs::path parent = path.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

Expected<void> create_private_directories(const fs::path& dir, const fs::path& archive)
{
  std::vector<fs::path> missing;
  for (fs::path p = dir; !p.empty(); p = p.parent_path()) {
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        return fail(ErrorKind::failed,
                    "cannot create archive {}: {} is not a directory; pass --archive PATH to "
                    "put the archive elsewhere",
                    archive.string(), p.string());
      }
      break;
    }
    missing.push_back(p);
    if (p == p.parent_path()) {
      break;
    }
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (::mkdir(it->c_str(), 0700) != 0) {
      if (errno == EEXIST) {
        continue; // another ferry made it first
      }
      return fail(ErrorKind::failed,
                  "cannot create directory {} for archive {}: {}; pass --archive PATH to put "
                  "the archive elsewhere",
                  it->string(), archive.string(), std::strerror(errno));
    }
    ::chmod(it->c_str(), 0700);
  }
  return {};
}

// Nonzero write bits and access(W_OK): root passes access() on anything, so the mode bits are
// what says that the user made the file read-only on purpose.
bool writable(const fs::path& path, const struct stat& st)
{
  return (st.st_mode & 0222) != 0 && ::access(path.c_str(), W_OK) == 0;
}

Expected<void> check_sqlite_magic(const fs::path& path, const struct stat& st)
{
  if (st.st_size == 0) {
    return {}; // a new archive another ferry has only just created
  }
  std::array<char, 16> head{};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return fail(ErrorKind::failed, "cannot read archive {}: {}", path.string(),
                std::strerror(errno));
  }
  const ssize_t n = ::pread(fd, head.data(), head.size(), 0);
  ::close(fd);
  if (n != static_cast<ssize_t>(head.size()) ||
      std::string_view(head.data(), head.size()) != sqlite_magic) {
    return fail(ErrorKind::failed,
                "archive {} is not an SQLite database (corrupt, or another kind of file); ferry "
                "left it untouched: move it aside to start a new archive, or pass --archive "
                "NEW_PATH",
                path.string());
  }
  return {};
}

std::string describe_access(const struct stat& st)
{
  std::string owner = std::to_string(st.st_uid);
  if (const passwd* pw = ::getpwuid(st.st_uid); pw != nullptr && pw->pw_name != nullptr) {
    owner = pw->pw_name;
  }
  return fmt::format("mode {}, owner {}", mode_text(st.st_mode), owner);
}

void strip_group_other_bits(const fs::path& path)
{
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 077) != 0 &&
      st.st_uid == ::geteuid()) {
    ::chmod(path.c_str(), st.st_mode & 0700);
  }
}

// The archive file's stat when it exists (nullopt when it does not): a regular file that
// starts like an SQLite database, or an error that names it.
Expected<std::optional<struct stat>> stat_existing_archive(const fs::path& path)
{
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return std::optional<struct stat>();
    }
    return fail(ErrorKind::failed, "cannot open archive {}: {}", path.string(),
                std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return fail(ErrorKind::failed,
                "archive {} is not a regular file; pass --archive PATH to use another file",
                path.string());
  }
  FERRY_TRY(check_sqlite_magic(path, st));
  return std::optional<struct stat>(st);
}

} // namespace

Expected<void> prepare_for_writing(const fs::path& path)
{
  const fs::path dir = directory_of(path);
  FERRY_TRY(create_private_directories(dir, path));

  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd >= 0) {
    ::fchmod(fd, 0600);
    ::close(fd);
  } else if (errno != EEXIST) {
    if (errno == EACCES || errno == EROFS || errno == EPERM) {
      return fail(ErrorKind::failed,
                  "cannot create archive {}: directory {} is not writable ({}); make it "
                  "writable or pass --archive NEW_PATH",
                  path.string(), dir.string(), std::strerror(errno));
    }
    return fail(ErrorKind::failed, "cannot create archive {}: {}; pass --archive NEW_PATH",
                path.string(), std::strerror(errno));
  }

  FERRY_TRY_ASSIGN(auto found, stat_existing_archive(path));
  if (!found) {
    return fail(ErrorKind::failed, "cannot open archive {}: {}", path.string(),
                std::strerror(ENOENT));
  }
  const struct stat st = *found;
  if (!writable(path, st)) {
    return fail(ErrorKind::failed,
                "archive {} is read-only ({}): ferry cannot record runs in it; make it "
                "writable or pass --archive NEW_PATH",
                path.string(), describe_access(st));
  }
  struct stat dst {};
  if (::stat(dir.c_str(), &dst) != 0 || !writable(dir, dst)) {
    return fail(ErrorKind::failed,
                "the directory {} of archive {} is read-only ({}): SQLite needs to create {}-wal "
                "and {}-shm beside the archive; make the directory writable or pass --archive "
                "NEW_PATH",
                dir.string(), path.string(), describe_access(dst), path.filename().string(),
                path.filename().string());
  }
  for (const char* suffix : {"", "-wal", "-shm"}) {
    strip_group_other_bits(path.string() + suffix);
  }
  return {};
}

Expected<bool> check_for_reading(const fs::path& path)
{
  FERRY_TRY_ASSIGN(auto found, stat_existing_archive(path));
  return found.has_value();
}

} // namespace ferry::archive
