#include "transport/ssh/exec.hpp"

#include <poll.h>

#include <thread>
#include <vector>

#include <libssh/callbacks.h>

#include "ferry/remote/launcher.hpp"
#include "ferry/remote/shell_neutral.hpp"
#include "transport/stop_schedule.hpp"

namespace ferry::ssh {

using Clock = std::chrono::steady_clock;

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

namespace {

struct Streams {
  OutputCapture out;
  OutputCapture err;
  std::vector<char> buffer = std::vector<char>(64 * 1024);
  // A run on a channel that may serve a later one (follow's `stayed`): the run ends without the
  // channel's end once stdout holds the whole report and stderr `END_MARKER stay` (the process
  // on the channel stays for the next run).
  bool may_stay = false;
  bool stayed = false;

  [[nodiscard]] bool channel_stays() const
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
  if (streams.channel_stays()) {
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

} // namespace

ExecOutcome follow(ssh_session session, ssh_channel channel, ExitWatch& watch,
                   const ExecRequest& request, CallWatchdog& watchdog,
                   std::unique_lock<std::mutex>& lock, bool* stayed)
{
  ExecOutcome outcome;
  outcome.start_limit_s = std::chrono::duration<double>(request.start_limit).count();
  Streams streams{capture_for(request, OutputStream::out),
                  capture_for(request, OutputStream::err, stayed != nullptr)};
  streams.may_stay = stayed != nullptr;
  pump(session, channel, request, watch, streams, outcome, lock);
  if (streams.stayed) { // the channel stays open for the next run
    *stayed = true;
    outcome.out = std::move(streams.out).finish();
    outcome.err = std::move(streams.err).finish();
    outcome.err.launcher_report.reset(); // `stay`: the channel's, not the job's
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

Expected<ExecOutcome> exec_on_new_channel(ssh_session session, std::string_view label,
                                          const std::string& command, const ExecRequest& request,
                                          CallWatchdog& watchdog,
                                          std::unique_lock<std::mutex>& lock,
                                          const FreeAChannel& free_a_channel)
{
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

Expected<ExecOutcome> exec(ssh_session session, std::string_view label, const ExecRequest& request,
                           CallWatchdog& watchdog, std::mutex& mutex,
                           const FreeAChannel& free_a_channel)
{
  FERRY_TRY_ASSIGN(const auto command, shell_neutral_command(request.argv));
  std::unique_lock lock(mutex);
  return exec_on_new_channel(session, label, command, request, watchdog, lock, free_a_channel);
}

} // namespace ferry::ssh
