#pragma once
// ProxyCommand and ProxyJump run by ferry itself, not by libssh: libssh 0.10 sends the
// command's stderr to /dev/null, so a failing bastion ("Host key verification failed", "Could
// not resolve hostname") showed only as a reset connection. Here the command's stdin and stdout
// are one end of a socket pair that libssh uses as its connection (SSH_OPTIONS_FD), and its
// stderr is kept (the last few KiB) for the error message and echoed under -v.
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <sys/types.h>

#include "ferry/expected.hpp"
#include "ferry/fd.hpp"

namespace ferry::ssh {

class ProxyProcess {
public:
  // Starts argv (argv[0] looked up on PATH). `log` gets each line of its stderr; may be empty.
  [[nodiscard]] static Expected<std::unique_ptr<ProxyProcess>>
  start(const std::vector<std::string>& argv, std::function<void(std::string)> log);
  ~ProxyProcess();
  ProxyProcess(const ProxyProcess&) = delete;
  ProxyProcess& operator=(const ProxyProcess&) = delete;

  // ferry's end of the connection (owned here: libssh does not close a descriptor it was given).
  [[nodiscard]] int socket() const { return m_socket.get(); }
  // Waits up to `wait_ms` for the command to end; its exit status (128+N for signal N) if it did.
  [[nodiscard]] std::optional<int> exit_status(int wait_ms);
  // What the command wrote on stderr (at most the last 4 KiB), made safe for a terminal.
  [[nodiscard]] std::string stderr_text();

private:
  ProxyProcess() = default;
  void read_stderr();
  void take_stderr(std::string_view bytes, std::string& line);

  pid_t m_pid = -1;
  std::optional<int> m_status;
  Fd m_socket;
  Fd m_stderr;
  std::function<void(std::string)> m_log;
  std::mutex m_lock;
  std::string m_tail;
  bool m_stderr_done = false;
  std::atomic<bool> m_stop{false};
  std::thread m_reader;
};

} // namespace ferry::ssh
