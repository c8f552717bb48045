#pragma once
// The messages between ferry and a connection holder over their Unix socket: a 4-byte
// big-endian length, then a CBOR map (docs/persistence.md). Bytes travel as CBOR byte
// strings, so file contents and job output need no escaping.
#include <chrono>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "ferry/expected.hpp"
#include "ferry/sessions.hpp"
#include "ferry/transport.hpp"

namespace ferry::held {

// Bumped whenever a message changes: a holder of another version is not used.
inline constexpr int k_protocol = 6;
// While a job runs the holder says it is alive at least this often (an `ev: beat`); ferry takes
// a holder silent for k_holder_silence as stopped.
inline constexpr std::chrono::seconds k_beat_every{2};
inline constexpr std::chrono::seconds k_holder_silence{10};
// Uploads may be bundles of up to 256 MiB; output comes capped.
inline constexpr std::size_t k_max_message = 600u << 20;

using Message = nlohmann::json;

// Writes one message; false when the peer is gone, or took nothing for 20 s.
[[nodiscard]] bool send_message(int fd, const Message& message);

enum class Received { message, closed, timeout, broken };
// Waits up to `limit` for one message (the whole of it once it started).
[[nodiscard]] Received receive_message(int fd, Message& message, std::chrono::milliseconds limit);

[[nodiscard]] nlohmann::json::binary_t bytes_of(std::string_view text);
[[nodiscard]] std::string text_of(const nlohmann::json& bytes);

[[nodiscard]] Message error_message(const Error& error);
// A reply that went well, with these fields.
[[nodiscard]] Message ok_message(Message fields = Message::object());
// The error a reply carries, if it carries one.
[[nodiscard]] std::optional<Error> error_in(const Message& reply);

[[nodiscard]] Message encode(const ExecOutcome& outcome);
[[nodiscard]] ExecOutcome decode_outcome(const Message& message);
[[nodiscard]] Message encode(const FetchedFile& file);
[[nodiscard]] FetchedFile decode_file(const Message& message);
[[nodiscard]] Message encode(const LauncherSpec& spec);
[[nodiscard]] LauncherSpec decode_launcher(const Message& message);
[[nodiscard]] Message encode(const RunBundle& bundle);
[[nodiscard]] RunBundle decode_bundle(const Message& message);
// A staged run as the holder names it (its id); its stop token is the caller's to set.
[[nodiscard]] Message encode(const StagedRun& run);
[[nodiscard]] StagedRun decode_run(const Message& message);
[[nodiscard]] Message encode(const LaunchRequest& request);
// The request's fields; its stop token and sinks are the caller's to set.
[[nodiscard]] LaunchRequest decode_launch(const Message& message);
[[nodiscard]] Message encode(const std::optional<std::vector<DirEntry>>& entries);
[[nodiscard]] std::optional<std::vector<DirEntry>> decode_entries(const Message& message);

// Keyboard-interactive prompts relayed to the client that asked for a connect (the holder has
// no terminal): `ev: prompt` with the round, answered by `answers` (or an `error`).
[[nodiscard]] Message encode(const PromptRound& round);
[[nodiscard]] PromptRound decode_round(const Message& message);

} // namespace ferry::held
