// The connection holder: a small background process that keeps one authenticated SSH session
// open after a run, for later ferry invocations of the same user to use through its Unix socket
// (docs/persistence.md). It serves each client on a thread of its own, every run on its own
// channel of the session, and ends when idle for its persist time, when asked
// (`ferry disconnect`), when the connection drops, or when the host's key is no longer trusted.
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <map>

#include "ferry/held.hpp"
#include "ferry/remote/launcher.hpp"
#include "ferry/sessions.hpp"
#include "ferry/util.hpp"
#include "transport/held/place.hpp"
#include "transport/held/wire.hpp"

namespace ferry::held {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr std::size_t k_held_output_cap = 64 * 1024;
// Idle work (SshConnection::prepare_idle): once this long has passed without a client, and
// again after this long.
constexpr auto k_idle_work_after = std::chrono::seconds(2);
constexpr auto k_idle_work_every = std::chrono::minutes(10);

Message ok(Message fields = Message::object())
{
  fields["ok"] = true;
  return fields;
}

template <typename T> Message reply_of(const Expected<T>& result, const char* name)
{
  if (!result) {
    return error_message(result.error());
  }
  if constexpr (std::is_void_v<T>) {
    (void)name;
    return ok();
  } else {
    return ok({{name, *result}});
  }
}

class Holder {
public:
  Holder(SshConnection& session, Fd listener, fs::path socket, ino_t inode, int persist_s)
      : m_session(session), m_listener(std::move(listener)), m_socket(std::move(socket)),
        m_socket_inode(inode), m_persist(std::chrono::seconds(persist_s)),
        m_since(utc_iso(std::chrono::system_clock::now()))
  {
    // The next run's standby opens while this run's job runs, not after it: a run that comes
    // right after finds it further along.
    m_session.on_ahead_taken([this] { want_standby(); });
  }
  Holder(const Holder&) = delete;
  Holder& operator=(const Holder&) = delete;
  ~Holder() { m_session.on_ahead_taken({}); }

  // Whether every client has gone (the session may be torn down).
  [[nodiscard]] bool idle() const { return m_clients == 0; }

  void serve()
  {
    std::thread preparer([this] { prepare_loop(); });
    // At once, not only once idle: runs that follow one another closely (a script's loop) may
    // never leave the holder idle, and would all go without a python standby.
    want(m_start_wanted);
    auto idle_since = Clock::now();
    std::optional<Clock::time_point> idle_work_at; // when prepare_idle was last asked for
    while (!m_exit && !interrupt_requested()) {
      pollfd p{m_listener.get(), POLLIN, 0};
      if (::poll(&p, 1, 500) > 0) {
        accept_one();
      }
      const auto now = Clock::now();
      if (m_clients > 0) {
        idle_since = now;
        // Clients that stay connected but ask nothing (stopped, or silent) do not keep it past
        // its persist time; a request under way (an upload, a run) does.
        if (m_requests == 0 && now - last_heard() >= m_persist) {
          break;
        }
        continue;
      }
      if (now - idle_since >= m_persist || !m_session.alive()) {
        break;
      }
      // Work that may take round trips (the python standby's script into the job cache) is
      // done once nobody has come for a while, and again every few minutes.
      if (now - idle_since >= k_idle_work_after && (!idle_work_at || *idle_work_at < idle_since ||
                                                    now - *idle_work_at >= k_idle_work_every)) {
        idle_work_at = now;
        want(m_idle_wanted);
      }
    }
    close_socket();
    {
      // Under the preparer's lock: it cannot miss the wake-up between its look and its wait.
      const std::lock_guard lock(m_prepare_mutex);
      m_exit = true;
    }
    m_prepare.notify_one();
    // Runs under way when told to go end as on an interrupt: their jobs are stopped. Before the
    // preparer is waited for: its SFTP steps wait for the runs' (let_runs_go_first).
    request_interrupt();
    preparer.join();
    for (auto until = Clock::now() + 15s; m_clients > 0 && Clock::now() < until;) {
      std::this_thread::sleep_for(20ms);
    }
  }

private:
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
    heard();
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

