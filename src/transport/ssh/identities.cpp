#include "transport/ssh/identities.hpp"

#include <chrono>
#include <deque>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "ferry/text.hpp"
#include "ferry/util.hpp"
#include "transport/ssh/keys.hpp"

namespace ferry::ssh {

namespace {

// A key file as read: its public key always, its private key when it is not encrypted.
struct FileKey {
  NamedFile file;
  std::string blob;
  Key public_key;
  Key private_key;
  std::string problem;
};

struct CertFile {
  NamedFile file;
  std::string blob;
  Key key;
  Certificate info;
};

// libssh asks this for a passphrase; ferry never prompts, it only learns the key is encrypted.
int refuse_passphrase(const char*, char*, size_t, int, int, void* asked)
{
  *static_cast<bool*>(asked) = true;
  return SSH_ERROR;
}

Key public_key_of(const std::string& path, const Key& private_key)
{
  ssh_key raw = nullptr;
  if (private_key && ssh_pki_export_privkey_to_pubkey(private_key.get(), &raw) == SSH_OK) {
    return Key(raw);
  }
  if (ssh_pki_import_pubkey_file((path + ".pub").c_str(), &raw) == SSH_OK) {
    return Key(raw);
  }
  // An encrypted OpenSSH key still carries its public key in the clear.
  if (const auto text = read_file(path)) {
    if (const auto blob = openssh_private_key_public_blob(*text)) {
      return key_from_blob(*blob);
    }
  }
  return Key();
}

std::optional<FileKey> load_key(const NamedFile& file, std::vector<std::string>& notes)
{
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file.path, ec)) {
    if (file.origin != "default") {
      notes.push_back(fmt::format("{} ({}): no such file", file.path, file.origin));
    }
    return std::nullopt;
  }
  FileKey key{file, {}, Key(), Key(), {}};
  ssh_key raw = nullptr;
  bool asked = false;
  if (ssh_pki_import_privkey_file(file.path.c_str(), nullptr, refuse_passphrase, &asked, &raw) ==
      SSH_OK) {
    key.private_key = Key(raw);
  } else {
    key.problem = asked ? "it is encrypted and no ssh-agent holds it (ferry never asks for a "
                          "passphrase: load it with ssh-add " +
                              file.path + ")"
                        : "libssh cannot read it";
  }
  key.public_key = public_key_of(file.path, key.private_key);
  key.blob = key_blob(key.public_key.get());
  if (key.blob.empty()) {
    notes.push_back(
        fmt::format("{} ({}): not offered: {} and its public key is unknown (no {}.pub)", file.path,
                    file.origin, key.problem, file.path));
    return std::nullopt;
  }
  return key;
}

std::optional<CertFile> load_certificate(const NamedFile& file, std::vector<std::string>& notes)
{
  ssh_key raw = nullptr;
  if (ssh_pki_import_cert_file(file.path.c_str(), &raw) != SSH_OK) {
    notes.push_back(
        fmt::format("{} ({}): not a certificate libssh can read", file.path, file.origin));
    return std::nullopt;
  }
  CertFile cert{file, {}, Key(raw), {}};
  cert.blob = key_blob(cert.key.get());
  auto info = parse_certificate(cert.blob);
  if (!info) {
    notes.push_back(
        fmt::format("{} ({}): not a certificate ferry can read", file.path, file.origin));
    return std::nullopt;
  }
  cert.info = std::move(*info);
  return cert;
}

std::uint64_t now_s()
{
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
}

class Builder {
public:
  Builder(const IdentityPlan& plan, const std::string& user) : m_plan(plan), m_user(user) {}

  Identities build();

private:
  void read_agent();
  std::vector<const CertFile*> certificates_for(const FileKey& key);
  void add_files(const std::vector<NamedFile>& files);
  void add_agent_keys();
  void add_file_key(const FileKey& key, const std::vector<const CertFile*>& certs);
  void add_certificate(const CertFile& cert, const FileKey* key);
  void add_agent_key(const AgentKey& key);
  void add(Identity identity);
  bool agent_holds(const std::string& blob) const
  {
    for (const auto& key : m_agent_keys) {
      if (key.blob == blob) {
        return true;
      }
    }
    return false;
  }

  const IdentityPlan& m_plan;
  const std::string& m_user;
  Identities m_out;
  std::vector<AgentKey> m_agent_keys;
  std::deque<CertFile> m_named_certs; // CertificateFile
  std::deque<CertFile> m_beside;      // KEY-cert.pub files (a deque: pointers to them stay valid)
  std::set<std::string> m_used;
};

void Builder::read_agent()
{
  if (m_plan.agent_socket.empty()) {
    return;
  }
  auto agent = AgentClient::connect(m_plan.agent_socket);
  auto keys = agent ? agent->keys() : Unexpected{agent.error()};
  if (!keys) {
    m_out.notes.push_back(fmt::format("agent ({}): {}", m_plan.agent_origin, keys.error().message));
    return;
  }
  m_agent_keys = std::move(*keys);
  m_out.agent.emplace(std::move(*agent));
}

