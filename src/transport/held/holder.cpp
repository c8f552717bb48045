// The connection holder: one small background process per user (and ferry protocol version)
// that keeps the authenticated SSH sessions of every persisted connection open, for the
// invocations of that user to use through its one Unix socket (docs/persistence.md). The first
// run of a host asks it to connect (as `ControlMaster auto` does); each client connection is
// served on a thread of its own, the hosts' preparing by a fixed few threads (PreparePool), and
// every host's expiry by the one main loop here. It ends when it has held nothing for a moment.
#include <cerrno>
#include <cstring>
#include <map>

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "ferry/held.hpp"
#include "ferry/util.hpp"
#include "transport/held/held_host.hpp"
#include "transport/held/place.hpp"
#include "transport/held/wire.hpp"

namespace ferry::held {

namespace fs = std::filesystem;

namespace {

using namespace std::chrono_literals;

// Idle work (SshConnection::prepare_idle): once this long has passed without a client, and
// again after this long.
constexpr auto k_idle_work_after = std::chrono::seconds(2);
constexpr auto k_idle_work_every = std::chrono::minutes(10);
// Holding no session and serving no client this long, the holder leaves.
constexpr auto k_linger = 1500ms;
// A client says what it wants at once; a connection silent this long is closed.
constexpr auto k_first_message = 2s;
constexpr int k_preparers = 3;
// A user asked for a second factor has this long to type it (sshd's LoginGraceTime is 120 s).
constexpr std::chrono::milliseconds k_answer_within = 180s;
// `ferry disconnect` is answered once the host is gone (its preparing step done, its session
// torn down), or after this long (its client waits 10 s for the answer).
constexpr auto k_end_settles_within = 8s;

Message gone(std::string_view why)
{
  return {{"gone", true}, {"why", std::string(why)}};
}

SshTarget target_of(const nlohmann::json& spec)
{
  SshTarget target;
  target.spec = spec.at("spec").get<std::string>();
  target.identity = spec.at("identity").get<std::string>();
  target.known_hosts = spec.at("known_hosts").get<std::string>();
  target.ssh_config = spec.at("ssh_config").get<std::string>();
  target.accept_new_host_key = spec.at("accept_new_host_key").get<bool>();
  target.connect_timeout_s = spec.at("connect_timeout_s").get<double>();
  target.retries = spec.value("retries", 1);
  target.remote_base = spec.at("remote_base").get<std::string>();
  return target;
}

// The holder has no terminal: the client that asked for the connect answers the host's
// keyboard-interactive prompts on its own, over its connection. The answers stay in memory.
Prompter relay_to(int fd)
{
  return [fd](const PromptRound& round) -> Expected<std::vector<std::string>> {
    Message reply;
    if (!send_message(fd, {{"ev", "prompt"}, {"round", encode(round)}}) ||
        receive_message(fd, reply, k_answer_within) != Received::message || !reply.is_object()) {
      return fail(ErrorKind::unreachable,
                  "{}: no answer to its keyboard-interactive prompts came back within {} s",
                  round.host, k_answer_within.count() / 1000);
    }
    if (auto error = error_in(reply)) {
      return Unexpected{*error};
    }
    std::vector<std::string> answers;
    for (const auto& answer : reply.value("answers", Message::array())) {
      answers.push_back(text_of(answer));
    }
    return answers;
  };
}

// What a failed connect tells the client: errors a direct connect would give the same way
// (unreachable, authentication, host key: exit 3) are its answer; anything else the holder
// cannot judge for the client, which then connects directly.
Message connect_failure(const Error& error)
{
  if (error.kind == ErrorKind::failed) {
    return gone(fmt::format("it could not connect: {}", error.message));
  }
  return error_message(error);
}

class Holder {
public:
  Holder(Fd listener, fs::path socket, ino_t inode)
      : m_listener(std::move(listener)), m_socket(std::move(socket)), m_socket_inode(inode),
        m_since(utc_iso(std::chrono::system_clock::now()))
  {
  }
  Holder(const Holder&) = delete;
  Holder& operator=(const Holder&) = delete;
  ~Holder() { m_pool.stop(); }

  // Whether every client has gone (the sessions may be torn down).
  [[nodiscard]] bool idle() const { return m_clients == 0; }

