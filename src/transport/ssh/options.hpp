#pragma once
// Where an SSH session goes: the target's options, then the ssh config, then the command line's
// values again (they win, as with ssh(1)).
#include <string>

#include "ferry/expected.hpp"
#include "ferry/sessions.hpp"
#include "transport/ssh/handles.hpp"

namespace ferry::ssh {

struct Resolved {
  std::string host; // after the config (HostName)
  std::string user;
  unsigned port = 22;
  std::string known_hosts;        // the file libssh reads and writes
  std::string global_known_hosts; // read only
};

[[nodiscard]] Expected<Resolved> configure(ssh_session session, const SshTarget& target);

// "~/x" with the user's home directory.
[[nodiscard]] std::string expand_home(const std::string& path);

} // namespace ferry::ssh
