#pragma once
// Is the server the host it claims to be? known_hosts as OpenSSH reads it, over every
// UserKnownHostsFile and GlobalKnownHostsFile, under the HostKeyAlias name when one is set:
// @revoked keys are refused always, a changed key is refused with both fingerprints and where
// the old one is, an unknown key is recorded (hashed under HashKnownHosts yes) only with
// StrictHostKeyChecking accept-new or --accept-new-host-key. libssh 0.10 reads one file of
// each kind, under the host's own name, so ferry does the whole check itself.
#include <string>
#include <vector>

#include "ferry/expected.hpp"
#include "transport/ssh/handles.hpp"
#include "transport/ssh/options.hpp"

namespace ferry::ssh {

struct ServerKey {
  Key key;
  std::string fingerprint; // "SHA256:…"
};

struct HostKeyVerdict {
  std::string found_in; // "FILE line N" where the key is recorded
  bool recorded = false;
};

// The key the server offered in the key exchange.
[[nodiscard]] Expected<ServerKey> server_key(ssh_session session, const std::string& label);

// Whether that key is trusted for the host; records it when the policy says so.
[[nodiscard]] Expected<HostKeyVerdict>
verify_host_key(const ServerKey& offered, const Resolved& where, const std::string& label);

// The key types known_hosts holds for the host ("ssh-ed25519", ...), to negotiate them first.
[[nodiscard]] std::vector<std::string> known_key_types(const Resolved& where);

// "SHA256:…" of a key ("SHA256:?" when it cannot be hashed).
[[nodiscard]] std::string fingerprint(ssh_key key);

// The known_hosts line that records `key` for `name`, hashed (|1|salt|hash) when asked.
[[nodiscard]] std::string known_hosts_line(const std::string& name, ssh_key key, bool hashed);

} // namespace ferry::ssh
