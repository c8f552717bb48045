#pragma once
// A direct connection's note of where the host's job cache holds the python standby's script
// (docs/run-protocol.md, "A first run without SFTP"): kept on this machine, per user and
// connection (next to the connection holders' sockets), written by a session that saw the
// script in the job cache as it swept the run base. A session's only run whose connection has a
// fresh note needs no SFTP at all: the standby stages the run itself. The note is fresh for an
// hour after the sweep, so that the base is still swept at least that often while it is used.
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace ferry::ssh {

inline constexpr std::chrono::hours k_standby_memo_fresh{1};

// Where a direct connection with these options keeps its note in this user's runtime directory
// `dir` (user_runtime_dir.hpp), beside the connection holder's socket.
[[nodiscard]] std::filesystem::path standby_memo_path(const std::filesystem::path& dir,
                                                      const std::string& options_identity);

// What a fresh note says for a connection with these options: the script's entry (its name
// `expected_name`: this build's script) and the sha256 a standby gave on its ready line for the
// compiled code it keeps beside it, or "no" when a standby could not start there lately; nullopt
// when there is no fresh note.
struct StandbyMemo {
  std::string entry;      // empty: a standby could not start on the host
  std::string tag_sha256; // empty: not known
};
[[nodiscard]] std::optional<StandbyMemo> recall_standby(const std::string& options_identity,
                                                        std::string_view expected_name);
// Notes the script's entry (an SFTP session saw it in the job cache as it swept the base);
// kept when a fresh note says a standby could not start there. The sha256 of the compiled code
// stays when the note already named that entry.
void remember_standby(const std::string& options_identity, const std::string& entry);
// Adds to a fresh note of `entry` the sha256 of the compiled code a `once` standby wrote beside
// it (its ready line), keeping the note's time: the base is still swept as often.
void remember_standby_code(const std::string& options_identity, const std::string& entry,
                           const std::string& tag_sha256);
// Notes that a standby could not start on the host (no python3, the script gone, a base it
// refused): the next runs stage over SFTP, for as long as the note is fresh.
void standby_failed(const std::string& options_identity);
// The note goes: the host's job cache lacks the script (an SFTP sweep saw it so).
void forget_standby(const std::string& options_identity);

} // namespace ferry::ssh
