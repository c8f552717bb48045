#pragma once
// Persistent sessions (docs/persistence.md): after a run, ferry leaves the host's authenticated
// session to a small background process of the same user, the holder, which later invocations
// reach over a Unix socket in a 0700 directory and use instead of connecting again.
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/sessions.hpp"

namespace ferry {

// How long a holder stays after its last client, by default (ControlPersist's usual minute).
inline constexpr int k_default_persist_s = 60;

// Uses the connection a live holder keeps for `direct`'s effective options when there is one;
// else connects `direct` itself and, when `persist_s` > 0, starts a holder as it ends. A holder
// that cannot be used (dead, stale, of another version) is passed over; one whose host key
// known_hosts no longer trusts refuses the run as a direct connection would.
[[nodiscard]] std::unique_ptr<HostSession>
make_persistent_session(std::unique_ptr<SshConnection> direct, const SshTarget& target,
                        int persist_s);

struct HeldConnection {
  std::string label; // the host as the user named it
  long pid = 0;
  std::string since; // UTC, ISO 8601
  std::filesystem::path socket;
};

// The live holders of this user (each asked over its socket).
[[nodiscard]] std::vector<HeldConnection> held_connections();
// Asks a holder to end (its runs under way are stopped); false when it was gone already.
[[nodiscard]] bool end_held(const HeldConnection& connection);

namespace held {
// What `ferry __hold` is given: the target to connect, how long to stay, where to listen.
[[nodiscard]] nlohmann::json holder_spec(const SshTarget& target, int persist_s,
                                         const std::filesystem::path& socket);
// `ferry __hold SPEC`: the holder's whole life; its exit status.
[[nodiscard]] int run_holder(std::string_view spec_text);
} // namespace held

} // namespace ferry