void Builder::add(Identity identity)
{
  if (!m_used.insert(identity.blob).second) {
    return;
  }
  const auto cert = parse_certificate(identity.blob);
  identity.type = key_type_label(blob_type(identity.blob));
  identity.fingerprint = blob_fingerprint(identity.blob);
  if (cert) {
    identity.doubts = certificate_doubts(*cert, m_user, now_s());
  }
  m_out.offered.push_back(std::move(identity));
}

void Builder::add_certificate(const CertFile& cert, const FileKey* key)
{
  Identity identity;
  identity.label = cert.file.path;
  identity.blob = cert.blob;
  identity.public_key = key_from_blob(cert.blob); // ssh_key_dup cannot copy a certificate
  if (agent_holds(cert.info.plain_blob)) {
    identity.agent_blob = cert.info.plain_blob;
  } else if (key != nullptr && key->private_key) {
    identity.private_key = Key(ssh_key_dup(key->private_key.get()));
    if (ssh_pki_copy_cert_to_privkey(cert.key.get(), identity.private_key.get()) != SSH_OK) {
      m_out.notes.push_back(
          fmt::format("{}: libssh cannot pair it with {}", cert.file.path, key->file.path));
      return;
    }
  } else {
    identity.problem = key != nullptr ? key->problem : "no key for it in a file or the agent";
  }
  add(std::move(identity));
}

void Builder::add_file_key(const FileKey& key, const std::vector<const CertFile*>& certs)
{
  for (const auto* cert : certs) {
    if (cert->info.plain_blob == key.blob) {
      add_certificate(*cert, &key);
    }
  }
  Identity identity;
  identity.label = key.file.path;
  identity.blob = key.blob;
  identity.public_key = Key(ssh_key_dup(key.public_key.get()));
  if (agent_holds(key.blob)) {
    identity.agent_blob = key.blob;
  } else if (key.private_key) {
    identity.private_key = Key(ssh_key_dup(key.private_key.get()));
  } else {
    identity.problem = key.problem;
  }
  add(std::move(identity));
}

void Builder::add_agent_key(const AgentKey& key)
{
  Identity identity;
  identity.label = fmt::format("agent key '{}'", terminal_safe(key.comment));
  identity.blob = key.blob;
  identity.public_key = key_from_blob(key.blob);
  identity.agent_blob = key.blob; // an agent that holds a certificate signs for it itself
  if (identity.public_key) {
    add(std::move(identity));
  }
}

std::vector<const CertFile*> Builder::certificates_for(const FileKey& key)
{
  std::vector<const CertFile*> certs;
  if (!m_plan.certificates.empty()) {
    for (const auto& cert : m_named_certs) { // CertificateFile replaces KEY-cert.pub, as in ssh
      certs.push_back(&cert);
    }
    return certs;
  }
  std::error_code ec;
  const std::string beside = key.file.path + "-cert.pub";
  if (std::filesystem::exists(beside, ec)) {
    if (auto cert = load_certificate({beside, key.file.origin}, m_out.notes)) {
      m_beside.push_back(std::move(*cert));
      certs.push_back(&m_beside.back());
    }
  }
  return certs;
}

void Builder::add_files(const std::vector<NamedFile>& files)
{
  for (const auto& file : files) {
    if (const auto key = load_key(file, m_out.notes)) {
      add_file_key(*key, certificates_for(*key));
    }
  }
}

void Builder::add_agent_keys()
{
  std::size_t skipped = 0;
  for (const auto& key : m_agent_keys) {
    if (m_plan.identities_only) {
      skipped += m_used.count(key.blob) == 0 ? 1 : 0;
    } else {
      add_agent_key(key);
    }
  }
  if (skipped > 0) {
    m_out.notes.push_back(fmt::format("{} other agent key(s) not offered: IdentitiesOnly yes ({})",
                                      skipped, m_plan.identities_only_origin));
  }
}

Identities Builder::build()
{
  read_agent();
  for (const auto& file : m_plan.certificates) {
    if (auto cert = load_certificate(file, m_out.notes)) {
      m_named_certs.push_back(std::move(*cert));
    }
  }
  add_files(m_plan.files);
  for (const auto& cert : m_named_certs) { // certificates whose key only the agent holds
    if (!m_used.count(cert.blob) && agent_holds(cert.info.plain_blob)) {
      add_certificate(cert, nullptr);
    }
  }
  add_agent_keys();
  if (m_plan.files.empty()) {
    add_files(m_plan.defaults); // ~/.ssh/id_*, as ssh, only when no key is named
  }
  return std::move(m_out);
}

} // namespace

Identities collect_identities(const IdentityPlan& plan, const std::string& user,
                              const std::function<void(std::string)>& say)
{
  Identities identities = Builder(plan, user).build();
  if (say) {
    for (const auto& id : identities.offered) {
      say(fmt::format("will offer {} {} {}{}", id.label, id.type, id.fingerprint,
                      id.agent_blob.empty() ? (id.problem.empty() ? "" : " (cannot sign)")
                                            : " (signed by the agent)"));
    }
    for (const auto& note : identities.notes) {
      say(note);
    }
  }
  return identities;
}

} // namespace ferry::ssh
