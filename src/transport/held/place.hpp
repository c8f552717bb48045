#pragma once
// Where this user's connection holder listens: one Unix socket in a 0700 directory of the
// user's own ($XDG_RUNTIME_DIR/ferry, else the cache directory's ferry/holders), named by a hash
// of the user, the ferry version and the protocol version. Nothing here is reachable from the
// network or by another user.
#include <filesystem>
#include <string>

#include <sys/types.h>

#include "ferry/expected.hpp"
#include "ferry/fd.hpp"

namespace ferry::held {

// The directory, made 0700 when missing. A directory that is a link, not the user's, or open
// to others is refused with what is wrong and what to do.
[[nodiscard]] Expected<std::filesystem::path> holder_dir(bool create);

// The socket of this user's holder (of this ferry version and protocol).
[[nodiscard]] std::filesystem::path holder_socket(const std::filesystem::path& dir);
// The lock the holder keeps while it lives (two holders never run at once).
[[nodiscard]] std::filesystem::path lock_path(const std::filesystem::path& socket);

// The uid and pid of the process at the other end of a connected Unix socket.
struct Peer {
  uid_t uid = 0;
  pid_t pid = 0;
};
[[nodiscard]] Expected<Peer> peer_of(int fd);

// Connects to a holder's socket; an error says why there is none to use.
[[nodiscard]] Expected<Fd> dial(const std::filesystem::path& socket);

} // namespace ferry::held
