#include "transport/ssh/auth.hpp"

#include <fmt/format.h>

namespace ferry::ssh {

Expected<void> authenticate(ssh_session session, std::string_view label, std::string_view user,
                            std::string_view identity)
{
  // Public keys first (agent, then key files): asking for "none" first, as ssh(1) does, costs
  // a round trip that almost never succeeds; it is still tried when the keys are refused.
  if (ssh_userauth_publickey_auto(session, nullptr, nullptr) == SSH_AUTH_SUCCESS ||
      ssh_userauth_none(session, nullptr) == SSH_AUTH_SUCCESS) {
    return {};
  }
  return fail(ErrorKind::unreachable,
              "{}: authentication failed for user {} (tried the ssh agent and {}); load the key "
              "into ssh-agent or pass --identity FILE",
              label, user, identity.empty() ? "the default keys in ~/.ssh" : identity);
}

} // namespace ferry::ssh
