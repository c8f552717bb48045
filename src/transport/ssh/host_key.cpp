#include "transport/ssh/host_key.hpp"

#include <filesystem>
#include <optional>

#include "transport/ssh/known_hosts.hpp"

namespace ferry::ssh {

namespace {

// The public key a known_hosts line carries; null when libssh cannot read it.
Key entry_key(const known_hosts::Entry& entry)
{
  ssh_key raw = nullptr;
  if (ssh_pki_import_pubkey_base64(entry.key_base64.c_str(),
                                   ssh_key_type_from_name(entry.key_type.c_str()),
                                   &raw) != SSH_OK) {
    return Key();
  }
  return Key(raw);
}

bool applies(const known_hosts::Entry& entry, known_hosts::Marker marker, const Resolved& where)
{
  return entry.marker == marker && known_hosts::host_matches(entry.hosts, where.host, where.port);
}

// The first plain entry for host:port (hashed names included), with its file and line, so a
// "changed" message can show both fingerprints and where the old one is.
struct RecordedKey {
  std::string fingerprint;
  std::string file;
  int line = 0;
};
std::optional<RecordedKey> recorded_key(const std::vector<known_hosts::Entry>& entries,
                                        const Resolved& where)
{
  for (const auto& entry : entries) {
    if (!applies(entry, known_hosts::Marker::none, where)) {
      continue;
    }
    if (const Key key = entry_key(entry)) {
      return RecordedKey{fingerprint(key.get()), entry.file, entry.line};
    }
  }
  return std::nullopt;
}

// The entry that revokes `key` for host:port (OpenSSH's `@revoked`), if any.
const known_hosts::Entry* revoking_entry(const std::vector<known_hosts::Entry>& entries,
                                         ssh_key key, const Resolved& where)
{
  for (const auto& entry : entries) {
    if (!applies(entry, known_hosts::Marker::revoked, where)) {
      continue;
    }
    const Key revoked = entry_key(entry);
    if (revoked && ssh_key_cmp(revoked.get(), key, SSH_KEY_CMP_PUBLIC) == 0) {
      return &entry;
    }
  }
  return nullptr;
}

Unexpected<Error> changed(const std::vector<known_hosts::Entry>& entries, const Resolved& where,
                          const HostKeyPolicy& policy, const std::string& offered)
{
  const auto recorded = recorded_key(entries, where);
  const std::string file = recorded ? recorded->file : where.known_hosts;
  return fail(ErrorKind::unreachable,
              "{}: host key changed: the server offers {} but {}{} records {}; refusing to "
              "connect (this could be an attack). If the host was really re-keyed, remove the "
              "old entry (ssh-keygen -R '{}' -f {}) and connect again",
              policy.label, offered, file, recorded ? fmt::format(" line {}", recorded->line) : "",
              recorded ? recorded->fingerprint : "another key",
              known_hosts::lookup_name(where.host, where.port), file);
}

// A @cert-authority line vouches only for certificates; libssh 0.10 negotiates plain host keys,
// so such a line cannot admit this server (ssh(1) with no certificate says the same).
std::string cert_authority_note(const std::vector<known_hosts::Entry>& entries,
                                const Resolved& where)
{
  for (const auto& entry : entries) {
    if (applies(entry, known_hosts::Marker::cert_authority, where)) {
      return fmt::format(". {} line {} trusts a certificate authority for this host, but ferry "
                         "checks plain host keys only (no host certificates): record the host's "
                         "own key",
                         entry.file, entry.line);
    }
  }
  return {};
}

Expected<void> unknown(ssh_session session, const std::vector<known_hosts::Entry>& entries,
                       const Resolved& where, const HostKeyPolicy& policy,
                       const std::string& offered)
{
  if (policy.accept_new) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(where.known_hosts).parent_path(), ec);
    if (ssh_session_update_known_hosts(session) != SSH_OK) {
      return fail(ErrorKind::unreachable, "{}: cannot record the host key in {}: {}", policy.label,
                  where.known_hosts, ssh_get_error(session));
    }
    return {};
  }
  return fail(ErrorKind::unreachable,
              "{}: host key unknown ({}; not in {}); refusing to connect{}. Check the "
              "fingerprint with the host's owner, then run again with --accept-new-host-key to "
              "record it",
              policy.label, offered, where.known_hosts, cert_authority_note(entries, where));
}

} // namespace

std::string fingerprint(ssh_key key)
{
  unsigned char* hash = nullptr;
  size_t length = 0;
  if (key == nullptr ||
      ssh_get_publickey_hash(key, SSH_PUBLICKEY_HASH_SHA256, &hash, &length) != SSH_OK) {
    return "SHA256:?";
  }
  char* text = ssh_get_fingerprint_hash(SSH_PUBLICKEY_HASH_SHA256, hash, length);
  ssh_clean_pubkey_hash(&hash);
  std::string result = text != nullptr ? text : "SHA256:?";
  ssh_string_free_char(text);
  return result;
}

Expected<ServerKey> server_key(ssh_session session, const HostKeyPolicy& policy)
{
  ssh_key raw_key = nullptr;
  if (ssh_get_server_publickey(session, &raw_key) != SSH_OK) {
    return fail(ErrorKind::unreachable, "{}: the server sent no host key", policy.label);
  }
  ServerKey offered{Key(raw_key), {}};
  offered.fingerprint = fingerprint(offered.key.get());
  return offered;
}

Expected<void> verify_host_key(ssh_session session, const ServerKey& offered, const Resolved& where,
                               const HostKeyPolicy& policy)
{
  const auto entries = known_hosts::read_files({where.known_hosts, where.global_known_hosts});

  // libssh 0.10 does not read @revoked lines: a revoked key is refused here first, whatever
  // else the files say and with --accept-new-host-key too, as ssh(1) refuses it.
  if (const auto* revoked = revoking_entry(entries, offered.key.get(), where)) {
    return fail(ErrorKind::unreachable,
                "{}: the server's host key {} is REVOKED ({} line {}: @revoked); refusing to "
                "connect. The key may be compromised: ask the host's owner for its new key",
                policy.label, offered.fingerprint, revoked->file, revoked->line);
  }
  switch (ssh_session_is_known_server(session)) {
  case SSH_KNOWN_HOSTS_OK:
    return {};
  case SSH_KNOWN_HOSTS_CHANGED:
  case SSH_KNOWN_HOSTS_OTHER:
    return changed(entries, where, policy, offered.fingerprint);
  case SSH_KNOWN_HOSTS_UNKNOWN:
  case SSH_KNOWN_HOSTS_NOT_FOUND:
    return unknown(session, entries, where, policy, offered.fingerprint);
  case SSH_KNOWN_HOSTS_ERROR:
  default:
    return fail(ErrorKind::unreachable, "{}: cannot check the host key against {}: {}",
                policy.label, where.known_hosts, ssh_get_error(session));
  }
}

} // namespace ferry::ssh
