#include "mcp/json_rpc.hpp"

#include <cerrno>
#include <utility>

#include <poll.h>
#include <unistd.h>

#include "ferry/text.hpp"
#include "ferry/util.hpp"

namespace ferry::mcp {

using nlohmann::json;

bool LineReader::take_line(std::string& line)
{
  const auto newline = m_buffer.find('\n');
  if (newline == std::string::npos) {
    return false;
  }
  line.assign(m_buffer, 0, newline);
  m_buffer.erase(0, newline + 1);
  if (!line.empty() && line.back() == '\r') {
    line.pop_back();
  }
  return true;
}

LineReader::Status LineReader::fill(std::chrono::milliseconds wait)
{
  pollfd pfd{m_fd, POLLIN, 0};
  const int ready = ::poll(&pfd, 1, static_cast<int>(wait.count()));
  if (ready == 0 || (ready < 0 && errno == EINTR)) {
    return Status::idle;
  }
  char chunk[64 * 1024];
  const ssize_t got = ready < 0 ? -1 : ::read(m_fd, chunk, sizeof chunk);
  if (got < 0 && errno == EINTR) {
    return Status::idle;
  }
  if (got <= 0) {
    m_eof = true;
    return Status::eof;
  }
  m_buffer.append(chunk, static_cast<std::size_t>(got));
  return Status::line;
}

std::optional<LineReader::Status> LineReader::from_buffer(std::string& line)
{
  for (;;) {
    if (m_discarding) {
      // Skip the rest of an oversized message; only its end is looked for.
      const auto newline = m_buffer.find('\n');
      m_buffer.erase(0, newline == std::string::npos ? m_buffer.size() : newline + 1);
      if (newline == std::string::npos) {
        return std::nullopt;
      }
      m_discarding = false;
      return Status::oversized;
    }
    if (!take_line(line)) {
      if (m_buffer.size() <= m_cap) {
        return std::nullopt;
      }
      m_discarding = true;
      continue;
    }
    if (line.size() > m_cap) {
      return Status::oversized;
    }
    if (!trim(line).empty()) {
      return Status::line;
    }
  }
}

LineReader::Status LineReader::unterminated(std::string& line)
{
  // A last message without its newline still counts when the input ends.
  if (m_discarding || trim(m_buffer).empty()) {
    m_buffer.clear();
    return Status::eof;
  }
  line = std::exchange(m_buffer, {});
  return line.size() > m_cap ? Status::oversized : Status::line;
}

LineReader::Status LineReader::next(std::string& line, std::chrono::milliseconds wait)
{
  for (;;) {
    if (const auto status = from_buffer(line)) {
      return *status;
    }
    if (m_eof) {
      return Status::eof;
    }
    const Status filled = fill(wait);
    if (filled == Status::eof) {
      return unterminated(line);
    }
    if (filled != Status::line) {
      return filled;
    }
  }
}

bool Writer::send(const json& message)
{
  std::string text = message.dump(-1, ' ', false, json::error_handler_t::replace);
  text.push_back('\n');
  std::lock_guard guard(m_lock);
  if (m_closed) {
    return false;
  }
  if (write_all(m_fd, text) != 0) {
    m_closed = true;
    return false;
  }
  return true;
}

bool Writer::closed() const
{
  std::lock_guard guard(m_lock);
  return m_closed;
}

namespace {

Incoming invalid(std::string problem, RpcError code = RpcError::invalid_request, json id = nullptr)
{
  Incoming message;
  message.problem = std::move(problem);
  message.problem_code = code;
  message.id = std::move(id);
  return message;
}

bool is_valid_id(const json& id)
{
  return id.is_string() || id.is_number_integer();
}

Incoming classify(json& message)
{
  if (message.is_array()) {
    return invalid("JSON-RPC batches are not supported (MCP removed them in 2025-06-18); send one "
                   "message per line");
  }
  if (!message.is_object()) {
    return invalid(
        fmt::format("a JSON-RPC message must be an object, not {}", message.type_name()));
  }
  const auto version = message.find("jsonrpc");
  if (version == message.end() || *version != "2.0") {
    return invalid(R"(a JSON-RPC message must carry "jsonrpc": "2.0")");
  }
  const auto id = message.find("id");
  const bool has_id = id != message.end();
  if (has_id && !is_valid_id(*id)) {
    return invalid("a request id must be a string or an integer");
  }
  const auto method = message.find("method");
  if (method == message.end()) {
    if (has_id && (message.contains("result") || message.contains("error"))) {
      Incoming response;
      response.kind = Incoming::Kind::response;
      response.id = *id;
      return response;
    }
    return invalid("a JSON-RPC message needs a \"method\" (or is a response with an \"id\")",
                   RpcError::invalid_request, has_id ? *id : json());
  }
  if (!method->is_string()) {
    return invalid("\"method\" must be a string", RpcError::invalid_request, has_id ? *id : json());
  }
  Incoming parsed;
  parsed.kind = has_id ? Incoming::Kind::request : Incoming::Kind::notification;
  parsed.id = has_id ? *id : json();
  parsed.method = method->get<std::string>();
  if (const auto params = message.find("params"); params != message.end()) {
    if (!params->is_object()) {
      return invalid(fmt::format("\"params\" of {} must be an object", shorten(parsed.method, 80)),
                     RpcError::invalid_params, parsed.id);
    }
    parsed.params = std::move(*params);
  }
  return parsed;
}

} // namespace

Incoming parse_message(std::string_view line)
{
  if (json_nesting_depth(line) > k_max_json_depth) {
    return invalid(fmt::format("message nests deeper than {} levels", k_max_json_depth),
                   RpcError::parse_error);
  }
  json message = json::parse(line.begin(), line.end(), nullptr, false);
  if (message.is_discarded()) {
    return invalid("not valid JSON (one UTF-8 JSON-RPC message per line)", RpcError::parse_error);
  }
  return classify(message);
}

json result_message(const json& id, json result)
{
  return {{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
}

json error_message(const json& id, RpcError code, std::string_view message)
{
  return {{"jsonrpc", "2.0"},
          {"id", id},
          {"error", {{"code", static_cast<int>(code)}, {"message", message}}}};
}

json notification(std::string_view method, json params)
{
  return {{"jsonrpc", "2.0"}, {"method", method}, {"params", std::move(params)}};
}

} // namespace ferry::mcp
