#include "transport/held/place.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "ferry/util.hpp"
#include "ferry/version.hpp"
#include "transport/held/wire.hpp"

namespace ferry::held {

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

Expected<fs::path> holder_dir(bool create)
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

fs::path holder_socket(const fs::path& dir)
{
  const std::string key = fmt::format("{}\n{}\n{}", ::getuid(), version(), k_protocol);
  return dir / ("holder-" + sha256_hex(key).substr(0, 16) + ".sock");
}

fs::path lock_path(const fs::path& socket)
{
  fs::path lock = socket;
  lock.replace_extension(".lock");
  return lock;
}

Expected<Peer> peer_of(int fd)
{
  ucred cred{};
  socklen_t size = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &size) != 0) {
    return fail(ErrorKind::failed, "cannot tell who is at the other end: {}", std::strerror(errno));
  }
  return Peer{cred.uid, cred.pid};
}

Expected<Fd> dial(const fs::path& socket)
{
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (socket.native().size() >= sizeof address.sun_path) {
    return fail(ErrorKind::failed, "{} is too long for a socket path", socket.string());
  }
  std::memcpy(address.sun_path, socket.c_str(), socket.native().size() + 1);
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) {
    return fail(ErrorKind::failed, "socket: {}", std::strerror(errno));
  }
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    return fail(ErrorKind::failed, "{}: {}", socket.string(), std::strerror(errno));
  }
  FERRY_TRY_ASSIGN(const Peer peer, peer_of(fd.get()));
  if (peer.uid != ::getuid()) {
    return fail(ErrorKind::failed, "{} is served by uid {}, not by you (uid {}); not used",
                socket.string(), peer.uid, ::getuid());
  }
  return fd;
}

} // namespace ferry::held
