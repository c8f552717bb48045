#pragma once
// Public-key authentication with the keys collect_identities chose, one at a time and in that
// order, so the right key comes before the server's MaxAuthTries runs out. When none works the
// message lists every key offered and what the server said to it.
#include <functional>
#include <string>

#include "ferry/expected.hpp"
#include "transport/ssh/handles.hpp"
#include "transport/ssh/identities.hpp"
#include "transport/ssh/pace.hpp"

namespace ferry::ssh {

struct AuthContext {
  std::string label; // what the user called the host
  std::string user;
  Pace pace;
  std::function<void(std::string)> log; // -v lines; may be empty
};

[[nodiscard]] Expected<void> authenticate(ssh_session session, Identities identities,
                                          const AuthContext& context);

} // namespace ferry::ssh
