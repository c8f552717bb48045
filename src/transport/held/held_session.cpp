// The client side of persistent sessions: a HostSession whose every step is a request to a
// holder (HeldSession), and the session the CLI makes (PersistentSession), which uses a live
// holder when there is one, else connects directly and starts a holder as it ends.
#include <cerrno>
#include <csignal>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ferry/held.hpp"
#include "transport/exec_request.hpp"
#include "transport/held/place.hpp"
#include "transport/held/wire.hpp"

namespace ferry {

namespace fs = std::filesystem;
using held::Message;
using held::Received;
using namespace std::chrono_literals;

namespace {

// A step's reply must come within this (the holder bounds each SFTP call itself).
constexpr std::chrono::milliseconds k_step_limit = 120s;

// How the holder answered a hello.
struct Greeting {
  enum class Kind { ok, none, refused } kind = Kind::none;
  std::string why; // none: why the holder cannot be used
  Error refusal;   // refused: the error a direct connection would have given
  Message reply;
};

Greeting greet(int fd)
{
  if (!held::send_message(fd, {{"op", "hello"}, {"protocol", held::k_protocol}})) {
    return {Greeting::Kind::none, "it closed the connection", {}, {}};
  }
  Message reply;
  if (held::receive_message(fd, reply, 10s) != Received::message || !reply.is_object()) {
    return {Greeting::Kind::none, "it did not answer", {}, {}};
  }
  if (reply.value("gone", false)) {
    return {Greeting::Kind::none, reply.value("why", std::string("it is ending")), {}, {}};
  }
  if (auto error = held::error_in(reply)) {
    return {Greeting::Kind::refused, {}, *error, {}};
  }
  return {Greeting::Kind::ok, {}, {}, std::move(reply)};
}

class HeldSession final : public HostSession {
public:
  HeldSession(fs::path socket, std::string label, Fd first, Message greeting)
      : m_socket(std::move(socket)), m_label(std::move(label)),
        m_target(greeting.value("target", Message::object()))
  {
    m_idle.push_back(std::move(first));
  }

  nlohmann::json target() const override { return m_target; }
  std::string label() const override { return m_label; }
  Expected<void> connect() override { return {}; }
  SessionTraits traits() const override { return {true}; }

  Expected<StagedRun> stage(const RunBundle& bundle, const StopToken& stop) override
  {
    std::uint64_t staged_id = 0;
    FERRY_TRY_ASSIGN(const auto reply,
                     call({{"op", "stage"}, {"bundle", held::encode(bundle)}}, 0, &staged_id));
    StagedRun run = held::decode_run(reply.at("run"));
    run.stop = stop;
    return run;
  }
  Expected<ExecOutcome> launch(StagedRun& run, const LaunchRequest& request) override;
  Expected<FetchedFile> fetch(const StagedRun& run, const std::string& rel,
                              const ChunkSink& sink) override;
  Expected<std::optional<std::vector<DirEntry>>> list(const StagedRun& run,
                                                      const std::string& rel) override
  {
    FERRY_TRY_ASSIGN(const auto reply,
                     call({{"op", "list"}, {"run", run.id}, {"path", rel}}, run.id));
    return held::decode_entries(reply.at("entries"));
  }
  Expected<void> finish(StagedRun& run, Finish how) override
  {
    auto finished =
        call({{"op", "finish"}, {"run", run.id}, {"how", static_cast<int>(how)}}, run.id);
    const std::lock_guard lock(m_mutex);
    if (auto pinned = m_pinned.extract(run.id)) {
      m_idle.push_back(std::move(pinned.mapped())); // free for the next run's stage
    }
    FERRY_TRY(finished);
    return {};
  }

private:
  Unexpected<Error> lost(std::string_view what) const
  {
    return fail(ErrorKind::failed, "{}: the connection holder ({}) {}", m_label,
                m_socket.filename().string(), what);
  }

