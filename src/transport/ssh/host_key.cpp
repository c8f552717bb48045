#include "transport/ssh/host_key.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include <fcntl.h>
#include <unistd.h>

#include "ferry/fd.hpp"
#include "ferry/util.hpp"
#include "transport/ssh/keys.hpp"
#include "transport/ssh/known_hosts.hpp"

namespace ferry::ssh {

namespace {

std::vector<known_hosts::Entry> all_entries(const Resolved& where)
{
  std::vector<std::string> files = where.user_known_hosts;
  files.insert(files.end(), where.global_known_hosts.begin(), where.global_known_hosts.end());
  return known_hosts::read_files(files);
}

bool applies(const known_hosts::Entry& entry, known_hosts::Marker marker, const Resolved& where)
{
  return entry.marker == marker && known_hosts::name_matches(entry.hosts, where.known_hosts_name);
}

std::string entry_blob(const known_hosts::Entry& entry)
{
  return known_hosts::base64_decode(entry.key_base64);
}

std::string files_text(const Resolved& where)
{
  std::string out;
  for (const auto& file : where.user_known_hosts) {
    out += (out.empty() ? "" : ", ") + file;
  }
  for (const auto& file : where.global_known_hosts) {
    out += (out.empty() ? "" : ", ") + file;
  }
  return out.empty() ? "no known_hosts file" : out;
}

std::string looked_up_as(const Resolved& where)
{
  return where.known_hosts_name == known_hosts::lookup_name(where.host, where.port)
             ? std::string()
             : fmt::format(" under the name '{}' (HostKeyAlias)", where.known_hosts_name);
}

Unexpected<Error> changed(const known_hosts::Entry& recorded, const Resolved& where,
                          const std::string& label, const std::string& offered)
{
  return fail(ErrorKind::unreachable,
              "{}: host key changed: the server offers {} but {} line {} records {}{}; refusing "
              "to connect (this could be an attack). If the host was really re-keyed, remove "
              "the old entry (ssh-keygen -R '{}' -f {}) and connect again",
              label, offered, recorded.file, recorded.line, blob_fingerprint(entry_blob(recorded)),
              looked_up_as(where), where.known_hosts_name, recorded.file);
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

Expected<HostKeyVerdict> record(const ServerKey& offered, const Resolved& where,
                                const std::string& label)
{
  if (where.user_known_hosts.empty()) {
    return fail(ErrorKind::unreachable,
                "{}: cannot record the host key: UserKnownHostsFile names no file", label);
  }
  const std::string& file = where.user_known_hosts.front();
  std::error_code ec;
  const auto parent = std::filesystem::path(file).parent_path();
  if (!parent.empty() && !std::filesystem::exists(parent, ec)) {
    std::filesystem::create_directories(parent, ec);
    std::filesystem::permissions(parent, std::filesystem::perms::owner_all, ec);
  }
  const std::string line =
      known_hosts_line(where.known_hosts_name, offered.key.get(), where.hash_known_hosts);
  Fd fd(::open(file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644));
  if (!fd || write_all(fd.get(), line) != 0 || fd.close() != 0) {
    return fail(ErrorKind::unreachable, "{}: cannot record the host key in {}: {}", label, file,
                std::strerror(errno));
  }
  return HostKeyVerdict{file, true};
}

Expected<HostKeyVerdict> unknown(const ServerKey& offered,
                                 const std::vector<known_hosts::Entry>& entries,
                                 const Resolved& where, const std::string& label)
{
  if (where.accept_new) {
    return record(offered, where, label);
  }
  return fail(ErrorKind::unreachable,
              "{}: host key unknown ({}; not in {}{}); refusing to connect{}. Check the "
              "fingerprint with the host's owner, then run again with --accept-new-host-key "
              "(or StrictHostKeyChecking accept-new) to record it",
              label, offered.fingerprint, files_text(where), looked_up_as(where),
              cert_authority_note(entries, where));
}

} // namespace

std::string fingerprint(ssh_key key)
{
  const std::string blob = key_blob(key);
  return blob.empty() ? "SHA256:?" : blob_fingerprint(blob);
}

std::string known_hosts_line(const std::string& name, ssh_key key, bool hashed)
{
  const std::string blob = key_blob(key);
  std::string field = name;
  if (hashed) {
    const std::string hex = random_hex(20);
    std::string salt;
    for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
      salt.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    }
    field = "|1|" + base64_encode(salt) + "|" + base64_encode(known_hosts::hmac_sha1(salt, name));
  }
  return fmt::format("{} {} {}\n", field, blob_type(blob), base64_encode(blob));
}

Expected<ServerKey> server_key(ssh_session session, const std::string& label)
{
  ssh_key raw_key = nullptr;
  if (ssh_get_server_publickey(session, &raw_key) != SSH_OK) {
    return fail(ErrorKind::unreachable, "{}: the server sent no host key", label);
  }
  ServerKey offered{Key(raw_key), {}};
  offered.fingerprint = fingerprint(offered.key.get());
  return offered;
}

std::vector<std::string> known_key_types(const Resolved& where)
{
  std::vector<std::string> types;
  for (const auto& entry : all_entries(where)) {
    if (applies(entry, known_hosts::Marker::none, where) &&
        std::find(types.begin(), types.end(), entry.key_type) == types.end()) {
      types.push_back(entry.key_type);
    }
  }
  return types;
}

Expected<HostKeyVerdict> verify_host_key(const ServerKey& offered, const Resolved& where,
                                         const std::string& label)
{
  const auto entries = all_entries(where);
  const std::string blob = key_blob(offered.key.get());
  // A revoked key is refused first, whatever else the files say and with accept-new too, as
  // ssh(1) refuses it (libssh 0.10 does not read @revoked lines).
  for (const auto& entry : entries) {
    if (entry.marker == known_hosts::Marker::revoked && entry_blob(entry) == blob &&
        known_hosts::name_matches(entry.hosts, where.known_hosts_name)) {
      return fail(ErrorKind::unreachable,
                  "{}: the server's host key {} is REVOKED ({} line {}: @revoked); refusing to "
                  "connect. The key may be compromised: ask the host's owner for its new key",
                  label, offered.fingerprint, entry.file, entry.line);
    }
  }
  const known_hosts::Entry* other = nullptr;
  for (const auto& entry : entries) {
    if (!applies(entry, known_hosts::Marker::none, where)) {
      continue;
    }
    if (entry_blob(entry) == blob) {
      return HostKeyVerdict{fmt::format("{} line {}", entry.file, entry.line), false};
    }
    if (other == nullptr ||
        (other->key_type != blob_type(blob) && entry.key_type == blob_type(blob))) {
      other = &entry; // prefer an entry of the offered type: that key changed
    }
  }
  if (other != nullptr) {
    return changed(*other, where, label, offered.fingerprint);
  }
  return unknown(offered, entries, where, label);
}

} // namespace ferry::ssh
