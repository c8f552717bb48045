#pragma once
// Persistent sessions (docs/persistence.md): one small background process of the user, the
// holder, connects the hosts ferry runs on and keeps their authenticated sessions open; every
// invocation reaches it over one Unix socket in a 0700 directory and runs through it.
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

// Runs through the user's holder (started when there is none), which uses the session it keeps
// for `direct`'s effective options or connects it now, as `direct` would connect; a holder that
// cannot be used (not startable, dead, of another version) is passed over and `direct`
// connects. A connect the holder made fails the run as a direct connect would have failed it.
[[nodiscard]] std::unique_ptr<HostSession>
make_persistent_session(std::unique_ptr<SshConnection> direct, const SshTarget& target,
                        int persist_s);

// `ferry attach`, `stop` and `ps`: the session the user's holder keeps already for `direct`'s
// effective options (a host held by `ferry connect` or a recent run; its persist time left as
// it is), else `direct` connecting as it would. No holder is started, nor a host connected
// through one, for this.
[[nodiscard]] std::unique_ptr<HostSession>
make_held_or_direct_session(std::unique_ptr<SshConnection> direct, const SshTarget& target);

// `ferry connect`: the holder connects the host now as a run's first connect would (its
// keyboard-interactive prompts asked through `target.prompt`) and keeps the session for
// `persist_s` after its last use. An error when the connect failed, or when no holder could
// serve it (nothing would be kept).
[[nodiscard]] Expected<void> hold_connection(std::unique_ptr<SshConnection> direct,
                                             const SshTarget& target, int persist_s);

struct HeldConnection {
  std::string label; // the host as the user named it
  long pid = 0;
  std::string since; // UTC, ISO 8601
  std::filesystem::path socket;
  std::string key; // the holder's name for it
};

// The sessions this user's holder keeps.
[[nodiscard]] std::vector<HeldConnection> held_connections();
// Asks the holder to end one (its runs under way are stopped); false when it was gone already.
[[nodiscard]] bool end_held(const HeldConnection& connection);

namespace held {
// The target as a hello names it to the holder (its paths absolute).
[[nodiscard]] nlohmann::json holder_target(const SshTarget& target);
// `ferry __hold SPEC`: the holder's whole life; its exit status.
[[nodiscard]] int run_holder(std::string_view spec_text);
} // namespace held

} // namespace ferry
