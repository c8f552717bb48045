// The client side of persistent sessions: a HostSession whose every step is a request to the
// holder (HeldSession), and the session the CLI makes (PersistentSession), which runs through
// the user's holder (starting it when there is none), else connects directly.
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

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
  Message story = Message::array(); // `-v`: the lines of the holder's connect for it
};

// The holder's connect asks the host's keyboard-interactive prompts through this client: its
// answers (or why there are none) go back on the same connection.
bool answer_prompts(int fd, const Message& ask, const Prompter& prompter)
{
  const PromptRound round = held::decode_round(ask.at("round"));
  auto answers = prompter ? prompter(round)
                          : Expected<std::vector<std::string>>(needs_interactive_login(round.host));
  if (!answers) {
    return held::send_message(fd, held::error_message(answers.error()));
  }
  Message list = Message::array();
  for (auto& answer : *answers) {
    list.push_back(held::bytes_of(answer));
    std::fill(answer.begin(), answer.end(), '\0');
  }
  return held::send_message(fd, {{"answers", std::move(list)}});
}

// The holder's reply to a hello; prompts it relays meanwhile are answered (the time the user
// takes is not the holder's).
Received hello_reply(int fd, const Message& hello, const Prompter& prompter, Message& reply)
{
  // The holder may be connecting the host for this hello: as long as a direct connect takes.
  const auto limit = std::chrono::seconds(10 + hello.value("wait_s", 0));
  while (true) {
    const Received got = held::receive_message(fd, reply, limit);
    if (got != Received::message || !reply.is_object() || reply.value("ev", "") != "prompt") {
      return got;
    }
    if (!answer_prompts(fd, reply, prompter)) {
      return Received::closed;
    }
  }
}

Greeting greet(int fd, const Message& hello, const Prompter& prompter)
{
  if (!held::send_message(fd, hello)) {
    return {Greeting::Kind::none, "it closed the connection", {}, {}, {}};
  }
  Message reply;
  if (hello_reply(fd, hello, prompter, reply) != Received::message || !reply.is_object()) {
    return {Greeting::Kind::none, "it did not answer", {}, {}, {}};
  }
  Message story = reply.value("story", Message::array());
  if (!story.is_array()) {
    story = Message::array();
  }
  if (reply.value("gone", false)) {
    return {Greeting::Kind::none,
            reply.value("why", std::string("it is ending")),
            {},
            {},
            std::move(story)};
  }
  if (auto error = held::error_in(reply)) {
    return {Greeting::Kind::refused, {}, *error, {}, std::move(story)};
  }
  return {Greeting::Kind::ok, {}, {}, std::move(reply), std::move(story)};
}

class HeldSession final : public HostSession {
public:
  HeldSession(fs::path socket, std::string label, Message hello, Fd first, Message greeting,
              Prompter prompter)
      : m_socket(std::move(socket)), m_label(std::move(label)), m_hello(std::move(hello)),
        m_target(greeting.value("target", Message::object())), m_prompter(std::move(prompter)),
        m_connected(greeting.value("connected", false))
  {
    m_idle.push_back(std::move(first));
    // Later connections find the session there: a holder that does not answer at once is
    // stopped (the run's finish must not wait for it as for a connect).
    m_hello.erase("wait_s");
  }

  nlohmann::json target() const override { return m_target; }
  std::string label() const override { return m_label; }
  Expected<void> connect() override { return {}; }
  SessionTraits traits() const override { return {true}; }