  // A connection to the holder: the one run `run` was staged on (the holder knows a run only on
  // the connection that staged it), else an idle one, else a new one (greeted).
  Expected<Fd> take(std::uint64_t run = 0)
  {
    {
      const std::lock_guard lock(m_mutex);
      if (run != 0) {
        if (auto pinned = m_pinned.extract(run)) {
          return std::move(pinned.mapped());
        }
      }
      while (!m_idle.empty()) {
        Fd fd = std::move(m_idle.back());
        m_idle.pop_back();
        // A holder says nothing on an idle connection: one readable now was closed (its holder
        // ended, or dropped a client silent past its persist time).
        pollfd p{fd.get(), POLLIN, 0};
        if (::poll(&p, 1, 0) == 0) {
          return fd;
        }
      }
    }
    auto fd = held::dial(m_socket);
    if (!fd) {
      return lost("is gone");
    }
    if (greet(fd->get()).kind != Greeting::Kind::ok) {
      return lost("no longer serves");
    }
    return std::move(*fd);
  }
  // `run` != 0: the connection stays that run's until its finish.
  void give_back(Fd fd, std::uint64_t run = 0)
  {
    const std::lock_guard lock(m_mutex);
    if (run != 0) {
      m_pinned[run] = std::move(fd);
    } else {
      m_idle.push_back(std::move(fd));
    }
  }

  // One request about run `run` (0: none), its reply (an error reply becomes the error). With
  // `staged`, a stage: the connection is kept for the run it staged, whose id goes there.
  Expected<Message> call(const Message& request, std::uint64_t run = 0,
                         std::uint64_t* staged = nullptr)
  {
    FERRY_TRY_ASSIGN(Fd fd, take(run));
    if (!held::send_message(fd.get(), request)) {
      return lost("went away");
    }
    Message reply;
    const auto got = held::receive_message(fd.get(), reply, k_step_limit);
    if (got != Received::message) {
      return lost(got == Received::timeout ? "did not answer within 120 s" : "went away");
    }
    if (auto error = held::error_in(reply)) {
      give_back(std::move(fd), run);
      return Unexpected{*error};
    }
    if (staged != nullptr) {
      *staged = reply.at("run").at("id").get<std::uint64_t>();
      run = *staged;
    }
    give_back(std::move(fd), run);
    return reply;
  }

  fs::path m_socket;
  std::string m_label;
  nlohmann::json m_target;
  std::mutex m_mutex;
  std::vector<Fd> m_idle;
  std::map<std::uint64_t, Fd> m_pinned; // by run id: the connection that staged it
};

Expected<FetchedFile> HeldSession::fetch(const StagedRun& run, const std::string& rel,
                                         const ChunkSink& sink)
{
  FERRY_TRY_ASSIGN(Fd fd, take(run.id));
  if (!held::send_message(fd.get(), {{"op", "fetch"}, {"run", run.id}, {"path", rel}})) {
    return lost("went away");
  }
  std::optional<Error> refused; // the sink's error: the rest is read and dropped
  while (true) {
    Message m;
    if (held::receive_message(fd.get(), m, k_step_limit) != Received::message) {
      return lost("went away while sending a file");
    }
    if (m.contains("chunk")) {
      if (!refused) {
        if (auto taken = sink(held::text_of(m.at("chunk"))); !taken) {
          refused = taken.error();
        }
      }
      continue;
    }
    give_back(std::move(fd), run.id);
    if (auto error = held::error_in(m)) {
      return Unexpected{*error};
    }
    if (refused) {
      return Unexpected{*refused};
    }
    return held::decode_file(m.at("file"));
  }
}

namespace {

// What an exec's run keeps of the job's output: ferry keeps it here, from the live events, under
// the request's cap (the holder keeps little of it: its memory stays small however much a job
// prints).
struct HeldOutput {
  explicit HeldOutput(const LaunchRequest& r)
      : request(r), out("", r.output_cap), err("", r.output_cap)
  {
  }
  // Takes an output or note event; false when the message is the exec's reply.
  bool take(const Message& m)
  {
    const std::string ev = m.value("ev", "");
    if (ev == "out" || ev == "err") {
      const std::string bytes = held::text_of(m.at("bytes"));
      (ev == "out" ? out : err).feed(bytes);
      if (request.on_output) {
        request.on_output(ev == "out" ? OutputStream::out : OutputStream::err, bytes);
      }
      return true;
    }
    if (ev == "note") {
      if (request.on_note) {
        request.on_note(m.value("text", ""));
      }
      return true;
    }
    return ev == "beat"; // the holder is alive; the job said nothing
  }
  // The holder's outcome with the output kept here.
  ExecOutcome outcome(const Message& reply) &&
  {
    ExecOutcome result = held::decode_outcome(reply.at("outcome"));
    for (auto [stream, capture] : {std::pair{&result.out, &out}, std::pair{&result.err, &err}}) {
      CapturedStream kept = std::move(*capture).finish();
      stream->bytes = std::move(kept.bytes);
      stream->truncated = kept.truncated;
      stream->dropped = kept.dropped;
    }
    return result;
  }

