// The runs that go to a channel opened ahead of them (channel.hpp).
#include "transport/ssh/standby/channel.hpp"

#include <poll.h>

#include "ferry/remote/launcher.hpp"
#include "ferry/remote/shell_neutral.hpp"
#include "ferry/remote/standby_boot.hpp"
#include "transport/ssh/standby/policy.hpp"

namespace ferry::ssh {

using Clock = std::chrono::steady_clock;

bool is_python(const StandbyChannel& standby)
{
  return standby && standby->python;
}

namespace {
const std::string& sh_command()
{
  static const std::string command = *shell_neutral_command({"/bin/sh", "-s"});
  return command;
}

void decide_standby(Standby& standby, const std::string& python_command)
{
  standby.python = !python_command.empty();
  standby.command = sh_command();
  standby.boot = python_command;
}

// How far a python standby's boot has come: its line written once, then its stdout read up to
// the ready line (startup files' noise before it is dropped). Failed once its channel ended.
StandbyState boot_python(ssh_session session, Standby& standby)
{
  const ssh_channel channel = standby.channel.get();
  if (!standby.booted) {
    if (ssh_channel_write(channel, standby.boot.data(),
                          static_cast<uint32_t>(standby.boot.size())) !=
        static_cast<int>(standby.boot.size())) {
      return StandbyState::failed;
    }
    standby.booted = true;
  }
  char buffer[4096];
  int n = 0;
  while ((n = ssh_channel_read_nonblocking(channel, buffer, sizeof buffer, 0)) > 0) {
    standby.said.append(buffer, static_cast<std::size_t>(n));
  }
  const std::string prefix = std::string(k_standby_ready) + " ";
  const auto at = standby.said.starts_with(prefix) ? 0 : standby.said.find("\n" + prefix);
  const auto from = at == std::string::npos ? at : (at == 0 ? 0 : at + 1) + prefix.size();
  const auto end = from == std::string::npos ? from : standby.said.find('\n', from);
  if (end != std::string::npos) {
    standby.tag_sha256 = standby.said.substr(from, end - from);
    standby.said.clear();
    standby.ready = true;
    return StandbyState::ready;
  }
  if (standby.said.size() > 65536) {
    standby.said.erase(0, standby.said.size() - prefix.size());
  }
  if (!standby.watch.exited && n == SSH_EOF) {
    // Past the end of its output libssh's reads take in no more packets: the exit status that
    // follows (4: its script refused) would wait in the socket, and the boot for its limit.
    // (Not ssh_channel_is_eof: that stays 0 while stderr holds bytes unread, as the refusal's
    // own line.)
    ssh_set_blocking(session, 0);
    (void)ssh_channel_get_exit_status(channel);
    ssh_set_blocking(session, 1);
  }
  if (standby.watch.exited || ssh_channel_is_closed(channel) != 0) {
    return StandbyState::failed;
  }
  return StandbyState::pending;
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
  return standby.boot.empty() || standby.ready ? StandbyState::ready
                                               : boot_python(session, standby);
}

StandbyChannel finish_standby(ssh_session session, std::unique_lock<std::mutex>& lock,
                              StandbyChannel standby, std::chrono::steady_clock::duration limit,
                              const StopToken* stop, int* exit_code)
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
    if (state == StandbyState::failed && exit_code != nullptr && standby->watch.status) {
      *exit_code = *standby->watch.status;
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
                            const std::string& python_command, int* exit_code)
{
  return finish_standby(session, lock, begin_standby(session, python_command), limit, nullptr,
                        exit_code);
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

// A python standby of a run's own, once its ready line came (null when it ended first or the
// run is stopped meanwhile): what it said goes to `use`.
StandbyChannel booted_python(ssh_session session, std::unique_lock<std::mutex>& lock,
                             StandbyChannel fresh, const ExecRequest& request,
                             const StandbyUse& use)
{
  int code = -1;
  fresh = finish_standby(session, lock, std::move(fresh), std::chrono::seconds(30), &request.stop,
                         &code);
  if (!fresh && code != -1 && use.boot_failed) {
    use.boot_failed(code);
  }
  if (fresh && use.booted) {
    use.booted(fresh->tag_sha256);
  }
  return fresh;
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
  if (!may_use || !(request.python_ahead || standby.any_job) || standby.python_command.empty() ||
      (standby.python_failed != nullptr && *standby.python_failed)) {
    return std::optional<ExecOutcome>();
  }
  // No standby free (runs side by side): this run's channel is a python standby of its own,
  // which may stay for a later run.
  StandbyChannel fresh;
  const auto try_open = [&] {
    fresh.reset(new Standby(session));
    decide_standby(*fresh, standby.python_command);
    return fresh->channel.open();
  };
  FERRY_TRY(start_channel(
      session, label, try_open, [&] { return fresh->channel.get(); }, sh_command(), request,
      watchdog, lock, free_a_channel));
  fresh->open = fresh->started = true;
  fresh = booted_python(session, lock, std::move(fresh), request, standby);
  if (!fresh) {
    return std::optional<ExecOutcome>();
  }
  return run_and_keep(session, std::move(fresh), command, request, watchdog, lock, standby, settle);
}

} // namespace

Expected<ExecOutcome> exec_launcher(ssh_session session, std::string_view label,
                                    const ExecRequest& request, CallWatchdog& watchdog,
                                    std::mutex& mutex, const FreeAChannel& free_a_channel,
                                    const StandbyUse& standby)
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
  return exec_on_new_channel(session, label, command, request, watchdog, lock, free_a_channel);
}

} // namespace ferry::ssh
