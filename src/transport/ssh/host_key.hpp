#pragma once
// Is the server the host it claims to be? known_hosts as OpenSSH reads it: @revoked keys are
// refused always, a changed key is refused with both fingerprints and where the old one is, an
// unknown key is recorded only when the user said so.
#include <string>

#include "ferry/expected.hpp"
#include "transport/ssh/handles.hpp"
#include "transport/ssh/options.hpp"

namespace ferry::ssh {

struct HostKeyPolicy {
  std::string label; // what the user called the host, for messages
  bool accept_new = false;
};

struct ServerKey {
  Key key;
  std::string fingerprint; // "SHA256:…"
};

// The key the server offered in the key exchange.
[[nodiscard]] Expected<ServerKey> server_key(ssh_session session, const HostKeyPolicy& policy);

// Whether that key is trusted for the host.
[[nodiscard]] Expected<void> verify_host_key(ssh_session session, const ServerKey& offered,
                                             const Resolved& where, const HostKeyPolicy& policy);

// "SHA256:…" of a key ("SHA256:?" when it cannot be hashed).
[[nodiscard]] std::string fingerprint(ssh_key key);

} // namespace ferry::ssh
