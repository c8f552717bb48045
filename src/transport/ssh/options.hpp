#pragma once
// Where an SSH session goes and whom it trusts, decided before libssh is touched: the ssh
// config read as ssh reads it (config.hpp), then the command line's values (they win, as with
// ssh(1)). Every ~ is the home directory of the user's passwd entry, as in ssh (not $HOME), so
// the files named in messages are the files read and written.
#include <functional>
#include <string>
#include <vector>

#include "ferry/expected.hpp"
#include "ferry/sessions.hpp"
#include "transport/ssh/config.hpp"
#include "transport/ssh/handles.hpp"
#include "transport/ssh/identities.hpp"

namespace ferry::ssh {

struct Resolved {
  std::string host_arg; // the name the user gave (an alias, say)
  std::string host;     // after HostName
  std::string user;
  unsigned port = 22;
  std::string known_hosts_name;              // HostKeyAlias, else host, or [host]:port off port 22
  std::vector<std::string> user_known_hosts; // read; a new key is recorded in the first
  std::vector<std::string> global_known_hosts; // read only
  bool accept_new = false;                     // StrictHostKeyChecking accept-new
  bool hash_known_hosts = false;               // HashKnownHosts yes: record the name hashed
  std::vector<std::string> proxy_argv;         // empty: a direct TCP connection
  std::string proxy_text;                      // "ProxyJump bastion (FILE line N)"
  IdentityPlan identities;
  std::string host_key_algorithms; // HostKeyAlgorithms as configured; empty: libssh's own
  double timeout_s = 10;
  std::vector<std::string> config_files; // read, in order
  std::vector<std::string> blocks;       // the Host and Match blocks that applied
  std::vector<std::string> warnings;     // what ferry does not honour, with file and line
  std::vector<std::pair<ssh_options_e, ConfigValue>> algorithms; // passed on to libssh
  // Where BatchMode yes was set ("FILE line N"); empty: keyboard-interactive may prompt.
  std::string batch_mode;
};

// The home directory every ssh file is under: the passwd entry's, as ssh's (else $HOME).
[[nodiscard]] std::string ssh_home();

[[nodiscard]] Expected<Resolved> resolve(const SshTarget& target);

// Sets libssh's options from `where`; `known_key_types` are the host key types known_hosts
// holds for the host (negotiated first); `fd` a connected proxy socket, or -1.
[[nodiscard]] Expected<void> configure(ssh_session session, const Resolved& where,
                                       const std::vector<std::string>& known_key_types, int fd);

// The config's warnings (target.warn) and, with -v, its story: the files read, the blocks that
// applied, where the connection goes, where the host key is looked up, the agent.
void tell_story(const Resolved& where, const SshTarget& target);
// SshConnection::options_identity.
[[nodiscard]] std::string options_identity(const SshTarget& target, const Resolved& where);

} // namespace ferry::ssh
