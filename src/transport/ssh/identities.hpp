#pragma once
// Which keys ferry offers, in which order, and how each one signs. OpenSSH 9.2 offers the
// agent's keys before an IdentityFile key the agent does not hold, so an agent with many keys
// can use up the server's MaxAuthTries first. ferry offers the keys the user named first
// (--identity, then IdentityFile, each after its certificates), then the agent's other keys
// (none of them under IdentitiesOnly yes), then the default ~/.ssh/id_* files when no key was
// named. A key the agent holds signs through the agent; a file key is read from its file, and
// an encrypted one the agent lacks is offered but never unlocked: ferry does not prompt.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ferry/expected.hpp"
#include "transport/ssh/agent.hpp"
#include "transport/ssh/handles.hpp"

namespace ferry::ssh {

struct NamedFile {
  std::string path;   // expanded
  std::string origin; // "--identity", "FILE line N", "default"
};

struct IdentityPlan {
  std::vector<NamedFile> files;        // --identity and IdentityFile, in that order
  std::vector<NamedFile> certificates; // CertificateFile
  std::vector<NamedFile> defaults;     // ~/.ssh/id_*: used when `files` is empty
  bool identities_only = false;
  std::string identities_only_origin;
  std::string agent_socket; // empty: no agent
  std::string agent_origin; // "SSH_AUTH_SOCK", "FILE line N (IdentityAgent)"
};

struct Identity {
  std::string label;       // the file, or "agent key COMMENT"
  std::string type;        // "ED25519", "ED25519-CERT"
  std::string fingerprint; // SHA256 of the public key
  std::string blob;        // what is offered (the certificate's blob for a certificate)
  Key public_key;
  Key private_key;        // a file key, with its certificate when one is offered
  std::string agent_blob; // the agent key that signs (non-empty: sign through the agent)
  std::string problem;    // why it cannot sign ("encrypted, and no agent holds it")
  std::string doubts;     // what may make a certificate be refused (expired, principals)
};

struct Identities {
  std::vector<Identity> offered;
  std::vector<std::string> notes; // keys left out, and why (for -v and the failure message)
  std::optional<AgentClient> agent;
};

// The keys to offer as `user`, in order. `log` gets one line per decision.
[[nodiscard]] Identities collect_identities(const IdentityPlan& plan, const std::string& user,
                                            const std::function<void(std::string)>& log);

} // namespace ferry::ssh
