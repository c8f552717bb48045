// A held host's client requests (docs/persistence.md, "Serving runs"): each client connection
// on a thread of its own, every run on its own channel of the host's one session.
#include <cerrno>
#include <mutex>
#include <thread>
#include <utility>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include "ferry/fd.hpp"
#include "ferry/remote/launcher.hpp"
#include "ferry/remote/shell_neutral.hpp"
#include "ferry/text.hpp"
#include "transport/held/held_host.hpp"
#include "transport/held/wire.hpp"

namespace ferry::held {

namespace {

using namespace std::chrono_literals;

constexpr std::size_t k_held_output_cap = 64 * 1024;

std::atomic<std::uint64_t> g_last_run{0}; // the runs' ids, unique in the holder

// Counts a request under way for as long as it lives.
struct Busy {
  explicit Busy(std::atomic<int>& n) : count(n) { ++count; }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;
  ~Busy() { --count; }
  std::atomic<int>& count;
};

// Where a client's run comes from: staged here, or a directory the client named (adopt).
enum class Origin {
  staged,
  detached, // a detached run's directory, in the run base: its files read, removed at its finish
  proc,     // /proc, read for a detached launcher's liveness: its files read, nothing else
};

// The runs a client staged (or adopted) and has not finished: finished for it when it goes. A
// staged one is removed, unless its launcher said it removed the directory itself; an adopted
// one is only forgotten (its detached job goes on, for a later attach).
struct ClientRuns {
  ClientRuns(SshConnection& s, PreparePool& p) : session(s), pool(p) {}
  ClientRuns(const ClientRuns&) = delete;
  ClientRuns& operator=(const ClientRuns&) = delete;
  ~ClientRuns()
  {
    for (auto& [id, run] : runs) {
      unplan(run);
      if (run.origin == Origin::staged) {
        (void)session.finish(run.staged, run.removed ? Finish::by_launcher : Finish::remove);
      } else if (run.origin == Origin::detached) {
        (void)session.finish(run.staged, Finish::keep);
      }
    }
  }
  struct Run {
    StagedRun staged;
    bool removed = false; // its launcher's report said it removed the run directory
    Origin origin = Origin::staged;
    // Staged as the session's only run (plan 1): the session is the holder's again (plan
    // unknown: standbys stay) once it has ended, or is finished without an exec.
    bool only_run = false;
  };
  // A run the client staged; its only run counts among the holder's first runs until unplan.
  void add(const StagedRun& staged, bool only_run)
  {
    runs[staged.id] = {staged, false, Origin::staged, only_run};
    if (only_run) {
      pool.first_run_began(); // other hosts' start work waits for it (PreparePool)
    }
  }
  // After an only run's exec (or its finish without one): the session's plan is unknown again.
  void unplan(Run& run) const
  {
    if (std::exchange(run.only_run, false)) {
      session.plan(0, 1);
      pool.first_run_ended();
    }
  }
  SshConnection& session;
  PreparePool& pool;
  std::map<std::uint64_t, Run> runs;
};

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

// Until `wake` is closed: a `stop` from the client, or the client going away, stops the run.
void watch_client(ClientLink& link, int wake)
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

class HostClient {
public:
  HostClient(HeldHost& host, PreparePool& pool, int fd)
      : m_host(host), m_session(*host.session), m_fd(fd), m_runs(m_session, pool)
  {
  }

  Message dispatch(const Message& request)
  {
    const std::string op = request.at("op").get<std::string>();
    if (op == "stage") {
      return stage(request);
    }
    if (op == "adopt") {
      return adopt(request.at("run_dir").get<std::string>());
    }
    const auto id = request.at("run").get<std::uint64_t>();
    const auto it = m_runs.runs.find(id);
    if (it == m_runs.runs.end()) {
      return error_message({ErrorKind::failed, fmt::format("no run {} staged by this client", id)});
    }
    StagedRun& run = it->second.staged;
    const Origin origin = it->second.origin;
    if (op == "launch") {
      // ferry executes only the files it has just put in place (a detached run's launch.sh may
      // have been rewritten by its job): what was adopted is never launched.
      return origin == Origin::staged
                 ? launch(request, it->second)
                 : error_message({ErrorKind::failed,
                                  fmt::format("run {} was named by its directory, not staged "
                                              "through this holder: it is not launched",
                                              id)});
    }
    if (op == "fetch") {
      return fetch(run, request.at("path").get<std::string>(),
                   request.value("offset", std::uint64_t{0}));
    }
    if (op == "list") {
      auto entries = m_session.list(run, request.at("path").get<std::string>());
      return entries ? ok_message({{"entries", encode(*entries)}}) : error_message(entries.error());
    }
    if (op == "finish") {
      const auto how = static_cast<Finish>(request.at("how").get<int>());
      if (origin == Origin::proc) {
        m_runs.runs.erase(it);
        return how == Finish::remove ? error_message({ErrorKind::failed, "/proc is not removed"})
                                     : ok_message();
      }
      m_runs.unplan(it->second);
      auto finished = m_session.finish(run, how);
      m_runs.runs.erase(it);
      return finished ? ok_message() : error_message(finished.error());
    }
    return error_message({ErrorKind::failed, fmt::format("unknown request {}", op)});
  }

private:
  Message stage(const Message& request)
  {
    // The run of the client whose hello connected the host, its only one: it goes as a
    // direct connection's only run (no SFTP, no standby kept after it); the standbys of the
    // runs to come are the holder's preparing, after it.
    const bool only_run = request.value("only_run", false);
    if (only_run) {
      m_session.plan(1, 1);
    }
    auto staged = m_session.stage(decode_bundle(request.at("bundle")), StopToken::make());
    if (!staged) {
      if (only_run) {
        m_session.plan(0, 1);
      }
      return error_message(staged.error());
    }
    staged->id = ++g_last_run;
    m_runs.add(*staged, only_run);
    return ok_message({{"run", encode(*staged)}});
  }

