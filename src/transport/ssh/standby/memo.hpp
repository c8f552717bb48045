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
// `expected_name`: this build's script), or "no" when a standby could not start there lately;
// nullopt when there is no fresh note.
struct StandbyMemo {
  std::string entry; // empty: a standby could not start on the host
};
[[nodiscard]] std::optional<StandbyMemo> recall_standby(const std::string& options_identity,
                                                        std::string_view expected_name);
// Notes the script's entry (an SFTP session saw it in the job cache as it swept the base);
// kept when a fresh note says a standby could not start there.
void remember_standby(const std::string& options_identity, const std::string& entry);
// Notes that a standby could not start on the host (no python3, the script gone, a base it
// refused): the next runs stage over SFTP, for as long as the note is fresh.
void standby_failed(const std::string& options_identity);
// The note goes: the host's job cache lacks the script (an SFTP sweep saw it so).
void forget_standby(const std::string& options_identity);

} // namespace ferry::ssh
