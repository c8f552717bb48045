#pragma once
// The two transports behind HostSession: SSH (libssh + SFTP) and this machine (Boost.Process).
#include <memory>
#include <string>

#include "ferry/transport.hpp"

namespace ferry {

struct SshTarget {
  std::string spec;        // [user@]host[:port] or an alias from the ssh config
  std::string identity;    // --identity
  std::string known_hosts; // --known-hosts (default: the config's, else ~/.ssh/known_hosts)
  std::string ssh_config;  // --ssh-config (default ~/.ssh/config)
  bool accept_new_host_key = false;
  double connect_timeout_s = 0; // --connect-timeout; 0: the ssh config's ConnectTimeout, else 10 s
  int retries = 1;              // extra connect attempts after a refused/timed-out/DNS failure
  std::string remote_base;      // default $HOME/.cache/ferry/runs on the host
};

[[nodiscard]] std::unique_ptr<HostSession> make_ssh_session(const SshTarget& target);

struct LocalTarget {
  std::string base; // default: the system temp directory
};

[[nodiscard]] std::unique_ptr<HostSession> make_local_session(const LocalTarget& target);

} // namespace ferry
