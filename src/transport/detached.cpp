// A detached run followed through the files its launcher writes (docs/run-protocol.md, "Detached
// runs"): the same captures as a live channel's, fed from the output files as they grow.
#include <algorithm>
#include <charconv>
#include <thread>

#include "ferry/remote/launcher.hpp"
#include "transport/exec_request.hpp"

namespace ferry {

namespace {

// The done file's line, "CODE CAUSE [OUT_DROPPED ERR_DROPPED]", is at most this long.
constexpr std::size_t k_done_cap = 96;
// The state file's line, "PID +SECONDS", is at most this long.
constexpr std::size_t k_state_cap = 64;
// /proc/PID/cmdline is read up to this much: the launcher's is `/bin/sh RUN_DIR/launch.sh
// detached`.
constexpr std::size_t k_cmdline_cap = 64 * 1024;
// How many polls apart the launcher is looked for in /proc while no done file is there.
constexpr int k_polls_per_liveness_look = 4;
// /proc/PID/stat is read up to this much (a command name of 16 bytes, then numbers).
constexpr std::size_t k_stat_cap = 4096;
// The flag of a kernel thread in /proc/PID/stat's ninth field (PF_KTHREAD).
constexpr unsigned long long k_kernel_thread = 0x00200000;

// The done file's bytes, nullopt when it is not there yet (or not a regular file).
Expected<std::optional<std::string>> done_line(HostSession& session, const StagedRun& run)
{
  FERRY_TRY_ASSIGN(auto fetched, fetch_capped(session, run, k_detached_done, k_done_cap));
  if (fetched.kind != FetchedFile::Kind::regular) {
    return std::optional<std::string>();
  }
  return std::optional<std::string>(std::move(fetched.bytes));
}

// The leading whole number of `text` (after `skip` words), nullopt when there is none.
template <typename Number> std::optional<Number> number_at(std::string_view text, int skip = 0)
{
  for (; skip > 0; --skip) {
    const auto space = text.find(' ');
    if (space == std::string_view::npos) {
      return std::nullopt;
    }
    text.remove_prefix(space + 1);
  }
  Number value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data() ||
      (end != text.data() + text.size() && *end != ' ' && *end != '\n')) {
    return std::nullopt;
  }
  return value;
}

// The exit status the done file gives; nullopt when it gives none.
std::optional<int> done_code(std::string_view line)
{
  return number_at<int>(line);
}

// The host keeps each output file within the run's output cap (its first and last half, as the
// capture does); the done file says how many bytes it dropped between them. The capture, which
// saw only what was kept, learns of them here.
void add_dropped(CapturedStream& stream, std::optional<std::uint64_t> dropped)
{
  if (dropped && *dropped > 0 && stream.saw_sentinel) {
    stream.dropped += *dropped;
    stream.truncated = true;
  }
}

// A file under the host's /proc (`rel`: `PID/cmdline`), read over the session's files.
Expected<FetchedFile> read_proc(HostSession& session, const std::string& rel, std::size_t cap)
{
  StagedRun proc;
  proc.run_dir = "/proc";
  return fetch_capped(session, proc, rel, cap);
}

// Whether /proc is there to read at all (sftp-server's own, or this process's, entry).
Expected<bool> proc_readable(HostSession& session)
{
  auto self = read_proc(session, "self/cmdline", k_cmdline_cap);
  return self && self->kind == FetchedFile::Kind::regular && !self->bytes.empty();
}

// The launcher's pid: its state file's, else the one it said on the channel; 0: none known.
Expected<long long> launcher_pid(HostSession& session, const StagedRun& run, long long said)
{
  FERRY_TRY_ASSIGN(const auto state,
                   fetch_capped(session, run, k_launcher_state_file, k_state_cap));
  if (state.kind == FetchedFile::Kind::regular) {
    if (const auto pid = number_at<long long>(state.bytes); pid && *pid > 0) {
      return *pid;
    }
  }
  return said > 0 ? said : 0;
}

// A process whose command line reads empty: one between the two halves of an exec (the
// launcher's pid is said before `exec setsid /bin/sh launch.sh detached` has run: under load a
// read of its command line found it so), a zombie or a kernel thread. Its stat tells which: only
// the first may still be the launcher.
Expected<bool> ended_or_kernel(HostSession& session, long long pid)
{
  auto stat = read_proc(session, std::to_string(pid) + "/stat", k_stat_cap);
  if (!stat || stat->kind == FetchedFile::Kind::other) {
    return false; // unreadable: not known to be gone
  }
  const auto name_end = stat->bytes.rfind(") ");
  if (stat->kind == FetchedFile::Kind::missing || name_end == std::string::npos) {
    return stat->kind == FetchedFile::Kind::missing;
  }
  // After the name: the state (field 3), then ppid, pgrp, session, tty, tpgid and the flags.
  const std::string_view fields = std::string_view(stat->bytes).substr(name_end + 2);
  const auto flags = number_at<unsigned long long>(fields, 6);
  return fields.starts_with('Z') || fields.starts_with('X') ||
         (flags && (*flags & k_kernel_thread) != 0);
}

// Whether the detached launcher is known to be gone: its pid names no process, or one that is
// not `/bin/sh RUN_DIR/launch.sh` (the pid was reused; an empty command line: ended_or_kernel),
// as `launch.sh stop` checks. Nothing is executed: /proc is read over the session's files. No
// pid known yet, or no /proc to read: not known to be gone. A launcher that ended writes its
// done file first: the caller looks again.
Expected<bool> launcher_gone(HostSession& session, const StagedRun& run, long long said)
{
  FERRY_TRY_ASSIGN(const long long pid, launcher_pid(session, run, said));
  if (pid == 0) {
    return false;
  }
  FERRY_TRY_ASSIGN(const bool readable, proc_readable(session));
  if (!readable) {
    return false;
  }
  auto cmdline = read_proc(session, std::to_string(pid) + "/cmdline", k_cmdline_cap);
  if (!cmdline || cmdline->kind == FetchedFile::Kind::other) {
    return false; // unreadable: not known to be gone
  }
  if (cmdline->kind == FetchedFile::Kind::missing) {
    return true;
  }
  if (cmdline->bytes.empty()) {
    return ended_or_kernel(session, pid);
  }
  const std::string launcher = run.run_dir + "/" + k_launcher_file;
  std::string_view args = cmdline->bytes;
  while (!args.empty()) {
    const auto end = args.find('\0');
    if (args.substr(0, end) == launcher) {
      return false;
    }
    args.remove_prefix(end == std::string_view::npos ? args.size() : end + 1);
  }
  return true;
}

// Reads on in one output file from `offset`, into its capture.
Expected<void> read_on(HostSession& session, const StagedRun& run, const char* file,
                       std::uint64_t& offset, OutputCapture& capture)
{
  const ChunkSink feed = [&](std::string_view chunk) {
    offset += chunk.size();
    capture.feed(chunk);
    return Expected<void>{};
  };
  // From where the last look stopped; a file not there (yet) reads as empty.
  FERRY_TRY_ASSIGN(const auto fetched, session.fetch(run, file, feed, offset));
  (void)fetched;
  return {};
}

// Waits `poll`; false when `stop` was asked meanwhile.
bool nap(const FollowRequest& request)
{
  constexpr auto step = std::chrono::milliseconds(50);
  for (auto waited = std::chrono::milliseconds(0); waited < request.poll; waited += step) {
    if (request.stop.stop_requested()) {
      return false;
    }
    std::this_thread::sleep_for(step);
  }
  return !request.stop.stop_requested();
}

OutputCapture capture_of(const StagedRun& run, const FollowRequest& request, OutputStream stream)
{
  std::function<void(std::string_view)> sink;
  if (request.on_output) {
    sink = [on_output = request.on_output, stream](std::string_view bytes) {
      on_output(stream, bytes);
    };
  }
  return OutputCapture(run.launcher.sentinel, request.output_cap,
                       stream == OutputStream::out ? run.launcher.end_marker : std::string(),
                       std::move(sink), request.report_cap);
}

// What the follow has read so far, and where it is in each file.
struct Reading {
  OutputCapture out;
  OutputCapture err;
  std::uint64_t out_offset = 0;
  std::uint64_t err_offset = 0;