  // A run directory the client names rather than stages (a detached run's, which an earlier
  // ferry staged): served only when it is one of ferry's run directories in this session's run
  // base (as staging finds and judges the base), or /proc (read-only).
  Message adopt(const std::string& dir)
  {
    auto origin = adoptable(dir);
    if (!origin) {
      return error_message(origin.error());
    }
    StagedRun staged;
    staged.run_dir = dir;
    staged.launcher.run_dir = dir;
    staged.id = ++g_last_run;
    m_runs.runs[staged.id] = {staged, false, *origin};
    return ok_message({{"run", {{"id", staged.id}}}});
  }

  Expected<Origin> adoptable(const std::string& dir)
  {
    if (dir == "/proc") {
      return Origin::proc;
    }
    FERRY_TRY_ASSIGN(const std::string base, m_session.run_base());
    const auto slash = dir.rfind('/');
    if (slash == std::string::npos || dir.substr(0, slash) != base ||
        !dir.substr(slash + 1).starts_with("ferry-") || !is_shell_neutral_token(dir)) {
      return fail(ErrorKind::failed,
                  "{}: '{}' is not a run directory in the run base {}; the holder serves only "
                  "ferry's own run directories there (a damaged record, or a run base changed "
                  "since the run started: try again with --persist 0)",
                  terminal_safe(m_host.label), terminal_safe(dir), terminal_safe(base));
    }
    return Origin::detached;
  }

  Message fetch(const StagedRun& run, const std::string& rel, std::uint64_t offset)
  {
    auto file = m_session.fetch(
        run, rel,
        [fd = m_fd](std::string_view chunk) -> Expected<void> {
          if (!send_message(fd, {{"chunk", bytes_of(chunk)}})) {
            return fail(ErrorKind::failed, "ferry went away");
          }
          return {};
        },
        offset);
    return file ? ok_message({{"file", encode(*file)}}) : error_message(file.error());
  }

  // The job's output goes to the client as it comes; a `stop` from the client, the client going
  // away, or the host's end (`ferry disconnect`) stops the job as an interrupt would.
  Message launch(const Message& message, ClientRuns::Run& run)
  {
    LaunchRequest request = decode_launch(message.at("request"));
    // ferry keeps the output from the events below; what the holder keeps is only a backstop.
    request.output_cap = std::min<std::size_t>(request.output_cap, k_held_output_cap);
    const StopToken stop = StopToken::make();
    request.stop = stop;
    run.staged.stop = stop;
    ClientLink link{m_fd, stop, {}, false, Clock::now()};
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
    m_host.launching(run.staged.id, stop);
    auto outcome = m_session.launch(run.staged, request);
    m_runs.unplan(run);
    m_host.launched(run.staged.id);
    wake_write.reset();
    watcher.join();
    if (!outcome) {
      return error_message(outcome.error());
    }
    const auto report = outcome->out.launcher_report
                            ? parse_launcher_report(*outcome->out.launcher_report)
                            : std::nullopt;
    run.removed = report && report->run_dir_removed;
    return ok_message({{"outcome", encode(*outcome)}});
  }

  HeldHost& m_host;
  SshConnection& m_session;
  int m_fd;
  ClientRuns m_runs;
};

} // namespace

void serve_host_client(const std::shared_ptr<HeldHost>& host, PreparePool& pool, int fd,
                       const std::atomic<bool>& exiting)
{
  HostClient client(*host, pool, fd);
  while (!exiting && !host->ending && !interrupt_requested()) {
    Message request;
    const auto got = receive_message(fd, request, 500ms);
    if (got == Received::timeout) {
      continue;
    }
    if (got != Received::message || !request.is_object()) {
      return;
    }
    host->heard();
    Message reply;
    try {
      const Busy busy(host->requests);
      reply = client.dispatch(request);
    } catch (const std::exception& e) {
      reply = error_message({ErrorKind::failed, fmt::format("bad request: {}", e.what())});
    }
    host->heard(); // a run's end counts: its persist time starts after it
    if (!send_message(fd, reply)) {
      return;
    }
    if (request.value("op", "") == "launch") {
      pool.want(host, host->start_pending.exchange(false) ? PreparePool::Wish::start
                                                          : PreparePool::Wish::standby);
    }
  }
}

} // namespace ferry::held