  void serve_client(int fd)
  {
    ClientRuns runs(*this);
    while (!m_exit && !interrupt_requested()) {
      Message request;
      const auto got = receive_message(fd, request, 500ms);
      if (got == Received::timeout) {
        continue;
      }
      if (got != Received::message || !request.is_object()) {
        return;
      }
      heard();
      Message reply;
      try {
        const Busy busy(m_requests);
        reply = dispatch(fd, request, runs);
      } catch (const std::exception& e) {
        reply = error_message({ErrorKind::failed, fmt::format("bad request: {}", e.what())});
      }
      heard(); // a run's end counts: its persist time starts after it
      if (!send_message(fd, reply)) {
        return;
      }
      if (request.value("op", "") == "launch") {
        want_standby();
      }
    }
  }

  // The next run's channel is opened here, after a run has answered its client: no client
  // waits for it.
  void prepare_loop()
  {
    std::unique_lock lock(m_prepare_mutex);
    while (!m_exit) {
      m_prepare.wait(
          lock, [this] { return m_exit || m_standby_wanted || m_idle_wanted || m_start_wanted; });
      if (m_exit) {
        return;
      }
      const bool idle = std::exchange(m_idle_wanted, false);
      const bool start = std::exchange(m_start_wanted, false);
      m_standby_wanted = false;
      lock.unlock();
      if (idle) {
        m_session.prepare_idle();
      } else if (start) {
        // A sh standby first, for a run that comes meanwhile; it stays for that run, and the
        // standby after it is a python one.
        m_session.prepare_ahead();
        m_session.prepare_interpreter();
      }
      m_session.prepare_ahead(); // nothing to do when a standby is there
      lock.lock();
    }
  }
  void want_standby() { want(m_standby_wanted); }
  void want(bool& flag)
  {
    {
      const std::lock_guard lock(m_prepare_mutex);
      flag = true;
    }
    m_prepare.notify_one();
  }

  Message hello(const Message& request)
  {
    if (request.value("protocol", 0) != k_protocol) {
      return {{"gone", true}, {"why", "another protocol version"}};
    }
    if (!m_session.alive()) {
      m_exit = true;
      return {{"gone", true}, {"why", "its connection has ended"}};
    }
    // known_hosts as it reads now decides, as for a direct connection.
    if (auto trusted = m_session.recheck_host_key(); !trusted) {
      m_exit = true;
      return error_message(trusted.error());
    }
    return ok({{"target", m_session.target()},
               {"pid", ::getpid()},
               {"since", m_since},
               {"label", m_session.label()}});
  }

  // The runs a client staged and has not finished: finished for it when it goes (removed, unless
  // its launcher said it removed the directory itself).
  struct ClientRuns {
    explicit ClientRuns(Holder& owner) : holder(owner) {}
    ClientRuns(const ClientRuns&) = delete;
    ClientRuns& operator=(const ClientRuns&) = delete;
    ~ClientRuns()
    {
      for (auto& [id, run] : runs) {
        (void)holder.m_session.finish(run.staged,
                                      run.removed ? Finish::by_launcher : Finish::remove);
      }
    }
    struct Run {
      StagedRun staged;
      bool removed = false; // its launcher's report said it removed the run directory
    };
    Holder& holder;
    std::map<std::uint64_t, Run> runs;
  };

  Message dispatch(int fd, const Message& request, ClientRuns& runs)
  {
    const std::string op = request.at("op").get<std::string>();
    if (op == "hello") {
      return hello(request);
    }
    if (op == "exit" || op == "info") {
      m_exit = m_exit || op == "exit";
      return ok({{"label", m_session.label()}, {"pid", ::getpid()}, {"since", m_since}});
    }
    if (op == "stage") {
      auto staged = m_session.stage(decode_bundle(request.at("bundle")), StopToken::make());
      if (!staged) {
        return error_message(staged.error());
      }
      staged->id = ++m_last_run;
      runs.runs[staged->id] = {*staged, false};
      return ok({{"run", encode(*staged)}});
    }
    const auto id = request.at("run").get<std::uint64_t>();
    const auto it = runs.runs.find(id);
    if (it == runs.runs.end()) {
      return error_message({ErrorKind::failed, fmt::format("no run {} staged by this client", id)});
    }
    StagedRun& run = it->second.staged;
    if (op == "launch") {
      return launch(fd, request, it->second);
    }
    if (op == "fetch") {
      return fetch(fd, run, request.at("path").get<std::string>());
    }
    if (op == "list") {
      auto entries = m_session.list(run, request.at("path").get<std::string>());
      return entries ? ok({{"entries", encode(*entries)}}) : error_message(entries.error());
    }
    if (op == "finish") {
      auto finished = m_session.finish(run, static_cast<Finish>(request.at("how").get<int>()));
      runs.runs.erase(it);
      return reply_of(finished, "");
    }
    return error_message({ErrorKind::failed, fmt::format("unknown request {}", op)});
  }