  Expected<void> read_on(HostSession& session, const StagedRun& run)
  {
    FERRY_TRY(ferry::read_on(session, run, k_detached_stdout, out_offset, out));
    return ferry::read_on(session, run, k_detached_stderr, err_offset, err);
  }
  // The outcome as a launch that ended gives it; `line` is the done file's (none: lost).
  Followed finish(FollowEnd end, const std::optional<std::string>& line) &&
  {
    Followed followed{end, {}};
    followed.outcome.out = std::move(out).finish();
    followed.outcome.err = std::move(err).finish();
    if (line) {
      followed.outcome.exit_code = done_code(*line);
      add_dropped(followed.outcome.out, number_at<std::uint64_t>(*line, 2));
      add_dropped(followed.outcome.err, number_at<std::uint64_t>(*line, 3));
    }
    return followed;
  }
};

// One look at a run with no done file: its directory and its launcher. nullopt: it runs.
Expected<std::optional<FollowEnd>> look_without_done(HostSession& session, const StagedRun& run,
                                                     const FollowRequest& request, int polls)
{
  FERRY_TRY_ASSIGN(const auto listed, session.list(run, ""));
  if (!listed) {
    return std::optional<FollowEnd>(FollowEnd::gone);
  }
  if (polls % k_polls_per_liveness_look != 0) {
    return std::optional<FollowEnd>();
  }
  FERRY_TRY_ASSIGN(const bool gone, launcher_gone(session, run, request.launcher_pid));
  return gone ? std::optional<FollowEnd>(FollowEnd::lost) : std::optional<FollowEnd>();
}

// One look at the run: the done file's line (looked at before the output: once it is there,
// the read that follows is the last) and, without one, how the run stands (nullopt: it runs).
struct Look {
  std::optional<std::string> line;
  std::optional<FollowEnd> end;
};
Expected<Look> look(HostSession& session, const StagedRun& run, const FollowRequest& request,
                    int polls)
{
  Look seen;
  FERRY_TRY_ASSIGN(seen.line, done_line(session, run));
  if (seen.line) {
    return seen;
  }
  FERRY_TRY_ASSIGN(seen.end, look_without_done(session, run, request, polls));
  if (seen.end == FollowEnd::lost) {
    // The launcher writes its done file before it ends: one there now was written meanwhile.
    FERRY_TRY_ASSIGN(seen.line, done_line(session, run));
    if (seen.line) {
      seen.end.reset();
    }
  }
  return seen;
}

} // namespace

