#include "transport/ssh/agent.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "ferry/util.hpp"

namespace ferry::ssh {

namespace {

constexpr char k_failure = 5;
constexpr char k_request_identities = 11;
constexpr char k_identities_answer = 12;
constexpr char k_sign_request = 13;
constexpr std::uint32_t k_max_message = 256 * 1024; // OpenSSH's AGENT_MAX_LEN

std::string u32(std::uint32_t n)
{
  return {static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8),
          static_cast<char>(n)};
}

std::string wire_string(std::string_view bytes)
{
  return u32(static_cast<std::uint32_t>(bytes.size())).append(bytes);
}

std::uint32_t read_u32(std::string_view bytes, std::size_t at)
{
  std::uint32_t n = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    n = (n << 8) | static_cast<unsigned char>(bytes[at + i]);
  }
  return n;
}

// A string at `at` of `bytes`, moving `at` past it; nullopt when it does not fit.
std::optional<std::string_view> take_string(std::string_view bytes, std::size_t& at)
{
  if (bytes.size() < at + 4 || bytes.size() - at - 4 < read_u32(bytes, at)) {
    return std::nullopt;
  }
  const auto length = read_u32(bytes, at);
  const auto out = bytes.substr(at + 4, length);
  at += 4 + length;
  return out;
}

// 0, or the errno (0 with `eof` set when the peer closed first).
int read_exact(int fd, char* out, std::size_t size, bool& eof)
{
  eof = false;
  while (size > 0) {
    const ssize_t n = ::read(fd, out, size);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      eof = n == 0;
      return n == 0 ? 0 : errno;
    }
    out += n;
    size -= static_cast<std::size_t>(n);
  }
  return 0;
}

// One framed message from `fd`; nullopt at the end of the stream or on an error.
std::optional<std::string> read_message(int fd)
{
  char header[4];
  bool eof = false;
  if (read_exact(fd, header, 4, eof) != 0 || eof) {
    return std::nullopt;
  }
  const std::uint32_t length = read_u32(std::string_view(header, 4), 0);
  if (length == 0 || length > k_max_message) {
    return std::nullopt;
  }
  std::string body(length, '\0');
  if (read_exact(fd, body.data(), length, eof) != 0 || eof) {
    return std::nullopt;
  }
  return body;
}

} // namespace

Expected<AgentClient> AgentClient::connect(const std::string& socket_path)
{
  sockaddr_un address{};
  if (socket_path.empty() || socket_path.size() >= sizeof(address.sun_path)) {
    return fail(ErrorKind::unreachable, "the ssh agent socket path '{}' is empty or too long",
                socket_path);
  }
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) {
    return fail(ErrorKind::unreachable, "cannot create a socket for the ssh agent: {}",
                std::strerror(errno));
  }
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, socket_path.data(), socket_path.size());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return fail(ErrorKind::unreachable, "cannot connect to the ssh agent at {}: {}", socket_path,
                std::strerror(errno));
  }
  // An agent that stops answering (a confirmation prompt nobody sees) must not hang ferry.
  const timeval wait{30, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
  return AgentClient(std::move(fd));
}

Expected<std::string> AgentClient::call(std::string_view request)
{
  const std::string framed = u32(static_cast<std::uint32_t>(request.size())).append(request);
  if (const int err = write_all(m_fd.get(), framed); err != 0) {
    return fail(ErrorKind::unreachable, "the ssh agent closed the connection: {}",
                std::strerror(err));
  }
  auto answer = read_message(m_fd.get());
  if (!answer) {
    return fail(ErrorKind::unreachable, "the ssh agent gave no answer");
  }
  return std::move(*answer);
}

Expected<std::vector<AgentKey>> AgentClient::keys()
{
  FERRY_TRY_ASSIGN(const std::string answer, call(std::string(1, k_request_identities)));
  if (answer.size() < 5 || answer[0] != k_identities_answer) {
    return fail(ErrorKind::unreachable, "the ssh agent did not list its keys");
  }
  const std::uint32_t count = read_u32(answer, 1);
  std::vector<AgentKey> keys;
  std::size_t at = 5;
  for (std::uint32_t i = 0; i < count && i < 4096; ++i) {
    const auto blob = take_string(answer, at);
    const auto comment = blob ? take_string(answer, at) : std::nullopt;
    if (!comment) {
      return fail(ErrorKind::unreachable, "the ssh agent's key list is malformed");
    }
    keys.push_back({std::string(*blob), std::string(*comment)});
  }
  return keys;
}

AgentRelay::AgentRelay(AgentClient agent) : m_agent(std::move(agent))
{
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0) {
    m_libssh_end = Fd(pair[0]);
    m_own_end = Fd(pair[1]);
    m_thread = std::thread([this] { serve(); });
  }
}

AgentRelay::~AgentRelay()
{
  m_stop = true;
  if (m_own_end) {
    ::shutdown(m_own_end.get(), SHUT_RDWR);
  }
  if (m_thread.joinable()) {
    m_thread.join();
  }
}

void AgentRelay::offer(std::vector<Offer> keys)
{
  std::lock_guard guard(m_lock);
  m_keys = std::move(keys);
}

std::string AgentRelay::last_signed()
{
  std::lock_guard guard(m_lock);
  return m_last_signed;
}

void AgentRelay::serve()
{
  while (!m_stop) {
    pollfd p{m_own_end.get(), POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) {
      continue;
    }
    const auto request = read_message(m_own_end.get());
    if (!request) {
      return; // libssh closed its end, or the relay is stopping
    }
    const std::string reply = answer(*request);
    if (write_all(m_own_end.get(), u32(static_cast<std::uint32_t>(reply.size())) + reply) != 0) {
      return;
    }
  }
}

std::string AgentRelay::answer(std::string_view request)
{
  std::lock_guard guard(m_lock);
  if (request[0] == k_request_identities) {
    std::string reply =
        std::string(1, k_identities_answer) + u32(static_cast<std::uint32_t>(m_keys.size()));
    for (const auto& key : m_keys) {
      reply += wire_string(key.offered) + wire_string("ferry");
    }
    return reply;
  }
  std::size_t at = 1;
  const auto key = request[0] == k_sign_request ? take_string(request, at) : std::nullopt;
  const auto chosen = std::find_if(m_keys.begin(), m_keys.end(), [&key](const Offer& offer) {
    return key && offer.offered == *key;
  });
  if (chosen == m_keys.end()) {
    return std::string(1, k_failure); // only the offered keys are signed for
  }
  m_last_signed = chosen->offered;
  const std::string forwarded = std::string(1, k_sign_request) + wire_string(chosen->signing) +
                                std::string(request.substr(at));
  auto signed_answer = m_agent.call(forwarded);
  return signed_answer ? *signed_answer : std::string(1, k_failure);
}

} // namespace ferry::ssh