  Message fetch(int fd, const StagedRun& run, const std::string& rel)
  {
    auto file = m_session.fetch(run, rel, [fd](std::string_view chunk) -> Expected<void> {
      if (!send_message(fd, {{"chunk", bytes_of(chunk)}})) {
        return fail(ErrorKind::failed, "ferry went away");
      }
      return {};
    });
    return file ? ok({{"file", encode(*file)}}) : error_message(file.error());
  }

  // A launch's events to its client, from the run's thread and the watcher's (one message at a
  // time). A client that takes none for a while (stopped) counts as gone: its job is stopped.
  struct ClientLink {
    int fd;
    StopToken stop;
    std::mutex mutex;
    bool broken = false;
    Clock::time_point last_sent = Clock::now();
    void send(const Message& m)
    {
      const std::lock_guard lock(mutex);
      if (!broken && !send_message(fd, m)) {
        broken = true;
        stop.request_stop();
      }
      last_sent = Clock::now();
    }
    // The holder is alive although the job says nothing: ferry waits on (k_holder_silence).
    void beat_if_quiet()
    {
      if (const std::lock_guard lock(mutex); Clock::now() - last_sent < k_beat_every) {
        return;
      }
      send({{"ev", "beat"}});
    }
  };

  // The job's output goes to the client as it comes; a `stop` from the client, or the client
  // going away, stops the job as an interrupt would.
  Message launch(int fd, const Message& message, ClientRuns::Run& run)
  {
    LaunchRequest request = decode_launch(message.at("request"));
    // ferry keeps the output from the events below; what the holder keeps is only a backstop.
    request.output_cap = std::min<std::size_t>(request.output_cap, k_held_output_cap);
    const StopToken stop = StopToken::make();
    request.stop = stop;
    run.staged.stop = stop;
    ClientLink link{fd, stop, {}, false, Clock::now()};
    request.on_output = [&link](OutputStream stream, std::string_view bytes) {
      link.send({{"ev", stream == OutputStream::out ? "out" : "err"}, {"bytes", bytes_of(bytes)}});
    };
    request.on_note = [&link](std::string_view text) {
      link.send({{"ev", "note"}, {"text", std::string(text)}});
    };
    // The watcher waits on the client and on a pipe that the end of the run closes: the outcome
    // goes out as soon as the run ends, not at the watcher's next look.
    int wake[2];
    if (::pipe2(wake, O_CLOEXEC) != 0) {
      return error_message(Error{ErrorKind::failed, "cannot make a pipe for the run"});
    }
    Fd wake_read(wake[0]);
    Fd wake_write(wake[1]);
    std::thread watcher([&] { watch_client(link, wake_read.get()); });
    auto outcome = m_session.launch(run.staged, request);
    wake_write.reset();
    watcher.join();
    if (!outcome) {
      return error_message(outcome.error());
    }
    const auto report = outcome->out.launcher_report
                            ? parse_launcher_report(*outcome->out.launcher_report)
                            : std::nullopt;
    run.removed = report && report->run_dir_removed;
    return ok({{"outcome", encode(*outcome)}});
  }

  // Until `wake` is closed: a `stop` from the client, or the client going away, stops the run.
  static void watch_client(ClientLink& link, int wake)
  {
    const int fd = link.fd;
    const StopToken& stop = link.stop;
    for (;;) {
      pollfd p[2] = {{fd, POLLIN, 0}, {wake, POLLIN, 0}};
      const int ready =
          ::poll(p, 2, static_cast<int>(std::chrono::milliseconds(k_beat_every).count()));
      if (ready == 0) {
        link.beat_if_quiet();
        continue;
      }
      if (ready < 0) {
        if (errno == EINTR) {
          continue;
        }
        stop.request_stop();
        return;
      }
      if (p[1].revents != 0) {
        return;
      }
      Message m;
      const auto got = receive_message(fd, m, 100ms);
      if (got == Received::timeout) {
        continue;
      }
      if (got != Received::message || m.value("op", "") == "stop") {
        stop.request_stop();
        if (got != Received::message) {
          return;
        }
      }
    }
  }

