#pragma once
// Public keys as the SSH wire format writes them ("blobs"), and the parts of an OpenSSH
// certificate ferry shows in messages (PROTOCOL.certkeys in OpenSSH's sources). libssh 0.10
// exposes neither a certificate's principals and validity nor its key's own blob, and
// ssh_key_cmp never equates a certificate with its key, so ferry reads the blobs itself.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::ssh {

// "ssh-ed25519", "ssh-ed25519-cert-v01@openssh.com", ...: the blob's first string.
[[nodiscard]] std::string blob_type(std::string_view blob);

struct Certificate {
  std::string type;       // "ssh-ed25519-cert-v01@openssh.com"
  std::string plain_blob; // the certified public key's own blob
  std::uint64_t serial = 0;
  std::uint32_t cert_type = 0; // 1 user, 2 host
  std::string key_id;
  std::vector<std::string> principals; // empty: any
  std::uint64_t valid_after = 0;
  std::uint64_t valid_before = 0; // seconds since the epoch; ~0: forever
};

// The certificate in a blob; nullopt when the blob is no certificate ferry can read.
[[nodiscard]] std::optional<Certificate> parse_certificate(std::string_view blob);

// Why a certificate may be refused for `user` at time `now` (empty: nothing seen): expired,
// not yet valid, not a user certificate, or principals that do not name the user (the server
// may still accept it through AuthorizedPrincipalsFile).
[[nodiscard]] std::string certificate_doubts(const Certificate& cert, const std::string& user,
                                             std::uint64_t now);

// The public blob stored unencrypted in an "openssh-key-v1" private key file's text; nullopt
// for another format.
[[nodiscard]] std::optional<std::string> openssh_private_key_public_blob(std::string_view text);

// "SHA256:..." of a blob, as ssh-keygen -l prints it (a certificate: of its key's own blob).
[[nodiscard]] std::string blob_fingerprint(std::string_view blob);
// "ED25519", "ED25519-CERT", "RSA", "ECDSA", ...: how ssh -v names a key type.
[[nodiscard]] std::string key_type_label(std::string_view type);

// Base64 (RFC 4648, with padding).
[[nodiscard]] std::string base64_encode(std::string_view bytes);

} // namespace ferry::ssh
