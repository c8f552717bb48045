#pragma once
// A host's connect as a fleet needs it (docs/run-protocol.md, "Pacing"): at most a few
// handshakes at once in the process, a server that dropped the connection before key exchange
// was done (sshd's MaxStartups) tried again after a short jittered wait, and the other
// transient failures (refused, timed out, DNS) tried again as --retries says.
#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "ferry/expected.hpp"
#include "ferry/transport.hpp"

namespace ferry::ssh {

// Handshakes (TCP connect to the end of authentication) under way at once in this process.
// sshd refuses new connections at random once MaxStartups' first number (10 by default) of
// them are unauthenticated, and hosts that look distinct may share one daemon (the addresses of
// one machine, hosts behind one bastion or port forward), so ferry stays below it whatever the
// sharing: two below the ten, for other clients and for the moment between a login and sshd
// freeing its slot.
inline constexpr int k_handshakes_at_once = 8;
// A server that dropped the connection before key exchange was done is tried this many times
// more, after 0.15-0.45 s, doubling up to four times that.
inline constexpr int k_max_drops = 8;

struct ConnectPlan {
  std::string label;
  int retries = 0; // --retries: more attempts after a refused, timed-out or DNS failure
  StopToken stop;
  std::function<void(std::string)> tell; // -v lines; may be empty
};

// Runs `attempt` (one connect) in a handshake slot, again while it fails in a way worth another
// try and the budget lasts. `may_retry` false (a proxy that said why) ends it at once.
[[nodiscard]] Expected<void> connect_paced(const ConnectPlan& plan,
                                           const std::function<Expected<void>()>& attempt,
                                           const std::function<bool()>& may_retry);

// ERROR given the class UNREACHED when it is an unreachable one that has none yet: what failed
// tells the class (the host key check, authentication).
[[nodiscard]] inline Unexpected<Error> classed(Unreached unreached, Unexpected<Error> error)
{
  if (error.error.kind == ErrorKind::unreachable && error.error.unreached == Unreached::none) {
    error.error.unreached = unreached;
  }
  return error;
}
[[nodiscard]] inline Expected<void> classed(Unreached unreached, Expected<void> result)
{
  if (result) {
    return result;
  }
  return classed(unreached, Unexpected{std::move(result).error()});
}

} // namespace ferry::ssh