Expected<DetachedState> detached_state(HostSession& session, const StagedRun& run,
                                       long long launcher_pid)
{
  FERRY_TRY_ASSIGN(const auto line, done_line(session, run));
  if (line) {
    return DetachedState::finished;
  }
  FERRY_TRY_ASSIGN(const auto listed, session.list(run, ""));
  if (!listed) {
    return DetachedState::gone;
  }
  FERRY_TRY_ASSIGN(const bool gone, launcher_gone(session, run, launcher_pid));
  if (!gone) {
    return DetachedState::running;
  }
  // The launcher writes its done file before it ends: one there now was written meanwhile.
  FERRY_TRY_ASSIGN(const auto again, done_line(session, run));
  return again ? DetachedState::finished : DetachedState::lost;
}

Expected<Followed> follow_detached(HostSession& session, const StagedRun& run,
                                   const FollowRequest& request)
{
  Reading reading{capture_of(run, request, OutputStream::out),
                  capture_of(run, request, OutputStream::err)};
  for (int polls = 0;; ++polls) {
    FERRY_TRY_ASSIGN(const Look seen, look(session, run, request, polls));
    if (seen.end == FollowEnd::gone) {
      return Followed{FollowEnd::gone, {}};
    }
    FERRY_TRY(reading.read_on(session, run));
    if (seen.line || seen.end) {
      return std::move(reading).finish(seen.line ? FollowEnd::done : FollowEnd::lost, seen.line);
    }
    if (!nap(request)) {
      return Followed{FollowEnd::stopped, {}};
    }
  }
}

} // namespace ferry
