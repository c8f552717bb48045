#pragma once
// JSON-RPC 2.0 over the MCP stdio transport: one message per line, UTF-8, no embedded newline.
// The reader bounds what a client can make ferry hold (k_max_message_bytes); the writer sends
// each message as one write, so messages from several threads never interleave.
#include <chrono>
#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace ferry::mcp {

// A message larger than this is refused unread (a tools/call carries parameters, not files).
inline constexpr std::size_t k_max_message_bytes = 4u << 20;

enum class RpcError : int {
  parse_error = -32700,
  invalid_request = -32600,
  method_not_found = -32601,
  invalid_params = -32602,
  internal_error = -32603,
  resource_not_found = -32002, // MCP's code for resources/read of an unknown URI
};

// Reads newline-delimited messages from a file descriptor.
class LineReader {
public:
  enum class Status { line, oversized, idle, eof };

  LineReader(int fd, std::size_t cap) : m_fd(fd), m_cap(cap) {}

  // The next message in `line` (Status::line), or: a message over the cap was skipped up to its
  // newline (oversized), nothing arrived within `wait` (idle), the input ended (eof).
  Status next(std::string& line, std::chrono::milliseconds wait);

private:
  bool take_line(std::string& line);
  // What the buffered bytes give without reading more; nullopt: nothing yet.
  std::optional<Status> from_buffer(std::string& line);
  Status unterminated(std::string& line);
  Status fill(std::chrono::milliseconds wait);

  int m_fd;
  std::size_t m_cap;
  std::string m_buffer;
  bool m_discarding = false; // inside a message over the cap: skip to its newline
  bool m_eof = false;
};

// Writes whole messages, one line each; after a failed write (the client went away) every
// later send returns false.
class Writer {
public:
  explicit Writer(int fd) : m_fd(fd) {}
  bool send(const nlohmann::json& message);
  [[nodiscard]] bool closed() const;

private:
  int m_fd;
  mutable std::mutex m_lock;
  bool m_closed = false;
};

// One incoming message, classified.
struct Incoming {
  enum class Kind { request, notification, response, invalid };
  Kind kind = Kind::invalid;
  nlohmann::json id; // requests (and responses); null when unknown
  std::string method;
  nlohmann::json params = nlohmann::json::object();
  std::string problem;                               // why an invalid message is invalid
  RpcError problem_code = RpcError::invalid_request; // parse_error when it is not JSON at all
};

// Parses one line. Malformed JSON, a nesting deeper than ferry reads anywhere, and batches
// (removed from MCP in 2025-06-18) come back invalid, with a `problem` naming it.
[[nodiscard]] Incoming parse_message(std::string_view line);

[[nodiscard]] nlohmann::json result_message(const nlohmann::json& id, nlohmann::json result);
[[nodiscard]] nlohmann::json error_message(const nlohmann::json& id, RpcError code,
                                           std::string_view message);
[[nodiscard]] nlohmann::json notification(std::string_view method, nlohmann::json params);

} // namespace ferry::mcp
