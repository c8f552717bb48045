#include "transport/ssh/exec.hpp"

#include <poll.h>

#include <thread>
#include <vector>

#include <libssh/callbacks.h>

#include "ferry/remote/launcher.hpp"
#include "ferry/remote/shell_neutral.hpp"
#include "transport/ssh/standby/policy.hpp"
#include "transport/stop_schedule.hpp"

namespace ferry::ssh {

using Clock = std::chrono::steady_clock;

// The channel's types, named (not in an anonymous namespace) because Standby holds them.
namespace channel_detail {

// Filled from libssh's callbacks: the launcher's exit is known without blocking, so a job that
// exited while a stray process holds its output open does not keep ferry waiting.
struct ExitWatch {
  bool exited = false;
  std::optional<int> status;
  Clock::time_point at;
};

void on_exit_status(ssh_session, ssh_channel, int status, void* userdata)
{
  auto* watch = static_cast<ExitWatch*>(userdata);
  watch->exited = true;
  watch->status = status;
  watch->at = Clock::now();
}

void on_exit_signal(ssh_session, ssh_channel, const char*, int, const char*, const char*,
                    void* userdata)
{
  auto* watch = static_cast<ExitWatch*>(userdata);
  watch->exited = true;
  watch->at = Clock::now();
}

// One exec channel with its exit callbacks, for the length of one run.
class ExecChannel {
public:
  ExecChannel(ssh_session session, ExitWatch& watch) : m_channel(ssh_channel_new(session))
  {
    m_callbacks.userdata = &watch;
    m_callbacks.channel_exit_status_function = on_exit_status;
    m_callbacks.channel_exit_signal_function = on_exit_signal;
    ssh_callbacks_init(&m_callbacks);
  }
  ExecChannel(const ExecChannel&) = delete;
  ExecChannel& operator=(const ExecChannel&) = delete;
  ~ExecChannel()
  {
    if (m_channel) {
      ssh_remove_channel_callbacks(m_channel.get(), &m_callbacks);
    }
  }

  [[nodiscard]] bool open() { return open_step() == SSH_OK; }
  // One step of the open: SSH_AGAIN while a non-blocking open waits for the server.
  [[nodiscard]] int open_step()
  {
    if (!m_channel) {
      return SSH_ERROR;
    }
    const int rc = ssh_channel_open_session(m_channel.get());
    if (rc == SSH_OK) {
      ssh_set_channel_callbacks(m_channel.get(), &m_callbacks);
    }
    return rc;
  }
  [[nodiscard]] ssh_channel get() const { return m_channel.get(); }

private:
  Channel m_channel;
  ssh_channel_callbacks_struct m_callbacks{};
};

} // namespace channel_detail

namespace {

using channel_detail::ExecChannel;
using channel_detail::ExitWatch;

struct Streams {
  OutputCapture out;
  OutputCapture err;
  std::vector<char> buffer = std::vector<char>(64 * 1024);
  // A python standby's run: the run ends without the channel's end once stdout holds the whole
  // report and stderr `END_MARKER stay` (the standby stays for the next run).
  bool may_stay = false;
  bool stayed = false;