  SshConnection& m_session;
  Fd m_listener;
  fs::path m_socket;
  ino_t m_socket_inode;
  Clock::duration m_persist;
  std::string m_since;
  std::atomic<int> m_clients{0};
  std::atomic<int> m_requests{0}; // requests under way (a stage, a run, a fetch)
  std::atomic<Clock::rep> m_last_heard{Clock::now().time_since_epoch().count()};
  void heard() { m_last_heard = Clock::now().time_since_epoch().count(); }
  [[nodiscard]] Clock::time_point last_heard() const
  {
    return Clock::time_point(Clock::duration(m_last_heard.load()));
  }
  // Counts a request under way for as long as it lives.
  struct Busy {
    explicit Busy(std::atomic<int>& n) : count(n) { ++count; }
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;
    ~Busy() { --count; }
    std::atomic<int>& count;
  };
  std::atomic<std::uint64_t> m_last_run{0}; // the runs' ids
  std::atomic<bool> m_exit{false};
  std::mutex m_prepare_mutex;
  std::condition_variable m_prepare;
  bool m_standby_wanted = false;
  bool m_idle_wanted = false;
  bool m_start_wanted = false; // prepare_interpreter, once, as the holder starts
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
  if (!fd || bound != 0 || ::chmod(fresh.c_str(), 0600) != 0 || ::listen(fd.get(), 64) != 0 ||
      ::lstat(fresh.c_str(), &st) != 0 || ::rename(fresh.c_str(), socket.c_str()) != 0) {
    const int e = errno;
    ::unlink(fresh.c_str());
    return fail(ErrorKind::failed, "cannot listen at {}: {}", socket.string(), std::strerror(e));
  }
  inode = st.st_ino;
  return fd;
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
  target.remote_base = spec.at("remote_base").get<std::string>();
  target.retries = 0;
  return target;
}

} // namespace

nlohmann::json holder_spec(const SshTarget& target, int persist_s, const fs::path& socket)
{
  return {{"spec", target.spec},
          {"identity", target.identity},
          {"known_hosts", target.known_hosts},
          {"ssh_config", target.ssh_config},
          {"accept_new_host_key", target.accept_new_host_key},
          {"connect_timeout_s", target.connect_timeout_s},
          {"remote_base", target.remote_base},
          {"persist_s", persist_s},
          {"socket", socket.string()}};
}

int run_holder(std::string_view spec_text)
{
  const auto spec = nlohmann::json::parse(spec_text, nullptr, false);
  if (!spec.is_object() || !spec.contains("socket")) {
    std::fputs("ferry: __hold is ferry's own connection holder; it is not run by hand\n", stderr);
    return 2;
  }
  const fs::path socket = spec.at("socket").get<std::string>();
  // One holder per connection: the second to start leaves at once.
  Fd lock(::open(lock_path(socket).c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!lock || ::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    return 0;
  }
  auto session = make_checked_ssh_session(target_of(spec));
  if (!session || !(*session)->connect()) {
    return 1;
  }
  // The connection checked by a connect like any other; its identity must be the one named.
  if (socket_path(socket.parent_path(), (*session)->options_identity()) != socket) {
    std::fputs("ferry holder: the options resolved differently; not holding\n", stderr);
    return 1;
  }
  // SFTP started now, not in the first client's run (3 round trips fewer for it).
  (*session)->prepare_files();
  ino_t inode = 0;
  auto listener = listen_at(socket, inode);
  if (!listener) {
    std::fprintf(stderr, "ferry holder: %s\n", listener.error().message.c_str());
    return 1;
  }
  Holder holder(**session, std::move(*listener), socket, inode,
                spec.value("persist_s", k_default_persist_s));
  holder.serve();
  if (!holder.idle()) {
    // Threads that did not finish in time still use the session: leave without tearing it down.
    std::fflush(nullptr);
    ::_exit(0);
  }
  return 0;
}

} // namespace ferry::held
