#include "transport/ssh/exec.hpp"

#include <thread>
#include <vector>

#include <libssh/callbacks.h>

#include "ferry/remote/shell_neutral.hpp"
#include "transport/stop_schedule.hpp"

namespace ferry::ssh {

namespace {

using Clock = std::chrono::steady_clock;

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

  [[nodiscard]] bool open()
  {
    if (!m_channel || ssh_channel_open_session(m_channel.get()) != SSH_OK) {
      return false;
    }
    ssh_set_channel_callbacks(m_channel.get(), &m_callbacks);
    return true;
  }
  [[nodiscard]] ssh_channel get() const { return m_channel.get(); }

private:
  Channel m_channel;
  ssh_channel_callbacks_struct m_callbacks{};
};

struct Streams {
  OutputCapture out;
  OutputCapture err;
  std::vector<char> buffer = std::vector<char>(64 * 1024);
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

// The read loop: until the channel ends, the connection is lost, or the output is held open.
void pump(ssh_session session, ssh_channel channel, const ExecRequest& request,
          const ExitWatch& watch, Streams& streams, ExecOutcome& outcome)
{
  Event event(ssh_event_new());
  ssh_event_add_session(event.get(), session);
  StopSchedule schedule(Clock::now(), request);
  while (true) {
    const bool got_data = drain(session, channel, streams, outcome);
    if (outcome.end == ExecEnd::lost || ssh_channel_is_eof(channel) ||
        ssh_channel_is_closed(channel)) {
      break;
    }
    if (!ssh_is_connected(session)) {
      lose(outcome, "the connection was closed");
      break;
    }
    if (watch.exited && Clock::now() - watch.at > k_output_linger) {
      outcome.output_held_open = true;
      break;
    }
    if (!apply_stop_step(schedule, channel, streams, outcome)) {
      break;
    }
    if (!got_data && ssh_event_dopoll(event.get(), 100) == SSH_ERROR &&
        !ssh_is_connected(session)) {
      lose(outcome, fmt::format("the connection dropped: {}", ssh_get_error(session)));
      break;
    }
  }
  ssh_event_remove_session(event.get(), session);
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

} // namespace

Expected<ExecOutcome> exec(ssh_session session, std::string_view label, const ExecRequest& request,
                           CallWatchdog& watchdog, const std::function<bool()>& free_a_channel)
{
  FERRY_TRY_ASSIGN(const auto command, shell_neutral_command(request.argv));
  ExitWatch watch;
  std::optional<ExecChannel> channel(std::in_place, session, watch);
  {
    const auto armed = watchdog.arm("open a channel", &request.stop);
    bool opened = channel->open();
    if (!opened && !watchdog.fired() && free_a_channel && free_a_channel()) {
      // The server frees the other channel's slot once it has reaped what ran there.
      for (int wait_ms = 0; !opened && wait_ms <= 640 && !watchdog.fired();
           wait_ms = std::max(20, wait_ms * 2)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
        channel.emplace(session, watch);
        opened = channel->open();
      }
    }
    if (!opened) {
      return fail(ErrorKind::failed, "{}: cannot open a channel: {}", label,
                  failure(session, watchdog));
    }
    if (ssh_channel_request_exec(channel->get(), command.c_str()) != SSH_OK) {
      return fail(ErrorKind::failed, "{}: cannot start `{}`: {}", label, command,
                  failure(session, watchdog));
    }
  }
  ExecOutcome outcome;
  outcome.start_limit_s = std::chrono::duration<double>(request.start_limit).count();
  Streams streams{capture_for(request, OutputStream::out), capture_for(request, OutputStream::err)};
  pump(session, channel->get(), request, watch, streams, outcome);
  if (outcome.end != ExecEnd::lost) {
    const auto armed = watchdog.arm("read the exit status", nullptr);
    if (!watch.exited && !outcome.output_held_open) {
      // EOF came first; the status follows right behind it.
      if (const int status = ssh_channel_get_exit_status(channel->get()); status >= 0) {
        watch.status = status;
      }
    }
    outcome.exit_code = watch.status;
    ssh_channel_close(channel->get());
  }
  outcome.out = std::move(streams.out).finish();
  outcome.err = std::move(streams.err).finish();
  return outcome;
}

} // namespace ferry::ssh
