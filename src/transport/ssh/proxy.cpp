#include "transport/ssh/proxy.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ferry/text.hpp"

extern char** environ;

namespace ferry::ssh {

namespace {

constexpr std::size_t k_stderr_kept = 4096;

int decode_status(int status)
{
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

} // namespace

Expected<std::unique_ptr<ProxyProcess>> ProxyProcess::start(const std::vector<std::string>& argv,
                                                            std::function<void(std::string)> log)
{
  int pair[2];
  int err[2];
  if (argv.empty() || ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    return fail(ErrorKind::unreachable, "cannot create a socket pair for the proxy command: {}",
                std::strerror(errno));
  }
  Fd ours(pair[0]), theirs(pair[1]);
  if (::pipe2(err, O_CLOEXEC) != 0) {
    return fail(ErrorKind::unreachable, "cannot create a pipe for the proxy command: {}",
                std::strerror(errno));
  }
  Fd err_read(err[0]), err_write(err[1]);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, theirs.get(), 0);
  posix_spawn_file_actions_adddup2(&actions, theirs.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, err_write.get(), 2);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE); // ferry ignores it; the command should not inherit that
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> args;
  for (const auto& arg : argv) {
    args.push_back(const_cast<char*>(arg.c_str()));
  }
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, args[0], &actions, &attributes, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (rc != 0) {
    return fail(ErrorKind::unreachable, "cannot run {}: {}", terminal_safe(argv[0]),
                std::strerror(rc));
  }
  std::unique_ptr<ProxyProcess> proxy(new ProxyProcess());
  proxy->m_pid = pid;
  proxy->m_socket = std::move(ours);
  proxy->m_stderr = std::move(err_read);
  proxy->m_log = std::move(log);
  proxy->m_reader = std::thread([p = proxy.get()] { p->read_stderr(); });
  return proxy;
}

ProxyProcess::~ProxyProcess()
{
  // The end of its connection ends a well-behaved proxy; TERM and then KILL the others.
  m_socket.reset();
  if (!exit_status(300)) {
    ::kill(m_pid, SIGTERM);
    if (!exit_status(1000)) {
      ::kill(m_pid, SIGKILL);
      (void)exit_status(5000);
    }
  }
  m_stop = true;
  if (m_reader.joinable()) {
    m_reader.join();
  }
}

std::optional<int> ProxyProcess::exit_status(int wait_ms)
{
  for (int waited = 0; !m_status; waited += 10) {
    int status = 0;
    const pid_t done = ::waitpid(m_pid, &status, WNOHANG);
    if (done == m_pid) {
      m_status = decode_status(status);
    } else if (done < 0 && errno != EINTR) {
      m_status = -1; // not ours to wait for any more
    } else if (waited >= wait_ms) {
      break;
    } else {
      ::poll(nullptr, 0, 10);
    }
  }
  if (m_status) {
    // Give the reader a moment to take in the last of stderr.
    for (int waited = 0; waited < wait_ms + 200; waited += 10) {
      std::lock_guard guard(m_lock);
      if (m_stderr_done) {
        break;
      }
      ::poll(nullptr, 0, 10);
    }
  }
  return m_status;
}

std::string ProxyProcess::stderr_text()
{
  std::lock_guard guard(m_lock);
  return terminal_safe(trim(m_tail));
}

void ProxyProcess::take_stderr(std::string_view bytes, std::string& line)
{
  std::lock_guard guard(m_lock);
  m_tail.append(bytes);
  if (m_tail.size() > k_stderr_kept) {
    m_tail.erase(0, m_tail.size() - k_stderr_kept);
  }
  for (const char c : bytes) {
    if (c != '\n') {
      if (line.size() < 1000) {
        line += c;
      }
    } else {
      if (m_log) {
        m_log("proxy: " + terminal_safe(line));
      }
      line.clear();
    }
  }
}

void ProxyProcess::read_stderr()
{
  std::string line;
  char buffer[1024];
  while (!m_stop) {
    pollfd p{m_stderr.get(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) {
      continue;
    }
    const ssize_t n = ::read(m_stderr.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      break;
    }
    take_stderr(std::string_view(buffer, static_cast<std::size_t>(n)), line);
  }
  if (m_log && !line.empty()) {
    m_log("proxy: " + terminal_safe(line));
  }
  std::lock_guard guard(m_lock);
  m_stderr_done = true;
}

} // namespace ferry::ssh
