#pragma once
// Where this user's connection holders listen: one Unix socket per connection in a 0700
// directory of the user's own ($XDG_RUNTIME_DIR/ferry, else the cache directory's
// ferry/holders), named by a hash of the user, the ferry version and the connection's effective
// options. Nothing here is reachable from the network or by another user.
#include <filesystem>
#include <string>

#include <sys/types.h>

#include "ferry/expected.hpp"
#include "ferry/fd.hpp"

namespace ferry::held {

// The directory, made 0700 when missing. A directory that is a link, not the user's, or open
// to others is refused with what is wrong and what to do.
[[nodiscard]] Expected<std::filesystem::path> holder_dir(bool create);

// The socket of the holder for a connection with these effective options.
[[nodiscard]] std::filesystem::path socket_path(const std::filesystem::path& dir,
                                                const std::string& options_identity);
// The lock its holder keeps while it lives (two holders of one connection never run at once).
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
