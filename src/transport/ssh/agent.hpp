#pragma once
// The ssh-agent, spoken to directly (draft-miller-ssh-agent): libssh 0.10 can only offer every
// key an agent holds, in the agent's order, which is how a crowded agent uses up the server's
// MaxAuthTries before the right key. ferry lists the keys itself and puts an AgentRelay between
// libssh and the agent that shows libssh only the keys ferry chose, in ferry's order.
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ferry/expected.hpp"
#include "ferry/fd.hpp"

namespace ferry::ssh {

struct AgentKey {
  std::string blob; // the public key or certificate, as the agent lists it
  std::string comment;
};

// One connection to an agent's socket.
class AgentClient {
public:
  [[nodiscard]] static Expected<AgentClient> connect(const std::string& socket_path);

  [[nodiscard]] Expected<std::vector<AgentKey>> keys();
  // One request (its body, without the length) and the agent's answer (likewise).
  [[nodiscard]] Expected<std::string> call(std::string_view request);

private:
  explicit AgentClient(Fd fd) : m_fd(std::move(fd)) {}
  Fd m_fd;
};

// A stand-in agent on a socket pair. libssh gets one end (ssh_set_agent_socket); a thread
// answers on the other: the identity list holds only the keys chosen with offer(), in that
// order, and a signing request for one of them goes on to the real agent, for the key that
// really signs (the plain key when a certificate from a file is offered).
class AgentRelay {
public:
  explicit AgentRelay(AgentClient agent);
  ~AgentRelay();
  AgentRelay(const AgentRelay&) = delete;
  AgentRelay& operator=(const AgentRelay&) = delete;

  // libssh's end of the pair; the caller passes it on to libssh, which closes it.
  [[nodiscard]] int release_libssh_end() { return m_libssh_end.release(); }
  struct Offer {
    std::string offered; // listed to libssh
    std::string signing; // the agent key that signs for it
  };
  // The keys libssh sees next.
  void offer(std::vector<Offer> keys);
  // The offered blob of the last key a signature was asked for (the one the server took).
  [[nodiscard]] std::string last_signed();

private:
  void serve();
  std::string answer(std::string_view request);

  AgentClient m_agent;
  Fd m_libssh_end;
  Fd m_own_end;
  std::mutex m_lock;
  std::vector<Offer> m_keys;
  std::string m_last_signed;
  std::atomic<bool> m_stop{false};
  std::thread m_thread;
};

} // namespace ferry::ssh