  const LaunchRequest& request;
  OutputCapture out;
  OutputCapture err;
};

} // namespace

Expected<ExecOutcome> HeldSession::launch(StagedRun& run, const LaunchRequest& request)
{
  FERRY_TRY_ASSIGN(Fd fd, take(run.id));
  if (!held::send_message(
          fd.get(), {{"op", "launch"}, {"run", run.id}, {"request", held::encode(request)}})) {
    return lost("went away");
  }
  bool stop_sent = false;
  HeldOutput output(request);
  // The holder's own deadline comes first; this one only bounds a holder that stopped answering,
  // as does its silence: while a job runs it beats every k_beat_every.
  using Clock = std::chrono::steady_clock;
  const auto until = Clock::now() + request.deadline + request.grace + 60s;
  auto heard = Clock::now();
  while (Clock::now() < until) {
    if (!stop_sent && request.stop.stop_requested()) {
      stop_sent = held::send_message(fd.get(), {{"op", "stop"}});
    }
    Message m;
    const auto got = held::receive_message(fd.get(), m, 50ms);
    if (got == Received::timeout) {
      if (Clock::now() - heard >= held::k_holder_silence) {
        return lost(fmt::format("stopped answering ({} s without a word while the job ran); the "
                                "launcher's own deadline stops the job",
                                held::k_holder_silence.count()));
      }
      continue;
    }
    heard = Clock::now();
    if (got != Received::message) {
      return lost("ended while the job ran; the launcher's own deadline stops the job");
    }
    if (output.take(m)) {
      continue;
    }
    give_back(std::move(fd), run.id);
    if (auto error = held::error_in(m)) {
      return Unexpected{*error};
    }
    return std::move(output).outcome(m);
  }
  return lost("did not answer");
}

// Starts `ferry __hold SPEC` detached (its own session, stdio on /dev/null, errors into a log
// beside the socket), reaped at once so that a long-lived ferry (the MCP server) keeps no
// zombie.
void start_holder(const SshTarget& target, int persist_s, const fs::path& socket)
{
  const std::string spec = held::holder_spec(target, persist_s, socket).dump();
  fs::path log = socket;
  log.replace_extension(".log");
  const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  const int err = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  char exe[] = "/proc/self/exe";
  char name[] = "ferry";
  char hold[] = "__hold";
  std::string arg = spec;
  char* argv[] = {name, hold, arg.data(), nullptr};
  const pid_t child = ::fork();
  if (child == 0) {
    ::setsid();
    if (::fork() != 0) {
      ::_exit(0);
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGHUP}) {
      ::signal(sig, SIG_DFL);
    }
    ::signal(SIGHUP, SIG_IGN);
    ::dup2(null, 0);
    ::dup2(null, 1);
    ::dup2(err >= 0 ? err : null, 2);
    // Nothing of this process's goes along: not its SSH socket (the session would live on in
    // the holder), not the archive.
    ::close_range(3, ~0U, 0);
    ::execv(exe, argv);
    ::_exit(127);
  }
  if (child > 0) {
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
  }
  ::close(null);
  if (err >= 0) {
    ::close(err);
  }
}

class PersistentSession final : public HostSession {
public:
  PersistentSession(std::unique_ptr<SshConnection> direct, SshTarget target, int persist_s)
      : m_direct(std::move(direct)), m_target(std::move(target)), m_persist_s(persist_s)
  {
  }
  ~PersistentSession() override
  {
    if (m_hand_over) {
      start_holder(m_target, m_persist_s, m_socket);
    }
  }
  PersistentSession(const PersistentSession&) = delete;
  PersistentSession& operator=(const PersistentSession&) = delete;