  void serve()
  {
    auto empty_since = Clock::now();
    while (!m_exit && !interrupt_requested()) {
      pollfd p{m_listener.get(), POLLIN, 0};
      if (::poll(&p, 1, 250) > 0) {
        accept_one();
      }
      const auto now = Clock::now();
      if (expire_hosts(now) || m_bound > 0) {
        empty_since = now;
      } else if (now - empty_since >= k_linger) {
        break;
      }
    }
    shut_down();
  }

private:
  void shut_down()
  {
    close_socket();
    m_exit = true;
    for (auto& host : hosts()) {
      host->end();
    }
    // Runs under way end as on an interrupt: their jobs are stopped. Before the preparers are
    // waited for: their SFTP steps wait for the runs' (let_runs_go_first).
    request_interrupt();
    m_pool.stop();
    for (auto until = Clock::now() + 15s; m_clients > 0 && Clock::now() < until;) {
      std::this_thread::sleep_for(20ms);
    }
    if (idle()) {
      const std::lock_guard lock(m_hosts_mutex);
      m_hosts.clear();
    }
  }

  std::vector<std::shared_ptr<HeldHost>> hosts()
  {
    const std::lock_guard lock(m_hosts_mutex);
    std::vector<std::shared_ptr<HeldHost>> all;
    for (const auto& [key, host] : m_hosts) {
      all.push_back(host);
    }
    return all;
  }

  // Ends the hosts whose time is up; whether any is left.
  bool expire_hosts(Clock::time_point now)
  {
    const auto all = hosts();
    for (const auto& host : all) {
      if (host->state == HeldHost::State::ready && host_expired(*host, now)) {
        end_host(host);
      }
    }
    return !all.empty();
  }

  bool host_expired(HeldHost& host, Clock::time_point now)
  {
    const auto persist = host.persist_time();
    if (host.clients > 0) {
      host.idle_since = now;
      // Clients that stay connected but ask nothing (stopped, or silent) do not keep it past
      // its persist time; a request under way (an upload, a run) does.
      return host.requests == 0 && now - host.last_heard_at() >= persist;
    }
    if (now - host.idle_since >= persist || !host.session->alive()) {
      return true;
    }
    if (host.start_pending.exchange(false)) {
      m_pool.want(host.shared_from_this(), PreparePool::Wish::start);
    }
    // Work that may take round trips (the python standby's script into the job cache) is done
    // once nobody has come for a while, and again every few minutes.
    if (now - host.idle_since >= k_idle_work_after &&
        (!host.idle_work_at || *host.idle_work_at < host.idle_since ||
         now - *host.idle_work_at >= k_idle_work_every)) {
      host.idle_work_at = now;
      m_pool.want(host.shared_from_this(), PreparePool::Wish::idle);
    }
    return false;
  }

  // Its runs under way are stopped, its clients let go; the session goes with the last of them.
  void end_host(const std::shared_ptr<HeldHost>& host)
  {
    host->end();
    {
      const std::lock_guard lock(m_hosts_mutex);
      if (auto it = m_hosts.find(host->key); it != m_hosts.end() && it->second == host) {
        m_hosts.erase(it);
      }
    }
    m_pool.retire(host);
  }

