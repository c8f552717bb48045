#pragma once
// known_hosts as OpenSSH reads it (sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT"), for what libssh 0.10
// does not do: it takes `@revoked` and `@cert-authority` lines for host patterns that never
// match, so a revoked key listed next to a plain entry for the same key would be accepted.
// ferry checks the markers itself; plain and hashed entries are still verified by libssh.
#include <string>
#include <string_view>
#include <vector>

namespace ferry::known_hosts {

enum class Marker { none, revoked, cert_authority };

struct Entry {
  Marker marker = Marker::none;
  std::string file;
  int line = 0;
  std::string hosts;      // the host-pattern field: "a,b,!c,*.x" or "|1|salt|hash"
  std::string key_type;   // "ssh-ed25519", ...
  std::string key_base64; // the public key blob
};

// The entries of one file's text. Blank lines and comments are skipped, and so are lines
// OpenSSH would skip: an unknown @marker or fewer than three fields.
[[nodiscard]] std::vector<Entry> parse(std::string_view text, const std::string& file);

// The entries of the files that exist and can be read (a missing file has none).
[[nodiscard]] std::vector<Entry> read_files(const std::vector<std::string>& files);

// Whether a host-pattern field matches host:port as OpenSSH matches it: the name looked up is
// `host` on port 22 and `[host]:port` otherwise; comma-separated patterns with `*` and `?`,
// case-insensitive; a matching `!pattern` excludes the line whatever else matches; a hashed
// field `|1|base64(salt)|base64(HMAC-SHA1(salt, name))` (ssh-keygen -H) matches that one name.
[[nodiscard]] bool host_matches(std::string_view patterns, std::string_view host, unsigned port);
// The same for a name already in lookup form ("host", "[host]:port", or a HostKeyAlias).
[[nodiscard]] bool name_matches(std::string_view patterns, std::string_view name);

// The name known_hosts records for host:port.
[[nodiscard]] std::string lookup_name(std::string_view host, unsigned port);

// HMAC-SHA1 (RFC 2104), raw bytes: the hash of hashed known_hosts names. Exposed for tests.
[[nodiscard]] std::string hmac_sha1(std::string_view key, std::string_view message);
// SHA-1 (FIPS 180-4) as lowercase hex: ssh_config's %C token.
[[nodiscard]] std::string sha1_hex(std::string_view message);
// Base64 (RFC 4648, with padding) decoding; empty on malformed input. Exposed for tests.
[[nodiscard]] std::string base64_decode(std::string_view text);

} // namespace ferry::known_hosts