  nlohmann::json target() const override { return active().target(); }
  std::string label() const override { return m_target.spec; }
  Expected<void> connect() override;
  SessionTraits traits() const override { return active().traits(); }
  // Only a direct connection's standbys end with its last run; a holder keeps its own.
  void plan(std::size_t runs, std::size_t at_once) override { active().plan(runs, at_once); }
  Expected<StagedRun> stage(const RunBundle& bundle, const StopToken& stop) override
  {
    return active().stage(bundle, stop);
  }
  Expected<ExecOutcome> launch(StagedRun& run, const LaunchRequest& request) override
  {
    return active().launch(run, request);
  }
  Expected<FetchedFile> fetch(const StagedRun& run, const std::string& rel,
                              const ChunkSink& sink) override
  {
    return active().fetch(run, rel, sink);
  }
  Expected<std::optional<std::vector<DirEntry>>> list(const StagedRun& run,
                                                      const std::string& rel) override
  {
    return active().list(run, rel);
  }
  Expected<void> finish(StagedRun& run, Finish how) override { return active().finish(run, how); }

private:
  HostSession& active() const
  {
    return m_held ? static_cast<HostSession&>(*m_held) : static_cast<HostSession&>(*m_direct);
  }
  void debug(std::string_view line) const
  {
    if (m_target.debug) {
      m_target.debug(line);
    }
  }
  // The holder's session when a live one serves these options; nullopt: connect directly.
  Expected<bool> use_holder();

  std::unique_ptr<SshConnection> m_direct;
  std::unique_ptr<HeldSession> m_held;
  SshTarget m_target;
  int m_persist_s;
  fs::path m_socket;
  bool m_hand_over = false;
};

Expected<bool> PersistentSession::use_holder()
{
  auto fd = held::dial(m_socket);
  if (!fd) {
    std::error_code ec;
    const auto status = fs::symlink_status(m_socket, ec);
    if (!ec && status.type() != fs::file_type::socket &&
        status.type() != fs::file_type::not_found && m_target.warn) {
      // No holder can ever listen there: without this line persistence would be off unseen.
      m_target.warn(fmt::format("{} is not a socket, so no connection holder can start there "
                                "and every run connects anew; remove it (or use --persist 0)",
                                m_socket.string()));
    } else if (!ec && status.type() == fs::file_type::socket) {
      // A dead holder's, or not this user's: replaced after the run.
      debug(fmt::format("the connection holder is not used: {}", fd.error().message));
    }
    return false;
  }
  auto greeting = greet(fd->get());
  switch (greeting.kind) {
  case Greeting::Kind::refused:
    return Unexpected{greeting.refusal};
  case Greeting::Kind::none:
    debug(fmt::format("the connection holder at {} is not used: {}", m_socket.string(),
                      greeting.why));
    return false;
  case Greeting::Kind::ok:
    break;
  }
  debug(fmt::format("using the connection held by process {} since {} ({})",
                    greeting.reply.value("pid", 0L), greeting.reply.value("since", ""),
                    m_socket.string()));
  m_held = std::make_unique<HeldSession>(m_socket, m_target.spec, std::move(*fd),
                                         std::move(greeting.reply));
  return true;
}

Expected<void> PersistentSession::connect()
{
  auto dir = held::holder_dir(true);
  if (!dir) {
    if (m_target.warn) {
      m_target.warn(fmt::format("connections are not kept (--persist): {}", dir.error().message));
    }
    return m_direct->connect();
  }
  m_socket = held::socket_path(*dir, m_direct->options_identity());
  FERRY_TRY_ASSIGN(const bool held, use_holder());
  if (held) {
    return {};
  }
  FERRY_TRY(m_direct->connect());
  m_hand_over = m_persist_s > 0;
  return {};
}

} // namespace

std::unique_ptr<HostSession> make_persistent_session(std::unique_ptr<SshConnection> direct,
                                                     const SshTarget& target, int persist_s)
{
  return std::make_unique<PersistentSession>(std::move(direct), target, persist_s);
}

namespace {

// One request and its reply on a connection of its own; nullopt when the holder did not answer.
std::optional<Message> ask(const fs::path& socket, const Message& request)
{
  auto fd = held::dial(socket);
  Message reply;
  if (!fd || !held::send_message(fd->get(), request) ||
      held::receive_message(fd->get(), reply, 10s) != Received::message || !reply.is_object() ||
      !reply.value("ok", false)) {
    return std::nullopt;
  }
  return reply;
}

} // namespace

std::vector<HeldConnection> held_connections()
{
  std::vector<HeldConnection> found;
  auto dir = held::holder_dir(false);
  if (!dir) {
    return found;
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(*dir, ec)) {
    if (entry.path().extension() != ".sock") {
      continue;
    }
    if (auto info = ask(entry.path(), {{"op", "info"}})) {
      found.push_back({info->value("label", ""), info->value("pid", 0L), info->value("since", ""),
                       entry.path()});
    }
  }
  return found;
}

bool end_held(const HeldConnection& connection)
{
  return ask(connection.socket, {{"op", "exit"}}).has_value();
}

} // namespace ferry