  // The holder connected the host for this session: its first run may go as a direct
  // connection's only run does (docs/persistence.md, "A host's first run through the holder").
  void plan(std::size_t runs, std::size_t /*at_once*/) override
  {
    const std::lock_guard lock(m_mutex);
    m_only_run = m_connected && runs == 1;
  }
  Expected<StagedRun> stage(const RunBundle& bundle, const StopToken& stop) override
  {
    Message request{{"op", "stage"}, {"bundle", held::encode(bundle)}};
    {
      const std::lock_guard lock(m_mutex);
      if (std::exchange(m_only_run, false)) {
        request["only_run"] = true;
      }
    }
    std::uint64_t staged_id = 0;
    FERRY_TRY_ASSIGN(const auto reply, call(request, 0, &staged_id));
    StagedRun run = held::decode_run(reply.at("run"));
    run.stop = stop;
    return run;
  }
  Expected<ExecOutcome> launch(StagedRun& run, const LaunchRequest& request) override;
  Expected<FetchedFile> fetch(const StagedRun& run, const std::string& rel, const ChunkSink& sink,
                              std::uint64_t offset) override;
  Expected<std::optional<std::vector<DirEntry>>> list(const StagedRun& run,
                                                      const std::string& rel) override
  {
    FERRY_TRY_ASSIGN(const std::uint64_t id, id_of(run));
    FERRY_TRY_ASSIGN(const auto reply, call({{"op", "list"}, {"run", id}, {"path", rel}}, id));
    return held::decode_entries(reply.at("entries"));
  }
  Expected<void> finish(StagedRun& run, Finish how) override
  {
    FERRY_TRY_ASSIGN(const std::uint64_t id, id_of(run));
    auto finished = call({{"op", "finish"}, {"run", id}, {"how", static_cast<int>(how)}}, id);
    const std::lock_guard lock(m_mutex);
    if (auto pinned = m_pinned.extract(id)) {
      m_idle.push_back(std::move(pinned.mapped())); // free for the next run's stage
    }
    m_adopted.erase(run.run_dir);
    FERRY_TRY(finished);
    return {};
  }

private:
  // The holder's id for `run`: its own, when it was staged through the holder; else (a detached
  // run, staged by an earlier ferry, or /proc) the id the holder gives the directory once it has
  // checked it (docs/run-protocol.md, "Through a held session").
  Expected<std::uint64_t> id_of(const StagedRun& run)
  {
    if (run.id != 0) {
      return run.id;
    }
    {
      const std::lock_guard lock(m_mutex);
      if (auto it = m_adopted.find(run.run_dir); it != m_adopted.end()) {
        return it->second;
      }
    }
    std::uint64_t adopted = 0;
    FERRY_TRY(call({{"op", "adopt"}, {"run_dir", run.run_dir}}, 0, &adopted));
    const std::lock_guard lock(m_mutex);
    m_adopted[run.run_dir] = adopted;
    return adopted;
  }

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
    if (greet(fd->get(), m_hello, m_prompter).kind != Greeting::Kind::ok) {
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
  Message m_hello; // names the connection to the holder
  nlohmann::json m_target;
  Prompter m_prompter; // for a holder that connects the host anew
  std::mutex m_mutex;
  std::vector<Fd> m_idle;
  std::map<std::uint64_t, Fd> m_pinned;           // by run id: the connection that staged it
  std::map<std::string, std::uint64_t> m_adopted; // by run directory: the holder's id for it
  const bool m_connected;  // the holder connected the host for this session's hello
  bool m_only_run = false; // plan: the first stage asks for a direct connection's only run
};

Expected<FetchedFile> HeldSession::fetch(const StagedRun& run, const std::string& rel,
                                         const ChunkSink& sink, std::uint64_t offset)
{
  FERRY_TRY_ASSIGN(const std::uint64_t id, id_of(run));
  FERRY_TRY_ASSIGN(Fd fd, take(id));
  if (!held::send_message(fd.get(),
                          {{"op", "fetch"}, {"run", id}, {"path", rel}, {"offset", offset}})) {
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
    give_back(std::move(fd), id);
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
void start_holder(const fs::path& socket)
{
  const std::string spec = Message{{"socket", socket.string()}}.dump();
  fs::path log = socket;
  log.replace_extension(".log");
  const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  const int err = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
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
    // Nothing of this process's goes along: not its sockets, not the archive.
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

// The holder's socket once it answers: a holder started now listens within milliseconds (it
// connects nothing before it listens).
Expected<Fd> dial_started(const fs::path& socket)
{
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (true) {
    auto fd = held::dial(socket);
    if (fd || std::chrono::steady_clock::now() >= until) {
      return fd;
    }
    std::this_thread::sleep_for(10ms);
  }
}

class PersistentSession final : public HostSession {
public:
  // `existing`: only a session the holder keeps already is used (none is connected, and no
  // holder started, for this one), else `direct` connects.
  PersistentSession(std::unique_ptr<SshConnection> direct, SshTarget target, int persist_s,
                    bool existing = false)
      : m_direct(std::move(direct)), m_target(std::move(target)), m_persist_s(persist_s),
        m_existing(existing)
  {
  }

  nlohmann::json target() const override { return active().target(); }
  std::string label() const override { return m_target.spec; }
  Expected<void> connect() override;
  // Through the holder only: an error when it cannot be used.
  Expected<void> hold();
  SessionTraits traits() const override { return active().traits(); }
  // A holder keeps its standbys past a run; it is told only of a first run that is its
  // connection's only one (HeldSession::plan).
  void plan(std::size_t runs, std::size_t at_once) override { active().plan(runs, at_once); }
  Expected<StagedRun> stage(const RunBundle& bundle, const StopToken& stop) override
  {
    return active().stage(bundle, stop);
  }
  Expected<ExecOutcome> launch(StagedRun& run, const LaunchRequest& request) override
  {
    return active().launch(run, request);
  }
  Expected<FetchedFile> fetch(const StagedRun& run, const std::string& rel, const ChunkSink& sink,
                              std::uint64_t offset) override
  {
    return active().fetch(run, rel, sink, offset);
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
  Message hello() const
  {
    // What a direct connect may take (retries included), for the holder's connect.
    const double connect_s = m_target.connect_timeout_s > 0 ? m_target.connect_timeout_s : 10;
    return {{"op", "hello"},
            {"protocol", held::k_protocol},
            {"target", held::holder_target(m_target)},
            {"identity", m_direct->options_identity()},
            {"persist_s", m_persist_s},
            {"verbose", static_cast<bool>(m_target.debug)},
            {"prompt", static_cast<bool>(m_target.prompt)},
            {"existing", m_existing},
            {"wait_s", static_cast<int>(connect_s * (1 + std::max(0, m_target.retries))) + 20}};
  }
  Expected<Fd> dial_holder();
  // Whether the holder serves this run; an error: the holder's connect failed as a direct one
  // would have.
  Expected<bool> use_holder();

  std::unique_ptr<SshConnection> m_direct;
  std::unique_ptr<HeldSession> m_held;
  SshTarget m_target;
  int m_persist_s;
  bool m_existing;
  fs::path m_socket;
  std::string m_not_used; // why the holder was passed over
};

Expected<Fd> PersistentSession::dial_holder()
{
  if (auto fd = held::dial(m_socket)) {
    return fd;
  }
  if (m_existing) {
    return fail(ErrorKind::failed, "no holder answers at {}", m_socket.string());
  }
  std::error_code ec;
  const auto status = fs::symlink_status(m_socket, ec);
  if (!ec && status.type() != fs::file_type::socket && status.type() != fs::file_type::not_found) {
    // No holder can ever listen there: without this line persistence would be off unseen.
    if (m_target.warn) {
      m_target.warn(fmt::format("{} is not a socket, so no connection holder can start there "
                                "and every run connects anew; remove it (or use --persist 0)",
                                m_socket.string()));
    }
    return fail(ErrorKind::failed, "{} is not a socket", m_socket.string());
  }
  // None, or a dead one's socket (replaced as the new one listens).
  start_holder(m_socket);
  return dial_started(m_socket);
}

Expected<bool> PersistentSession::use_holder()
{
  const Message request = hello();
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto fd = dial_holder();
    if (!fd) {
      m_not_used = fd.error().message;
      debug(fmt::format("the connection holder is not used: {}", m_not_used));
      return false;
    }
    auto greeting = greet(fd->get(), request, m_target.prompt);
    // The holder's connect for this run, told as a direct connect tells it.
    for (const auto& line : greeting.story) {
      debug(line.get<std::string>());
    }
    switch (greeting.kind) {
    case Greeting::Kind::refused:
      return Unexpected{greeting.refusal};
    case Greeting::Kind::none:
      m_not_used = greeting.why;
      debug(fmt::format("the connection holder at {} is not used: {}", m_socket.string(),
                        greeting.why));
      if (greeting.why == "it closed the connection" || greeting.why == "it is ending") {
        continue; // it was leaving as this run came: a new one starts
      }
      return false;
    case Greeting::Kind::ok:
      break;
    }
    const auto& reply = greeting.reply;
    if (reply.value("connected", false)) {
      debug(fmt::format("the connection holder (process {}) connected {} for this run ({})",
                        reply.value("pid", 0L), m_target.spec, m_socket.string()));
    } else {
      debug(fmt::format("using the connection held by process {} since {} ({})",
                        reply.value("pid", 0L), reply.value("since", ""), m_socket.string()));
    }
    m_held = std::make_unique<HeldSession>(m_socket, m_target.spec, request, std::move(*fd),
                                           std::move(greeting.reply), m_target.prompt);
    return true;
  }
  return false;
}

Expected<void> PersistentSession::connect()
{
  auto dir = held::holder_dir(!m_existing);
  if (!dir) {
    if (m_target.warn && !m_existing) {
      m_target.warn(fmt::format("connections are not kept (--persist): {}", dir.error().message));
    }
    return m_direct->connect();
  }
  m_socket = held::holder_socket(*dir);
  FERRY_TRY_ASSIGN(const bool held, use_holder());
  if (held) {
    return {};
  }
  return m_direct->connect();
}

Expected<void> PersistentSession::hold()
{
  FERRY_TRY_ASSIGN(const auto dir, held::holder_dir(true));
  m_socket = held::holder_socket(dir);
  FERRY_TRY_ASSIGN(const bool held, use_holder());
  if (!held) {
    return fail(ErrorKind::failed, "{}: the connection holder at {} could not keep it: {}",
                m_target.spec, m_socket.string(), m_not_used);
  }
  return {};
}

} // namespace

Expected<void> hold_connection(std::unique_ptr<SshConnection> direct, const SshTarget& target,
                               int persist_s)
{
  PersistentSession session(std::move(direct), target, persist_s);
  return session.hold();
}

std::unique_ptr<HostSession> make_persistent_session(std::unique_ptr<SshConnection> direct,
                                                     const SshTarget& target, int persist_s)
{
  return std::make_unique<PersistentSession>(std::move(direct), target, persist_s);
}

std::unique_ptr<HostSession> make_held_or_direct_session(std::unique_ptr<SshConnection> direct,
                                                         const SshTarget& target)
{
  return std::make_unique<PersistentSession>(std::move(direct), target, 0, true);
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
  const fs::path socket = held::holder_socket(*dir);
  const auto info = ask(socket, {{"op", "info"}});
  if (!info) {
    return found;
  }
  for (const auto& session : info->value("sessions", Message::array())) {
    found.push_back({session.value("label", ""), info->value("pid", 0L), session.value("since", ""),
                     socket, session.value("key", "")});
  }
  return found;
}

bool end_held(const HeldConnection& connection)
{
  const auto reply = ask(connection.socket, {{"op", "end"}, {"key", connection.key}});
  return reply && reply->value("ended", false);
}

} // namespace ferry