  [[nodiscard]] bool standby_stays() const
  {
    if (!may_stay) {
      return false;
    }
    const auto report = out.report_so_far();
    return report && err.report_so_far() == std::string_view("stay\n") &&
           is_whole_launcher_report(*report);
  }
};

// Reads what both streams have now. Returns whether anything came; sets `lost` on a read error
// that is not the end of the channel.
bool drain(ssh_session session, ssh_channel channel, Streams& streams, ExecOutcome& outcome)
{
  bool got_data = false;
  for (int is_stderr = 0; is_stderr < 2; ++is_stderr) {
    while (true) {
      const int n = ssh_channel_read_nonblocking(
          channel, streams.buffer.data(), static_cast<uint32_t>(streams.buffer.size()), is_stderr);
      if (n == SSH_ERROR) {
        if (!ssh_channel_is_eof(channel) && !ssh_channel_is_closed(channel)) {
          outcome.end = ExecEnd::lost;
          outcome.lost_reason =
              fmt::format("reading the job's output failed: {}", ssh_get_error(session));
        }
        break;
      }
      if (n <= 0) {
        break;
      }
      got_data = true;
      (is_stderr ? streams.err : streams.out)
          .feed(std::string_view(streams.buffer.data(), static_cast<std::size_t>(n)));
    }
  }
  return got_data;
}

void lose(ExecOutcome& outcome, std::string reason)
{
  outcome.end = ExecEnd::lost;
  outcome.lost_reason = std::move(reason);
}

// Applies the stop schedule's step; false when ferry gives up on the job.
bool apply_stop_step(StopSchedule& schedule, ssh_channel channel, const Streams& streams,
                     ExecOutcome& outcome)
{
  switch (schedule.next(Clock::now(), streams.out.started() || streams.err.started())) {
  case StopSchedule::Step::term:
    // OpenSSH >= 7.9 kills the session's process group; the launcher forwards it to the job.
    ssh_channel_request_send_signal(channel, "TERM");
    return true;
  case StopSchedule::Step::kill:
    ssh_channel_request_send_signal(channel, "KILL");
    return true;
  case StopSchedule::Step::give_up:
    lose(outcome, "the job did not stop after TERM and KILL");
    return false;
  case StopSchedule::Step::none:
    return true;
  }
  return true;
}

// One turn of the read loop, holding the session's lock: reads what came and decides whether
// the loop ends (the channel ended, the connection is lost, or the output is held open).
enum class Turn { data, idle, done };
Turn turn(ssh_session session, ssh_channel channel, const ExitWatch& watch, Streams& streams,
          StopSchedule& schedule, ExecOutcome& outcome)
{
  const bool got_data = drain(session, channel, streams, outcome);
  if (outcome.end == ExecEnd::lost) {
    return Turn::done;
  }
  if (streams.standby_stays()) {
    streams.stayed = true;
    return Turn::done;
  }
  // A dropped connection closes every channel too: without the exit status, it was lost.
  if (!ssh_is_connected(session) && !watch.exited) {
    lose(outcome, fmt::format("the connection dropped: {}", ssh_get_error(session)));
    return Turn::done;
  }
  if (ssh_channel_is_eof(channel) || ssh_channel_is_closed(channel)) {
    return Turn::done;
  }
  if (watch.exited && Clock::now() - watch.at > k_output_linger) {
    outcome.output_held_open = true;
    return Turn::done;
  }
  if (!apply_stop_step(schedule, channel, streams, outcome)) {
    return Turn::done;
  }
  return got_data ? Turn::data : Turn::idle;
}

// The read loop. Between turns it waits for the socket without the lock. Another channel's
// reader may take this channel's data off the socket into libssh's buffers, so the wait is
// short (the next turn finds it there).
void pump(ssh_session session, ssh_channel channel, const ExecRequest& request,
          const ExitWatch& watch, Streams& streams, ExecOutcome& outcome,
          std::unique_lock<std::mutex>& lock)
{
  StopSchedule schedule(Clock::now(), request);
  const int fd = ssh_get_fd(session);
  while (true) {
    const Turn now = turn(session, channel, watch, streams, schedule, outcome);
    if (now == Turn::done) {
      break;
    }
    if (now == Turn::idle) {
      lock.unlock();
      pollfd socket{fd, POLLIN, 0};
      (void)::poll(&socket, 1, 20);
      lock.lock();
    }
  }
  if (outcome.end != ExecEnd::lost && schedule.reason()) {
    outcome.end = *schedule.reason();
  }
}

// Why a blocking step failed: the watchdog's reason when it cut the connection, else libssh's.
std::string failure(ssh_session session, const CallWatchdog& watchdog)
{
  const auto cut = watchdog.fired();
  return cut ? *cut : std::string(ssh_get_error(session));
}

// Opens a channel by `try_open` (a new channel each call); when the server refuses it, asks
// `free_a_channel` for room and tries again while the server frees the slot (it does once it
// has reaped what ran there).
bool open_channel(const std::function<bool()>& try_open, CallWatchdog& watchdog,
                  std::unique_lock<std::mutex>& lock, const FreeAChannel& free_a_channel)
{
  for (int freed = 0; freed < 64 && !watchdog.fired(); ++freed) {
    if (try_open()) {
      return true;
    }
    if (watchdog.fired() || !free_a_channel || !free_a_channel(lock)) {
      return false;
    }
    // Holding the lock (and the armed watchdog) all along: only a host that allows one
    // channel gets here, and there nothing else can use the session meanwhile anyway.
    for (int wait_ms = 0; wait_ms <= 640 && !watchdog.fired();
         wait_ms = std::max(20, wait_ms * 2)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
      if (try_open()) {
        return true;
      }
    }
  }
  return false;
}

// The run's channel from its start on: reads it to its end, then takes the exit status. With
// `stayed` (a python standby's run), the run may end before the channel does: then *stayed is
// set, the code is the report's and the channel stays open for the next run.
ExecOutcome follow(ssh_session session, ssh_channel channel, ExitWatch& watch,
                   const ExecRequest& request, CallWatchdog& watchdog,
                   std::unique_lock<std::mutex>& lock, bool* stayed = nullptr)
{
  ExecOutcome outcome;
  outcome.start_limit_s = std::chrono::duration<double>(request.start_limit).count();
  Streams streams{capture_for(request, OutputStream::out),
                  capture_for(request, OutputStream::err, stayed != nullptr)};
  streams.may_stay = stayed != nullptr;
  pump(session, channel, request, watch, streams, outcome, lock);
  if (streams.stayed) {
    *stayed = true;
    outcome.out = std::move(streams.out).finish();
    outcome.err = std::move(streams.err).finish();
    outcome.err.launcher_report.reset(); // `stay`: the standby's, not the job's
    outcome.exit_code = parse_launcher_report(outcome.out.launcher_report.value_or(""))->code;
    return outcome;
  }
  if (outcome.end != ExecEnd::lost) {
    const auto armed = watchdog.arm("read the exit status", nullptr);
    if (!watch.exited && !outcome.output_held_open) {
      // EOF came first; the status follows right behind it.
      if (const int status = ssh_channel_get_exit_status(channel); status >= 0) {
        watch.status = status;
      }
    }
    outcome.exit_code = watch.status;
    ssh_channel_close(channel);
  }
  outcome.out = std::move(streams.out).finish();
  outcome.err = std::move(streams.err).finish();
  return outcome;
}

} // namespace

// A channel opened ahead of its run: its `/bin/sh -s`, or the python standby, waits on stdin
// for one line.
class Standby {
public:
  explicit Standby(ssh_session session) : channel(session, watch) {}
  channel_detail::ExitWatch watch; // before the channel, whose callbacks point at it
  channel_detail::ExecChannel channel;
  bool python = false;  // its command is the python standby (src/remote/standby.py)
  std::string command;  // what it runs: `/bin/sh -s`, or the python standby's command
  bool open = false;    // the server confirmed the channel (its exec request comes next)
  bool started = false; // the server accepted the exec request
};

void StandbyFree::operator()(Standby* standby) const
{
  delete standby;
}

bool is_python(const StandbyChannel& standby)
{
  return standby && standby->python;
}

namespace {
void decide_standby(Standby& standby, const std::string& python_command)
{
  static const std::string sh_command = *shell_neutral_command({"/bin/sh", "-s"});
  standby.python = !python_command.empty();
  standby.command = standby.python ? python_command : sh_command;
}
} // namespace

StandbyChannel begin_standby(ssh_session session, const std::string& python_command)
{
  StandbyChannel standby(new Standby(session));
  decide_standby(*standby, python_command);
  return advance_standby(session, *standby) == StandbyState::failed ? nullptr : std::move(standby);
}

StandbyState advance_standby(ssh_session session, Standby& standby)
{
  while (!standby.started) {
    ssh_set_blocking(session, 0);
    const int rc = standby.open
                       ? ssh_channel_request_exec(standby.channel.get(), standby.command.c_str())
                       : standby.channel.open_step();
    ssh_set_blocking(session, 1);
    if (rc == SSH_AGAIN) {
      return StandbyState::pending;
    }
    if (rc != SSH_OK) {
      return StandbyState::failed;
    }
    if (standby.open) {
      standby.started = true;
    } else {
      standby.open = true;
    }
  }
  return StandbyState::ready;
}

StandbyChannel finish_standby(ssh_session session, std::unique_lock<std::mutex>& lock,
                              StandbyChannel standby, std::chrono::steady_clock::duration limit,
                              const StopToken* stop)
{
  const auto until = Clock::now() + limit;
  const int fd = ssh_get_fd(session);
  // The lock released while the server answers: the session's runs and SFTP steps go on
  // meanwhile.
  while (standby) {
    const StandbyState state = advance_standby(session, *standby);
    if (state == StandbyState::ready) {
      return standby;
    }
    if (state == StandbyState::failed || Clock::now() > until || !ssh_is_connected(session) ||
        (stop != nullptr && stop->stop_requested())) {
      return nullptr;
    }
    lock.unlock();
    pollfd socket{fd, POLLIN, 0};
    (void)::poll(&socket, 1, 20);
    lock.lock();
  }
  return nullptr;
}

StandbyChannel open_standby(ssh_session session, std::unique_lock<std::mutex>& lock,
                            std::chrono::steady_clock::duration limit,
                            const std::string& python_command)
{
  return finish_standby(session, lock, begin_standby(session, python_command), limit);
}

namespace {

// Runs the launcher on a standby channel; nullopt when the channel has gone meanwhile (or never
// showed the launcher's first line: its shell had gone), and a new channel should run it.
// *stayed: a python standby stays for the next run (its channel is still open). `stage` (a
// python standby only): the line that has it make the run's files, sent instead (*handed set).
std::optional<ExecOutcome> run_on_standby(ssh_session session, Standby& standby,
                                          const std::string& command, const ExecRequest& request,
                                          CallWatchdog& watchdog,
                                          std::unique_lock<std::mutex>& lock,
                                          bool* python_standby_failed, bool& stayed,
                                          const std::string* stage, bool* handed)
{
  const ssh_channel channel = standby.channel.get();
  (void)ssh_channel_poll(channel, 0); // takes in a close or an exit that came meanwhile
  if (ssh_channel_is_open(channel) == 0 || ssh_channel_is_eof(channel) != 0 ||
      standby.watch.exited) {
    return std::nullopt;
  }

  // Neutral tokens only: the line means the same to any sh.
  // ` last` tells a python standby that no run follows on this channel: it ends after this one.
  const std::string line =
      stage != nullptr ? *stage
                       : "exec " + command + (standby.python && request.last ? " last" : "") + "\n";
  if (stage != nullptr) {
    *handed = true;
  }
  {
    const auto armed = watchdog.arm("start the launcher", &request.stop);
    if (ssh_channel_write(channel, line.data(), static_cast<uint32_t>(line.size())) !=
        static_cast<int>(line.size())) {
      return std::nullopt;
    }
  }
  auto outcome = follow(session, channel, standby.watch, request, watchdog, lock,
                        standby.python ? &stayed : nullptr);
  if (!outcome.out.saw_sentinel && outcome.end == ExecEnd::exited &&
      !request.stop.stop_requested()) {
    // A python standby that could not start here (no python3: 127 from the login shell; its
    // script gone from the cache: 2; no /proc or no interpreter to start ahead: 3) will not
    // start next time either.
    const int code = outcome.exit_code.value_or(-1);
    if (standby.python && python_standby_failed != nullptr &&
        (code == 2 || code == 3 || code == 126 || code == 127)) {
      *python_standby_failed = true;
    }
    return std::nullopt;
  }
  return outcome;
}

// A run's files still to be made (StandbyUse::settle): made once, over SFTP, unless a python
// standby was given them (`handed`: then only if that standby did not run it).
struct Settle {
  std::function<Expected<void>(bool)> files;
  bool handed = false;
  [[nodiscard]] bool pending() const { return static_cast<bool>(files); }
  Expected<void> operator()()
  {
    if (!files) {
      return {};
    }
    auto make = std::exchange(files, nullptr);
    const bool after_standby = std::exchange(handed, false);
    return make(after_standby);
  }
};

// A python standby that stayed after its run: the standby if there is none, else a spare while
// there is room. Holding the lock.
void keep_standby(const StandbyUse& use, StandbyChannel standby)
{
  standby::Facts facts;
  facts.has_standby = static_cast<bool>(*use.standby);
  facts.spares = use.spares != nullptr ? use.spares->size() : standby::k_max_spares;
  switch (standby::keep_after_run(!use.may_keep || use.may_keep(), facts)) {
  case standby::Keep::standby:
    *use.standby = std::move(standby);
    break;
  case standby::Keep::spare:
    use.spares->push_back(std::move(standby));
    break;
  case standby::Keep::none:
    break; // its channel closes: the standby reads the end of its stdin and ends
  }
}

// The standby a launcher run may take (the standby, else a spare); null when there is none.
StandbyChannel take_standby(const StandbyUse& use)
{
  if (*use.standby) {
    return std::move(*use.standby);
  }
  if (use.spares == nullptr || use.spares->empty()) {
    return nullptr;
  }
  StandbyChannel spare = std::move(use.spares->back());
  use.spares->pop_back();
  return spare;
}

} // namespace

namespace {

// Opens a channel by `try_open` and requests `exec_command` on it (`channel()`), bounded by the
// watchdog; an error says which step failed.
Expected<void> start_channel(ssh_session session, std::string_view label,
                             const std::function<bool()>& try_open,
                             const std::function<ssh_channel()>& channel,
                             const std::string& exec_command, const ExecRequest& request,
                             CallWatchdog& watchdog, std::unique_lock<std::mutex>& lock,
                             const FreeAChannel& free_a_channel)
{
  const auto armed = watchdog.arm("open a channel", &request.stop);
  if (!open_channel(try_open, watchdog, lock, free_a_channel)) {
    return fail(ErrorKind::failed, "{}: cannot open a channel: {}", label,
                failure(session, watchdog));
  }
  if (ssh_channel_request_exec(channel(), exec_command.c_str()) != SSH_OK) {
    return fail(ErrorKind::failed, "{}: cannot start `{}`: {}", label, exec_command,
                failure(session, watchdog));
  }
  return {};
}

// run_on_standby, and the standby kept when it stays for the next run. A run still to be staged
// is staged by a python standby, else over SFTP first.
Expected<std::optional<ExecOutcome>>
run_and_keep(ssh_session session, StandbyChannel standby, const std::string& command,
             const ExecRequest& request, CallWatchdog& watchdog, std::unique_lock<std::mutex>& lock,
             const StandbyUse& use, Settle& settle)
{
  const bool stages = settle.pending() && standby->python;
  if (!stages) {
    FERRY_TRY(settle());
  }
  bool stayed = false;
  auto outcome =
      run_on_standby(session, *standby, command, request, watchdog, lock, use.python_failed, stayed,
                     stages ? &use.stage : nullptr, &settle.handed);
  if (stayed) {
    keep_standby(use, std::move(standby));
  }
  return outcome;
}

// The run on a standby: the one the session has, else (a python3 job's run, none free) a python
// standby of its own. nullopt: none, or it could not run there; the run goes to a channel of its
// own.
Expected<std::optional<ExecOutcome>>
run_on_a_standby(ssh_session session, std::string_view label, const std::string& command,
                 const ExecRequest& request, CallWatchdog& watchdog,
                 std::unique_lock<std::mutex>& lock, const FreeAChannel& free_a_channel,
                 const StandbyUse& standby, Settle& settle)
{
  const bool may_use = standby.standby != nullptr;
  // Freed while the lock is held, as every channel.
  if (StandbyChannel taken = may_use ? take_standby(standby) : nullptr) {
    // A python standby usually stays for the next run: no other opens meanwhile.
    if (standby.taken && !taken->python) {
      standby.taken();
    }
    return run_and_keep(session, std::move(taken), command, request, watchdog, lock, standby,
                        settle);
  }
  if (!may_use || !request.python_standby || standby.python_command.empty() ||
      (standby.python_failed != nullptr && *standby.python_failed)) {
    return std::optional<ExecOutcome>();
  }
  // No standby free (runs side by side): this run's channel is a python standby of its own,
  // which may stay for a later run.
  StandbyChannel fresh;
  const auto try_open = [&] {
    fresh.reset(new Standby(session));
    fresh->python = true;
    return fresh->channel.open();
  };
  FERRY_TRY(start_channel(
      session, label, try_open, [&] { return fresh->channel.get(); }, standby.python_command,
      request, watchdog, lock, free_a_channel));
  return run_and_keep(session, std::move(fresh), command, request, watchdog, lock, standby, settle);
}

} // namespace

Expected<ExecOutcome> exec(ssh_session session, std::string_view label, const ExecRequest& request,
                           CallWatchdog& watchdog, std::mutex& mutex,
                           const FreeAChannel& free_a_channel, const StandbyUse& standby)
{
  FERRY_TRY_ASSIGN(const auto command, shell_neutral_command(request.argv));
  std::unique_lock lock(mutex);
  Settle settle{standby.settle};
  auto on_standby = run_on_a_standby(session, label, command, request, watchdog, lock,
                                     free_a_channel, standby, settle);
  if (standby.staged_by_standby != nullptr) {
    *standby.staged_by_standby = settle.handed;
  }
  FERRY_TRY(on_standby);
  if (*on_standby) {
    return std::move(**on_standby);
  }
  // It could not start there: the run goes to a channel of its own, its files made first
  // (the standby, if it was given them, did not run it).
  if (standby.staged_by_standby != nullptr) {
    *standby.staged_by_standby = false;
  }
  FERRY_TRY(settle());
  ExitWatch watch;
  // Declared after the lock: the channel is freed (a libssh call) while the lock is held.
  std::optional<ExecChannel> channel;
  const auto try_open = [&] {
    channel.emplace(session, watch);
    return channel->open();
  };
  FERRY_TRY(start_channel(
      session, label, try_open, [&] { return channel->get(); }, command, request, watchdog, lock,
      free_a_channel));
  return follow(session, channel->get(), watch, request, watchdog, lock);
}

} // namespace ferry::ssh