  void accept_one()
  {
    Fd client(::accept4(m_listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!client) {
      return;
    }
    const auto peer = peer_of(client.get());
    if (!peer || peer->uid != ::getuid()) {
      return; // never serves another user: closed unanswered
    }
    ++m_clients;
    std::thread([this, fd = std::move(client)]() mutable {
      serve_client(fd.get());
      fd.reset();
      --m_clients;
    }).detach();
  }

  void close_socket()
  {
    // Only when the name is still ours: a holder that replaced this one keeps its socket.
    struct stat now {};
    if (::lstat(m_socket.c_str(), &now) == 0 && now.st_ino == m_socket_inode) {
      ::unlink(m_socket.c_str());
    }
  }

  // A client's first message says what it wants: a host's session (hello), or the holder's
  // own business (`ferry disconnect`).
  void serve_client(int fd)
  {
    Message request;
    if (receive_message(fd, request, k_first_message) != Received::message ||
        !request.is_object()) {
      return;
    }
    if (request.value("op", "") != "hello") {
      (void)send_message(fd, manage(request));
      return;
    }
    std::shared_ptr<HeldHost> host;
    Message reply;
    try {
      reply = hello(request, host, fd);
    } catch (const std::exception& e) {
      reply = gone(fmt::format("bad hello: {}", e.what()));
    }
    if (host) {
      ++m_bound;
      if (send_message(fd, reply)) {
        serve_host_client(host, m_pool, fd, m_exit);
      }
      --host->clients;
      --m_bound;
      return;
    }
    (void)send_message(fd, reply);
  }

  Message manage(const Message& request)
  {
    const std::string op = request.value("op", "");
    if (op == "info") {
      Message sessions = Message::array();
      for (const auto& host : hosts()) {
        if (host->state == HeldHost::State::ready) {
          sessions.push_back({{"key", host->key}, {"label", host->label}, {"since", host->since}});
        }
      }
      return ok_message({{"pid", ::getpid()}, {"since", m_since}, {"sessions", sessions}});
    }
    if (op == "end") {
      std::shared_ptr<HeldHost> host;
      {
        const std::lock_guard lock(m_hosts_mutex);
        if (auto it = m_hosts.find(request.value("key", "")); it != m_hosts.end()) {
          host = it->second;
        }
      }
      if (!host) {
        return ok_message({{"ended", false}});
      }
      const auto gone = host->gone();
      end_host(host);
      host.reset();
      (void)gone.wait_for(k_end_settles_within);
      return ok_message({{"ended", true}});
    }
    if (op == "exit") {
      m_exit = true;
      return ok_message();
    }
    return error_message({ErrorKind::failed, fmt::format("unknown request {}", op)});
  }

  // The held session for these options: the one there is (checked), or a new one, connected
  // now on this client's thread (its prompts relayed to the client on `fd`). `bound` is set
  // when the client may use it. A hello that asks only for an `existing` one (`ferry attach`)
  // connects nothing and leaves the session's persist time as it is.
  Message hello(const Message& request, std::shared_ptr<HeldHost>& bound, int fd)
  {
    if (request.value("protocol", 0) != k_protocol) {
      return gone("another protocol version");
    }
    const std::string identity = request.at("identity").get<std::string>();
    const nlohmann::json& target = request.at("target");
    const bool existing = request.value("existing", false);
    for (int attempt = 0; attempt < 2 && !m_exit; ++attempt) {
      const auto found =
          find_or_add(sha256_hex(identity), target.at("spec").get<std::string>(), !existing);
      const std::shared_ptr<HeldHost>& host = found.first;
      const bool fresh = found.second;
      if (!host) {
        return gone("it holds no session for these options");
      }
      Message story = Message::array();
      if (fresh) {
        SshTarget wanted = target_of(target);
        if (request.value("prompt", false)) {
          wanted.prompt = relay_to(fd);
        }
        story = connect_host(host, std::move(wanted), identity, request.value("verbose", false));
      }
      std::unique_lock lock(host->mutex);
      host->settled.wait(lock, [&] { return host->state != HeldHost::State::connecting; });
      if (host->state == HeldHost::State::failed) {
        Message failure = host->failure;
        failure["story"] = std::move(story);
        return failure;
      }
      lock.unlock();
      if (!fresh && !host->session->alive()) {
        end_host(host); // and connect anew
        if (existing) {
          return gone("its session for these options had ended");
        }
        continue;
      }
      // known_hosts as it reads now decides, as for a direct connection.
      if (auto trusted = fresh ? Expected<void>{} : host->session->recheck_host_key(); !trusted) {
        end_host(host);
        return error_message(trusted.error());
      }
      if (!existing) {
        host->persist = std::chrono::duration_cast<Clock::duration>(
                            std::chrono::seconds(request.value("persist_s", k_default_persist_s)))
                            .count();
      }
      ++host->clients;
      host->heard();
      bound = host;
      return ok_message({{"target", host->session->target()},
                         {"pid", ::getpid()},
                         {"since", host->since},
                         {"label", host->label},
                         {"connected", fresh},
                         {"story", std::move(story)}});
    }
    return gone("it is ending");
  }

  // The host kept for `key`, else (with `add`) a new one to connect; {nullptr, false}: none.
  std::pair<std::shared_ptr<HeldHost>, bool> find_or_add(const std::string& key,
                                                         const std::string& label, bool add)
  {
    const std::lock_guard lock(m_hosts_mutex);
    if (auto it = m_hosts.find(key); it != m_hosts.end()) {
      return {it->second, false};
    }
    if (!add) {
      return {nullptr, false};
    }
    auto host = std::make_shared<HeldHost>(key, label, utc_iso(std::chrono::system_clock::now()));
    m_hosts[key] = host;
    return {host, true};
  }

  // Connects as a direct run does (the same config, host-key policy and authentication).
  // Its `-v` story (config files read, the host key, the keys offered) goes back to the client
  // that asked for the connect when it asked for one.
  Message connect_host(const std::shared_ptr<HeldHost>& host, SshTarget target,
                       const std::string& identity, bool verbose)
  {
    struct Story {
      std::mutex mutex;
      Message lines = Message::array();
      bool told = false; // later lines (the session's own, after its connect) are not kept
    };
    const auto story = std::make_shared<Story>();
    if (verbose) {
      target.debug = [story](std::string_view line) {
        const std::lock_guard lock(story->mutex);
        if (!story->told) {
          story->lines.push_back(std::string(line));
        }
      };
    }
    Message failure;
    auto session = make_checked_ssh_session(target);
    if (!session) {
      failure = gone(fmt::format("it read the options differently: {}", session.error().message));
    } else if ((*session)->options_identity() != identity) {
      failure = gone("the options resolved differently in it (another environment)");
    } else if (auto connected = (*session)->connect(); !connected) {
      failure = connect_failure(connected.error());
    } else {
      const std::weak_ptr<HeldHost> weak = host;
      // The next run's standby opens while this run's job runs, not after it.
      (*session)->on_ahead_taken([this, weak] {
        if (auto h = weak.lock()) {
          m_pool.want(h, PreparePool::Wish::standby);
        }
      });
      host->session = std::move(*session);
    }
    {
      const std::lock_guard lock(host->mutex);
      if (host->session) {
        host->state = HeldHost::State::ready;
      } else {
        host->failure = failure;
        host->state = HeldHost::State::failed;
      }
    }
    host->settled.notify_all();
    if (!host->session) {
      end_host(host); // the next client connects anew
    }
    const std::lock_guard lock(story->mutex);
    story->told = true;
    return std::move(story->lines);
  }

  Fd m_listener;
  fs::path m_socket;
  ino_t m_socket_inode;
  std::string m_since;
  std::atomic<int> m_clients{0}; // client connections
  std::atomic<int> m_bound{0};   // of them, those bound to a host
  std::atomic<bool> m_exit{false};
  std::mutex m_hosts_mutex;
  std::map<std::string, std::shared_ptr<HeldHost>> m_hosts; // by key
  PreparePool m_pool{k_preparers};
};

// Listens on a fresh name, then renames it over the socket's: a stale socket of a dead holder
// is replaced in one step, and a client never finds a socket nobody listens on yet.
Expected<Fd> listen_at(const fs::path& socket, ino_t& inode)
{
  const fs::path fresh = socket.string() + "." + std::to_string(::getpid());
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (fresh.native().size() >= sizeof address.sun_path) {
    return fail(ErrorKind::failed, "{} is too long for a socket path", fresh.string());
  }
  std::memcpy(address.sun_path, fresh.c_str(), fresh.native().size() + 1);
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ::unlink(fresh.c_str());
  const mode_t old = ::umask(077);
  const int bound = ::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address);
  ::umask(old);
  struct stat st {};
  if (!fd || bound != 0 || ::chmod(fresh.c_str(), 0600) != 0 || ::listen(fd.get(), 256) != 0 ||
      ::lstat(fresh.c_str(), &st) != 0 || ::rename(fresh.c_str(), socket.c_str()) != 0) {
    const int e = errno;
    ::unlink(fresh.c_str());
    return fail(ErrorKind::failed, "cannot listen at {}: {}", socket.string(), std::strerror(e));
  }
  inode = st.st_ino;
  return fd;
}

bool lock_within(int fd, const fs::path& socket, Clock::duration limit)
{
  for (const auto until = Clock::now() + limit; ::flock(fd, LOCK_EX | LOCK_NB) != 0;) {
    if (Clock::now() >= until || dial(socket)) {
      return false; // another holder serves
    }
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

} // namespace

nlohmann::json holder_target(const SshTarget& target)
{
  // The holder serves clients started in other directories: paths go absolute.
  const auto absolute = [](const std::string& path) {
    return path.empty() || path[0] == '~' ? path : fs::absolute(path).string();
  };
  return {{"spec", target.spec},
          {"identity", absolute(target.identity)},
          {"known_hosts", absolute(target.known_hosts)},
          {"ssh_config", absolute(target.ssh_config)},
          {"accept_new_host_key", target.accept_new_host_key},
          {"connect_timeout_s", target.connect_timeout_s},
          {"retries", target.retries},
          {"remote_base", target.remote_base}};
}

int run_holder(std::string_view spec_text)
{
  const auto spec = nlohmann::json::parse(spec_text, nullptr, false);
  if (!spec.is_object() || !spec.contains("socket")) {
    std::fputs("ferry: __hold is ferry's own connection holder; it is not run by hand\n", stderr);
    return 2;
  }
  const fs::path socket = spec.at("socket").get<std::string>();
  // One holder: a second one leaves. It waits a moment first: the lock may be a leaving
  // holder's, whose socket is already gone (the client that started this one waits for it).
  Fd lock(::open(lock_path(socket).c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!lock || !lock_within(lock.get(), socket, 3s)) {
    return 0;
  }
  ino_t inode = 0;
  auto listener = listen_at(socket, inode);
  if (!listener) {
    std::fprintf(stderr, "ferry holder: %s\n", listener.error().message.c_str());
    return 1;
  }
  Holder holder(std::move(*listener), socket, inode);
  holder.serve();
  if (!holder.idle()) {
    // Threads that did not finish in time still use the sessions: leave without tearing down.
    std::fflush(nullptr);
    ::_exit(0);
  }
  return 0;
}

} // namespace ferry::held
