#pragma once
// Public-key authentication with the keys collect_identities chose, one at a time and in that
// order, so the right key comes before the server's MaxAuthTries runs out. When none works the
// message lists every key offered and what the server said to it. A server that asks for
// keyboard-interactive (a second factor after a key, or instead of one) gets one set of answers
// from the context's prompter; a wrong one fails the connect.
#include <functional>
#include <string>

#include "ferry/expected.hpp"
#include "ferry/sessions.hpp"
#include "transport/ssh/handles.hpp"
#include "transport/ssh/identities.hpp"
#include "transport/ssh/pace.hpp"

namespace ferry::ssh {

struct AuthContext {
  std::string label; // what the user called the host
  std::string user;
  Pace pace;
  std::function<void(std::string)> log; // -v lines; may be empty
  Prompter prompt;                      // empty: nobody can answer a keyboard-interactive login
  std::string batch_mode; // where the ssh config set BatchMode yes (then `prompt` is empty)
};

[[nodiscard]] Expected<void> authenticate(ssh_session session, Identities identities,
                                          const AuthContext& context);

} // namespace ferry::ssh
