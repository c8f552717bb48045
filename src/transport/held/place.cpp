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
#include "transport/user_runtime_dir.hpp"

namespace ferry::held {

namespace fs = std::filesystem;

Expected<fs::path> holder_dir(bool create)
{
  return user_runtime_dir(create);
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
